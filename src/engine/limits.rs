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
use crate::spawn::Spawner;

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

    /// Where the warm, background revocation and the engine's background thread start (SPEC
    /// E9). Default: a rayon pool of [`pool_threads`](Self::pool_threads) threads of the
    /// engine's own (a spawner given here is used as it is, and neither `pool_threads` nor
    /// [`pool_stack_size`](Self::pool_stack_size) applies).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Spawner, Typed, TypedMachine};
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
    ///     .spawner(Spawner::global()) // rayon's global pool
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = Some(spawner);
        self
    }

    /// The stack size of each thread of the engine's pool, in bytes: the state machine runs
    /// there during a warm, so a machine that recurses deeply (or a runtime it calls into,
    /// like an interpreter) may need more than the default. Default: Rust's default for new
    /// threads (2 MiB, or `RUST_MIN_STACK`). At least 64 KiB.
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
    ///     .pool_stack_size(16 << 20) // 16 MiB per pool thread
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn pool_stack_size(mut self, bytes: usize) -> Self {
        self.pool_stack_size = Some(bytes);
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

    /// Whether opening starts a warm of every pending entity at once (SPEC R6), as
    /// [`Engine::warm`](super::Engine::warm) would (it adopts, on first use, namespaces nobody
    /// holds). Default: false. What entities owe (repairs, deferred work) is delivered by the
    /// background warm either way ([`background_warm`](Self::background_warm)).
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

    /// Whether the background warm runs (SPEC R6, R3, R8). Default: true.
    ///
    /// An entity's owed unclean-restart repairs and the work deferred to it while it was
    /// pending are applied inside its restore unit, so an entity nobody touches would keep them
    /// for ever. The background warm restores, one entity at a time on the engine's pool, the
    /// pending entities of every namespace this engine adopts (and, at open, those it holds or
    /// resumes after its own crash), each pending entity work is deferred to, and each one a
    /// revocation pushes to. It yields to other work on the pool, never adopts a namespace
    /// another owner holds, and close stops it. Turn it off to have entities restore only on
    /// their first touch or an explicit [`Engine::warm`](super::Engine::warm) (tests that count
    /// restore units do, to stay deterministic). Its progress is in
    /// [`EngineStats::background`](super::EngineStats::background).
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
    ///     .background_warm(false) // restore only on touch
    ///     .open()?;
    /// assert!(engine.stats().background.warm.is_none());
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn background_warm(mut self, on: bool) -> Self {
        self.background_warm = on;
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

    /// How long this engine's owner lease lasts (SPEC F12): the engine's incarnation is live
    /// while it renews the lease, and another engine with its owner id is refused at open until
    /// the lease has expired. Renewed in the background every
    /// `(owner_lease - lease_margin_ms) / 2` (with [`renew_owner_lease`](Self::renew_owner_lease)),
    /// and the engine serves only until `owner_lease - lease_margin_ms` after the start of its
    /// last successful renewal (a call after that renews first): so a deposed owner stops
    /// serving reads at most that long after the take-over's bump (docs/fencing.md). Default:
    /// 10 s ([`DEFAULT_OWNER_LEASE`](super::DEFAULT_OWNER_LEASE)); must exceed the fence's
    /// `lease_margin_ms` (5 s by default), which bounds clock skew.
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
    ///     .owner_lease(std::time::Duration::from_secs(20)) // renewed every 7.5 s
    ///     .open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn owner_lease(mut self, lease: std::time::Duration) -> Self {
        self.owner_lease = lease;
        self
    }

    /// Whether the engine renews its owner lease in the background (SPEC F12): a thread of its
    /// own, every `(owner_lease - lease_margin_ms) / 2` of real time. Default: true. Off, the
    /// lease is renewed only by the calls that find it about to lapse (and by
    /// [`Engine::renew_owner_lease`]): an engine left idle longer than its lease is then
    /// taken for crashed by other engines (so `take_over` needs no `force`), and one deposed
    /// while idle learns it at its next call. For deterministic simulations, which must start
    /// no background work on real time.
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
    ///     .renew_owner_lease(false)
    ///     .open()?;
    /// engine.renew_owner_lease()?; // the application renews when it likes
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn renew_owner_lease(mut self, renew: bool) -> Self {
        self.renew_owner_lease = renew;
        self
    }

    /// Test-only negative controls (feature `test-hooks`): turns ownership and liveness guards
    /// off, one per switch, so tests can show they catch each removal.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn owner_switches_for_test(mut self, switches: super::OwnerSwitches) -> Self {
        self.switches = switches;
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
