//! The partition store (SPEC S1-S10).
//!
//! Owns: the store contract ([`Store`]), its vocabulary ([`Batch`], [`Outcome`], ...), the
//! file-backed store (the default), the in-memory store (for tests) and, with the `etcd`
//! feature, the etcd backend (`EtcdStore`). It knows nothing of
//! entities, epochs or restores, and calls nothing above it.

#[cfg(feature = "etcd")]
mod etcd;
mod file;
mod iter;
mod memory;
mod types;

#[cfg(feature = "etcd")]
pub use etcd::{
    ETCD_DEFAULT_MAX_REQUEST_BYTES, ETCD_DEFAULT_MAX_TXN_OPS, EtcdStore, EtcdStoreBuilder,
};

pub use file::{
    BackupReport, CompactionReport, DamagedRecord, FileStore, FileStoreBuilder, OpenReport,
    RefusedPartition, StoreDamage, SyncPolicy, TornTail,
};

// The file layer and the fault-injecting disk, public only to the crash and fault tests
// (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub use file::{
    CrashPoint, FailMode, FaultFs, OpenMode, OsFs, PathKind, SkipSync, Vfs, VfsFile, VfsLock,
};
// Where a file store's bytes go, for the tests that bound its footprint (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
pub use file::Footprint;
pub(crate) use file::{FileCheck, FileState, backup_unopened, check_unopened};
pub use iter::{ENTRIES_PAGE, Entries};
pub use memory::MemoryStore;
pub use types::{
    Batch, Cursor, KeyRange, MAX_BATCH_BYTES, MAX_KEY_BYTES, MAX_PARTITION_NAME_BYTES,
    MAX_VALUE_BYTES, Op, Outcome, Partition, Precondition, ScanPage, StoreLimits, StoreStats,
    check_key,
};
pub(crate) use types::{check_guards, check_key_within, refuse_deadlines};

use std::path::Path;

use crate::error::Result;

/// The store contract (SPEC S1, S2, S9). Every backend passes the same conformance suite.
///
/// A partition is the unit of atomicity: one batch touches exactly one partition, and its
/// preconditions are checked and its operations applied atomically with respect to every other
/// batch on that partition. Handles are `Send + Sync` and meant to be shared through an `Arc`.
///
/// The contract stays small on purpose (point reads, ordered ranges, guarded batches on one
/// partition) so that a distributed engine such as etcd (transactions with compares, ranges)
/// can implement it.
///
/// ```
/// use portcullis::store::{Batch, KeyRange, MemoryStore, Outcome, Partition, Store};
/// let store = MemoryStore::new();
/// let p = Partition::new("accounts").unwrap();
/// let outcome = store.apply(&p, &Batch::new().absent(b"alice".to_vec()).put(b"alice".to_vec(), b"10".to_vec())).unwrap();
/// assert_eq!(outcome, Outcome::Committed);
/// assert_eq!(store.get(&p, b"alice").unwrap(), Some(b"10".to_vec()));
/// let page = store.scan(&p, &KeyRange::all(), None, 10).unwrap();
/// assert_eq!(page.entries.len(), 1);
/// assert!(page.next.is_none());
/// ```
pub trait Store: Send + Sync {
    /// The value of `key` in partition `p`, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// assert_eq!(store.get(&p, b"alice")?, Some(b"10".to_vec()));
    /// assert_eq!(store.get(&p, b"bob")?, None);
    /// # Ok(())
    /// # }
    /// ```
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// The value of `key` as the next batch on `p` will see it: like [`Store::get`], but it
    /// also sees batches that have committed and are still becoming durable, instead of waiting
    /// for them.
    ///
    /// Use it only to build a guarded batch (a compare-and-set loop): such a batch is checked
    /// against the same state, and it can only become durable after everything it read, since
    /// recovery keeps a prefix of the commit order. Do not show the value to anyone else: a
    /// crash can still take it away. Concurrent compare-and-set loops that read this way share
    /// syncs instead of each waiting for the previous winner's.
    ///
    /// The default answers like `get`; backends with a commit pipeline override it.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    /// let store = MemoryStore::new();
    /// let p = Partition::new("counters").unwrap();
    /// // A compare-and-set increment.
    /// loop {
    ///     let current = store.get_for_update(&p, b"n").unwrap();
    ///     let n = current.as_deref().map_or(0, |v| v[0]);
    ///     let guard = match current {
    ///         Some(v) => Batch::new().equals(b"n".to_vec(), v),
    ///         None => Batch::new().absent(b"n".to_vec()),
    ///     };
    ///     if store.apply(&p, &guard.put(b"n".to_vec(), vec![n + 1])).unwrap().is_committed() {
    ///         break;
    ///     }
    /// }
    /// assert_eq!(store.get(&p, b"n").unwrap(), Some(vec![1]));
    /// ```
    fn get_for_update(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get(p, key)
    }

    /// One answer per key, in the order asked, all read from one consistent view.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10").put("bob", "5"))?;
    /// let values = store.get_many(&p, &[b"bob", b"carol", b"alice"])?;
    /// assert_eq!(values, [Some(b"5".to_vec()), None, Some(b"10".to_vec())]);
    /// # Ok(())
    /// # }
    /// ```
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>>;

    /// At most `limit` entries of `range` in key order, starting strictly after `cursor`.
    ///
    /// Each page is consistent on its own. The returned cursor resumes strictly after the last
    /// key returned; it is `None` once the range is exhausted. `limit` must be at least 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    /// use portcullis::store::KeyRange;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("a", "1").put("b", "2").put("c", "3"))?;
    /// let first = store.scan(&p, &KeyRange::all(), None, 2)?;
    /// assert_eq!(first.entries.len(), 2);
    /// let rest = store.scan(&p, &KeyRange::all(), first.next.as_ref(), 2)?;
    /// assert_eq!(rest.entries, [(b"c".to_vec(), b"3".to_vec())]);
    /// assert!(rest.next.is_none());
    /// # Ok(())
    /// # }
    /// ```
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage>;

    /// [`Store::scan`], lending each entry of the page to `visit` (in key order) instead of
    /// returning it: returns the cursor of the next page, `None` once the range is exhausted,
    /// like [`ScanPage::next`]. An error from `visit` stops the page and is returned as is.
    ///
    /// The page is the same consistent page `scan` would return (SPEC S1), and damage is
    /// reported the same way (SPEC S4). The provided implementation calls [`Store::scan`];
    /// a backend overrides it to lend keys and values from buffers it reuses, without an
    /// allocation per entry (the file store does). Entries are lent after the store's reads
    /// are done, so `visit` may call the store.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, KeyRange, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("a", "1").put("b", "22").put("c", "333"))?;
    /// let mut bytes = 0;
    /// let next = store.scan_visit(&p, &KeyRange::all(), None, 2, &mut |_key, value| {
    ///     bytes += value.len();
    ///     Ok(())
    /// })?;
    /// assert_eq!(bytes, 3);
    /// let last = store.scan_visit(&p, &KeyRange::all(), next.as_ref(), 2, &mut |key, _| {
    ///     assert_eq!(key, b"c");
    ///     Ok(())
    /// })?;
    /// assert!(last.is_none());
    /// # Ok(())
    /// # }
    /// ```
    #[allow(clippy::type_complexity)]
    fn scan_visit(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<Option<Cursor>> {
        let page = self.scan(p, range, cursor, limit)?;
        for (key, value) in &page.entries {
            visit(key, value)?;
        }
        Ok(page.next)
    }

    /// Every entry of `range` in key order, as an iterator that reads [`Store::scan`] pages of
    /// [`ENTRIES_PAGE`] entries as it goes (see [`Entries`]). On a `dyn Store`, use
    /// [`Entries::new`].
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, KeyRange, MemoryStore, Partition, Store};
    /// let store = MemoryStore::new();
    /// let p = Partition::new("users").unwrap();
    /// store.apply(&p, &Batch::new().put(b"u/1".to_vec(), b"ann".to_vec()).put(b"u/2".to_vec(), b"bo".to_vec())).unwrap();
    /// for entry in store.entries(&p, KeyRange::prefix(b"u/")) {
    ///     let (key, value) = entry.unwrap();
    ///     assert!(key.starts_with(b"u/") && !value.is_empty());
    /// }
    /// ```
    fn entries(&self, p: &Partition, range: KeyRange) -> Entries<'_>
    where
        Self: Sized,
    {
        Entries::new(self, p.clone(), range)
    }

    /// Checks the batch's preconditions and applies its operations, atomically.
    ///
    /// A failed precondition or passed deadline changes nothing. Under a syncing policy,
    /// `Committed` means durable (SPEC S3).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    /// use portcullis::store::Outcome;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// let open = Batch::new().absent("alice").put("alice", "10");
    /// assert_eq!(store.apply(&p, &open)?, Outcome::Committed);
    /// assert_eq!(store.apply(&p, &open)?, Outcome::PreconditionFailed { index: 0 });
    /// # Ok(())
    /// # }
    /// ```
    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome>;

    /// The partitions whose name starts with `prefix`, in name order. Reads no partition's rows.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// store.apply(&Partition::new("audit")?, &Batch::new().put("1", "opened"))?;
    /// assert_eq!(store.list_partitions(b"acc")?, [p]);
    /// # Ok(())
    /// # }
    /// ```
    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>>;

    /// Whether partition `p` exists: a batch of it has committed. Reads no rows.
    ///
    /// The default lists partitions; backends answer it from their table in constant time.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// assert!(!store.contains_partition(&p)?);
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// assert!(store.contains_partition(&p)?);
    /// # Ok(())
    /// # }
    /// ```
    fn contains_partition(&self, p: &Partition) -> Result<bool> {
        Ok(self.list_partitions(p.as_bytes())?.first() == Some(p))
    }

    /// The store's clock, which `NotAfter` preconditions are checked against.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// // A deadline a second from now on the store's own clock.
    /// let batch = Batch::new().not_after(store.now_ms() + 1_000).put("alice", "10");
    /// assert!(store.apply(&p, &batch)?.is_committed());
    /// # Ok(())
    /// # }
    /// ```
    fn now_ms(&self) -> u64;

    /// How much one batch may carry on this backend (SPEC S11). A batch over any limit is
    /// refused with [`Error::TooLarge`](crate::Error::TooLarge) before anything is touched,
    /// never split.
    ///
    /// The default is [`StoreLimits::DEFAULT`] (SPEC S1's limits, no count limit). A backend
    /// with tighter limits overrides it, and a store that wraps another forwards it.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// let limits = store.limits();
    /// assert_eq!(limits.max_key_bytes, portcullis::store::MAX_KEY_BYTES);
    /// assert!(Batch::new().put("alice", "10").validate_within(&limits).is_ok());
    /// # Ok(())
    /// # }
    /// ```
    fn limits(&self) -> StoreLimits {
        StoreLimits::DEFAULT
    }

    /// Whether this backend evaluates `NotAfter` preconditions on its own clock, inside the
    /// commit step (SPEC S2, S11).
    ///
    /// `true` (the default) for the file-backed and in-memory stores. A backend that cannot
    /// (etcd has no compare on server time) answers `false` and refuses every batch that
    /// carries a `NotAfter` with [`Error::InvalidArgument`](crate::Error::InvalidArgument);
    /// fencing then keeps F7 without server-side deadlines. A store that wraps another must
    /// forward this answer: a wrapper around a deadline-less backend that answers `true` would
    /// let fencing rely on a check that never happens.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// if store.evaluates_deadlines() {
    ///     store.apply(&p, &Batch::new().not_after(store.now_ms() + 1_000).put("alice", "10"))?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    fn evaluates_deadlines(&self) -> bool {
        true
    }

    /// A number naming this open handle, if it holds the store's data alone: while it is open,
    /// no other handle, in this process or another, can open the same data (the file store's
    /// directory lock, SPEC S6). Rows written through another handle of the same data were
    /// written by one that has been closed, or whose process has ended. The engine uses it to
    /// take an owner lease written through another handle for ended at once, instead of waiting
    /// for it to expire (SPEC F12).
    ///
    /// `None` (the default) for the in-memory store and for etcd (many processes share it);
    /// a number drawn at open for the file store (random, so two handles practically never
    /// share one). A store that wraps another should forward it: every view of one handle
    /// answers the same number.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{FileStore, MemoryStore, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let first = FileStore::open(dir.path())?;
    /// let handle = first.exclusive_handle().expect("a file store holds its directory alone");
    /// first.close()?;
    /// let again = FileStore::open(dir.path())?;
    /// assert_ne!(again.exclusive_handle(), Some(handle), "each open is another handle");
    /// assert_eq!(MemoryStore::new().exclusive_handle(), None);
    /// # Ok(())
    /// # }
    /// ```
    fn exclusive_handle(&self) -> Option<u64> {
        None
    }

    /// Counters for batching, syncs and laziness.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// assert_eq!(store.stats().batches, 1);
    /// # Ok(())
    /// # }
    /// ```
    fn stats(&self) -> StoreStats;

    /// Flushes what a clean shutdown records and releases the store; later calls answer
    /// [`Error::Closed`](crate::Error::Closed). Closing twice is harmless.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.close()?;
    /// assert!(store.get(&p, b"alice").is_err()); // Closed
    /// # Ok(())
    /// # }
    /// ```
    fn close(&self) -> Result<()>;

    /// Writes a consistent copy of the store, as it is at one instant during the call, to the
    /// directory `dest`, which must not exist, while other threads keep using the store
    /// (SPEC S12). The file-backed store does it ([`FileStore::backup`], which says what is
    /// guaranteed). A store that keeps nothing in a directory answers
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) saying what to do instead:
    /// the in-memory store has nothing on disk to copy, and an etcd store is backed up with
    /// etcd's own snapshot (docs/etcd.md, "Backup"). The default answers that too: a store
    /// that wraps another forwards this call to it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{Batch, FileStore, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let file: Arc<dyn Store> = Arc::new(FileStore::open(dir.path().join("live"))?);
    /// file.apply(&Partition::new("accounts")?, &Batch::new().put("alice", "10"))?;
    /// let report = file.backup(&dir.path().join("copy"))?;
    /// assert!(report.files_copied > 0);
    ///
    /// let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// assert!(memory.backup(&dir.path().join("other")).is_err()); // nothing on disk to copy
    /// # Ok(())
    /// # }
    /// ```
    fn backup(&self, dest: &Path) -> Result<BackupReport> {
        let _ = dest;
        Err(crate::Error::invalid(
            "this store cannot back itself up to a directory; copy its partitions into a FileStore (list_partitions, entries, apply) instead",
        ))
    }
}

pub(crate) fn check_limit(limit: usize) -> Result<()> {
    if limit == 0 {
        return Err(crate::Error::invalid("a scan limit must be at least 1"));
    }
    Ok(())
}
