//! The store's configuration: [`FileStoreBuilder`] and its setters, with their defaults
//! documented, and the test-only switches behind the `fault-injection` feature.
//!
//! May call: nothing but [`FileStore`]'s opening (see `open.rs`).

use std::path::PathBuf;
use std::sync::Arc;

#[cfg(feature = "fault-injection")]
use super::fault;
use super::{FileStore, SyncPolicy, Vfs};
#[cfg(feature = "fault-injection")]
use super::{Partition, SkipSync};
use crate::clock::SharedClock;
use crate::error::Result;
use crate::spawn::Spawner;

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
    pub(super) dir: PathBuf,
    pub(super) vfs: Arc<dyn Vfs>,
    pub(super) clock: SharedClock,
    pub(super) spawner: Spawner,
    pub(super) sync_policy: SyncPolicy,
    pub(super) segment_bytes: u64,
    pub(super) snapshot_every_bytes: u64,
    pub(super) base_every_records: u32,
    pub(super) auto_compact: bool,
    pub(super) max_open_segments: usize,
    pub(super) max_loaded_partitions: Option<usize>,
    /// Where the store's events go (SPEC E8; see `watch.rs`).
    pub(super) events: crate::observe::Events,
    /// Whether the store delivers its events on its callers' threads (opened on its own), or
    /// leaves that to the engine that opened it.
    pub(super) events_inline: bool,
    /// A sync or gather slower than this is a commit stall.
    pub(super) stall_threshold: std::time::Duration,
    #[cfg(feature = "fault-injection")]
    pub(super) skip_syncs: crate::sync::HashSet<SkipSync>,
    #[cfg(feature = "fault-injection")]
    pub(super) append_observer: Option<AppendObserver>,
    #[cfg(feature = "fault-injection")]
    pub(super) reader_pin: fault::skip::PinSwitch,
    #[cfg(feature = "fault-injection")]
    pub(super) skip_value_checks: bool,
    #[cfg(feature = "fault-injection")]
    pub(super) skip_scatter_trigger: bool,
    #[cfg(feature = "fault-injection")]
    pub(super) skip_reclaim_trigger: bool,
    #[cfg(feature = "fault-injection")]
    pub(super) version_2_records: bool,
    #[cfg(feature = "fault-injection")]
    pub(super) compaction_observer: Option<CompactionObserver>,
    /// Called by a compaction that finds another holding compaction's lock (tests only).
    #[cfg(feature = "fault-injection")]
    pub(super) compaction_wait_observer: Option<Hook>,
    /// Called by a backup once it has chosen its point (tests only).
    #[cfg(feature = "fault-injection")]
    pub(super) backup_point_observer: Option<Hook>,
}

/// A test-only call at a point of interest (see [`FileStoreBuilder::observe_backup_point`]).
#[cfg(feature = "fault-injection")]
#[derive(Clone)]
pub(super) struct Hook(pub(super) Arc<dyn Fn() + Send + Sync>);

#[cfg(feature = "fault-injection")]
impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

/// Called with the segments a compaction took as victims once it has read them (tests only;
/// see [`FileStoreBuilder::observe_compaction_victims`]).
#[cfg(feature = "fault-injection")]
#[derive(Clone)]
pub(super) struct CompactionObserver(pub(super) Arc<ObserveVictimsFn>);

#[cfg(feature = "fault-injection")]
pub(super) type ObserveVictimsFn = dyn Fn(&[u32]) + Send + Sync;

#[cfg(feature = "fault-injection")]
impl std::fmt::Debug for CompactionObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompactionObserver")
    }
}

/// Called with each batch's partition and journal sequence number once it is appended (tests
/// only; see [`FileStoreBuilder::observe_appends`]).
#[cfg(feature = "fault-injection")]
#[derive(Clone)]
pub(super) struct AppendObserver(pub(super) Arc<ObserveFn>);

#[cfg(feature = "fault-injection")]
pub(super) type ObserveFn = dyn Fn(&Partition, u64) + Send + Sync;

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

    /// Where background work starts (SPEC E9): heads snapshots and compaction as pool tasks,
    /// the periodic syncer as a thread (default: rayon's global pool and std threads).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::Spawner;
    /// use portcullis::store::FileStore;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a pool");
    /// let store = FileStore::builder(dir.path())
    ///     .spawner(Spawner::pool(std::sync::Arc::new(pool)))
    ///     .open()?;
    /// assert!(store.open_report().created);
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = spawner;
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

    /// Whether compaction starts by itself on the rayon pool, after a commit or at open, when
    /// sealed journal segments are a third dead, or scattered (histories appended in turns with
    /// other partitions', which it then lays out together) (default true).
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

    /// Keeps at most `partitions` partition indexes loaded when a call returns (SPEC S8): when
    /// a call, committed or not, leaves more loaded, the least recently touched idle ones (no
    /// reader, writer or compaction using them, no batch waiting to become durable) are
    /// dropped down to three quarters of the budget, keeping nothing of a partition with no
    /// record and only the name and newest record's location of one whose location is not in
    /// the newest heads snapshot; their next touch loads them again. Partitions in use are
    /// never dropped, so the count can exceed the budget while more are in use at once. Under
    /// a budget a heads snapshot also falls due once `max(partitions, 65,536)` such locations
    /// are held, and folds them back into its pages, so memory does not grow with the number
    /// of partitions written since open. Default: none (an index stays loaded until close).
    /// At least 1.
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
    /// scattered, only because segments are dead, so a test can show that histories appended in
    /// turns stay scattered without it (a negative control). Never use this outside a test.
    #[cfg(feature = "fault-injection")]
    pub fn skip_scatter_trigger(mut self) -> Self {
        self.skip_scatter_trigger = true;
        self
    }

    /// Test only (feature `fault-injection`): no segment is ever due because of its dead bytes
    /// (compaction starts only because of scatter), from the moment the store opens, before any
    /// background compaction open may start (a negative control). Never use this outside a test.
    #[cfg(feature = "fault-injection")]
    pub fn skip_reclaim_trigger(mut self) -> Self {
        self.skip_reclaim_trigger = true;
        self
    }

    /// Test only (feature `fault-injection`): bases and compaction's copies are written as
    /// format version 2 wrote them (whole keys), from the moment the store opens, so a
    /// compaction open starts writes them that way too (a negative control). Never use this
    /// outside a test.
    #[cfg(feature = "fault-injection")]
    pub fn write_version_2_records(mut self) -> Self {
        self.version_2_records = true;
        self
    }

    /// Test only (feature `fault-injection`): calls `observe` with the numbers of the segments
    /// a compaction took as victims, once it has read them to find their partitions and before
    /// it rewrites any (an empty list when it took none), so a test can hold other threads
    /// until compaction has chosen. Called on the compacting thread, under compaction's own
    /// lock only.
    #[cfg(feature = "fault-injection")]
    pub fn observe_compaction_victims(
        mut self,
        observe: impl Fn(&[u32]) + Send + Sync + 'static,
    ) -> Self {
        self.compaction_observer = Some(CompactionObserver(Arc::new(observe)));
        self
    }

    /// Test only (feature `fault-injection`): calls `observe` when a compaction finds
    /// compaction's lock held (by another compaction, a backup or close), before it waits for
    /// it, so a test knows the compaction is held back. Called on the compacting thread,
    /// under no lock of the store.
    #[cfg(feature = "fault-injection")]
    pub fn observe_compaction_waits(mut self, observe: impl Fn() + Send + Sync + 'static) -> Self {
        self.compaction_wait_observer = Some(Hook(Arc::new(observe)));
        self
    }

    /// Test only (feature `fault-injection`): calls `observe` when a backup
    /// ([`FileStore::backup`]) has chosen its point, synced the journal through it and copied
    /// the manifest and heads snapshot, before it links or copies any journal segment. Called
    /// on the backing-up thread, under compaction's lock (see `SkipSync::BackupCompactionLock`).
    #[cfg(feature = "fault-injection")]
    pub fn observe_backup_point(mut self, observe: impl Fn() + Send + Sync + 'static) -> Self {
        self.backup_point_observer = Some(Hook(Arc::new(observe)));
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
