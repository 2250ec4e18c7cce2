//! The file-backed store: one shared journal of segment files with a chain of records per
//! partition, group commit, lazy per-partition indexes, recovery and compaction.
//!
//! Owns: the on-disk format ([`format`]), the journal and its group commit ([`journal`]),
//! per-partition indexes ([`partition`]), the partition table ([`table`]), open-time recovery
//! ([`recovery`]), heads snapshots ([`heads`]), the manifest ([`container`]), compaction
//! ([`compaction`]) and the file layer ([`vfs`]).
//! See `docs/DESIGN.md` for the format and the reasoning behind it.
//!
//! Lock order, outermost first: partition table -> a partition's `commit` -> journal reader pin
//! (`Journal::pin`, shared) -> journal append mutex -> a partition's `view`. A reader takes its
//! pin after loading and catching up (which take `commit`), never twice. The heads snapshot takes the journal append mutex and then the
//! partition table for reading; no path holds the table while appending, so the two never meet.

mod chain;
mod compaction;
mod container;
mod damage;
mod durability;
#[cfg(any(test, feature = "fault-injection"))]
mod fault;
mod format;
mod heads;
mod journal;
mod overlay;
mod partition;
mod recovery;
mod scatter;
mod segments;
mod table;
mod unload;
mod values;
mod verify;
mod vfs;
mod window;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

pub use compaction::CompactionReport;
pub use damage::{RefusedPartition, StoreDamage};
#[cfg(feature = "fault-injection")]
pub use fault::skip::SkipSync;
#[cfg(feature = "fault-injection")]
pub use fault::{CrashPoint, FailMode, FaultFs};
pub use journal::SyncPolicy;
pub use recovery::{DamagedRecord, TornTail};
pub(crate) use verify::{FileCheck, FileState, check_unopened};
// The file layer, public only to the crash and fault tests (feature `fault-injection`).
#[cfg(feature = "fault-injection")]
pub use vfs::{OpenMode, OsFs, PathKind, Vfs, VfsFile, VfsLock};
#[cfg(not(feature = "fault-injection"))]
pub(crate) use vfs::{OsFs, PathKind, Vfs, VfsLock};

use self::format::{MAX_BODY_LEN, RecordKind, ValueLoc};
use self::journal::Journal;
use self::partition::{CommitState, IndexOp, Load, Lookup, PartState, Pending, PendingOp};
use self::recovery::Damage;
use super::{
    Batch, Cursor, KeyRange, Op, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
    check_guards, check_key, check_limit,
};
use crate::clock::{SharedClock, SystemClock};
use crate::error::{Error, Result};

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

/// What opening the store read, and how long it took (SPEC S5).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OpenReport {
    /// Wall time of the whole open.
    pub elapsed: Duration,
    /// Whether the directory held no store and one was created.
    pub created: bool,
    /// Bytes of heads snapshot read.
    pub snapshot_bytes: u64,
    /// Whether the store had to be rebuilt by scanning the whole journal (the snapshot or the
    /// manifest was missing or unreadable).
    pub rebuilt_by_full_scan: bool,
    /// Why it was rebuilt: which file was missing or damaged, and how.
    pub rebuild_reason: Option<String>,
    /// Bytes of journal scanned (only what was written after the snapshot).
    pub journal_bytes_scanned: u64,
    /// Records scanned in that journal.
    pub records_scanned: u64,
    /// Partitions known after open.
    pub partitions: u64,
    /// The torn tail that was truncated, if any.
    pub torn_tail: Option<TornTail>,
    /// Damaged records and ranges this open found in the journal it scanned (SPEC S4). Open
    /// does not read older, sealed segments: damage there is found, refused and recorded by
    /// the first load that needs it (see [`FileStore::damage`]).
    pub damaged: Vec<DamagedRecord>,
    /// Everything the store refuses after open: what this open found plus what earlier opens
    /// found and no operator has accepted (see [`FileStore::damage`]).
    pub refused: StoreDamage,
}

/// Configures and opens a [`FileStore`]. Every setter documents its default.
///
/// ```
/// use portcullis::store::{FileStore, SyncPolicy};
/// let dir = tempfile::tempdir().unwrap();
/// let store = FileStore::builder(dir.path())
///     .sync_policy(SyncPolicy::SyncEveryCommit)
///     .segment_bytes(8 << 20)
///     .open()
///     .unwrap();
/// assert!(store.open_report().created);
/// ```
#[derive(Clone, Debug)]
pub struct FileStoreBuilder {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    clock: SharedClock,
    sync_policy: SyncPolicy,
    segment_bytes: u64,
    snapshot_every_bytes: u64,
    base_every_records: u32,
    auto_compact: bool,
    max_open_segments: usize,
    max_loaded_partitions: Option<usize>,
    #[cfg(feature = "fault-injection")]
    skip_syncs: std::collections::HashSet<SkipSync>,
    #[cfg(feature = "fault-injection")]
    append_observer: Option<AppendObserver>,
    #[cfg(feature = "fault-injection")]
    reader_pin: fault::skip::PinSwitch,
    #[cfg(feature = "fault-injection")]
    skip_value_checks: bool,
    #[cfg(feature = "fault-injection")]
    skip_scatter_trigger: bool,
}

/// Called with each batch's partition and journal sequence number once it is appended (tests
/// only; see [`FileStoreBuilder::observe_appends`]).
#[cfg(feature = "fault-injection")]
#[derive(Clone)]
struct AppendObserver(Arc<ObserveFn>);

#[cfg(feature = "fault-injection")]
type ObserveFn = dyn Fn(&Partition, u64) + Send + Sync;

#[cfg(feature = "fault-injection")]
impl std::fmt::Debug for AppendObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AppendObserver")
    }
}

impl FileStoreBuilder {
    /// Test only (feature `fault-injection`): the file layer (default: the operating
    /// system's). Crash tests pass a fault-injecting one.
    #[cfg(feature = "fault-injection")]
    pub fn vfs(mut self, vfs: Arc<dyn Vfs>) -> Self {
        self.vfs = vfs;
        self
    }

    /// The file layer; the inspector passes one that never changes the directory.
    #[cfg(not(feature = "fault-injection"))]
    pub(crate) fn vfs(mut self, vfs: Arc<dyn Vfs>) -> Self {
        self.vfs = vfs;
        self
    }

    /// The clock `NotAfter` preconditions are checked against (default: the system clock).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let clock = std::sync::Arc::new(portcullis::ManualClock::new(1_000));
    /// let store = FileStore::builder(dir.path())
    ///     .clock(clock.clone())
    ///     .open()?;
    /// let p = Partition::new("accounts")?;
    /// let late = Batch::new().not_after(1_500).put("alice", "0");
    /// clock.advance(1_000); // 2,000 now
    /// assert!(!store.apply(&p, &late)?.is_committed());
    /// # Ok(())
    /// # }
    /// ```
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How commits reach stable storage (default: [`SyncPolicy::SyncEveryCommit`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .sync_policy(portcullis::SyncPolicy::SyncEveryCommit) // the default: lose nothing acknowledged
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sync_policy(mut self, policy: SyncPolicy) -> Self {
        self.sync_policy = policy;
        self
    }

    /// Size at which the journal moves to a new segment file (default 32 MiB, at least 4 KiB).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .segment_bytes(8 << 20) // 8 MiB segments
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes.max(4096);
        self
    }

    /// Journal bytes between heads snapshots; bounds what open must scan after a crash
    /// (default 32 MiB).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .snapshot_every_bytes(4 << 20) // open scans at most about 4 MiB after a crash
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn snapshot_every_bytes(mut self, bytes: u64) -> Self {
        self.snapshot_every_bytes = bytes.max(4096);
        self
    }

    /// Records in a partition's chain before a base record bounds the next load (default 64;
    /// larger partitions wait for one eighth of their key count).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .base_every_records(16)
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn base_every_records(mut self, records: u32) -> Self {
        self.base_every_records = records.max(2);
        self
    }

    /// Whether compaction starts by itself on the rayon pool when garbage outweighs live data,
    /// or when sealed journal segments are scattered (histories appended in turns with other
    /// partitions', which it then lays out together) (default true).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .auto_compact(false) // compact only when asked, with FileStore::compact
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn auto_compact(mut self, on: bool) -> Self {
        self.auto_compact = on;
        self
    }

    /// Journal segment files kept open at once (default 128, at least 4). Others are opened
    /// when read and closed again, so a journal of any number of segments needs a bounded
    /// number of file descriptors.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .max_open_segments(32)
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_open_segments(mut self, files: usize) -> Self {
        self.max_open_segments = files.max(4);
        self
    }

    /// Keeps at most about `partitions` partition indexes loaded (SPEC S8): when more are
    /// loaded, the least recently touched idle ones (no reader, writer or compaction using
    /// them, no batch waiting to become durable) are dropped down to three quarters of the
    /// budget, keeping only their name and newest record's location, as open does; their next
    /// touch loads them again. Partitions in use are never dropped, so the count can exceed the
    /// budget while more are in use at once. Default: none (an index stays loaded until
    /// close). At least 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = FileStore::builder(dir.path()).max_loaded_partitions(2).open()?;
    /// for i in 0..10 {
    ///     let p = Partition::new(format!("p{i}"))?;
    ///     store.apply(&p, &Batch::new().put(b"k".to_vec(), vec![i]))?;
    /// }
    /// assert!(store.stats().partitions_loaded <= 2);
    /// // A dropped index loads again on its next touch.
    /// assert_eq!(store.get(&Partition::new("p0")?, b"k")?, Some(vec![0]));
    /// # Ok::<(), portcullis::Error>(())
    /// ```
    pub fn max_loaded_partitions(mut self, partitions: usize) -> Self {
        self.max_loaded_partitions = Some(partitions.max(1));
        self
    }

    /// Test only (feature `fault-injection`): skips one kind of sync, so a crash test can show
    /// it would catch the sync's absence. Never use this outside a negative control.
    #[cfg(feature = "fault-injection")]
    pub fn skip_sync(mut self, skip: SkipSync) -> Self {
        self.skip_syncs.insert(skip);
        self
    }

    /// Test only (feature `fault-injection`): calls `observe` with each batch's partition and
    /// journal sequence number once it is appended, before it is durable, so a crash test knows
    /// the journal order of concurrent commits. Called on the committing thread, under no lock.
    #[cfg(feature = "fault-injection")]
    pub fn observe_appends(
        mut self,
        observe: impl Fn(&Partition, u64) + Send + Sync + 'static,
    ) -> Self {
        self.append_observer = Some(AppendObserver(Arc::new(observe)));
        self
    }

    /// Test only (feature `fault-injection`): turns off the reader pin, so compaction deletes
    /// segments that readers still hold locations into (a negative control). Never use this
    /// outside a test.
    #[cfg(feature = "fault-injection")]
    pub fn skip_reader_pin(mut self) -> Self {
        self.reader_pin.off = true;
        self
    }

    /// Test only (feature `fault-injection`): calls `observe` when compaction, about to delete
    /// segments, finds a reader pinned and waits for it; called on the compacting thread just
    /// before it waits.
    #[cfg(feature = "fault-injection")]
    pub fn observe_reader_waits(mut self, observe: impl Fn() + Send + Sync + 'static) -> Self {
        self.reader_pin.on_wait = Some(Arc::new(observe));
        self
    }

    /// Test only (feature `fault-injection`): values cut out of a merged read, or taken from
    /// the records a load has just read, skip their checksums, so a test can show that it
    /// catches a damaged value read that way (a negative control). Never use this outside a
    /// test.
    #[cfg(feature = "fault-injection")]
    pub fn skip_value_checks(mut self) -> Self {
        self.skip_value_checks = true;
        self
    }

    /// Test only (feature `fault-injection`): compaction never starts because the journal is
    /// scattered, only because of garbage, so a test can show that histories appended in
    /// turns stay scattered without it (a negative control). Never use this outside a test.
    #[cfg(feature = "fault-injection")]
    pub fn skip_scatter_trigger(mut self) -> Self {
        self.skip_scatter_trigger = true;
        self
    }

    /// Opens (creating if needed) the store.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .sync_policy(portcullis::SyncPolicy::SyncEveryCommit)
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(self) -> Result<FileStore> {
        FileStore::open_with(self)
    }
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
    /// Estimated bytes of journal no longer reachable from any index.
    garbage_bytes: AtomicU64,
    /// How scattered each segment sealed since open is (starts compaction by itself too).
    scatter: scatter::Scatter,
    background: compaction::Background,
    /// Unloading idle indexes under `max_loaded_partitions` (SPEC S8).
    index_budget: unload::IndexBudget,
    /// Record bodies chain walks read lately, so the reads after a load take values from them.
    recent: values::RecentRecords,
    /// Dropping the sender stops the periodic sync thread.
    syncer: Mutex<Option<crossbeam::channel::Sender<()>>>,
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
            sync_policy: SyncPolicy::default(),
            segment_bytes: 32 << 20,
            snapshot_every_bytes: 32 << 20,
            base_every_records: 64,
            auto_compact: true,
            max_open_segments: 128,
            max_loaded_partitions: None,
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
        }
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(unused_mut))]
    fn open_with(mut config: FileStoreBuilder) -> Result<FileStore> {
        let started = Instant::now();
        #[cfg(feature = "fault-injection")]
        {
            config.vfs =
                fault::skip::SkippingVfs::wrap(config.vfs.clone(), &config.dir, &config.skip_syncs);
        }
        let vfs = config.vfs.clone();
        let dir = config.dir.clone();
        let io = |what: &str, e| Error::io(format!("{what} {}", dir.display()), e);
        match vfs.kind(&dir).map_err(|e| io("inspecting", e))? {
            Some(PathKind::File) => {
                return Err(Error::invalid(format!(
                    "{} is a file; a store needs a directory",
                    dir.display()
                )));
            }
            Some(PathKind::Dir) => {}
            None => durability::create_dir_durably(&*vfs, &dir)?,
        }
        let lock = match vfs.try_lock(&dir.join(LOCK_FILE)) {
            Ok(lock) => lock,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Error::Locked {
                    path: dir.display().to_string(),
                });
            }
            Err(e) => return Err(io("locking", e)),
        };
        let journal_dir = dir.join(JOURNAL_DIR);
        if vfs.kind(&journal_dir).map_err(|e| io("inspecting", e))? != Some(PathKind::Dir) {
            durability::create_dir_durably(&*vfs, &journal_dir)?;
        }

        let mut report = OpenReport::default();
        let mut damage = Damage::default();
        let rebuild = |report: &mut OpenReport, why: String| {
            log::warn!("{why}; rebuilding by a full scan");
            report.rebuilt_by_full_scan = true;
            report.rebuild_reason.get_or_insert(why);
        };
        let manifest = match container::read(&*vfs, &dir, MANIFEST, MANIFEST_MAGIC)
            .and_then(|m| m.map(|env| decode_manifest(&env)).transpose())
        {
            Ok(m) => m,
            Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
            Err(e) => {
                // Keep the damaged file as evidence; a fresh manifest is written after the
                // rebuild. The damage it recorded is also in the newest snapshot.
                let aside = dir.join(format!("{MANIFEST}.damaged"));
                if let Err(e) = vfs.rename(&dir.join(MANIFEST), &aside) {
                    log::warn!("could not move the damaged manifest aside: {e}");
                }
                rebuild(&mut report, format!("the manifest is unusable ({e})"));
                damage.merge(damage::from_newest_snapshot(&*vfs, &dir));
                None
            }
        };
        let numbers = recovery::list_segments(&*vfs, &journal_dir)?;
        let created = manifest.is_none() && numbers.is_empty() && !report.rebuilt_by_full_scan;
        report.created = created;

        let mut snapshot_name = None;
        let mut start = None;
        let mut heads = HashMap::new();
        let mut base = None;
        // A snapshot of an older format is read whole and rewritten in the current one.
        let mut convert = false;
        // Garbage made after the snapshot (at most `snapshot_every_bytes` of journal, unless the
        // process crashed) and before a full-scan rebuild is not counted.
        let mut garbage = 0;
        if let Some(m) = &manifest {
            damage.merge(m.damage.clone());
        }
        match manifest.as_ref().and_then(|m| m.snapshot.clone()) {
            Some(name) => match heads::open(&*vfs, &dir, &name) {
                Ok(Some(snap)) => {
                    report.snapshot_bytes = snap.bytes;
                    let position = snap.position;
                    start = Some((position.segment, position.offset, position.next_lsn));
                    garbage = position.garbage_bytes;
                    match snap.heads {
                        heads::Heads::Paged(pages) => base = Some(Arc::new(pages)),
                        heads::Heads::Listed(listed) => {
                            log::info!("converting heads snapshot {name} to the paged format");
                            convert = true;
                            heads = listed
                                .into_iter()
                                .map(|(k, v)| (k.into_boxed_slice(), v))
                                .collect();
                        }
                    }
                    damage.merge(position.damage);
                    snapshot_name = Some(name);
                }
                Ok(None) => rebuild(&mut report, format!("heads snapshot {name} is missing")),
                Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
                Err(e) => rebuild(&mut report, format!("heads snapshot unusable ({e})")),
            },
            None if !numbers.is_empty() && !report.rebuilt_by_full_scan => rebuild(
                &mut report,
                "no manifest or snapshot beside the journal".to_owned(),
            ),
            None => {}
        }

        let files =
            segments::SegmentFiles::new(journal_dir.clone(), vfs.clone(), config.max_open_segments);
        // Only the segments the scan reads are opened here (from the snapshot's on; all of them
        // for a rebuild); older ones are checked on first use. Every read goes through the
        // bounded table, so no number of segments exhausts the file descriptors.
        #[allow(unused_mut)]
        let mut segments = recovery::open_segments_with(
            &*vfs,
            &journal_dir,
            &numbers,
            start.map_or(0, |(s, _, _)| s),
            // The handle that read the header joins the table: the scan reads through it.
            |number, file| {
                files.adopt(number, file);
                files.file(number)
            },
        )?;
        #[cfg(feature = "fault-injection")]
        if config.skip_syncs.contains(&SkipSync::ZeroEndCheck) {
            segments.zero_end_check = false;
        }
        let outcome = recovery::scan(
            &*vfs,
            &journal_dir,
            segments,
            start.map(|(s, o, _)| (s, o)),
            start.map(|(_, _, l)| l),
            recovery::Known {
                heads,
                pages: base.as_deref(),
            },
            &damage,
        )?;
        #[cfg(feature = "fault-injection")]
        let (skip_tail, trust_anything, any_tail) = (
            config.skip_syncs.contains(&SkipSync::ScannedTail),
            config.skip_syncs.contains(&SkipSync::FoundNothingCheck),
            config.skip_syncs.contains(&SkipSync::EmptyTailCheck),
        );
        #[cfg(not(feature = "fault-injection"))]
        let (skip_tail, trust_anything, any_tail) = (false, false, false);
        let scan_start = start.map(|(s, o, _)| (s, o));
        // After a clean close there is nothing to make durable: no write, no sync.
        if !(trust_anything || durability::found_nothing(&outcome, scan_start)) {
            durability::sync_what_open_found(
                &*vfs,
                &dir,
                &journal_dir,
                &outcome.tail,
                scan_start,
                skip_tail,
                durability::Needs::of(&outcome.tail, scan_start, any_tail),
            )?;
        }
        report.journal_bytes_scanned = outcome.bytes_scanned;
        report.records_scanned = outcome.records_scanned;
        report.torn_tail = outcome.torn_tail.clone();
        report.damaged = outcome.records.clone();
        let overlay = table::overlay_of(base.as_deref(), outcome.heads, convert);
        report.partitions = base.as_ref().map_or(0, |b| b.partitions())
            + overlay.values().filter(|k| !k.in_base).count() as u64;
        let found_damage = !outcome.damage.is_empty();
        let persisted = damage.clone();
        damage.merge(outcome.damage);
        report.refused = damage::describe(&damage);

        let journal = Journal::new(
            journal_dir,
            vfs.clone(),
            config.sync_policy,
            config.segment_bytes,
            outcome.tail,
            files,
        );
        #[cfg(feature = "fault-injection")]
        let journal = journal
            .with_pin_switch(config.reader_pin.clone())
            .with_sparse_steps(config.skip_syncs.contains(&SkipSync::ZeroFill));
        let journal = Arc::new(journal);
        let table = table::Table {
            base,
            overlay,
            touched: HashMap::new(),
        };
        let syncer = match config.sync_policy {
            SyncPolicy::PeriodicMayLoseRecent { interval_ms } => {
                Some(spawn_periodic_syncer(journal.clone(), interval_ms))
            }
            _ => None,
        };
        // New damage is persisted at once: the next open may not scan where it was found.
        let needs_snapshot =
            report.rebuilt_by_full_scan || manifest.is_none() || found_damage || convert;
        // The snapshot on disk describes the journal exactly when open found nothing after it.
        let snapshot_current = snapshot_name.is_some()
            && report.journal_bytes_scanned == 0
            && report.torn_tail.is_none()
            && report.damaged.is_empty();
        #[cfg(feature = "fault-injection")]
        let scatter_off = config.skip_scatter_trigger;
        #[cfg(not(feature = "fault-injection"))]
        let scatter_off = false;
        let scatter = scatter::Scatter::new(config.segment_bytes, scatter_off);
        let inner = Arc::new(Inner {
            config,
            journal,
            table: RwLock::new(table),
            refuses_unknown: AtomicBool::new(!damage.unattributed.is_empty()),
            damage: Mutex::new(damage),
            closed: AtomicBool::new(false),
            lock: Mutex::new(Some(lock)),
            report: OpenReport::default(),
            snapshot: Mutex::new(SnapshotState {
                newest: snapshot_name,
                finished: false,
                current_at: (snapshot_current && !convert).then_some(0),
                damage_on_disk: persisted,
                abandoned: false,
            }),
            snapshot_running: AtomicBool::new(false),
            bytes_at_last_snapshot: AtomicU64::new(0),
            compaction_running: AtomicBool::new(false),
            compaction_lock: Mutex::new(()),
            batches: AtomicU64::new(0),
            loaded: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            garbage_bytes: AtomicU64::new(garbage),
            scatter,
            background: compaction::Background::default(),
            index_budget: unload::IndexBudget::default(),
            recent: values::RecentRecords::default(),
            syncer: Mutex::new(syncer),
        });
        if needs_snapshot {
            // A new store gets its manifest at once; a rebuilt one gets a snapshot, so the
            // next open is fast again.
            inner.write_snapshot()?;
        }
        report.elapsed = started.elapsed();
        log::info!(
            "opened store {}: {} partitions, {} snapshot bytes, {} journal bytes scanned in {:?}",
            inner.config.dir.display(),
            report.partitions,
            report.snapshot_bytes,
            report.journal_bytes_scanned,
            report.elapsed
        );
        let mut inner = inner;
        Arc::get_mut(&mut inner)
            .expect("no other handle exists yet")
            .report = report;
        Ok(FileStore { inner })
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
        compaction::compact(&self.inner, compaction::Pick::All)
    }

    /// Test hook: background compaction runs started by themselves (garbage outweighing live
    /// data, or scattered segments) since open; one run may compact several times in a row.
    #[cfg(feature = "test-hooks")]
    pub fn background_compactions(&self) -> u64 {
        self.inner.background.started()
    }

    /// Test hook: waits until every compaction started by itself so far has finished.
    #[cfg(feature = "test-hooks")]
    pub fn wait_for_background_compactions(&self) {
        self.inner.background.wait_idle()
    }
}

fn spawn_periodic_syncer(
    journal: Arc<Journal>,
    interval_ms: u64,
) -> crossbeam::channel::Sender<()> {
    let (stop, stopped) = crossbeam::channel::bounded::<()>(0);
    let interval = Duration::from_millis(interval_ms.max(1));
    std::thread::Builder::new()
        .name("portcullis-sync".into())
        .spawn(move || {
            // Runs until the store drops its sender.
            while let Err(crossbeam::channel::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(interval)
            {
                if let Err(e) = journal.sync_all() {
                    log::warn!("periodic sync failed: {e}");
                    return;
                }
            }
        })
        .expect("spawning the periodic sync thread");
    stop
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    fn ensure_loaded(&self, state: &PartState) -> Result<()> {
        if state.view.read().loaded {
            return Ok(());
        }
        let mut commit = state.commit.lock();
        self.load_locked(state, &mut commit)
    }

    /// Makes reads linearizable: a read waits for the batches of this partition that were
    /// committed before it began (appended, and so already decided) to become durable, then
    /// sees them. Readers never see a batch that a crash could still take away, and a reader
    /// that lost a compare-and-set sees the batch that beat it on its next read.
    fn catch_up(&self, state: &PartState) {
        let appended = state.appended_lsn.load(Ordering::Acquire);
        if appended <= state.folded_lsn.load(Ordering::Acquire) {
            return;
        }
        // If the sync fails the batch never becomes visible; the durable view is still right.
        if self.journal.wait_durable(appended).is_ok() {
            self.fold(state, &mut state.commit.lock());
        }
    }

    /// Builds the partition's index on first access (SPEC S5, S8).
    fn load_locked(&self, state: &PartState, commit: &mut CommitState) -> Result<()> {
        match &commit.load {
            Load::Loaded => return Ok(()),
            Load::Corrupt(detail) => return Err(state.corrupt_error(detail)),
            Load::NotLoaded => {}
        }
        if let Some(detail) = self.refusal(state.hash) {
            log::warn!("partition {} refused: {detail}", state.name);
            commit.load = Load::Corrupt(detail.clone());
            return Err(state.corrupt_error(&detail));
        }
        let loaded = chain::load_index(
            &self.journal,
            &self.recent,
            state,
            partition::head_of(state),
        )
        .and_then(|(index, chain_len)| {
            // Every segment a value lives in must be there with an intact header: open
            // checked only the ones it scanned, so a damaged one is found here, and refuses
            // the partition like a damaged chain (SPEC S4).
            self.check_value_segments(&index)?;
            Ok((index, chain_len))
        });
        match loaded {
            Ok((index, chain_len)) => {
                let mut view = state.view.write();
                view.index = index;
                view.loaded = true;
                commit.chain_len = chain_len;
                commit.load = Load::Loaded;
                state.warm.store(true, Ordering::Relaxed);
                self.loaded.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "loaded partition {} ({} keys, chain {})",
                    state.name,
                    view.index.len(),
                    chain_len
                );
                Ok(())
            }
            Err(Error::Corrupt { what, detail }) => {
                log::warn!("partition {} refused: {what}: {detail}", state.name);
                let detail = format!("{what}: {detail}");
                // Remembered across snapshots and reopens until an operator accepts it.
                self.damage
                    .lock()
                    .refuse(state.hash, Some(state.name.as_bytes()), detail.clone());
                commit.load = Load::Corrupt(detail.clone());
                Err(state.corrupt_error(&detail))
            }
            Err(other) => Err(other),
        }
    }

    /// Checks the header of every segment `index` has a value in (each one once per open:
    /// see [`Journal::segment`]).
    fn check_value_segments(&self, index: &partition::Index) -> Result<()> {
        #[cfg(feature = "fault-injection")]
        if self
            .config
            .skip_syncs
            .contains(&SkipSync::ValueSegmentCheck)
        {
            return Ok(());
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in index.values() {
            let segment = self::format::loc_segment(v.at);
            if seen.insert(segment) {
                self.journal.segment(segment)?;
            }
        }
        Ok(())
    }

    /// A partition ready for reading: loaded, with the batches already decided for it durable
    /// and visible (see [`Inner::catch_up`]). `None` if it has never been written.
    fn readable(&self, p: &Partition) -> Result<Option<Arc<PartState>>> {
        let Some(state) = self.part(p, false)? else {
            self.check_absent(p)?;
            return Ok(None);
        };
        self.ensure_loaded(&state)?;
        self.catch_up(&state);
        // Over budget: drop idle indexes (this one is held, so it stays).
        self.unload_idle();
        Ok(Some(state))
    }

    /// The newest committed value of `key`, pending batches included: what a precondition
    /// checked now would see. The caller holds the partition's `commit` lock.
    fn latest_value(
        &self,
        state: &PartState,
        commit: &CommitState,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let _pin = self.journal.pin();
        self.latest_value_in(state, commit, &state.view.read(), key)
    }

    fn latest_value_in(
        &self,
        state: &PartState,
        commit: &CommitState,
        view: &partition::View,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        match commit.lookup(view, key) {
            Lookup::Pending(value) => Ok(value),
            Lookup::Durable(None) => Ok(None),
            Lookup::Durable(Some(v)) => self.read_value(state, &v).map(Some),
        }
    }

    fn read_value(&self, state: &PartState, v: &ValueLoc) -> Result<Vec<u8>> {
        if state.warm.load(Ordering::Relaxed) {
            if let Some(value) = self.recent.value(v, self.value_checks()) {
                return Ok(value);
            }
            state.warm.store(false, Ordering::Relaxed);
        }
        self.journal.read_value(v, &state.name)
    }

    /// Reads many values with as few reads as possible (see [`values`]); answers in order.
    fn read_values(&self, state: &PartState, locs: &[ValueLoc]) -> Result<Vec<Vec<u8>>> {
        let check = self.value_checks();
        let recent = state.warm.load(Ordering::Relaxed).then_some(&self.recent);
        let (values, from_recent) =
            values::read_many(&self.journal, recent, locs, &state.name, check)?;
        if recent.is_some() && from_recent == 0 && !locs.is_empty() {
            state.warm.store(false, Ordering::Relaxed);
        }
        Ok(values)
    }

    /// Whether values read through a merged read or the recent records are checked (always,
    /// unless a test turned it off).
    fn value_checks(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        if self.config.skip_value_checks {
            return false;
        }
        true
    }

    /// Moves batches that are now visible from `pending` into the readers' index, in order.
    fn fold(&self, state: &PartState, commit: &mut CommitState) {
        let visible = self.journal.visible_lsn();
        if commit.pending.front().is_none_or(|p| p.lsn > visible) {
            return;
        }
        let mut view = state.view.write();
        while commit.pending.front().is_some_and(|p| p.lsn <= visible) {
            let pending = commit.pending.pop_front().expect("checked above");
            state.folded_lsn.store(pending.lsn, Ordering::Release);
            let freed = partition::apply_to_index(
                &mut view.index,
                pending.ops.into_iter().map(IndexOp::from),
            );
            self.garbage_bytes.fetch_add(freed, Ordering::Relaxed);
        }
    }

    /// Writes a base record once the chain since the last one is long enough, so the next
    /// load walks a bounded chain. Not waited on: it only shortens future loads. Batches still
    /// in flight are folded into the base (it follows them in the journal, so a crash that
    /// keeps the base keeps them too); a hot partition thus gets bases even under constant load.
    fn maybe_write_base(&self, state: &PartState, commit: &mut CommitState) -> Result<()> {
        let view = state.view.read();
        let due = self
            .config
            .base_every_records
            .max((view.index.len() / 8) as u32);
        if commit.chain_len < due {
            return Ok(());
        }
        if commit.pending.is_empty() {
            return self.write_base(state, commit, &view.index);
        }
        let mut index = view.index.clone();
        drop(view);
        for pending in &commit.pending {
            let ops = pending.ops.iter().map(|op| match op {
                PendingOp::Put(k, v, _) => IndexOp::Put(k.clone(), *v),
                PendingOp::Delete(k) => IndexOp::Delete(k.clone().into_boxed_slice()),
                PendingOp::DeleteRange(r) => IndexOp::DeleteRange(r.clone()),
            });
            partition::apply_to_index(&mut index, ops);
        }
        self.write_base(state, commit, &index)
    }

    fn write_base(
        &self,
        state: &PartState,
        commit: &mut CommitState,
        index: &partition::Index,
    ) -> Result<()> {
        chain::write_base(&self.journal, state, commit, index)
    }

    /// Writes a heads snapshot at the current journal position, then points the manifest at it.
    fn write_snapshot(&self) -> Result<()> {
        let mut state = self.snapshot.lock();
        if state.finished {
            return Ok(());
        }
        self.write_snapshot_locked(&mut state)
    }

    fn write_snapshot_locked(&self, state: &mut SnapshotState) -> Result<()> {
        let base = self.table.read().base.clone();
        if base.as_ref().is_some_and(|b| b.any_damaged()) {
            return self.abandon_snapshot(state);
        }
        let bytes_before = self.journal.counters.bytes_appended.load(Ordering::Relaxed);
        let damage = self.damage.lock().clone();
        if state.current_at == Some(bytes_before) && damage == state.damage_on_disk {
            // Nothing was appended since the snapshot on disk: it is still exact.
            return Ok(());
        }
        // The heads that differ from the pages open read, at one journal position; the pages
        // never change, so they are merged in after the pause.
        let (segment, offset, next_lsn, (changed, garbage_bytes)) =
            self.journal.with_appends_paused(|| {
                let changed = self.table.read().changed();
                (changed, self.garbage_bytes.load(Ordering::Relaxed))
            });
        // Every head must point at a durable record before the snapshot names it.
        self.journal.sync_all()?;
        let position = heads::Position {
            segment,
            offset,
            next_lsn,
            damage: damage.clone(),
            garbage_bytes,
        };
        let name = format!("heads-{next_lsn:020}.snap");
        let vfs = &*self.config.vfs;
        let dir = &self.config.dir;
        let partitions = match heads::write(vfs, dir, &name, &position, base.as_deref(), &changed) {
            Err(Error::Corrupt { .. }) if base.as_ref().is_some_and(|b| b.any_damaged()) => {
                return self.abandon_snapshot(state);
            }
            other => other?,
        };
        container::write_atomic(
            vfs,
            dir,
            MANIFEST,
            MANIFEST_MAGIC,
            &Manifest {
                snapshot: Some(name.clone()),
                damage: damage.clone(),
            },
        )?;
        // Lookups still read the pages of the file open read, through the handle open keeps,
        // which a removed file's name does not affect.
        if let Some(old) = state.newest.replace(name.clone())
            && old != name
        {
            // The manifest no longer names it; a failure here only leaves a stray file.
            if let Err(e) = vfs.remove(&dir.join(&old)) {
                log::warn!("could not remove old heads snapshot {old}: {e}");
            }
        }
        self.bytes_at_last_snapshot
            .store(bytes_before, Ordering::Relaxed);
        state.current_at = Some(bytes_before);
        state.damage_on_disk = damage;
        log::debug!("wrote heads snapshot {name} ({partitions} partitions)");
        Ok(())
    }

    /// A page of the snapshot open read is damaged: the journal is synced and the manifest
    /// names no snapshot (keeping the damaged file as evidence), so the next open rebuilds
    /// every head from the journal (SPEC S4) instead of losing the page's partitions.
    fn abandon_snapshot(&self, state: &mut SnapshotState) -> Result<()> {
        let appended = self.journal.counters.bytes_appended.load(Ordering::Relaxed);
        self.journal.sync_all()?;
        // Commits do not ask again until another interval of journal is written.
        self.bytes_at_last_snapshot
            .store(appended, Ordering::Relaxed);
        let damage = self.damage.lock().clone();
        if state.abandoned && damage == state.damage_on_disk {
            return Ok(());
        }
        let vfs = &*self.config.vfs;
        container::write_atomic(
            vfs,
            &self.config.dir,
            MANIFEST,
            MANIFEST_MAGIC,
            &Manifest {
                snapshot: None,
                damage: damage.clone(),
            },
        )?;
        if !state.abandoned {
            log::warn!(
                "a page of the heads snapshot is damaged; the manifest names no snapshot now, so the next open rebuilds the heads from the journal"
            );
        }
        state.abandoned = true;
        state.newest = None;
        state.current_at = None;
        state.damage_on_disk = damage;
        Ok(())
    }

    /// Starts what is due in the background after a commit whose record went to `segment`
    /// (every segment below it is sealed).
    fn after_commit(self: &Arc<Self>, segment: u32) {
        let appended = self.journal.counters.bytes_appended.load(Ordering::Relaxed);
        let since = appended.saturating_sub(self.bytes_at_last_snapshot.load(Ordering::Relaxed));
        if since >= self.config.snapshot_every_bytes
            && !self.snapshot_running.swap(true, Ordering::AcqRel)
        {
            let inner = self.clone();
            rayon::spawn(move || {
                if let Err(e) = inner.write_snapshot() {
                    log::warn!("background heads snapshot failed: {e}");
                }
                inner.snapshot_running.store(false, Ordering::Release);
            });
        }
        if self.config.auto_compact
            && !self.compaction_running.load(Ordering::Acquire)
            && (self.scatter.maybe_due(segment) || compaction::worth_compacting(self))
        {
            compaction::spawn(self);
        }
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

impl Store for FileStore {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let inner = &self.inner;
        inner.check_open()?;
        check_key(key)?;
        let Some(state) = inner.readable(p)? else {
            return Ok(None);
        };
        // Pinned from taking the location until the value is read (see `Journal::pin`).
        let _pin = inner.journal.pin();
        let found = state.view.read().index.get(key).copied();
        found.map(|v| inner.read_value(&state, &v)).transpose()
    }

    fn get_for_update(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let inner = &self.inner;
        inner.check_open()?;
        check_key(key)?;
        let Some(state) = inner.part(p, false)? else {
            inner.check_absent(p)?;
            return Ok(None);
        };
        let mut commit = state.commit.lock();
        inner.load_locked(&state, &mut commit)?;
        // The same answer a batch's precondition would get.
        inner.latest_value(&state, &commit, key)
    }

    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let inner = &self.inner;
        inner.check_open()?;
        for key in keys {
            check_key(key)?;
        }
        let Some(state) = inner.readable(p)? else {
            return Ok(vec![None; keys.len()]);
        };
        // Locations are taken under one lock, so the answers are one consistent view; values
        // at a location never change.
        let _pin = inner.journal.pin();
        let locs: Vec<Option<ValueLoc>> = {
            let view = state.view.read();
            keys.iter().map(|k| view.index.get(*k).copied()).collect()
        };
        let mut values = inner
            .read_values(&state, &locs.iter().flatten().copied().collect::<Vec<_>>())?
            .into_iter();
        Ok(locs.iter().map(|v| v.and_then(|_| values.next())).collect())
    }

    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        let inner = &self.inner;
        inner.check_open()?;
        check_limit(limit)?;
        let range = match cursor {
            Some(c) => range.after(&c.0),
            None => range.clone(),
        };
        let Some(state) = inner.readable(p)? else {
            return Ok(ScanPage::default());
        };
        if range.is_empty() {
            return Ok(ScanPage::default());
        }
        let _pin = inner.journal.pin();
        let (found, more) = {
            let view = state.view.read();
            let mut iter = view.index.range::<[u8], _>(range.as_bounds());
            let found: Vec<(Vec<u8>, ValueLoc)> = iter
                .by_ref()
                .take(limit)
                .map(|(k, v)| (k.to_vec(), *v))
                .collect();
            (found, iter.next().is_some())
        };
        let locs: Vec<ValueLoc> = found.iter().map(|(_, v)| *v).collect();
        let values = inner.read_values(&state, &locs)?;
        let entries: Vec<(Vec<u8>, Vec<u8>)> =
            found.into_iter().map(|(k, _)| k).zip(values).collect();
        let next = match (more, entries.last()) {
            (true, Some((last, _))) => Some(Cursor(last.clone())),
            _ => None,
        };
        Ok(ScanPage { entries, next })
    }

    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        let inner = &self.inner;
        inner.check_open()?;
        batch.validate_within(&self.limits())?;
        // The contract counts keys and values; the journal record also frames every operation
        // (a `DeleteRange` included). A record over the frame limit would be acknowledged and
        // then refused by every later read of the journal, so it is refused here (SPEC S11).
        let record_len = format::batch_body_len(p.as_bytes(), batch.ops());
        if record_len > MAX_BODY_LEN {
            return Err(Error::TooLarge {
                what: "journal record of the batch (keys, values and framing of every operation)",
                size: record_len,
                limit: MAX_BODY_LEN,
            });
        }
        if let Some(reason) = inner.journal.failed() {
            return Err(Error::SyncFailed(reason));
        }
        if inner.refuses_unknown.load(Ordering::Acquire) && inner.part(p, false)?.is_none() {
            inner.check_absent(p)?;
        }
        let state = inner.part(p, true)?.expect("created on demand");
        let mut intent = inner.journal.announce();
        let (lsn, segment) = {
            let mut commit = state.commit.lock();
            inner.load_locked(&state, &mut commit)?;
            let refused = {
                let _pin = inner.journal.pin();
                let view = state.view.read();
                check_guards(
                    batch.guards(),
                    || inner.config.clock.now_ms(),
                    |key| inner.latest_value_in(&state, &commit, &view, key),
                )?
            };
            if let Some(outcome) = refused {
                return Ok(outcome);
            }
            if batch.ops().is_empty() {
                return Ok(Outcome::Committed);
            }
            let (body, value_offsets) =
                format::encode_batch_body(p.as_bytes(), partition::head_of(&state), batch.ops());
            let (lsn, at) = intent.append(RecordKind::Batch, state.hash, &body, |lsn, at| {
                state.place_head(lsn, at)
            })?;
            let record_len = (format::FRAME_LEN + body.len()) as u64;
            let prev_end = state.last_end.swap(at + record_len, Ordering::Relaxed);
            inner.scatter.note_commit(prev_end, at, record_len);
            let body_at = at + format::FRAME_LEN as u64;
            let mut offsets = value_offsets.into_iter();
            let ops = batch
                .ops()
                .iter()
                .map(|op| match op {
                    Op::Put(k, v) => {
                        let offset = offsets.next().expect("one offset per put");
                        let loc = ValueLoc {
                            at: body_at + offset as u64,
                            len: v.len() as u32,
                            crc: crc32c::crc32c(v),
                        };
                        PendingOp::Put(k.clone().into_boxed_slice(), loc, v.clone())
                    }
                    Op::Delete(k) => PendingOp::Delete(k.clone()),
                    Op::DeleteRange(r) => PendingOp::DeleteRange(r.clone()),
                })
                .collect();
            commit.pending.push_back(Pending { lsn, ops });
            state.appended_lsn.store(lsn, Ordering::Release);
            commit.chain_len += 1;
            (lsn, format::loc_segment(at))
        };
        #[cfg(feature = "fault-injection")]
        if let Some(observe) = &inner.config.append_observer {
            (observe.0)(p, lsn);
        }
        // Wait outside the partition's lock, so its next writer can queue behind us and share
        // our sync (SPEC S3).
        let durable = inner.journal.wait_durable(lsn);
        {
            let mut commit = state.commit.lock();
            inner.fold(&state, &mut commit);
            if durable.is_ok() {
                // A base only shortens future loads; failing to write one (say, the store is
                // closing) must not turn a committed batch into an error.
                if let Err(e) = inner.maybe_write_base(&state, &mut commit) {
                    log::debug!("skipped a base record for {}: {e}", state.name);
                }
            }
        }
        durable?;
        inner.batches.fetch_add(1, Ordering::Relaxed);
        inner.after_commit(segment);
        inner.unload_idle();
        Ok(Outcome::Committed)
    }

    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        self.inner.check_open()?;
        // A partition exists once a batch of it has been written; a refused first batch
        // leaves no trace.
        self.inner.list_partitions(prefix)
    }

    fn contains_partition(&self, p: &Partition) -> Result<bool> {
        self.inner.check_open()?;
        self.inner.contains(p)
    }

    fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// SPEC S1's limits, with no limit on the number of operations (SPEC S11).
    fn limits(&self) -> StoreLimits {
        StoreLimits::DEFAULT
    }

    /// `NotAfter` is checked against the store's clock inside the commit step (SPEC S2).
    fn evaluates_deadlines(&self) -> bool {
        true
    }

    fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        StoreStats {
            batches: inner.batches.load(Ordering::Relaxed),
            syncs: inner.journal.counters.syncs.load(Ordering::Relaxed),
            bytes_written: inner
                .journal
                .counters
                .bytes_appended
                .load(Ordering::Relaxed),
            partitions: inner.table.read().partitions(),
            partitions_loaded: inner.loaded.load(Ordering::Relaxed),
            segments: inner.journal.live_segments().len() as u64,
            compactions: inner.compactions.load(Ordering::Relaxed),
            garbage_bytes: inner.garbage_bytes.load(Ordering::Relaxed),
            indexes_dropped: inner.index_budget.unloaded.load(Ordering::Relaxed),
        }
    }

    fn close(&self) -> Result<()> {
        self.inner.close()
    }
}
