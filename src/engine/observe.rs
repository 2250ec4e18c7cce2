//! What the engine tells its listener and shows in its stats (SPEC E8): the builder's
//! [`listener`](EngineBuilder::listener), the bridge that turns the restore layer's hook calls
//! into events, refusals, the namespaces held, and why the engine is degraded.
//!
//! Owns `EngineWatch` (in the engine's `Inner`), [`HeldNamespace`] and the bridge. Calls the
//! owners, the liveness and the background thread for their health; runs the listener only
//! through the hub (`crate::observe`), which the engine delivers at the end of its outermost
//! calls (`lifecycle.rs`) and after each background step.

use std::sync::Arc;
use std::time::Duration;

use super::owner::Mode;
use super::{Engine, EngineBuilder};
use crate::entity::{EntityId, Namespace};
use crate::error::Error;
use crate::observe::{Degraded, DegradedCause, Event, Events, Listener};
use crate::restore::{
    Containment, Metrics, RefusedDeferral, StateMachine, UnitReport, WarmProgress,
};

/// A namespace this engine serves, as [`EngineStats::namespaces`](super::EngineStats::namespaces)
/// lists it (SPEC F11).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldNamespace {
    /// The namespace.
    pub namespace: Namespace,
    /// The epoch it is served under (its grant; 0 for an unfenced namespace).
    pub epoch: u64,
    /// Whether its writes are fenced (SPEC F2): `false` for a namespace served unfenced.
    pub fenced: bool,
    /// Terms whose repairs are still owed to its entities (SPEC R3).
    pub owed_repairs: u64,
}

/// The engine's side of observability, held in its `Inner`.
pub(super) struct EngineWatch {
    pub(super) events: Events,
    pub(super) max_resident: Option<u64>,
    /// The negative control (feature `test-hooks`): the engine never reports its own
    /// conditions.
    #[cfg(feature = "test-hooks")]
    pub(super) health_off: crate::sync::atomic::AtomicBool,
}

impl EngineWatch {
    pub(super) fn new(events: Events, max_resident: Option<usize>) -> Self {
        EngineWatch {
            events,
            max_resident: max_resident.map(|n| n as u64),
            #[cfg(feature = "test-hooks")]
            health_off: Default::default(),
        }
    }
}

impl<M: StateMachine> EngineBuilder<M> {
    /// Tells `listener` what the engine and the store it opens do and find (SPEC E8):
    /// containments, refusals, refused deferrals, warms, revocations, take-overs and
    /// depositions, sweeps, owner lease renewals that failed, background threads that ended,
    /// and the store's events (commit stalls, failed syncs, compactions, recovery findings,
    /// failed snapshots) when the engine opens the store from a
    /// [`directory`](Self::directory) (a store given with [`store`](Self::store) keeps its own
    /// listener). The listener is called with no lock of the engine or the store held, at
    /// the end of the outermost engine call that emitted the event (a call made from inside a
    /// closure or a hook leaves it to the call around it), or after the background step (see
    /// [`crate::observe`], "Delivery"). It may call the engine, except to close it
    /// ([`Error::WouldDeadlock`]). Default: none (events cost nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use portcullis::observe::Event;
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Seats; // refuses a booking past 2 seats
    /// impl TypedMachine for Seats {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn check(&self, s: &u64, _: &ApplyContext, n: &u64) -> Result<(), Rejection> {
    ///         if s + n > 2 { Err(Rejection::new("sold out")) } else { Ok(()) }
    ///     }
    ///     fn apply(&self, s: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *s += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let engine = Engine::builder(Typed(Seats))
    ///     .directory(dir.path())
    ///     .listener(Arc::new(move |e: &Event| log.lock().unwrap().push(e.to_string())))
    ///     .open()?;
    /// let show = EntityId::new("shows", "tonight")?;
    /// engine.register(&show)?;
    /// assert!(engine.append_typed(&show, &[3]).is_err()); // refused
    /// // Among what it heard (the background warm's end, for one, may come first):
    /// assert!(seen.lock().unwrap().iter().any(|e| e == "shows/tonight: refused: sold out"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn listener(mut self, listener: Arc<dyn Listener>) -> Self {
        self.listener = Some((listener, false));
        self
    }

    /// Test only (feature `test-hooks`): [`listener`](Self::listener) with the lock rule's
    /// negative control: each event of the engine and of its store is handed to the listener
    /// where it is emitted, under whatever lock the emitting code holds. Never use this
    /// outside a negative control.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn listener_at_emit_for_test(mut self, listener: Arc<dyn Listener>) -> Self {
        self.listener = Some((listener, true));
        self
    }
}

/// The restore layer's hook as the engine installs it when a listener is set: the
/// application's own [`Metrics`] (if any) is called as before, and containments, refused
/// deferrals and finished warms become events too (the hook is called with no lock held; the
/// events are delivered after the unit, the call or the warm).
struct Bridge {
    metrics: Option<Arc<dyn Metrics>>,
    events: Events,
}

impl Metrics for Bridge {
    fn entity_restored(&self, entity: &EntityId, report: &UnitReport) {
        if let Some(m) = &self.metrics {
            m.entity_restored(entity, report);
        }
    }

    fn entity_contained(&self, entity: &EntityId, reason: &Containment, elapsed: Duration) {
        self.events.emit(|| Event::Contained {
            entity: entity.clone(),
            reason: reason.clone(),
        });
        if let Some(m) = &self.metrics {
            m.entity_contained(entity, reason, elapsed);
        }
    }

    fn warm_finished(&self, progress: &WarmProgress) {
        self.events.emit(|| Event::WarmFinished {
            progress: progress.clone(),
        });
        if let Some(m) = &self.metrics {
            m.warm_finished(progress);
        }
    }

    fn deferred(&self, entity: &EntityId, bytes: usize) {
        if let Some(m) = &self.metrics {
            m.deferred(entity, bytes);
        }
    }

    fn appended(&self, entity: &EntityId, records: u64, bytes: u64) {
        if let Some(m) = &self.metrics {
            m.appended(entity, records, bytes);
        }
    }

    fn deferral_refused(&self, entity: &EntityId, refused: &RefusedDeferral) {
        self.events.emit(|| Event::DeferralRefused {
            entity: entity.clone(),
            refused: refused.clone(),
        });
        if let Some(m) = &self.metrics {
            m.deferral_refused(entity, refused);
        }
    }
}

/// The hook the restore layer gets: the application's, or a bridge to the listener when one
/// is set (so with neither, reporting stays one branch).
pub(super) fn restore_hook(
    metrics: Option<Arc<dyn Metrics>>,
    events: &Events,
) -> Option<Arc<dyn Metrics>> {
    if !events.is_on() {
        return metrics;
    }
    Some(Arc::new(Bridge {
        metrics,
        events: events.clone(),
    }))
}

impl<M: StateMachine> Engine<M> {
    /// Tells the listener of a refusal (SPEC R12) and answers the error as it is.
    pub(super) fn refusal_told(&self, entity: &EntityId, error: Error) -> Error {
        if let Error::Refused { reason, .. } = &error {
            self.inner.watch.events.emit(|| Event::Refused {
                entity: entity.clone(),
                reason: reason.clone(),
            });
        }
        error
    }

    /// The namespaces this engine serves now, with their grants.
    pub(super) fn held_namespaces(&self) -> Vec<HeldNamespace> {
        let mut held: Vec<HeldNamespace> = self
            .inner
            .owners
            .all_held()
            .into_iter()
            .map(|(namespace, h)| HeldNamespace {
                namespace,
                epoch: h.grant,
                fenced: h.mode == Mode::Fenced,
                owed_repairs: h.owed.len() as u64,
            })
            .collect();
        held.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        held
    }

    /// The gravest condition of the engine or its store standing now (SPEC E8): the store's
    /// (`store`, from its stats), a background thread of the engine that ended, or an owner
    /// lease that could not be renewed.
    pub(super) fn degraded(&self, store: Option<Degraded>) -> Option<Degraded> {
        let inner = &self.inner;
        #[cfg(feature = "test-hooks")]
        if inner
            .watch
            .health_off
            .load(crate::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        let background = inner.background.dead().map(|why| {
            Degraded::new(
                DegradedCause::BackgroundThreadEnded,
                format!(
                    "thread portcullis-engine ended ({why}): owner lease renewals, lease sweeps and \
                     the background warm wait until the engine's next call starts it again"
                ),
            )
        });
        let lease = inner.owners.liveness.renewal_failure().map(|why| {
            Degraded::new(
                DegradedCause::OwnerLeaseNotRenewed,
                format!(
                    "the owner lease was not renewed: {why}; the engine stops serving once it lapses (at {} ms on the engine clock)",
                    inner.owners.liveness.valid_until_ms()
                ),
            )
        });
        [store, background, lease]
            .into_iter()
            .flatten()
            .min_by_key(|d| d.cause)
    }

    /// Test-only negative control (feature `test-hooks`): the engine's stats never say it
    /// is degraded for a reason of its own (its store's stats still do).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_health_off_for_test(&self, off: bool) {
        self.inner
            .watch
            .health_off
            .store(off, crate::sync::atomic::Ordering::Relaxed);
    }
}
