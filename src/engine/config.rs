//! The engine's builder-style configuration (SPEC E2). Every setter documents its default.

use std::path::PathBuf;
use std::sync::Arc;

use super::Engine;
use super::owner::Mode;
use crate::clock::{SharedClock, SystemClock};
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::fence::FenceConfig;
use crate::restore::{Metrics, StateMachine};
use crate::store::{FileStore, FileStoreBuilder, Store, SyncPolicy};

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
///     fn encode_checkpoint(&self, s: &u64) -> Vec<u8> { s.to_le_bytes().to_vec() }
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
    pub(crate) close_timeout: std::time::Duration,
    pub(crate) warm_parallelism: usize,
    pub(crate) checkpoint_tail_bound: u64,
    pub(crate) truncate_after_checkpoint: bool,
    pub(crate) warm_on_open: bool,
    pub(crate) metrics: Option<Arc<dyn Metrics>>,
    pub(crate) fence: FenceConfig,
    pub(crate) register_on_first_write: bool,
    pub(crate) checkpoint_every: Option<u64>,
    pub(crate) max_resident_entities: Option<usize>,
    pub(crate) file_store: Vec<FileStoreOption>,
    pub(crate) sweep_expired_leases: bool,
    pub(crate) sweep_interval: std::time::Duration,
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
            .field("close_timeout", &self.close_timeout)
            .field("warm_parallelism", &self.warm_parallelism)
            .field("checkpoint_tail_bound", &self.checkpoint_tail_bound)
            .field("checkpoint_every", &self.checkpoint_every)
            .field("max_resident_entities", &self.max_resident_entities)
            .field("truncate_after_checkpoint", &self.truncate_after_checkpoint)
            .field("register_on_first_write", &self.register_on_first_write)
            .field("warm_on_open", &self.warm_on_open)
            .field("file_store_options", &self.file_store.len())
            .field("fence", &self.fence)
            .field("sweep_expired_leases", &self.sweep_expired_leases)
            .field("sweep_interval", &self.sweep_interval)
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
            close_timeout: std::time::Duration::from_secs(30),
            warm_parallelism: 4,
            checkpoint_tail_bound: 10_000,
            truncate_after_checkpoint: false,
            warm_on_open: false,
            metrics: None,
            fence: FenceConfig::default(),
            register_on_first_write: false,
            checkpoint_every: None,
            max_resident_entities: None,
            file_store: Vec::new(),
            sweep_expired_leases: true,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
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

    /// Whether a write ([`Engine::write`], [`Engine::append`], [`Engine::defer`] and their
    /// typed forms) to an entity that is not registered registers it first, instead of
    /// answering [`Error::UnknownEntity`]. Default: false, so a misspelt id is an error rather
    /// than a new entity. Reads never register.
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
    ///     .register_on_first_write(true)
    ///     .open()?;
    /// let new = EntityId::new("counters", "first")?;
    /// engine.append_typed(&new, &[1])?; // no register call needed
    /// assert_eq!(engine.read(&new, |t| *t)?, 1);
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn register_on_first_write(mut self, register: bool) -> Self {
        self.register_on_first_write = register;
        self
    }

    /// Publishes a checkpoint (SPEC L3) whenever a write leaves at least `records` records
    /// after the entity's newest checkpoint, so a restart replays at most about that many.
    /// Default: none (checkpoints only on [`Engine::checkpoint`] and when a restore folds more
    /// than [`checkpoint_tail_bound`](Self::checkpoint_tail_bound)). At least 1.
    ///
    /// The checkpoint runs after the write has committed; if it fails, the write still
    /// succeeds and the failure is logged (the next write owes the checkpoint again).
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
    ///     .checkpoint_every(100) // a restart replays at most about 100 records per entity
    ///     .open()?;
    /// let e = EntityId::new("counters", "a")?;
    /// engine.register(&e)?;
    /// engine.append_typed(&e, &[1; 100])?;
    /// assert!(engine.verify_checkpoint(&e)?); // the write left a checkpoint
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint_every(mut self, records: u64) -> Self {
        self.checkpoint_every = Some(records);
        self
    }

    /// Keeps at most `entities` entities restored in memory (SPEC R10). When a restore would
    /// exceed it, idle restored entities (no call using them, no write in flight, not
    /// contained) are passivated, least recently touched first: their state is dropped and
    /// their next touch restores them again from their newest checkpoint plus the log tail,
    /// exactly once, behind the same gate. Nothing is written when an entity is passivated.
    /// Entities in use are never dropped, so the count can exceed the budget while more than
    /// `entities` calls run at once. A passivated entity nobody uses also leaves the registry
    /// of entities, so memory follows the budget rather than the entities ever touched.
    /// Default: none (every restored entity stays in memory). At least 1. See also
    /// [`Engine::passivate`].
    ///
    /// A warm or [`Engine::fold_all`] over more entities than the budget restores each of
    /// them and passivates most again: it works, but costs a restore per entity per visit.
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
    /// let engine = Engine::builder(Typed(Count))
    ///     .store(std::sync::Arc::new(portcullis::store::MemoryStore::new()))
    ///     .register_on_first_write(true)
    ///     .max_resident_entities(2)
    ///     .open()?;
    /// for i in 0..5 {
    ///     engine.append_typed(&EntityId::new("counters", format!("c{i}"))?, &[()])?;
    /// }
    /// assert!(engine.stats().passivation.resident <= 2);
    /// // A passivated entity restores on its next touch, with the same state.
    /// assert_eq!(engine.read(&EntityId::new("counters", "c0")?, |n| *n)?, 1);
    /// # Ok::<(), portcullis::Error>(())
    /// ```
    pub fn max_resident_entities(mut self, entities: usize) -> Self {
        self.max_resident_entities = Some(entities);
        self
    }

    /// The clock (SPEC E4). One clock serves the engine, the fence and the store: with
    /// [`directory`](Self::directory) the store is opened with this clock; with
    /// [`store`](Self::store) the engine reads the store's own clock, and `open` refuses a
    /// clock that disagrees with it (give the store the same clock instead). Default: the
    /// system clock, or the given store's clock.
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

    /// The owner id this engine serves namespaces as (SPEC F11). Engines sharing one store
    /// need distinct ids; each id has its own incarnations, and a namespace's owner row names
    /// the id holding it. 1 to 64 bytes of `[a-z0-9._-]`. Default: `"default"`.
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
    /// would (SPEC F11). It never adopts a namespace another owner holds at its current epoch,
    /// nor one this engine was fenced out of or released. Turn it off when namespaces move
    /// between engines, so that only an explicit [`Engine::own`] serves one. Default: true.
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

    /// Threads in the engine's rayon pool (the warm and background revocation).
    /// Default: the number of available cores. At least 1.
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
    ///     .pool_threads(2)
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn pool_threads(mut self, threads: usize) -> Self {
        self.pool_threads = threads;
        self
    }

    /// How long [`Engine::close`] (and a drop of the last handle) waits for the warm, the
    /// background drivers and calls in flight before it gives up with `Unavailable` and leaves
    /// the incarnation not marked clean (SPEC R11). Default: 30 s.
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
    ///     .close_timeout(std::time::Duration::from_secs(5))
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn close_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// At most this many entities are restored by a warm at once (SPEC R6). Default: 4.
    /// Foreground touches never queue behind this bound: they restore inline.
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
    ///     .warm_parallelism(2)
    ///     .warm_on_open(true)
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn warm_parallelism(mut self, workers: usize) -> Self {
        self.warm_parallelism = workers;
        self
    }

    /// A restore unit that folds more records than this publishes a checkpoint (SPEC R3).
    /// Default: 10,000.
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
    ///     .checkpoint_tail_bound(1_000)
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint_tail_bound(mut self, records: u64) -> Self {
        self.checkpoint_tail_bound = records;
        self
    }

    /// Whether [`Engine::checkpoint`] also truncates the history the checkpoint covers
    /// (SPEC L3). Default: false (keep all history).
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
    ///     .truncate_after_checkpoint(true)
    ///     .open()?;
    /// let e = EntityId::new("counters", "a")?;
    /// engine.register(&e)?;
    /// engine.append_typed(&e, &[1, 2, 3])?;
    /// engine.checkpoint(&e)?; // records 1 to 3 are deleted now
    /// assert_eq!(engine.history(&e, 1)?.count(), 0);
    /// assert_eq!(engine.read(&e, |t| *t)?, 6);
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn truncate_after_checkpoint(mut self, truncate: bool) -> Self {
        self.truncate_after_checkpoint = truncate;
        self
    }

    /// Whether opening starts a background warm at once (SPEC R6). Default: false.
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
    ///     .warm_on_open(true)
    ///     .open()?;
    /// assert!(engine.current_warm().is_some());
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn warm_on_open(mut self, warm: bool) -> Self {
        self.warm_on_open = warm;
        self
    }

    /// Epoch fencing parameters (SPEC F). Default: [`FenceConfig::default`] (30 s leases,
    /// 5 s margin).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    /// use portcullis::fence::FenceConfig;
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let config = FenceConfig::builder().epoch_lease_ms(10_000).lease_margin_ms(2_000).build()?;
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total))
    ///     .store(store)
    ///     .fence_config(config)
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence_config(mut self, config: FenceConfig) -> Self {
        self.fence = config;
        self
    }

    /// Whether the engine sweeps expired leased-shard rows in the background (SPEC F9, F11):
    /// every [`sweep_interval`](Self::sweep_interval), a background sweeper deletes the rows whose
    /// lease has expired in every namespace the engine serves, so they never pile up. It starts
    /// when the engine first serves a fenced namespace ([`Engine::sweeper`]). Default: true.
    /// Turn it off only if something else sweeps
    /// ([`Fence::sweep_step`](crate::fence::Fence::sweep_step)).
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
    ///     .sweep_expired_leases(false) // sweep with Fence::sweep_step instead
    ///     .open()?;
    /// assert!(engine.sweeper().is_none());
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sweep_expired_leases(mut self, sweep: bool) -> Self {
        self.sweep_expired_leases = sweep;
        self
    }

    /// The time between passes of the expired-lease sweeper (real time). Default: 60 s
    /// ([`DEFAULT_SWEEP_INTERVAL`]; docs/fencing.md says why). Must be above zero.
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
    ///     .sweep_interval(std::time::Duration::from_secs(10))
    ///     .own(portcullis::Namespace::new("jobs")?) // a fenced namespace starts the sweeper
    ///     .open()?;
    /// assert_eq!(engine.sweeper().expect("on by default").interval().as_secs(), 10);
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sweep_interval(mut self, interval: std::time::Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// A hook for counters and timings (SPEC R9). Default: none, which costs nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    /// use portcullis::restore::{Metrics, UnitReport};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// struct Log;
    /// impl Metrics for Log {
    ///     fn entity_restored(&self, entity: &EntityId, report: &UnitReport) {
    ///         println!("{entity} restored: {report:?}");
    ///     }
    /// }
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total))
    ///     .store(store)
    ///     .metrics(std::sync::Arc::new(Log))
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn metrics(mut self, metrics: Arc<dyn Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Opens the engine: records the new incarnation, adopts the namespaces given with
    /// [`own`](Self::own), and returns at once (SPEC R1).
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
    ///     .warm_on_open(false)
    ///     .open()?;
    /// let e = EntityId::new("counters", "a")?;
    /// engine.register(&e)?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(mut self) -> Result<Engine<M>> {
        if self.pool_threads == 0 || self.warm_parallelism == 0 {
            return Err(Error::invalid(
                "pool_threads and warm_parallelism must be at least 1",
            ));
        }
        if self.sweep_interval.is_zero() {
            return Err(Error::invalid("sweep_interval must be above zero"));
        }
        if self.max_resident_entities == Some(0) {
            return Err(Error::invalid(
                "max_resident_entities must be at least 1 entity",
            ));
        }
        if self.checkpoint_every == Some(0) {
            return Err(Error::invalid("checkpoint_every must be at least 1 record"));
        }
        if self.store.is_some() && !self.file_store.is_empty() {
            return Err(Error::invalid(
                "sync_policy and file_store configure the default file store, but a store was \
                 given with EngineBuilder::store: configure that store instead",
            ));
        }
        super::incarnation::check_owner(&self.owner)?;
        let (store, owns_store) = match &self.store {
            Some(store) => {
                if let Some(clock) = &self.clock {
                    check_one_clock(clock, &**store)?;
                }
                (Arc::clone(store), false)
            }
            None => {
                let Some(dir) = &self.directory else {
                    return Err(Error::invalid(
                        "no store configured: pass a directory (EngineBuilder::directory) or a store",
                    ));
                };
                let clock = self
                    .clock
                    .clone()
                    .unwrap_or_else(|| Arc::new(SystemClock) as SharedClock);
                let mut builder = FileStore::builder(dir);
                for configure in self.file_store.drain(..) {
                    builder = configure(builder);
                }
                let store: Arc<dyn Store> = Arc::new(builder.clock(clock).open()?);
                (store, true)
            }
        };
        Engine::open_with(self, store, owns_store)
    }
}

/// How far apart (ms) the given clock and the store's may read at open and still be taken for
/// one clock: enough for two reads of the same system clock, far below any lease margin.
const CLOCK_TOLERANCE_MS: u64 = 50;

/// SPEC E4: refuses a clock that is not the store's. Reads the clock, the store's clock, then
/// the clock again; the store's reading must fall between the two (within a small tolerance).
fn check_one_clock(clock: &SharedClock, store: &dyn Store) -> Result<()> {
    let before = clock.now_ms();
    let theirs = store.now_ms();
    let after = clock.now_ms();
    if theirs.saturating_add(CLOCK_TOLERANCE_MS) < before
        || theirs > after.saturating_add(CLOCK_TOLERANCE_MS)
    {
        return Err(Error::invalid(format!(
            "the engine's clock reads {before} ms but the store's reads {theirs} ms: one clock must \
             serve engine, fence and store (SPEC E4); give the store the same clock (for example \
             MemoryStore::with_clock), or leave EngineBuilder::clock unset to use the store's"
        )));
    }
    Ok(())
}
