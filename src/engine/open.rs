//! Opening an engine (SPEC E2, E4, R1): the builder's checks on its settings, the one clock
//! engine, fence and store share, and the wiring of restore, fence, owners, sweeper and pool
//! into a new [`Engine`].
//!
//! Owns [`EngineBuilder::open`] and the engine's constructor. Calls the store (to open the
//! default file store and read its clock), [`crate::restore`], [`crate::fence`] and the engine's
//! incarnation and owner modules; runs no application code.

use std::sync::Arc;

use crate::sync::OnceLock;

use crate::sync::Mutex;

use super::background::{Background, Duties};
use super::liveness::Liveness;
use super::owned_store::OwnedStore;
use super::owner::Owners;
use super::{Engine, EngineBuilder, Inner, incarnation, lifecycle};
use crate::clock::{Clock, SharedClock, SystemClock};
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::observe::Events;
use crate::restore::{RestoreConfig, Restorer, StateMachine};
use crate::spawn::Spawner;
use crate::store::{FileStore, Store};

impl<M: StateMachine> EngineBuilder<M> {
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
        if self.pool_stack_size.is_some_and(|bytes| bytes < 64 << 10) {
            return Err(Error::invalid("pool_stack_size must be at least 64 KiB"));
        }
        if self.sweep_interval.is_zero() {
            return Err(Error::invalid("sweep_interval must be above zero"));
        }
        let margin = self.fence.lease_margin_ms();
        if self.owner_lease.as_millis() <= u128::from(margin) + 1 {
            return Err(Error::invalid(format!(
                "owner_lease must exceed the fence's lease margin ({margin} ms), which bounds \
                 clock skew: give a longer owner lease or a smaller margin"
            )));
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
        let _span = crate::observe::span!("portcullis.engine.open", owner = self.owner);
        let events = match &self.listener {
            Some((listener, at_emit)) => Events::new(Arc::clone(listener), *at_emit),
            None => Events::default(),
        };
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
                builder = builder.clock(clock);
                // The store the engine opens tells the engine's listener (SPEC E8).
                if events.is_on() {
                    builder = builder.engine_events(events.clone());
                }
                let store: Arc<dyn Store> = Arc::new(builder.open()?);
                (store, true)
            }
        };
        Engine::open_with(self, store, owns_store, events)
    }
}

/// The longest owner lease an engine takes (a day): longer settings are capped.
const MAX_OWNER_LEASE_MS: u64 = 24 * 3_600_000;

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

impl<M: StateMachine> Engine<M> {
    /// Builds the engine over `store` from a checked configuration; `owns_store` says whether
    /// close closes the store too (it does when the engine opened it from a directory).
    fn open_with(
        config: EngineBuilder<M>,
        store: Arc<dyn Store>,
        owns_store: bool,
        events: Events,
    ) -> Result<Self> {
        // One clock (SPEC E4): the engine and the fence read the store's clock, the one
        // `NotAfter` deadlines are checked against.
        let clock: SharedClock = Arc::new(StoreClock {
            store: Arc::clone(&store),
            given: config.clock.clone(),
        });
        // The owner lease (SPEC F12), on the engine's clock; capped so no setting overflows.
        let lease_ms = u64::try_from(config.owner_lease.as_millis())
            .unwrap_or(u64::MAX)
            .min(MAX_OWNER_LEASE_MS);
        let margin_ms = config.fence.lease_margin_ms();
        let began_at = clock.now_ms();
        // Refused while another incarnation of this owner id is live (SPEC F12).
        let incarnation = incarnation::begin(
            &*store,
            &config.owner,
            (began_at, lease_ms),
            config.switches.ignore_live_incarnation,
        )?;
        let liveness = Arc::new(Liveness::new(
            Arc::clone(&store),
            Arc::clone(&clock),
            config.owner.clone(),
            incarnation.clone(),
            (lease_ms, margin_ms),
            began_at,
        ));
        let fence = Fence::new(Arc::clone(&store), Arc::clone(&clock), config.fence);
        // Revocations, depositions and sweeps are told through the fence (SPEC E8).
        fence.set_events(events.clone());
        let owners = Arc::new(Owners::new(
            (Arc::clone(&store), fence.clone()),
            (config.owner.clone(), incarnation.number),
            config.adopt_on_first_use,
            Arc::clone(&liveness),
            config.switches,
        ));
        let owned = Arc::new(OwnedStore::new(
            Arc::clone(&store),
            fence.clone(),
            Arc::clone(&owners),
        ));
        let owners_for_units = Arc::clone(&owners);
        let owners_for_deferrals = Arc::clone(&owners);
        let owners_for_slots = Arc::clone(&owners);
        let owners_for_terms = Arc::clone(&owners);
        let restore_config = RestoreConfig {
            checkpoint_tail_bound: config.checkpoint_tail_bound,
            incarnation: incarnation.number,
            owed_repairs: Arc::new(move |ns: &Namespace| {
                owners_for_units.serving(ns).map(|h| (h.term, h.owed))
            }),
            defer_term: Arc::new(move |ns: &Namespace| {
                owners_for_deferrals.serving(ns).map(|h| h.term)
            }),
            owed_now: Arc::new(move |ns: &Namespace| owners_for_slots.held(ns).map(|h| h.owed)),
            clock: Arc::clone(&clock),
            events: events.clone(),
            term_now: Arc::new(move |ns: &Namespace| owners_for_terms.term_of(ns)),
            guards: config.switches.restore_guards(),
        };
        let restorer = Arc::new(Restorer::new(
            Arc::clone(&owned) as Arc<dyn Store>,
            Arc::new(config.machine),
            restore_config,
            super::observe::restore_hook(config.metrics, &events),
            config.max_resident_entities,
        ));
        let planned = Arc::downgrade(&restorer);
        owned.set_planned_term(Box::new(move |entity| {
            planned.upgrade().and_then(|r| r.planned_term(entity))
        }));
        let forget = Arc::downgrade(&restorer);
        owners.set_on_readopt(Box::new(move |ns, wait| {
            if let Some(restorer) = forget.upgrade() {
                restorer.forget_namespace(ns, wait);
            }
        }));
        let spawner = match config.spawner {
            Some(spawner) => spawner,
            None if crate::sync::simulating() => Spawner::default(),
            None => Spawner::new_pool(config.pool_threads, config.pool_stack_size, "portcullis")
                .map_err(|e| Error::invalid(format!("could not start the thread pool: {e}")))?,
        };
        // Background revocation runs on the engine's pool, and close stops it (SPEC R11).
        fence.set_spawner(spawner.clone());
        // The engine's background thread (SPEC F9, F12, R6): owner lease renewals unless turned
        // off, the expired-lease sweeper (installed at the first fenced adoption), and the
        // background warm unless turned off. It holds the owners, not the engine.
        let renew: Option<(std::time::Duration, super::background::Renew)> =
            config.renew_owner_lease.then(|| {
                let interval = std::time::Duration::from_millis(
                    (lease_ms.saturating_sub(margin_ms) / 2).max(1),
                );
                let renewing = Arc::clone(&owners);
                let renew: super::background::Renew = Box::new(move || renewing.renew());
                (interval, renew)
            });
        let background = Background::new(
            Duties {
                renew,
                warm: OnceLock::new(),
                warm_on: config.background_warm,
            },
            config.switches.background_death_unwatched,
            Arc::clone(&clock),
            spawner.clone(),
            events.clone(),
        );
        ::log::info!(
            "engine open: owner {:?}, incarnation {}; entities restore on first touch",
            config.owner,
            incarnation.number
        );
        let inner = Arc::new(Inner {
            restorer,
            store,
            owned,
            owners,
            owns_store,
            spawner,
            clock,
            incarnation,
            warm_parallelism: config.warm_parallelism,
            truncate_after_checkpoint: config.truncate_after_checkpoint,
            register_on_first_write: config.register_on_first_write,
            checkpoint_every: config.checkpoint_every,
            fence,
            sweeper: OnceLock::new(),
            background,
            owed: Mutex::new(Default::default()),
            background_warm: Mutex::new(None),
            lifecycle: lifecycle::Lifecycle::default(),
            close_timeout: config.close_timeout,
            warm: Mutex::new(None),
            watch: super::observe::EngineWatch::new(events, config.max_resident_entities),
        });
        let engine = Engine {
            handles: Arc::new(super::lifecycle::LastHandle(Arc::clone(&inner))),
            inner,
        };
        engine.inner.install_duties(
            &engine.inner,
            config.sweep_expired_leases.then_some(config.sweep_interval),
            config.switches.revocation_restores_inline,
        );
        if config.renew_owner_lease || config.sweep_expired_leases || config.background_warm {
            engine.inner.background.start()?;
        }
        engine.inner.owe_at_open();
        for (ns, mode) in &config.own {
            engine.inner.owners.adopt(ns, *mode, false)?;
        }
        if config.warm_on_open {
            engine.warm()?;
        }
        engine.inner.watch.events.deliver();
        Ok(engine)
    }
}

/// The store's clock as a [`Clock`]: the one clock engine, fence and store share (SPEC E4).
/// Wall time is always the store's (leases and deadlines are judged by it); monotonic time and
/// timed waits are the clock given to the builder, when one was (checked at open to read as the
/// store's), so a simulated clock drives the engine's schedule and waits too (SPEC E9).
#[derive(Clone)]
struct StoreClock {
    store: Arc<dyn Store>,
    given: Option<SharedClock>,
}

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreClock")
    }
}

impl Clock for StoreClock {
    fn now_ms(&self) -> u64 {
        self.store.now_ms()
    }

    fn instant(&self) -> std::time::Instant {
        match &self.given {
            Some(clock) => clock.instant(),
            None => crate::clock::SystemClock.instant(),
        }
    }

    #[cfg(feature = "simulation")]
    fn wake_at(&self, deadline: std::time::Instant, waker: crate::clock::CondvarWaker) {
        if let Some(clock) = &self.given {
            clock.wake_at(deadline, waker);
        }
    }

    #[cfg(feature = "simulation")]
    fn is_simulated(&self) -> bool {
        self.given
            .as_ref()
            .is_some_and(|clock| clock.is_simulated())
    }
}
