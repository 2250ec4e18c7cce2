//! The public blocking API (SPEC E2): configuration, the rayon pool, the clock and telemetry,
//! over [`crate::restore`] and, for writes, epoch fencing ([`crate::fence`]).
//!
//! Owns: [`Engine`] (open, register, read, write, try write, defer, refused deferrals,
//! checkpoint, warm, release, bump, revoke, mark recovered, stats, backup, close), its
//! [`EngineBuilder`], the incarnation rows in the reserved system partition `s/engine`, and the
//! write path. Calls restore, log and fence; never the other way.
//!
//! Handles are `Send + Sync` and cheap to clone: clones share one engine.
//!
//! This file holds the handle, its shared state and the per-entity reads; the other calls sit
//! one job per file: `config.rs` and `limits.rs` (the builder), `open.rs` (opening),
//! `write.rs`, `check.rs` (refusing before writing), `checkpoint.rs`, `restored.rs` (warm,
//! fold, containment), `history.rs`, `memory.rs` (passivation), `fencing.rs` (ownership and
//! fencing), `takeover.rs` (`take_over`, `owner_of`), `lifecycle.rs` (close), `backup.rs`
//! (online backup, delegated to the store); and the ownership machinery they share: `owner.rs`
//! and `owner/live.rs` (holdings, owner rows, adoption), `liveness.rs` (the owner lease and its
//! renewer), `incarnation.rs`, `owned_store.rs` (the fenced store view), `switches.rs`
//! (test-only guard switches).

mod background;
mod backup;
mod check;
mod checkpoint;
mod config;
mod duty;
mod fencing;
mod history;
mod incarnation;
mod lifecycle;
mod limits;
mod liveness;
mod memory;
mod observe;
mod open;
mod options;
mod owned_store;
mod owner;
mod restored;
mod settle;
mod stats;
mod switches;
mod takeover;
mod write;

use std::sync::Arc;

use crate::sync::OnceLock;

use crate::sync::Mutex;

pub use background::BackgroundStats;
pub use config::{DEFAULT_SWEEP_INTERVAL, EngineBuilder};
pub use history::History;
pub(crate) use incarnation::describe as describe_incarnation;
pub use liveness::DEFAULT_OWNER_LEASE;
pub use observe::HeldNamespace;
pub use stats::{EngineStats, OwnerLeaseStats};
#[cfg(feature = "test-hooks")]
pub use switches::OwnerSwitches;
pub use takeover::{NamespaceOwner, TakeOver};
pub use write::{Deferred, Written};

use crate::clock::SharedClock;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::fence::{Fence, SweeperHandle};
use crate::log::Guarded;
use crate::restore::{self, Containment, ReasonKind, Restorer, StateMachine, Warm};
use crate::spawn::Spawner;
use crate::store::Store;
use incarnation::Incarnation;
use owned_store::OwnedStore;
use owner::Owners;

/// An open engine: many durable entities over one store, each restored lazily on first touch.
///
/// See [`EngineBuilder`] for an example.
pub struct Engine<M: StateMachine> {
    inner: Arc<Inner<M>>,
    /// Shared by the application's handles only: the engine's own threads hold `inner`.
    handles: Arc<lifecycle::LastHandle<M>>,
}

impl<M: StateMachine> Clone for Engine<M> {
    fn clone(&self) -> Self {
        Engine {
            inner: Arc::clone(&self.inner),
            handles: Arc::clone(&self.handles),
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
    /// Where the warm and the fence's drivers and sweeper start (SPEC E9): the engine's own
    /// rayon pool unless the builder was given a spawner.
    spawner: Spawner,
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
    /// fenced adoption unless turned off (`None`: it could not start).
    sweeper: OnceLock<Option<SweeperHandle>>,
    /// The engine's background thread: owner lease renewals (SPEC F12), the sweeper (F9) and
    /// the background warm (R6).
    background: background::Background,
    /// What the background warm owes (`duty.rs`).
    owed: Mutex<duty::Owed>,
    /// The background warm most recently started.
    background_warm: Mutex<Option<Warm>>,
    /// Calls in flight and whether close began (SPEC R11).
    lifecycle: lifecycle::Lifecycle,
    /// How long `close` waits for the warm, drivers and calls in flight.
    close_timeout: std::time::Duration,
    warm: Mutex<Option<Warm>>,
    /// The listener's hub, the budgets the stats show, and the health switch (SPEC E8).
    watch: observe::EngineWatch,
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

    /// Every registered entity, in name order. Lists partition names and reads each one's
    /// registration marker: O(entities) small reads. (A partition the fence alone wrote, a lease
    /// for an entity never registered, is no entity: it is not listed, a touch of it answers
    /// [`Error::UnknownEntity`], and [`register`](Self::register) registers it.)
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
            // Restored under the holding the namespace is served under now: state restored
            // under an earlier one is stale, and `ensure` restores it again (SPEC F11).
            if self.inner.restorer.is_current(slot)
                && let Some(loaded) = state.as_mut()
            {
                let _holding = self.inner.restorer.holding(slot);
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
        let store = self.inner.store.stats();
        EngineStats {
            max_resident_entities: self.inner.watch.max_resident,
            namespaces: self.held_namespaces(),
            degraded: self.degraded(store.degraded.clone()),
            incarnation: self.inner.incarnation.number,
            unclean_previous: self.inner.incarnation.unclean_previous,
            phases: self.inner.restorer.phase_counts(),
            units_run: self.inner.restorer.units_run(),
            passivation: self.inner.restorer.passivation_stats(),
            warm: self.current_warm().map(|w| w.progress()),
            store,
            owner_lease: {
                let liveness = &self.inner.owners.liveness;
                let (renewals, failed_renewals) = liveness.counts();
                OwnerLeaseStats {
                    renewals,
                    failed_renewals,
                    valid_until_ms: liveness.valid_until_ms(),
                }
            },
            background: {
                let (running, restarts, last_death) = self.inner.background.stats();
                BackgroundStats {
                    running,
                    restarts,
                    last_death,
                    warm: self.background_warm_progress(),
                }
            },
        }
    }

    /// The engine's state machine, shared: the typed layer decodes history with it (SPEC E7).
    pub(crate) fn shared_machine(&self) -> Arc<M> {
        Arc::clone(&self.inner.restorer.machine)
    }

    /// Test-only negative control: a checkpoint the machine does not decode contains its
    /// entity, as before SPEC E7, even when the whole history could be replayed instead.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_checkpoint_fallback_off_for_test(&self, off: bool) {
        self.inner.restorer.fallback.set_off(off);
    }

    /// Test-only negative control: commits the engine's entity batches without the fence, as
    /// before SPEC F11, so tests can show they catch the unfenced writes.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_bypass_fence_for_test(&self, bypass: bool) {
        self.inner.owned.set_bypass_fence(bypass);
    }
}
