//! The file-backed store: one shared journal of segment files with a chain of records per
//! partition, group commit, lazy per-partition indexes, recovery and compaction.
//!
//! Owns: the on-disk format ([`mod@format`]), the journal and its group commit ([`journal`]),
//! per-partition indexes ([`partition`]), the partition table ([`table`]), open-time recovery
//! ([`recovery`]), heads snapshots ([`heads`]), the manifest ([`container`]), compaction
//! ([`compaction`]) and what starts it (scattered segments, [`scatter`]; dead bytes per
//! segment, [`space`]), online backup ([`backup`]) and the file layer ([`vfs`]). [`FileStore`]
//! itself is split by job: its configuration ([`builder`]), opening ([`open`]), the read path
//! ([`read`]), what follows an append ([`commit`]), heads snapshot writing ([`snapshot`]) and
//! the [`Store`] contract ([`ops`]); this file keeps the shared types ([`FileStore`], `Inner`),
//! the file names and the manifest, and closing.
//! See `docs/DESIGN.md` for the format and the reasoning behind it.
//!
//! Lock order, outermost first: partition table -> a partition's `commit` -> journal reader pin
//! (`Journal::pin`, shared) -> journal append mutex -> a partition's `view`. A reader takes its
//! pin after loading and catching up (which take `commit`), never twice. The heads snapshot takes the journal append mutex and then the
//! partition table for reading; no path holds the table while appending, so the two never meet.
//! Once written, the snapshot takes the table for writing to fold its heads back ([`fold`]),
//! holding only its own lock. A backup takes compaction's lock, then the snapshot's lock, then
//! the append mutex only to read its point (as compaction and close take the first two).

mod backup;
mod builder;
mod chain;
mod commit;
mod compaction;
mod container;
mod damage;
mod durability;
#[cfg(any(test, feature = "fault-injection"))]
mod fault;
mod fold;
#[cfg(feature = "test-hooks")]
mod footprint;
mod format;
mod heads;
mod journal;
mod key_index;
mod open;
mod ops;
mod overlay;
mod partition;
mod pool;
mod read;
mod recovery;
mod scatter;
mod segments;
mod snapshot;
mod space;
mod table;
mod unload;
mod values;
mod verify;
mod vfs;
mod watch;
mod window;

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::path::Path;
use std::sync::Arc;

use crate::sync::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

pub use backup::BackupReport;
pub(crate) use backup::backup_unopened;
pub use builder::FileStoreBuilder;
pub use compaction::CompactionReport;
pub use damage::{RefusedPartition, StoreDamage};
#[cfg(feature = "fault-injection")]
pub use fault::skip::SkipSync;
#[cfg(feature = "fault-injection")]
pub use fault::{CrashPoint, FailMode, FaultFs};
#[cfg(feature = "test-hooks")]
pub use footprint::Footprint;
pub use journal::SyncPolicy;
pub use open::OpenReport;
pub use recovery::{DamagedRecord, TornTail};
pub(crate) use verify::{FileCheck, FileState, check_unopened};
// The file layer, public only to the crash and fault tests (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub use vfs::{OpenMode, OsFs, PathKind, Vfs, VfsFile, VfsLock};
#[cfg(not(feature = "fault-injection"))]
pub(crate) use vfs::{OsFs, PathKind, Vfs, VfsLock};

use self::journal::Journal;
use self::recovery::Damage;
use super::{
    Batch, Cursor, KeyRange, Op, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
    check_guards, check_key, check_limit,
};
use crate::clock::SystemClock;
use crate::error::{Error, Result};
use crate::spawn::Spawner;

const MANIFEST: &str = "MANIFEST";
const MANIFEST_MAGIC: &[u8; 8] = b"PCLSMANI";
const SNAPSHOT_MAGIC: &[u8; 8] = b"PCLSHEAD";
const LOCK_FILE: &str = "LOCK";
const JOURNAL_DIR: &str = "journal";

#[derive(Serialize, Deserialize, Default)]
struct Manifest {
    /// The newest heads snapshot, if any.
    snapshot: Option<String>,
    /// What the store refuses (also in the snapshot, so losing one file loses neither).
    damage: Damage,
}

/// The manifest as format version 1 wrote it.
#[derive(Deserialize)]
struct ManifestV1 {
    snapshot: Option<String>,
}

fn decode_manifest(env: &container::Envelope) -> Result<Manifest> {
    if env.version == 1 {
        let m: ManifestV1 = env.decode()?;
        return Ok(Manifest {
            snapshot: m.snapshot,
            damage: Damage::default(),
        });
    }
    env.decode()
}

struct SnapshotState {
    /// The file the manifest names.
    newest: Option<String>,
    /// Set by close after the final snapshot: nothing may write to the directory after it.
    finished: bool,
    /// The journal's appended-bytes counter at which the snapshot on disk was current, if it
    /// is: a close after a session that only read then writes nothing.
    current_at: Option<u64>,
    /// The damage the snapshot on disk records.
    damage_on_disk: Damage,
    /// Set once a page of the snapshot open read was found damaged: no snapshot can be
    /// written (it would have to copy that page), so the manifest names none and the next
    /// open rebuilds the heads from the journal.
    abandoned: bool,
}

struct Inner {
    config: FileStoreBuilder,
    journal: Arc<Journal>,
    table: RwLock<table::Table>,
    /// What the store refuses (SPEC S4); persisted with every snapshot. A leaf lock: nothing
    /// else is taken while it is held.
    damage: Mutex<Damage>,
    /// Whether unattributed damage stands, so partitions the store does not know are refused.
    refuses_unknown: AtomicBool,
    closed: AtomicBool,
    lock: Mutex<Option<Box<dyn VfsLock>>>,
    report: OpenReport,
    /// Serialises snapshot writers and remembers the newest snapshot's name.
    snapshot: Mutex<SnapshotState>,
    snapshot_running: AtomicBool,
    bytes_at_last_snapshot: AtomicU64,
    compaction_running: AtomicBool,
    compaction_lock: Mutex<()>,
    batches: AtomicU64,
    loaded: AtomicU64,
    compactions: AtomicU64,
    /// How scattered each segment sealed since open is (starts compaction by itself too).
    scatter: scatter::Scatter,
    /// What the store knows of its footprint, and which record formats it writes.
    space: space::Space,
    background: compaction::Background,
    /// Unloading idle indexes under `max_loaded_partitions` (SPEC S8).
    index_budget: unload::IndexBudget,
    /// Folding the heads each snapshot wrote out of the table's overlay (SPEC S8).
    folds: fold::Folds,
    /// Record bodies chain walks read lately, so the reads after a load take values from them.
    recent: values::RecentRecords,
    /// Scan pages' buffers kept for the next page, so a page is neither allocated nor
    /// zero-filled afresh (bounded: see [`pool`]).
    pages: pool::Pool<read::PageBuf>,
    /// Dropping the sender stops the periodic sync thread.
    syncer: Mutex<Option<crate::sync::channel::Sender<()>>>,
    /// This open handle's number (`Store::exclusive_handle`), drawn at open.
    handle: u64,
    /// Its health and the counters its stats add to the journal's (SPEC E8).
    watch: watch::Watch,
}

/// The file-backed store (SPEC S3-S8, S10). Cheap to clone; clones share the store.
///
/// ```
/// use portcullis::store::{Batch, FileStore, Partition, Store};
/// let dir = tempfile::tempdir().unwrap();
/// let p = Partition::new("sessions/1").unwrap();
/// {
///     let store = FileStore::open(dir.path()).unwrap();
///     let outcome = store.apply(&p, &Batch::new().put(b"k".to_vec(), b"v".to_vec())).unwrap();
///     assert!(outcome.is_committed());
///     store.close().unwrap();
/// }
/// let store = FileStore::open(dir.path()).unwrap();
/// assert_eq!(store.get(&p, b"k").unwrap(), Some(b"v".to_vec()));
/// assert_eq!(store.open_report().journal_bytes_scanned, 0); // a clean close left a snapshot
/// ```
#[derive(Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("dir", &self.inner.config.dir)
            .finish()
    }
}

impl FileStore {
    /// Opens the store in `dir` with the default configuration, creating it if needed.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// store.close()?;
    /// let store = FileStore::open(dir.path())?; // reopen: the batch is there
    /// assert_eq!(store.get(&p, b"alice")?, Some(b"10".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(dir: impl AsRef<Path>) -> Result<FileStore> {
        Self::builder(dir).open()
    }

    /// A configuration for the store in `dir`.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    /// use portcullis::SyncPolicy;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .sync_policy(SyncPolicy::PeriodicMayLoseRecent { interval_ms: 50 })
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(dir: impl AsRef<Path>) -> FileStoreBuilder {
        FileStoreBuilder {
            dir: dir.as_ref().to_path_buf(),
            vfs: Arc::new(OsFs),
            clock: Arc::new(SystemClock),
            spawner: Spawner::default(),
            sync_policy: SyncPolicy::default(),
            segment_bytes: 32 << 20,
            snapshot_every_bytes: 32 << 20,
            base_every_records: 64,
            auto_compact: true,
            max_open_segments: 128,
            max_loaded_partitions: None,
            events: Default::default(),
            events_inline: true,
            stall_threshold: watch::DEFAULT_STALL_THRESHOLD,
            #[cfg(feature = "fault-injection")]
            skip_syncs: Default::default(),
            #[cfg(feature = "fault-injection")]
            append_observer: None,
            #[cfg(feature = "fault-injection")]
            reader_pin: Default::default(),
            #[cfg(feature = "fault-injection")]
            skip_value_checks: false,
            #[cfg(feature = "fault-injection")]
            skip_scatter_trigger: false,
            #[cfg(feature = "fault-injection")]
            skip_reclaim_trigger: false,
            #[cfg(feature = "fault-injection")]
            version_2_records: false,
            #[cfg(feature = "fault-injection")]
            compaction_observer: None,
            #[cfg(feature = "fault-injection")]
            compaction_wait_observer: None,
            #[cfg(feature = "fault-injection")]
            backup_point_observer: None,
        }
    }

    /// What open read and how long it took.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// let report = store.open_report();
    /// assert!(report.created && report.refused.is_empty());
    /// println!("opened in {:?}, {} partitions", report.elapsed, report.partitions);
    /// # Ok(())
    /// # }
    /// ```
    pub fn open_report(&self) -> &OpenReport {
        &self.inner.report
    }

    /// The store's directory.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// assert_eq!(store.path(), dir.path());
    /// # Ok(())
    /// # }
    /// ```
    pub fn path(&self) -> &Path {
        &self.inner.config.dir
    }

    /// Writes and syncs everything committed so far, whatever the sync policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    /// use portcullis::SyncPolicy;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path()).sync_policy(SyncPolicy::NeverSyncMayLoseRecent).open()?;
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// store.flush()?; // durable now, whatever the sync policy
    /// # Ok(())
    /// # }
    /// ```
    pub fn flush(&self) -> Result<()> {
        self.inner.check_open()?;
        let _events = self.inner.deliver_after_call();
        self.inner.journal.sync_all().map(|_| ())
    }

    /// Writes a heads snapshot now, so that the next open scans nothing before this point.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// store.apply(&Partition::new("accounts")?, &Batch::new().put("alice", "10"))?;
    /// store.write_heads_snapshot()?;
    /// store.close()?;
    /// let store = FileStore::open(dir.path())?;
    /// assert_eq!(store.open_report().records_scanned, 0); // nothing after the snapshot
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_heads_snapshot(&self) -> Result<()> {
        self.inner.check_open()?;
        let _events = self.inner.deliver_after_call();
        self.inner.write_snapshot()
    }

    /// Reclaims space now: rewrites what is still live in every sealed segment and deletes
    /// those segments (SPEC S7). Safe to call while others read and write.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path())?;
    /// let p = Partition::new("accounts")?;
    /// for n in 0..100 {
    ///     store.apply(&p, &Batch::new().put("alice", n.to_string()))?; // 99 overwritten values
    /// }
    /// let report = store.compact()?;
    /// println!("{} segments removed, {} bytes copied", report.segments_removed, report.bytes_copied);
    /// assert_eq!(store.get(&p, b"alice")?, Some(b"99".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn compact(&self) -> Result<CompactionReport> {
        self.inner.check_open()?;
        let _events = self.inner.deliver_after_call();
        compaction::compact(&self.inner, compaction::Pick::All)
    }

    /// Test hook: background compaction runs started by themselves (garbage outweighing live
    /// data, or scattered segments) since open; one run may compact several times in a row.
    #[cfg(feature = "test-hooks")]
    pub fn background_compactions(&self) -> u64 {
        self.inner.background.started()
    }

    /// Waits until every compaction the store started by itself has finished, and those it
    /// started after them because more segments were due: once it returns, the store has
    /// settled, and compaction has nothing left to do until the next commit (SPEC S7, S13).
    /// A store reopened with segments due (a load its close cut short) starts compacting at
    /// open. A compaction that fails is logged and tried again after a later commit.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path()).segment_bytes(64 << 10).open()?;
    /// let p = Partition::new("accounts")?;
    /// for n in 0..2_000 {
    ///     store.apply(&p, &Batch::new().put("alice", vec![n as u8; 100]))?;
    /// }
    /// store.wait_for_background_compactions(); // the overwritten values were reclaimed
    /// assert!(store.stats().compactions >= 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_for_background_compactions(&self) {
        self.inner.background.wait_idle()
    }

    /// Test hook: where the journal's bytes go (SPEC S13). Loads every partition and reads
    /// every segment.
    #[cfg(feature = "test-hooks")]
    pub fn footprint(&self) -> Result<Footprint> {
        self.inner.check_open()?;
        self.inner.footprint()
    }
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Closes the store. After it returns nothing of this handle writes to the directory again,
    /// so another process may open it: a running compaction is waited for, the journal is
    /// sealed (commits racing the close fail with `Closed` or are in the final sync), a final
    /// snapshot is written, and only then is the directory lock released.
    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.syncer.lock().take();
        let _no_compaction = self.compaction_lock.lock();
        let mut snapshot = self.snapshot.lock();
        self.journal.seal();
        let result = match self.journal.failed() {
            Some(reason) => Err(Error::SyncFailed(reason)),
            None => self.write_snapshot_locked(&mut snapshot),
        };
        // Everything was synced before the trim: a failure leaves the tail at its preallocated
        // size, which the next open reads to its end. It is reported all the same.
        let result = result.and_then(|()| self.journal.trim_tail());
        snapshot.finished = true;
        self.lock.lock().take();
        log::info!("closed store {}", self.config.dir.display());
        result
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire)
            && let Err(e) = self.close()
        {
            log::warn!(
                "closing store {} on drop failed: {e}",
                self.config.dir.display()
            );
        }
    }
}
