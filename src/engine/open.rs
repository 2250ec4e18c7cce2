//! Opening an engine (SPEC E2, E4, R1): the builder's checks on its settings, the one clock
//! engine, fence and store share, and the wiring of restore, fence, owners, sweeper and pool
//! into a new [`Engine`].
//!
//! Owns [`EngineBuilder::open`] and the engine's constructor. Calls the store (to open the
//! default file store and read its clock), [`crate::restore`], [`crate::fence`] and the engine's
//! incarnation and owner modules; runs no application code.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::owned_store::OwnedStore;
use super::owner::{self, Owners};
use super::{Engine, EngineBuilder, Inner, incarnation, lifecycle};
use crate::clock::{Clock, SharedClock, SystemClock};
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::restore::{RestoreConfig, Restorer, StateMachine};
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

impl<M: StateMachine> Engine<M> {
    /// Builds the engine over `store` from a checked configuration; `owns_store` says whether
    /// close closes the store too (it does when the engine opened it from a directory).
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
