//! The background warm (SPEC R6, R3, R8): what an engine owes its entities is delivered without
//! waiting for a touch. Owed unclean-restart repairs and work deferred to a pending entity are
//! applied inside its restore unit, so an entity nobody touches would keep them for ever; the
//! engine's background thread (`background.rs`) therefore starts a warm of what is owed:
//!
//! - at open, the namespaces it holds (given with `EngineBuilder::own`) and those it resumes
//!   after its own crash (its owner id's earlier incarnation holds them, unreleased: adopted on
//!   first use, as any call would); namespaces of other owners and free ones are left alone;
//! - every namespace it adopts later (a first use, `own`, `take_over`): their entities may owe
//!   repairs and hold deferred work;
//! - every pending entity work is deferred to, or a revocation pushes to (its touch, SPEC R2).
//!
//! It restores one entity at a time (parallelism 1) on the engine's pool, yielding to other
//! pool work between entities, so it competes with nothing the application waits for; a
//! foreground touch of an entity it has not reached restores at once, and one of the entity it
//! is restoring shares that unit (R2). Close stops it like any warm. With
//! `EngineBuilder::background_warm(false)` none of this runs: entities restore on their first
//! touch or an explicit `Engine::warm`.
//!
//! Owns the list of what is owed. Calls the restore registry (pending entities, the warm) and
//! the owners (which namespaces are held).

use crate::sync::HashSet;

use super::owner::Mode;
use super::{Engine, Inner};
use crate::entity::{EntityId, Namespace};
use crate::restore::{self, StateMachine, WarmPlan};

/// What the background warm owes (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Owed {
    /// The namespaces held at open, and resumed after a crash.
    at_open: bool,
    namespaces: HashSet<Namespace>,
    entities: HashSet<EntityId>,
}

impl Owed {
    fn is_empty(&self) -> bool {
        !self.at_open && self.namespaces.is_empty() && self.entities.is_empty()
    }
}

impl<M: StateMachine> Inner<M> {
    /// The namespaces held at open, and those resumed after a crash, are owed a warm.
    pub(super) fn owe_at_open(&self) {
        if self.background.duties().warm_on {
            self.owed.lock().at_open = true;
            self.background.warm_due();
        }
    }

    /// A namespace adopted now is owed a warm.
    pub(super) fn owe_namespace(&self, ns: &Namespace) {
        if self.background.duties().warm_on {
            self.owed.lock().namespaces.insert(ns.clone());
            self.background.warm_due();
        }
    }

    /// A pending entity (work deferred to it, or a revocation pushed to it) is owed a restore.
    pub(super) fn owe_entity(&self, entity: &EntityId) {
        if self.background.duties().warm_on {
            self.owed.lock().entities.insert(entity.clone());
            self.background.warm_due();
        }
    }

    /// Starts a warm of what is owed, on the background thread. While one runs, what was owed
    /// since waits: the running warm asks again when it finishes.
    pub(super) fn run_warm_duty(&self) {
        if self.lifecycle.is_closed() {
            return;
        }
        let mut current = self.background_warm.lock();
        if current.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        let owed = std::mem::take(&mut *self.owed.lock());
        if owed.is_empty() {
            return;
        }
        let ids = match self.owed_entities(&owed) {
            Ok(ids) => ids,
            Err(e) => {
                ::log::warn!("the background warm could not list what is owed (retried): {e}");
                let mut again = self.owed.lock();
                again.at_open |= owed.at_open;
                again.namespaces.extend(owed.namespaces);
                again.entities.extend(owed.entities);
                return;
            }
        };
        if ids.is_empty() {
            return;
        }
        // The end asks again with no reference to the engine: it runs on a pool thread once
        // the warm is marked finished, when close may have returned and the engine be dropped.
        let plan = WarmPlan {
            parallelism: 1,
            yields: !self.owners.switches().warm_never_yields,
            on_finish: Some(self.background.warm_due_waker()),
        };
        ::log::debug!("background warm: {} entities owe a restore", ids.len());
        *current = Some(restore::start_warm_over(
            &self.restorer,
            &self.spawner,
            ids,
            plan,
        ));
    }

    /// The pending entities of what is owed, in the namespaces this engine serves.
    fn owed_entities(&self, owed: &Owed) -> crate::Result<Vec<EntityId>> {
        let owners = &self.owners;
        let mut ids = Vec::new();
        if owed.at_open || !owed.namespaces.is_empty() {
            ids = restore::pending_in(&self.restorer, &mut |ns| {
                let wanted = owed.namespaces.contains(ns) || owed.at_open;
                wanted && (owners.held(ns).is_some() || (owed.at_open && owners.resumes(ns)))
            })?;
        }
        let listed: HashSet<EntityId> = ids.iter().cloned().collect();
        ids.extend(
            owed.entities
                .iter()
                .filter(|e| {
                    !listed.contains(*e)
                        && owners.held(e.namespace()).is_some()
                        && self.restorer.is_idle_pending(e)
                })
                .cloned(),
        );
        Ok(ids)
    }
}

impl<M: StateMachine> Engine<M> {
    /// The background warm's progress, if one was started (see [`EngineStats::background`]).
    ///
    /// [`EngineStats::background`]: super::EngineStats::background
    pub(super) fn background_warm_progress(&self) -> Option<restore::WarmProgress> {
        self.inner
            .background_warm
            .lock()
            .as_ref()
            .map(restore::Warm::progress)
    }
}

impl<M: StateMachine> Inner<M> {
    /// Installs what the engine's background does once the engine exists: the warm duty, the
    /// sweeper started at the first fenced adoption (`sweep_interval`, unless sweeping is off)
    /// with every adoption owed a warm, and the revocation push observer (`inline` is a
    /// negative control: the push restores the entity inside the slice, as before).
    pub(super) fn install_duties(
        &self,
        me: &std::sync::Arc<Inner<M>>,
        sweep_interval: Option<std::time::Duration>,
        inline: bool,
    ) {
        let weak = std::sync::Arc::downgrade(me);
        let duty = weak.clone();
        let _ = self.background.duties().warm.set(Box::new(move || {
            if let Some(inner) = duty.upgrade() {
                inner.run_warm_duty();
            }
        }));
        let adopted = weak.clone();
        self.owners.set_on_adopt(Box::new(move |ns, mode| {
            if let Some(inner) = adopted.upgrade() {
                if mode == Mode::Fenced
                    && let Some(interval) = sweep_interval
                {
                    inner.start_sweeper(interval);
                }
                inner.owe_namespace(ns);
            }
        }));
        // A revocation push is a touch too (SPEC R2): a pending entity of a namespace this
        // engine serves is owed a restore, which the background warm runs, so the slice itself
        // stays bounded (SPEC F4): it neither runs a restore unit nor waits for one. A namespace
        // being taken over is not restored here: state read before the take-over completes
        // could be stale. The lease is pushed either way.
        let pushed = weak;
        self.fence
            .set_push_observer(std::sync::Arc::new(move |entity| {
                let Some(inner) = pushed.upgrade() else {
                    return;
                };
                if inner.owners.held(entity.namespace()).is_none() {
                    return;
                }
                if inline {
                    // The negative control: the unit runs (or is waited for) in the slice.
                    if let Err(e) = inner.restorer.touch(entity) {
                        ::log::debug!("revocation touched {entity}, which answered: {e}");
                    }
                    return;
                }
                if inner.restorer.is_idle_pending(entity) {
                    inner.owe_entity(entity);
                }
            }));
    }

    /// Starts the expired-lease sweeper on the background thread, once (SPEC F9).
    fn start_sweeper(&self, interval: std::time::Duration) {
        self.sweeper.get_or_init(|| {
            let held = std::sync::Arc::downgrade(&self.owners);
            let served = move || {
                held.upgrade().map_or_else(Vec::new, |o| {
                    o.all_held().into_iter().map(|(ns, _)| ns).collect()
                })
            };
            match self
                .fence
                .sweeper_driven_by(interval, Box::new(served), self.background.waker())
            {
                Ok((handle, duty)) => {
                    self.background.set_sweeper(duty);
                    Some(handle)
                }
                Err(e) => {
                    ::log::warn!("the expired-lease sweeper did not start: {e}");
                    None
                }
            }
        });
    }
}
