//! The engine's builder-style configuration (SPEC E2): the [`EngineBuilder`] itself, its
//! defaults, and the setters that choose the store (directory, given store, the default file
//! store's options) and whom the engine serves as (clock, owner id, namespaces adopted at open).
//! Every setter documents its default.
//!
//! Owns the builder's fields. Its bounds and switches are in `limits.rs`, the checks and the
//! opening in `open.rs`. Calls nothing: the file store's options are kept as closures and
//! applied when the engine opens the store.

use std::path::PathBuf;
use std::sync::Arc;

#[cfg(doc)]
use super::Engine;
use super::owner::Mode;
use crate::clock::SharedClock;
use crate::entity::Namespace;
use crate::fence::FenceConfig;
use crate::restore::{Metrics, StateMachine};
use crate::spawn::Spawner;
use crate::store::{FileStoreBuilder, Store, SyncPolicy};

/// Configures and opens an [`Engine`].
///
/// ```
/// use std::sync::Arc;
/// use portcullis::engine::Engine;
/// use portcullis::restore::{ApplyContext, Rejection, StateMachine};
/// use portcullis::store::MemoryStore;
/// use portcullis::EntityId;
///
/// struct Count;
/// impl StateMachine for Count {
///     type State = u64;
///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
///     fn apply(&self, s: &mut u64, _: &ApplyContext<'_>, _: &[u8]) -> Result<(), Rejection> {
///         *s += 1;
///         Ok(())
///     }
///     fn encode_checkpoint(&self, s: &u64) -> Result<Vec<u8>, Rejection> { Ok(s.to_le_bytes().to_vec()) }
///     fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<u64, Rejection> {
///         b.try_into().map(u64::from_le_bytes).map_err(|_| Rejection::new("bad checkpoint"))
///     }
/// }
///
/// let engine = Engine::builder(Count)
///     .store(Arc::new(MemoryStore::new()))
///     .warm_parallelism(2)
///     .open()
///     .unwrap();
/// let room = EntityId::new("chat", "room-1").unwrap();
/// engine.register(&room).unwrap();
/// engine.append(&room, vec![b"hi".to_vec()]).unwrap();
/// assert_eq!(engine.read(&room, |n| *n).unwrap(), 1);
/// engine.close().unwrap();
/// ```
pub struct EngineBuilder<M: StateMachine> {
    pub(crate) machine: M,
    pub(crate) store: Option<Arc<dyn Store>>,
    pub(crate) directory: Option<PathBuf>,
    pub(crate) clock: Option<SharedClock>,
    pub(crate) owner: String,
    pub(crate) adopt_on_first_use: bool,
    pub(crate) own: Vec<(Namespace, Mode)>,
    pub(crate) pool_threads: usize,
    pub(crate) spawner: Option<Spawner>,
    pub(crate) pool_stack_size: Option<usize>,
    pub(crate) close_timeout: std::time::Duration,
    pub(crate) warm_parallelism: usize,
    pub(crate) checkpoint_tail_bound: u64,
    pub(crate) truncate_after_checkpoint: bool,
    pub(crate) warm_on_open: bool,
    pub(crate) background_warm: bool,
    pub(crate) metrics: Option<Arc<dyn Metrics>>,
    pub(crate) fence: FenceConfig,
    pub(crate) register_on_first_write: bool,
    pub(crate) checkpoint_every: Option<u64>,
    pub(crate) max_resident_entities: Option<usize>,
    pub(crate) file_store: Vec<FileStoreOption>,
    pub(crate) sweep_expired_leases: bool,
    pub(crate) sweep_interval: std::time::Duration,
    pub(crate) owner_lease: std::time::Duration,
    pub(crate) renew_owner_lease: bool,
    pub(crate) switches: super::switches::OwnerSwitches,
    /// The listener (SPEC E8), and whether it is the lock rule's negative control.
    pub(crate) listener: Option<(Arc<dyn crate::observe::Listener>, bool)>,
}

/// The default time between passes of the engine's expired-lease sweeper (see
/// [`EngineBuilder::sweep_interval`]).
pub const DEFAULT_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// One change to the default file store's configuration, applied when the engine opens it.
pub(crate) type FileStoreOption = Box<dyn FnOnce(FileStoreBuilder) -> FileStoreBuilder + Send>;

impl<M: StateMachine> std::fmt::Debug for EngineBuilder<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("store", &self.store.as_ref().map(|_| "given"))
            .field("directory", &self.directory)
            .field("pool_threads", &self.pool_threads)
            .field("pool_stack_size", &self.pool_stack_size)
            .field("close_timeout", &self.close_timeout)
            .field("warm_parallelism", &self.warm_parallelism)
            .field("checkpoint_tail_bound", &self.checkpoint_tail_bound)
            .field("checkpoint_every", &self.checkpoint_every)
            .field("max_resident_entities", &self.max_resident_entities)
            .field("truncate_after_checkpoint", &self.truncate_after_checkpoint)
            .field("register_on_first_write", &self.register_on_first_write)
            .field("warm_on_open", &self.warm_on_open)
            .field("background_warm", &self.background_warm)
            .field("file_store_options", &self.file_store.len())
            .field("fence", &self.fence)
            .field("sweep_expired_leases", &self.sweep_expired_leases)
            .field("sweep_interval", &self.sweep_interval)
            .field("owner_lease", &self.owner_lease)
            .field("renew_owner_lease", &self.renew_owner_lease)
            .field("listener", &self.listener.is_some())
            .finish_non_exhaustive()
    }
}

impl<M: StateMachine> EngineBuilder<M> {
    pub(crate) fn new(machine: M) -> Self {
        EngineBuilder {
            machine,
            store: None,
            directory: None,
            clock: None,
            owner: super::incarnation::DEFAULT_OWNER.to_string(),
            adopt_on_first_use: true,
            own: Vec::new(),
            pool_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            spawner: None,
            pool_stack_size: None,
            close_timeout: std::time::Duration::from_secs(30),
            warm_parallelism: 4,
            checkpoint_tail_bound: 10_000,
            truncate_after_checkpoint: false,
            warm_on_open: false,
            background_warm: true,
            metrics: None,
            fence: FenceConfig::default(),
            register_on_first_write: false,
            checkpoint_every: None,
            max_resident_entities: None,
            file_store: Vec::new(),
            sweep_expired_leases: true,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            owner_lease: super::liveness::DEFAULT_OWNER_LEASE,
            renew_owner_lease: true,
            switches: Default::default(),
            listener: None,
        }
    }

    /// Opens the default, file-backed store in `dir` (created if missing). Either this or
    /// [`store`](Self::store) is required; a store given with `store` wins.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let engine = Engine::builder(Typed(Total))
    ///     .directory(dir.path())
    ///     .open()?;
    /// // Reopening the directory later finds every entity written here.
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn directory(mut self, dir: impl Into<PathBuf>) -> Self {
        self.directory = Some(dir.into());
        self
    }

    /// A store to open over instead of the default file-backed one (the in-memory store for
    /// tests, or another backend). The file store's own options
    /// ([`sync_policy`](Self::sync_policy), [`file_store`](Self::file_store)) cannot be
    /// combined with it: [`open`](Self::open) refuses the mix.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total))
    ///     .store(store)
    ///     .open()?;
    /// assert_eq!(engine.incarnation(), 1);
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// How the default file store makes commits durable (SPEC S3). Default:
    /// [`SyncPolicy::SyncEveryCommit`], where a write returns only once it is on stable
    /// storage. The other policies say in their names what a crash may lose.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let engine = Engine::builder(Typed(Total))
    ///     .directory(dir.path())
    ///     // A crash may lose up to 50 ms of acknowledged writes, never part of one.
    ///     .sync_policy(portcullis::SyncPolicy::PeriodicMayLoseRecent { interval_ms: 50 })
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sync_policy(self, policy: SyncPolicy) -> Self {
        self.file_store(move |b| b.sync_policy(policy))
    }

    /// Any other option of the default file store (segment size, snapshots, compaction),
    /// applied to its [`FileStoreBuilder`] when the engine opens it. The engine sets the
    /// store's clock to its own ([`clock`](Self::clock)) after these. May be called more than
    /// once; the changes apply in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let engine = Engine::builder(Typed(Total))
    ///     .directory(dir.path())
    ///     .file_store(|store| store.segment_bytes(8 << 20).auto_compact(false))
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn file_store(
        mut self,
        configure: impl FnOnce(FileStoreBuilder) -> FileStoreBuilder + Send + 'static,
    ) -> Self {
        self.file_store.push(Box::new(configure));
        self
    }

    /// Keeps at most about `partitions` partition indexes of the default file store loaded
    /// (SPEC S8): idle ones are dropped, least recently touched first, and load again on their
    /// next touch (see [`FileStoreBuilder::max_loaded_partitions`]). Pair it with
    /// [`max_resident_entities`](Self::max_resident_entities), which bounds the restored
    /// states: an entity's partition stays touched while it is restored and written. Default:
    /// none.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::typed::{Typed, TypedMachine};
    /// use portcullis::{Engine, EntityId, Rejection};
    /// struct Count;
    /// impl TypedMachine for Count {
    ///     type Record = (); type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, s: &mut u64, _: &portcullis::ApplyContext<'_>, _: ()) -> Result<(), Rejection> { *s += 1; Ok(()) }
    /// }
    /// let dir = tempfile::tempdir().unwrap();
    /// let engine = Engine::builder(Typed(Count))
    ///     .directory(dir.path())
    ///     .max_resident_entities(1_000)
    ///     .max_loaded_partitions(1_000)
    ///     .open()?;
    /// engine.close()?;
    /// # Ok::<(), portcullis::Error>(())
    /// ```
    pub fn max_loaded_partitions(self, partitions: usize) -> Self {
        self.file_store(move |b| b.max_loaded_partitions(partitions))
    }

    /// The clock (SPEC E4). One clock serves the engine, the fence and the store: with
    /// [`directory`](Self::directory) the store is opened with this clock; with
    /// [`store`](Self::store) the engine reads the store's own clock for wall time (leases,
    /// deadlines), and `open` refuses a clock that disagrees with it (give the store the same
    /// clock instead). Either way the engine's monotonic time and timed waits (its background
    /// schedule, close's and the warm's waits) are this clock's ([`Clock::instant`](
    /// crate::Clock::instant)), which a simulated clock moves (SPEC E9). Default: the system
    /// clock, or the given store's clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = std::sync::Arc::new(portcullis::ManualClock::new(1_000));
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let engine = Engine::builder(Typed(Total))
    ///     .directory(dir.path())
    ///     .clock(clock.clone())
    ///     .open()?;
    /// assert_eq!(engine.now_ms(), 1_000);
    /// clock.advance(500);
    /// assert_eq!(engine.now_ms(), 1_500);
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The owner id this engine serves namespaces as (SPEC F11, F12). Engines sharing one
    /// store need distinct ids; each id has its own incarnations, and a namespace's owner row
    /// names the id holding it. At most one incarnation of an id is live at a time: an engine
    /// opened with the id of a live one (whose owner lease has not expired, see
    /// [`owner_lease`](Self::owner_lease)) is refused with
    /// [`OwnerLive`](crate::Error::OwnerLive), in this process or another; so two processes
    /// that both leave the default never collide silently (the second is refused), and a
    /// process restarted after a crash opens once its previous incarnation's lease expired (at
    /// once on a file store, whose directory lock proves that incarnation ended). 1 to 64
    /// bytes of `[a-z0-9._-]`. Default: `"default"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total))
    ///     .store(store)
    ///     .owner("node-1")
    ///     .open()?;
    /// assert_eq!(engine.owner(), "node-1");
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Adopts `ns` at open, as [`Engine::own`] would (SPEC F11). May be given several times.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total))
    ///     .store(store)
    ///     .adopt_on_first_use(false)
    ///     .own(portcullis::Namespace::new("counters")?)
    ///     .open()?;
    /// assert_eq!(engine.grant(&portcullis::Namespace::new("counters")?), Some(0));
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn own(mut self, ns: Namespace) -> Self {
        self.own.push((ns, Mode::Fenced));
        self
    }

    /// Adopts `ns` unfenced at open, as [`Engine::own_unfenced`] would.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total))
    ///     .store(store)
    ///     .own_unfenced(portcullis::Namespace::new("counters")?)
    ///     .open()?;
    /// let ns = portcullis::Namespace::new("counters")?;
    /// assert!(engine.bump_epoch(&ns, 1).is_err()); // unfenced namespaces are never taken over
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn own_unfenced(mut self, ns: Namespace) -> Self {
        self.own.push((ns, Mode::Unfenced));
        self
    }

    /// Whether the first call on a namespace nobody holds adopts it, as [`Engine::own`]
    /// would (SPEC F11, F12). It never takes a namespace from another owner (even one whose
    /// epoch was bumped: taking it needs [`Engine::take_over`]), nor adopts one this engine was
    /// fenced out of or released; it restarts one an earlier, crashed incarnation of this
    /// owner id held. The warm and `fold_all` adopt the same way, and leave other owners'
    /// namespaces alone. Turn it off when namespaces move between engines, so that only an
    /// explicit [`Engine::own`] serves one. Default: true.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total))
    ///     .store(store)
    ///     .adopt_on_first_use(false) // only Engine::own serves a namespace
    ///     .open()?;
    /// let e = EntityId::new("counters", "a")?;
    /// assert!(engine.register(&e).is_err()); // NotServed
    /// engine.own(e.namespace())?;
    /// engine.register(&e)?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn adopt_on_first_use(mut self, adopt: bool) -> Self {
        self.adopt_on_first_use = adopt;
        self
    }
}
