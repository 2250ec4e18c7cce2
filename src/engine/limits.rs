//! The builder's bounds and behaviour switches (SPEC E2, R3, R6, R9, R10, R11, F9): registration
//! on first write, checkpoint cadence, the memory budget, the pool and warm sizes, the close
//! bound, fencing parameters, the expired-lease sweeper and the metrics hook. Every setter
//! documents its default.
//!
//! Owns only these setters: each records its value on the [`EngineBuilder`], and `open.rs`
//! checks the values when the engine opens. Calls nothing.

use std::sync::Arc;

use super::EngineBuilder;
#[cfg(doc)]
use super::{DEFAULT_SWEEP_INTERVAL, Engine};
#[cfg(doc)]
use crate::error::Error;
use crate::fence::FenceConfig;
use crate::restore::{Metrics, StateMachine};

impl<M: StateMachine> EngineBuilder<M> {
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
}
