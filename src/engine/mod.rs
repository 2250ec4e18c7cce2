//! The public blocking API (SPEC E2): configuration, the rayon pool, the clock and telemetry,
//! over [`crate::restore`] and, for writes, epoch fencing ([`crate::fence`]).
//!
//! Owns: [`Engine`] (open, register, read, write, defer, checkpoint, warm, release, bump,
//! revoke, mark recovered, stats, close), its [`EngineBuilder`], the incarnation rows in the
//! reserved system partition `s/engine`, and the write path. Calls restore, log and fence;
//! never the other way.
//!
//! Handles are `Send + Sync` and cheap to clone: clones share one engine.

mod config;
mod fencing;
mod history;
mod incarnation;
mod lifecycle;
mod memory;
mod options;
mod owned_store;
mod owner;
mod settle;
mod stats;
mod write;

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

pub use config::{DEFAULT_SWEEP_INTERVAL, EngineBuilder};
pub use history::History;
pub(crate) use incarnation::describe as describe_incarnation;
pub use stats::EngineStats;
pub use write::{Deferred, Written};

use crate::clock::{Clock, SharedClock};
use crate::entity::{EntityId, Namespace};
use crate::error::{Error, Result};
use crate::fence::{Fence, SweeperHandle};
use crate::log::{self, Guarded};
use crate::restore::{self, Containment, ReasonKind, RestoreConfig, Restorer, StateMachine, Warm};
use crate::store::Store;
use incarnation::Incarnation;
use owned_store::OwnedStore;
use owner::Owners;

/// How many times [`Engine::verify_checkpoint`] audits again when the checkpoint or history
/// root moved during its walk.
pub(crate) const AUDIT_ATTEMPTS: usize = 3;

/// An open engine: many durable entities over one store, each restored lazily on first touch.
///
/// See [`EngineBuilder`] for an example.
pub struct Engine<M: StateMachine> {
    inner: Arc<Inner<M>>,
}

impl<M: StateMachine> Clone for Engine<M> {
    fn clone(&self) -> Self {
        Engine {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<M: StateMachine> std::fmt::Debug for Engine<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("incarnation", &self.inner.incarnation.number)
            .field("open", &!self.inner.lifecycle.is_closed())
            .finish_non_exhaustive()
    }
}

struct Inner<M: StateMachine> {
    restorer: Arc<Restorer<M>>,
    /// The store itself: reads, and rows outside entity partitions.
    store: Arc<dyn Store>,
    /// The store as the engine writes entities: every batch fenced under its namespace's
    /// holding (SPEC F11).
    owned: Arc<OwnedStore>,
    /// The namespaces this engine serves.
    owners: Arc<Owners>,
    /// Whether this engine opened the store itself (from a directory) and so closes it.
    owns_store: bool,
    /// The engine's pool: the warm and background drivers run here (SPEC R6, R11).
    pool: Arc<rayon::ThreadPool>,
    clock: SharedClock,
    incarnation: Incarnation,
    warm_parallelism: usize,
    truncate_after_checkpoint: bool,
    /// Register an unknown entity on its first write instead of answering `UnknownEntity`.
    register_on_first_write: bool,
    /// Publish a checkpoint once a write leaves this many records after the newest one.
    checkpoint_every: Option<u64>,
    /// The epoch fence every write commits through (SPEC F2, F3).
    fence: Fence,
    /// The expired-lease sweeper over the namespaces this engine serves, started at the first
    /// fenced adoption unless turned off.
    sweeper: Arc<OnceLock<SweeperHandle>>,
    /// Calls in flight and whether close began (SPEC R11).
    lifecycle: lifecycle::Lifecycle,
    /// How long `close` waits for the warm, drivers and calls in flight.
    close_timeout: std::time::Duration,
    warm: Mutex<Option<Warm>>,
}

impl<M: StateMachine> Engine<M> {
    /// Starts configuring an engine for `machine`.
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
    /// let engine = Engine::builder(Typed(Total)).directory(dir.path()).open()?;
    /// engine.close()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(machine: M) -> EngineBuilder<M> {
        EngineBuilder::new(machine)
    }

    fn open_with(
        config: EngineBuilder<M>,
        store: Arc<dyn Store>,
        owns_store: bool,
    ) -> Result<Self> {
        // One clock (SPEC E4): the engine and the fence read the store's clock, the one
        // `NotAfter` deadlines are checked against.
        let clock: SharedClock = Arc::new(StoreClock(Arc::clone(&store)));
        let incarnation = incarnation::begin(&*store, &config.owner)?;
        let fence = Fence::new(Arc::clone(&store), Arc::clone(&clock), config.fence);
        let owners = Arc::new(Owners::new(
            Arc::clone(&store),
            fence.clone(),
            config.owner.clone(),
            incarnation.number,
            config.adopt_on_first_use,
        ));
        let owned = Arc::new(OwnedStore::new(
            Arc::clone(&store),
            fence.clone(),
            Arc::clone(&owners),
        ));
        let owners_for_units = Arc::clone(&owners);
        let owners_for_deferrals = Arc::clone(&owners);
        let owners_for_slots = Arc::clone(&owners);
        let restore_config = RestoreConfig {
            checkpoint_tail_bound: config.checkpoint_tail_bound,
            incarnation: incarnation.number,
            owed_repairs: Arc::new(move |ns: &Namespace| {
                owners_for_units.serving(ns).map(|h| h.owed)
            }),
            defer_term: Arc::new(move |ns: &Namespace| {
                owners_for_deferrals.serving(ns).map(|h| h.term)
            }),
            owed_now: Arc::new(move |ns: &Namespace| owners_for_slots.held(ns).map(|h| h.owed)),
        };
        let restorer = Arc::new(Restorer::new(
            Arc::clone(&owned) as Arc<dyn Store>,
            Arc::new(config.machine),
            restore_config,
            config.metrics,
            config.max_resident_entities,
        ));
        let forget = Arc::downgrade(&restorer);
        owners.set_on_readopt(Box::new(move |ns| {
            if let Some(restorer) = forget.upgrade() {
                restorer.forget_namespace(ns);
            }
        }));
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(config.pool_threads)
                .thread_name(|i| format!("portcullis-{i}"))
                .build()
                .map_err(|e| Error::invalid(format!("could not start the thread pool: {e}")))?,
        );
        // Background revocation runs on the engine's pool, and close stops it (SPEC R11).
        fence.set_pool(Arc::clone(&pool));
        // Expired leased-shard rows are swept in the background, so they never pile up: the
        // sweeper starts when the engine first serves a fenced namespace (one that serves only
        // unfenced namespaces has no rows, and runs none); close stops it with the drivers.
        let sweeper = Arc::new(OnceLock::new());
        if config.sweep_expired_leases {
            let (slot, fence) = (Arc::clone(&sweeper), fence.clone());
            let (held, interval) = (Arc::downgrade(&owners), config.sweep_interval);
            owners.set_on_adopt(Box::new(move |mode| {
                if mode != owner::Mode::Fenced || slot.get().is_some() {
                    return;
                }
                let held = held.clone();
                let served = move || {
                    held.upgrade().map_or_else(Vec::new, |o| {
                        o.all_held().into_iter().map(|(ns, _)| ns).collect()
                    })
                };
                match fence.sweep_in_background(interval, Box::new(served)) {
                    Ok(handle) => {
                        let _ = slot.set(handle);
                    }
                    Err(e) => ::log::warn!("the expired-lease sweeper did not start: {e}"),
                }
            }));
        }
        ::log::info!(
            "engine open: owner {:?}, incarnation {}; entities restore on first touch",
            config.owner,
            incarnation.number
        );
        let engine = Engine {
            inner: Arc::new(Inner {
                restorer,
                store,
                owned,
                owners,
                owns_store,
                pool,
                clock,
                incarnation,
                warm_parallelism: config.warm_parallelism,
                truncate_after_checkpoint: config.truncate_after_checkpoint,
                register_on_first_write: config.register_on_first_write,
                checkpoint_every: config.checkpoint_every,
                fence,
                sweeper,
                lifecycle: lifecycle::Lifecycle::default(),
                close_timeout: config.close_timeout,
                warm: Mutex::new(None),
            }),
        };
        for (ns, mode) in &config.own {
            engine.inner.owners.adopt(ns, *mode, false)?;
        }
        // A revocation push is a touch too (SPEC R2): restore the entity before its lease
        // changes, if this engine serves its namespace (a namespace being taken over is not
        // restored here: state read before the take-over completes could be stale). A refusal
        // does not stop revocation: the lease is pushed either way.
        let restorer = Arc::downgrade(&engine.inner.restorer);
        let owners = Arc::downgrade(&engine.inner.owners);
        engine
            .inner
            .fence
            .set_push_observer(Arc::new(move |entity| {
                let serves = owners
                    .upgrade()
                    .is_some_and(|o| o.held(entity.namespace()).is_some());
                if serves
                    && let Some(restorer) = restorer.upgrade()
                    && let Err(e) = restorer.touch(entity)
                {
                    ::log::debug!("revocation touched {entity}, which answered: {e}");
                }
            }));
        if config.warm_on_open {
            engine.warm()?;
        }
        Ok(engine)
    }

    /// The restored slot of an entity, restoring it now if it is pending (SPEC R2). The
    /// entity's namespace must be served (SPEC F11): a deposed namespace answers
    /// [`Error::Fenced`] from memory, without a store call.
    /// The slot stays pinned while the caller holds it: passivation (SPEC R10) leaves it be.
    fn touch(&self, entity: &EntityId) -> Result<restore::Pinned<M::State>> {
        self.inner.owners.serving(entity.namespace())?;
        self.inner.restorer.touch_pinned(entity)
    }

    /// This engine's incarnation number (1, 2, 3 ...), counted per owner id.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// assert_eq!(engine.incarnation(), 1); // the first engine over this store
    /// # Ok(())
    /// # }
    /// ```
    pub fn incarnation(&self) -> u64 {
        self.inner.incarnation.number
    }

    /// The owner id this engine serves namespaces as (see [`EngineBuilder::owner`]).
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// println!("serving as {}", engine.owner());
    /// assert!(!engine.owner().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn owner(&self) -> &str {
        self.inner.owners.owner()
    }

    /// This owner's previous incarnation, if it ended without a clean shutdown. The repairs
    /// that follow from it are owed per namespace (see [`Engine::owed_repairs`]).
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// assert_eq!(engine.unclean_previous(), None); // a new store: nothing to repair
    /// # Ok(())
    /// # }
    /// ```
    pub fn unclean_previous(&self) -> Option<u64> {
        self.inner.incarnation.unclean_previous
    }

    /// The engine's clock, in milliseconds: the store's clock (SPEC E4).
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let started = engine.now_ms();
    /// assert!(engine.now_ms() >= started);
    /// # Ok(())
    /// # }
    /// ```
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Registers an entity durably; it starts pending. Returns `false` if it already was.
    /// The marker is written under the namespace's grant like every other engine write.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// assert!(engine.register(&clicks)?); // registered now
    /// assert!(!engine.register(&clicks)?); // it already was
    /// # Ok(())
    /// # }
    /// ```
    pub fn register(&self, entity: &EntityId) -> Result<bool> {
        let _open = self.enter()?;
        self.inner.owners.serving(entity.namespace())?;
        self.inner.restorer.register(entity)
    }

    /// Every registered entity, in name order. Lists partition names: O(entities), no rows.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// for name in ["b", "a"] {
    ///     engine.register(&EntityId::new("counters", name)?)?;
    /// }
    /// let names: Vec<String> = engine.entities()?.iter().map(|e| e.to_string()).collect();
    /// assert_eq!(names, ["counters/a", "counters/b"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn entities(&self) -> Result<Vec<EntityId>> {
        let _open = self.enter()?;
        self.inner.restorer.entities()
    }

    /// Reads an entity's state through `f`, restoring it first if it is pending (SPEC R2).
    ///
    /// A contained entity answers [`Error::Contained`] with its named reason (SPEC R4).
    ///
    /// `f` runs while the engine holds the entity's state lock: from inside it, calls that
    /// touch an entity (read, write, append, defer, checkpoint, fold_all) or close the engine
    /// are refused with [`Error::WouldDeadlock`]; calls that touch none (stats, containment,
    /// entities) are fine (SPEC R11, `docs/restore.md`).
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[2, 3])?;
    /// assert_eq!(engine.read(&clicks, |total| *total)?, 5);
    /// let unknown = EntityId::new("counters", "nobody")?;
    /// assert!(matches!(engine.read(&unknown, |t| *t), Err(portcullis::Error::UnknownEntity(_))));
    /// # Ok(())
    /// # }
    /// ```
    pub fn read<T>(&self, entity: &EntityId, f: impl FnOnce(&M::State) -> T) -> Result<T> {
        let _open = self.enter()?;
        let slot = self.touch(entity)?;
        let mut f = Some(f);
        self.with_loaded(&slot, |loaded| {
            let f = f.take().expect("called once");
            Ok(f(&loaded.state))
        })
    }

    /// Runs `f` on the loaded state of a restored slot. If the state was taken away between
    /// the touch and the lock (the entity was contained meanwhile), answers the containment.
    /// Lock order: the state, then (briefly) the gate's mutex, which is a leaf lock. While `f`
    /// runs, this thread is marked as holding the entity, so any touch from inside `f` is
    /// refused instead of deadlocking (SPEC R11).
    fn with_loaded<T>(
        &self,
        slot: &Arc<restore::Slot<M::State>>,
        mut f: impl FnMut(&mut restore::Loaded<M::State>) -> Result<T>,
    ) -> Result<T> {
        self.inner.restorer.check_reentry(slot.entity())?;
        for _ in 0..3 {
            let mut state = slot.state();
            // Checked under the state lock: a write that contains the entity does so while
            // holding this lock, so a restored phase here means the state is trustworthy.
            if slot.is_restored()
                && let Some(loaded) = state.as_mut()
            {
                let _holding = self.inner.restorer.holding(slot.entity());
                return f(loaded);
            }
            drop(state);
            self.inner.restorer.ensure(slot)?;
        }
        Err(Error::Unavailable {
            reason: format!("{} changed state repeatedly during the call", slot.entity()),
            retry_after_ms: 10,
        })
    }

    /// Publishes a checkpoint of an entity's state at its last record (SPEC L3), and truncates
    /// the history it covers if so configured. Returns the checkpoint's sequence number.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1, 2, 3])?;
    /// assert_eq!(engine.checkpoint(&clicks)?, 3); // covers records 1 to 3
    /// assert_eq!(engine.verify_checkpoint(&clicks)?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint(&self, entity: &EntityId) -> Result<u64> {
        let _open = self.enter()?;
        let slot = self.touch(entity)?;
        let restorer = &self.inner.restorer;
        // Fenced under the namespace's grant, like every engine write (SPEC F11).
        let store = &*self.inner.owned;
        let p = entity.partition();
        let mut contained = None;
        let done = self.with_loaded(&slot, |loaded| {
            self.settle(entity, &slot, loaded, &mut contained)?;
            let bytes = restorer.machine().encode_checkpoint(&loaded.state);
            let seq = loaded.head.head.last_seq();
            let written =
                log::write_checkpoint(store, &p, &loaded.head, seq, bytes, Default::default());
            match self.unless_lost(loaded, written)? {
                Guarded::Committed(head) => loaded.head = head,
                other => return Err(self.log_moved(&slot, "checkpoint", &other, &mut contained)),
            }
            if self.inner.truncate_after_checkpoint {
                let truncated = log::truncate_before(store, &p, &loaded.head, seq + 1);
                match self.unless_lost(loaded, truncated)? {
                    Guarded::Committed(head) => loaded.head = head,
                    other => {
                        return Err(self.log_moved(&slot, "truncation", &other, &mut contained));
                    }
                }
            }
            Ok(seq)
        });
        if let Some(reason) = contained {
            restorer.report_contained(entity, &reason);
        }
        done
    }

    /// Passes a checkpoint's or truncation's answer on; a failed one is remembered as
    /// unsettled (it adds no records, so the next write adopts whatever head it left).
    fn unless_lost<T>(
        &self,
        loaded: &mut restore::Loaded<M::State>,
        answer: Result<T>,
    ) -> Result<T> {
        answer.inspect_err(|_| {
            loaded.unsettled = Some(restore::Unsettled {
                head_if_committed: loaded.head.head,
                first_seq: loaded.head.head.next_seq,
                records: Vec::new(),
            });
        })
    }

    /// Contains an entity whose log head moved under the engine: its in-memory state no longer
    /// matches the store, so it must be restored again after an operator looks at it.
    /// The caller holds the state lock; it reports `contained` once the lock is released (no
    /// application code under a lock, SPEC R11).
    fn log_moved<T: std::fmt::Debug>(
        &self,
        slot: &restore::Slot<M::State>,
        what: &str,
        outcome: &Guarded<T>,
        contained: &mut Option<Arc<Containment>>,
    ) -> Error {
        let reason = Containment::new(
            ReasonKind::CorruptRecord,
            format!("the log changed under the engine during a {what} ({outcome:?})"),
        );
        let (error, reason) = self.inner.restorer.contain_restored(slot, reason);
        *contained = Some(reason);
        error
    }

    /// Checks an entity's newest checkpoint against the history it folds by recomputing the
    /// digest chain (SPEC L4). It reads rows only and holds no entity lock while it runs. A
    /// mismatch contains the entity and is returned as its refusal.
    ///
    /// The walk is adopted only if, once it ends, the head still names the same checkpoint
    /// and the same history root (first retained record and its base digest): a checkpoint
    /// with truncation that lands during the walk deletes records the walk has not read yet,
    /// which is not damage, and a checkpoint replaced during the walk was not the one
    /// verified. The audit then starts over (at most 3 times, then
    /// `Unavailable`).
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// assert_eq!(engine.verify_checkpoint(&clicks)?, false); // no checkpoint yet
    /// engine.append_typed(&clicks, &[7])?;
    /// engine.checkpoint(&clicks)?;
    /// assert_eq!(engine.verify_checkpoint(&clicks)?, true); // it folds the history it covers
    /// # Ok(())
    /// # }
    /// ```
    pub fn verify_checkpoint(&self, entity: &EntityId) -> Result<bool> {
        let _open = self.enter()?;
        self.inner.owners.serving(entity.namespace())?;
        // Answers UnknownEntity for an entity never registered; makes no slot unless the audit
        // finds something to contain.
        self.inner.restorer.existing(entity)?;
        let store = &*self.inner.store;
        let p = entity.partition();
        for _ in 0..AUDIT_ATTEMPTS {
            let before = log::read_head(store, &p)?.head;
            let Some(mark) = before.checkpoint else {
                return Ok(false);
            };
            let walked = log::verify_checkpoint_against_history(store, &p, &mark);
            let after = log::read_head(store, &p)?.head;
            let root = |h: &log::LogHead| (h.checkpoint, h.first_seq, h.base_digest);
            if root(&after) != root(&before) {
                ::log::debug!(
                    "{entity}: its checkpoint or history root moved during an audit; auditing again"
                );
                continue;
            }
            return match walked {
                Ok(()) => Ok(true),
                Err(e @ Error::Corrupt { .. }) => {
                    let reason = Containment::new(ReasonKind::CorruptCheckpoint, e.to_string());
                    let slot = self.inner.restorer.slot(entity)?;
                    Err(self.inner.restorer.contain_unless_running(&slot, reason))
                }
                Err(e) => Err(e),
            };
        }
        Err(Error::Unavailable {
            reason: format!(
                "the checkpoint of {entity} changed during each of {AUDIT_ATTEMPTS} audits"
            ),
            retry_after_ms: 10,
        })
    }

    /// Starts a background warm of every pending entity, or returns the one already running
    /// (SPEC R6).
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1])?;
    /// let warm = engine.warm()?; // restores every pending entity in the background
    /// let progress = warm.wait()?;
    /// assert!(progress.finished);
    /// # Ok(())
    /// # }
    /// ```
    pub fn warm(&self) -> Result<Warm> {
        let _open = self.enter()?;
        let mut current = self.inner.warm.lock();
        if let Some(warm) = current.as_ref()
            && !warm.is_finished()
        {
            return Ok(warm.clone());
        }
        let warm = restore::start_warm(
            &self.inner.restorer,
            &self.inner.pool,
            self.inner.warm_parallelism,
        )?;
        *current = Some(warm.clone());
        Ok(warm)
    }

    /// The warm most recently started, if any.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// assert!(engine.current_warm().is_none());
    /// engine.warm()?.wait()?;
    /// assert!(engine.current_warm().is_some_and(|w| w.is_finished()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn current_warm(&self) -> Option<Warm> {
        self.inner.warm.lock().clone()
    }

    /// Releases a contained entity so its next touch runs its restore unit again (SPEC R4).
    /// Returns whether it was contained.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// // Nothing to release: the entity is not contained.
    /// assert!(!engine.release(&clicks)?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn release(&self, entity: &EntityId) -> Result<bool> {
        let _open = self.enter()?;
        self.inner.restorer.release(entity)
    }

    /// Why an entity is contained, if it is. Does not touch it.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1])?;
    /// assert!(engine.containment(&clicks)?.is_none()); // healthy
    /// # Ok(())
    /// # }
    /// ```
    pub fn containment(&self, entity: &EntityId) -> Result<Option<Containment>> {
        let _open = self.enter()?;
        self.inner.restorer.containment(entity)
    }

    /// Folds every entity's state into one answer (SPEC R7): waits for a warm to restore every
    /// pending entity first, then visits each restored entity. Contained entities are skipped
    /// and counted in the second value.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// for (name, n) in [("a", 1), ("b", 2)] {
    ///     let e = EntityId::new("counters", name)?;
    ///     engine.register(&e)?;
    ///     engine.append_typed(&e, &[n])?;
    /// }
    /// let (sum, contained) = engine.fold_all(0, |sum, _, total| sum + total)?;
    /// assert_eq!((sum, contained), (3, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fold_all<A>(
        &self,
        init: A,
        mut f: impl FnMut(A, &EntityId, &M::State) -> A,
    ) -> Result<(A, u64)> {
        let _open = self.enter()?;
        // Waiting for the warm from inside a closure or a restore unit could wait for this
        // very thread (a warm worker may need the entity it holds): refused (SPEC R11).
        if let Some(kind) = self.inner.restorer.holding_or_restoring() {
            return Err(Error::WouldDeadlock {
                entity: String::new(),
                detail: format!("fold_all waits for the warm, and was called from inside {kind}"),
            });
        }
        self.warm()?.wait()?;
        let mut acc = init;
        let mut contained = 0;
        for entity in self.inner.restorer.entities()? {
            let slot = match self.touch(&entity) {
                Ok(slot) => slot,
                Err(Error::Contained { .. }) => {
                    contained += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut slot_acc = Some(acc);
            let result = self.with_loaded(&slot, |loaded| {
                let a = slot_acc.take().expect("called once");
                Ok(f(a, &entity, &loaded.state))
            });
            acc = match result {
                Ok(a) => a,
                Err(Error::Contained { .. }) if slot_acc.is_some() => {
                    contained += 1;
                    slot_acc.take().expect("still held")
                }
                Err(e) => return Err(e),
            };
        }
        Ok((acc, contained))
    }

    /// Counters for restore, the warm and the store.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1])?;
    /// let stats = engine.stats();
    /// assert_eq!(stats.phases.entities, 1);
    /// assert_eq!(stats.incarnation, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            incarnation: self.inner.incarnation.number,
            unclean_previous: self.inner.incarnation.unclean_previous,
            phases: self.inner.restorer.phase_counts(),
            units_run: self.inner.restorer.units_run(),
            passivation: self.inner.restorer.passivation_stats(),
            warm: self.current_warm().map(|w| w.progress()),
            store: self.inner.store.stats(),
        }
    }

    /// Test-only negative control: commits the engine's entity batches without the fence, as
    /// before SPEC F11, so tests can show they catch the unfenced writes.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_bypass_fence_for_test(&self, bypass: bool) {
        self.inner.owned.set_bypass_fence(bypass);
    }
}

/// The store's clock as a [`Clock`]: the one clock engine, fence and store share (SPEC E4).
#[derive(Clone)]
struct StoreClock(Arc<dyn Store>);

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreClock")
    }
}

impl Clock for StoreClock {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}
