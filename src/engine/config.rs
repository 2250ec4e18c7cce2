//! The engine's builder-style configuration (SPEC E2). Every setter documents its default.

use std::path::PathBuf;
use std::sync::Arc;

use super::Engine;
use crate::clock::{SharedClock, SystemClock};
use crate::error::{Error, Result};
use crate::fence::FenceConfig;
use crate::restore::{Metrics, StateMachine};
use crate::store::{FileStore, Store};

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
/// engine.append(&room, 0, vec![b"hi".to_vec()]).unwrap();
/// assert_eq!(engine.read(&room, |n| *n).unwrap(), 1);
/// engine.close().unwrap();
/// ```
pub struct EngineBuilder<M: StateMachine> {
    pub(crate) machine: M,
    pub(crate) store: Option<Arc<dyn Store>>,
    pub(crate) directory: Option<PathBuf>,
    pub(crate) clock: SharedClock,
    pub(crate) pool_threads: usize,
    pub(crate) warm_parallelism: usize,
    pub(crate) checkpoint_tail_bound: u64,
    pub(crate) truncate_after_checkpoint: bool,
    pub(crate) warm_on_open: bool,
    pub(crate) metrics: Option<Arc<dyn Metrics>>,
    pub(crate) fence: FenceConfig,
}

impl<M: StateMachine> EngineBuilder<M> {
    pub(crate) fn new(machine: M) -> Self {
        EngineBuilder {
            machine,
            store: None,
            directory: None,
            clock: Arc::new(SystemClock),
            pool_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            warm_parallelism: 4,
            checkpoint_tail_bound: 10_000,
            truncate_after_checkpoint: false,
            warm_on_open: false,
            metrics: None,
            fence: FenceConfig::default(),
        }
    }

    /// Opens the default, file-backed store in `dir` (created if missing). Either this or
    /// [`store`](Self::store) is required; a store given with `store` wins.
    pub fn directory(mut self, dir: impl Into<PathBuf>) -> Self {
        self.directory = Some(dir.into());
        self
    }

    /// A store to open over instead of the default file-backed one (the in-memory store for
    /// tests, or another backend).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The clock the engine reads (SPEC E4). Default: the system clock.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Threads in the engine's rayon pool (warm, and later revocation and compaction).
    /// Default: the number of available cores. At least 1.
    pub fn pool_threads(mut self, threads: usize) -> Self {
        self.pool_threads = threads;
        self
    }

    /// At most this many entities are restored by a warm at once (SPEC R6). Default: 4.
    /// Foreground touches never queue behind this bound: they restore inline.
    pub fn warm_parallelism(mut self, workers: usize) -> Self {
        self.warm_parallelism = workers;
        self
    }

    /// A restore unit that folds more records than this publishes a checkpoint (SPEC R3).
    /// Default: 10,000.
    pub fn checkpoint_tail_bound(mut self, records: u64) -> Self {
        self.checkpoint_tail_bound = records;
        self
    }

    /// Whether [`Engine::checkpoint`] also truncates the history the checkpoint covers
    /// (SPEC L3). Default: false (keep all history).
    pub fn truncate_after_checkpoint(mut self, truncate: bool) -> Self {
        self.truncate_after_checkpoint = truncate;
        self
    }

    /// Whether opening starts a background warm at once (SPEC R6). Default: false.
    pub fn warm_on_open(mut self, warm: bool) -> Self {
        self.warm_on_open = warm;
        self
    }

    /// Epoch fencing parameters (SPEC F). Default: [`FenceConfig::default`] (30 s leases,
    /// 5 s margin).
    pub fn fence_config(mut self, config: FenceConfig) -> Self {
        self.fence = config;
        self
    }

    /// A hook for counters and timings (SPEC R9). Default: none, which costs nothing.
    pub fn metrics(mut self, metrics: Arc<dyn Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Opens the engine: records the new incarnation, registers every entity found as pending,
    /// and returns at once (SPEC R1).
    pub fn open(mut self) -> Result<Engine<M>> {
        if self.pool_threads == 0 || self.warm_parallelism == 0 {
            return Err(Error::invalid(
                "pool_threads and warm_parallelism must be at least 1",
            ));
        }
        if self.store.is_none() {
            let Some(dir) = &self.directory else {
                return Err(Error::invalid(
                    "no store configured: pass a directory (EngineBuilder::directory) or a store",
                ));
            };
            let store = FileStore::builder(dir)
                .clock(Arc::clone(&self.clock))
                .open()?;
            self.store = Some(Arc::new(store));
        }
        Engine::open_with(self)
    }
}
