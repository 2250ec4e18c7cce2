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
    CompactionReport, DamagedRecord, FileStore, FileStoreBuilder, OpenReport, RefusedPartition,
    StoreDamage, SyncPolicy, TornTail,
};

// The file layer and the fault-injecting disk, public only to the crash and fault tests
// (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub use file::{
    CrashPoint, FailMode, FaultFs, OpenMode, OsFs, PathKind, SkipSync, Vfs, VfsFile, VfsLock,
};
pub(crate) use file::{FileCheck, FileState, check_unopened};
pub use iter::{ENTRIES_PAGE, Entries};
pub use memory::MemoryStore;
pub use types::{
    Batch, Cursor, KeyRange, MAX_BATCH_BYTES, MAX_KEY_BYTES, MAX_PARTITION_NAME_BYTES,
    MAX_VALUE_BYTES, Op, Outcome, Partition, Precondition, ScanPage, StoreLimits, StoreStats,
    check_key,
};
pub(crate) use types::{check_guards, check_key_within, refuse_deadlines};

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
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>>;

    /// At most `limit` entries of `range` in key order, starting strictly after `cursor`.
    ///
    /// Each page is consistent on its own. The returned cursor resumes strictly after the last
    /// key returned; it is `None` once the range is exhausted. `limit` must be at least 1.
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage>;

    /// Every entry of `range` in key order, as an iterator that reads [`Store::scan`] pages of
    /// [`ENTRIES_PAGE`] entries as it goes (see [`Entries`]). On a `dyn Store`, use
    /// [`Entries::new`].
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
    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome>;

    /// The partitions whose name starts with `prefix`, in name order. Reads no partition's rows.
    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>>;

    /// Whether partition `p` exists: a batch of it has committed. Reads no rows.
    ///
    /// The default lists partitions; backends answer it from their table in constant time.
    fn contains_partition(&self, p: &Partition) -> Result<bool> {
        Ok(self.list_partitions(p.as_bytes())?.first() == Some(p))
    }

    /// The store's clock, which `NotAfter` preconditions are checked against.
    fn now_ms(&self) -> u64;

    /// How much one batch may carry on this backend (SPEC S11). A batch over any limit is
    /// refused with [`Error::TooLarge`](crate::Error::TooLarge) before anything is touched,
    /// never split.
    ///
    /// The default is [`StoreLimits::DEFAULT`] (SPEC S1's limits, no count limit). A backend
    /// with tighter limits overrides it, and a store that wraps another forwards it.
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
    fn evaluates_deadlines(&self) -> bool {
        true
    }

    /// Counters for batching, syncs and laziness.
    fn stats(&self) -> StoreStats;

    /// Flushes what a clean shutdown records and releases the store; later calls answer
    /// [`Error::Closed`](crate::Error::Closed). Closing twice is harmless.
    fn close(&self) -> Result<()>;
}

pub(crate) fn check_limit(limit: usize) -> Result<()> {
    if limit == 0 {
        return Err(crate::Error::invalid("a scan limit must be at least 1"));
    }
    Ok(())
}
