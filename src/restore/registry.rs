//! The registry of entities and their gates (SPEC R1, R2, R4, R5, R8): who is pending, who is
//! restored, who is contained, and the one place that runs a restore unit.

use crate::sync::HashMap;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::sync::{Mutex, MutexGuard, RwLock};

use super::RestoreConfig;
use super::containment::{Containment, ReasonKind};
use super::gate::{Claim, Gate, PENDING, Phase};
use super::keys;
use super::machine::StateMachine;
use super::passivate::{Residency, SlotLife};
use super::refused::CheckSwitch;
use super::restoring::{self, Kind};
use super::telemetry::{self, MetricsHook};
use super::unit::FallbackSwitch;
use super::unit::{self, Loaded, UnitFailure};
use super::waits::{RunnerOf, WaitGraph};
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::store::{Batch, Outcome, Store};

/// One registered entity: its gate and, once restored, its state.
pub struct Slot<S> {
    pub(super) entity: EntityId,
    pub(super) gate: Gate,
    /// Boxed: a slot that is not restored (in use while pending, contained) should cost a
    /// pointer here.
    state: Mutex<Option<Box<Loaded<S>>>>,
    /// Pins, last touch and residency, for passivation (SPEC R10).
    pub(super) life: SlotLife,
    /// The term of the namespace holding its state was restored under (0: never restored).
    /// Written before the gate says `Restored`; state of another term than the holding's now
    /// is stale and restored again before it serves (SPEC F11).
    pub(super) term: AtomicU64,
}

impl<S> Slot<S> {
    /// The entity.
    pub fn entity(&self) -> &EntityId {
        &self.entity
    }

    /// Locks the entity's state. `None` means it is not restored (or was just contained).
    /// Take it only after a successful touch, and never wait on another entity's gate while
    /// holding it (lock order: gate, then state).
    pub fn state(&self) -> MutexGuard<'_, Option<Box<Loaded<S>>>> {
        self.state.lock()
    }

    /// Whether the gate says restored (the gate's mutex is a leaf lock: it may be taken while
    /// holding the state).
    pub fn is_restored(&self) -> bool {
        matches!(*self.gate.lock(), Phase::Restored)
    }

    pub(super) fn state_lock(&self) -> &Mutex<Option<Box<Loaded<S>>>> {
        &self.state
    }

    /// The term of the holding its state was restored under.
    pub(super) fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }
}

impl<S: Send> RunnerOf for Slot<S> {
    fn gate(&self) -> &Gate {
        &self.gate
    }
}

/// Where deferred work went (SPEC R8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deferral {
    /// Stored durably as a deferred row; the restore unit will apply it.
    Queued,
    /// The entity is already restored: the caller should write the record directly.
    AlreadyRestored,
    /// A precondition of the caller's extra batch failed (for an idempotent deferral: the
    /// same id was accepted before); nothing was written.
    Duplicate,
}

/// Counts of entities by phase.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PhaseCounts {
    /// Registered entities.
    pub entities: u64,
    /// Not yet restored in this process.
    pub pending: u64,
    /// Being restored right now.
    pub running: u64,
    /// Restored.
    pub restored: u64,
    /// Contained, including fail-closed ones.
    pub contained: u64,
    /// Threads waiting on some entity's gate right now.
    pub waiting: u64,
}

/// The registry of entities, their gates, and the restore unit runner.
pub struct Restorer<M: StateMachine> {
    pub(super) store: Arc<dyn Store>,
    pub(crate) machine: Arc<M>,
    pub(super) config: RestoreConfig,
    pub(super) slots: RwLock<HashMap<EntityId, Arc<Slot<M::State>>>>,
    /// Which thread waits on which entity's unit (cycle detection, SPEC R11).
    pub(super) waits: WaitGraph,
    pub(super) stopping: AtomicUsize,
    units_run: AtomicU64,
    pub(super) arrivals: AtomicU64,
    pub(super) metrics: MetricsHook,
    /// The passivation budget, ring and counters (SPEC R10).
    pub(super) residency: Residency<M::State>,
    /// Whether the state machine's `check` runs (SPEC R12; off only in a negative control).
    pub(crate) checks: CheckSwitch,
    /// Whether an undecodable checkpoint falls back to the history (SPEC E7; off only in a
    /// negative control).
    pub(crate) fallback: FallbackSwitch,
    /// Entities whose last restore unit lost a batch's answer: their next unit seals the log
    /// first (SPEC F12).
    lost_answers: Mutex<crate::sync::HashSet<EntityId>>,
}

impl<M: StateMachine> Restorer<M> {
    /// A registry over `store` with no entities yet.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        machine: Arc<M>,
        config: RestoreConfig,
        metrics: MetricsHook,
        max_resident: Option<usize>,
    ) -> Self {
        Restorer {
            store,
            machine,
            config,
            slots: RwLock::new(HashMap::default()),
            waits: WaitGraph::default(),
            stopping: AtomicUsize::new(0),
            units_run: AtomicU64::new(0),
            arrivals: AtomicU64::new(0),
            metrics,
            residency: Residency::new(max_resident),
            checks: CheckSwitch::default(),
            fallback: FallbackSwitch::default(),
            lost_answers: Mutex::new(crate::sync::HashSet::default()),
        }
    }

    /// The application's state machine.
    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// The engine's clock.
    pub(crate) fn clock(&self) -> &crate::clock::SharedClock {
        &self.config.clock
    }

    /// The metrics hook, if any.
    pub(crate) fn metrics(&self) -> &MetricsHook {
        &self.metrics
    }

    /// This registry's identity in the thread-local marks (its address; it lives in an `Arc`).
    pub(crate) fn owner(&self) -> usize {
        std::ptr::from_ref(self).cast::<()>() as usize
    }

    /// Marks this thread as holding `entity`'s state while application code runs, until the
    /// guard drops: any touch from there is refused (SPEC R11).
    pub(crate) fn holding(&self, slot: &Slot<M::State>) -> restoring::Mark {
        restoring::mark_under(self.owner(), Kind::Holding, Some(&slot.entity), slot.term())
    }

    /// The term of the holding whose state this thread works on for `entity` (inside its unit,
    /// or holding its state in a call): the engine's writes for it commit only while the
    /// namespace is still held under that term (SPEC F11).
    pub(crate) fn planned_term(&self, entity: &EntityId) -> Option<u64> {
        if self.config.guards.stale_holding_served {
            return None;
        }
        restoring::planned_term(self.owner(), entity)
    }

    /// Marks this thread as inside a public engine call until the guard drops.
    pub(crate) fn in_call(&self) -> restoring::Mark {
        restoring::mark(self.owner(), Kind::Call, None)
    }

    /// Refuses a touch of `entity` that would wait for something this thread holds: the
    /// entity's own restore unit, or any entity's state lock (SPEC R3, R11).
    pub(crate) fn check_reentry(&self, entity: &EntityId) -> Result<()> {
        if restoring::is_restoring(self.owner(), entity) {
            return Err(inside_own_unit(entity));
        }
        if let Some(held) = restoring::held(self.owner()) {
            return Err(Error::WouldDeadlock {
                entity: entity.to_string(),
                detail: format!(
                    "this thread holds {held} (a read, write or fold_all closure, or apply during a write, is running)"
                ),
            });
        }
        Ok(())
    }

    /// What this thread is inside that must not wait for the warm: a closure holding an
    /// entity, or a restore unit.
    pub(crate) fn holding_or_restoring(&self) -> Option<&'static str> {
        if restoring::held(self.owner()).is_some() {
            return Some("a closure that holds an entity");
        }
        restoring::restoring_any(self.owner()).then_some("a restore unit")
    }

    /// Whether this thread is inside any call, closure or restore unit of this engine (so it
    /// must not wait for the engine to close).
    pub(crate) fn inside_engine(&self) -> bool {
        restoring::innermost(self.owner()).is_some()
    }

    /// Every registered entity: one whose partition exists in the store. Reads partition names
    /// only (SPEC R1), never rows.
    fn registered(&self) -> Result<Vec<EntityId>> {
        let partitions = self.store.list_partitions(b"e/")?;
        Ok(partitions
            .iter()
            .filter_map(EntityId::from_partition)
            .collect())
    }

    fn pending_slot(entity: EntityId) -> Slot<M::State> {
        Slot {
            entity,
            gate: Gate::new(PENDING),
            state: Mutex::new(None),
            life: SlotLife::default(),
            term: AtomicU64::new(0),
        }
    }

    /// Registers an entity durably (a marker row, written only if absent, creates its
    /// partition). Returns `false`, and writes nothing, if the entity is already registered:
    /// in this process or an earlier one (its partition exists), or by a concurrent call. The
    /// marker keeps the incarnation that first registered the entity. Makes no slot: the
    /// entity is pending until its first touch, like any registered entity.
    pub(crate) fn register(&self, entity: &EntityId) -> Result<bool> {
        let restored = self
            .slots
            .read()
            .get(entity)
            .is_some_and(|s| !matches!(*s.gate.lock(), Phase::Pending { .. }));
        if restored {
            return Ok(false);
        }
        let p = entity.partition();
        // The marker, not the partition, says it is registered: the fence may have written a
        // lease into the partition of an entity never registered (SPEC R1).
        if self.is_registered(entity)? {
            return Ok(false);
        }
        let marker = Batch::new().absent(keys::entity_key()).put(
            keys::entity_key(),
            self.config.incarnation.to_be_bytes().to_vec(),
        );
        // Of concurrent registrations, the guard lets exactly one commit.
        Ok(self.store.apply(&p, &marker)? == Outcome::Committed)
    }

    /// The slot of a registered entity. Slots are made on first need, so an entity nobody has
    /// touched costs nothing here: open does no work per entity (SPEC R1), and an entity
    /// without a slot is pending. A pending slot nobody uses leaves again (`retire.rs`).
    pub fn slot(&self, entity: &EntityId) -> Result<Arc<Slot<M::State>>> {
        if let Some(slot) = self.slots.read().get(entity) {
            return Ok(Arc::clone(slot));
        }
        if !self.store.contains_partition(&entity.partition())? {
            return Err(Error::UnknownEntity(entity.to_string()));
        }
        Ok(self.listed_slot(entity))
    }

    /// The slot of an entity known to be registered: one listed by its partition's name
    /// (entity partitions are never removed, so it still is). Like [`slot`](Self::slot)
    /// without asking the store whether the partition exists, which costs a lookup in the
    /// store's table of partitions per entity (a heads-snapshot page on `FileStore`).
    pub(crate) fn listed_slot(&self, entity: &EntityId) -> Arc<Slot<M::State>> {
        if let Some(slot) = self.slots.read().get(entity) {
            return Arc::clone(slot);
        }
        let mut slots = self.slots.write();
        let slot = slots
            .entry(entity.clone())
            .or_insert_with(|| Arc::new(Self::pending_slot(entity.clone())));
        Arc::clone(slot)
    }

    /// [`touch`](Self::touch) of an entity known to be registered (see
    /// [`listed_slot`](Self::listed_slot)): the warm's touch.
    pub(crate) fn touch_listed(&self, entity: &EntityId) -> Result<()> {
        self.check_reentry(entity)?;
        let slot = self.listed_slot(entity);
        self.ensure(&slot)
    }

    /// Whether a unit runs for `entity` now (on another thread: a warm worker runs its units
    /// to the end before it asks). Asks nothing of the store.
    pub(crate) fn is_being_restored(&self, entity: &EntityId) -> bool {
        let slot = self.slots.read().get(entity).cloned();
        slot.is_some_and(|s| matches!(*s.gate.lock(), Phase::Running { .. }))
    }

    /// Whether `entity` is pending with no unit running for it (an entity without a slot is):
    /// a touch would start its unit. Asks nothing of the store.
    pub(crate) fn is_idle_pending(&self, entity: &EntityId) -> bool {
        let slot = self.slots.read().get(entity).cloned();
        slot.is_none_or(|s| matches!(*s.gate.lock(), Phase::Pending { .. }))
    }

    /// Touches an entity (SPEC R2): restores it now if it is pending, waits if another thread
    /// is restoring it, and answers at once if it is restored, contained (SPEC R4) or damaged
    /// (SPEC R5). A touch that would wait for something this thread holds (its own unit, a
    /// state lock, or a cycle of units) is refused with [`Error::WouldDeadlock`] (SPEC R11).
    pub fn touch(&self, entity: &EntityId) -> Result<Arc<Slot<M::State>>> {
        self.check_reentry(entity)?;
        let slot = self.slot(entity)?;
        self.ensure(&slot)?;
        Ok(slot)
    }

    /// Whether `slot` is restored under the holding its namespace is served under now (the
    /// gate's mutex is a leaf lock: it may be taken while holding the state). A namespace not
    /// served now has no holding to compare with: calls for it are refused before they get
    /// here.
    pub(crate) fn is_current(&self, slot: &Slot<M::State>) -> bool {
        slot.is_restored() && !self.is_stale(slot)
    }

    /// Whether `slot`'s state was restored under another holding than its namespace's now.
    fn is_stale(&self, slot: &Slot<M::State>) -> bool {
        if self.config.guards.stale_holding_served {
            return false;
        }
        (self.config.term_now)(slot.entity.namespace()).is_some_and(|now| now != slot.term())
    }

    /// Makes a restored `slot` whose state is stale (restored under an earlier holding of its
    /// namespace) pending again, dropping its state with no lock held, so its next touch
    /// restores it under the current holding (SPEC F11). Lock order: the state, then the gate.
    /// Waits for a call still using the stale state to end (this thread holds no state: a
    /// touch from a closure is refused before it gets here).
    fn forget_stale(&self, slot: &Slot<M::State>) {
        let mut state = slot.state.lock();
        let stale = self.is_stale(slot);
        let mut phase = slot.gate.lock();
        let mut dropped = None;
        if matches!(*phase, Phase::Restored) && stale {
            ::log::debug!(
                "{}: its state was restored under an earlier holding of its namespace; restoring it again",
                slot.entity
            );
            *phase = PENDING;
            dropped = state.take();
            self.residency.left(&slot.life);
            slot.life.forgotten();
        }
        drop(phase);
        drop(state);
        drop(dropped);
        slot.gate.nudge();
    }

    /// Makes sure `slot` is restored, running its unit on this thread if it is pending, and
    /// restoring it again if its state was restored under an earlier holding (SPEC F11).
    pub(crate) fn ensure(&self, slot: &Arc<Slot<M::State>>) -> Result<()> {
        let me = restoring::token();
        let mut stale_units = 0;
        let mut phase = slot.gate.lock();
        loop {
            match &*phase {
                Phase::Restored => {
                    // The owners' table is not read under the gate's mutex (a leaf).
                    drop(phase);
                    if self.is_stale(slot) {
                        self.forget_stale(slot);
                        phase = slot.gate.lock();
                        continue;
                    }
                    self.residency.touched(&slot.life);
                    return Ok(());
                }
                Phase::Contained(reason) => return Err(reason.to_error(&slot.entity)),
                Phase::Damaged => return Err(fail_closed(&slot.entity)),
                Phase::Running { by } => {
                    let by = *by;
                    if by == me {
                        // Only reachable through a path that skipped the restoring mark.
                        return Err(inside_own_unit(&slot.entity));
                    }
                    if self.is_stopping() {
                        return Err(stopping(&slot.entity));
                    }
                    let target: Arc<dyn RunnerOf> = Arc::clone(slot) as Arc<dyn RunnerOf>;
                    let _waiting = self.waits.enter(me, &slot.entity, target, by)?;
                    slot.gate.wait(&mut phase);
                }
                // A deferral's row is being written: the unit must not scan the rows yet.
                Phase::Pending { deferring } if *deferring > 0 => slot.gate.wait(&mut phase),
                Phase::Pending { .. } => {
                    slot.gate.claim(&mut phase, me);
                    drop(phase);
                    if !self.run_unit(slot, me)? {
                        // Restored under a holding that ended meanwhile: nothing installed;
                        // the next round restores under the current one.
                        stale_units += 1;
                        if stale_units >= STALE_UNITS {
                            return Err(holding_changed(&slot.entity));
                        }
                        phase = slot.gate.lock();
                        continue;
                    }
                    // No lock held: counts it resident, and passivates others over budget.
                    self.activated(slot);
                    return Ok(());
                }
            }
        }
    }

    /// Runs the restore unit for a slot this thread has claimed, and records the outcome.
    /// Answers `false` (the entity pending again, nothing installed) when the namespace's
    /// holding changed while the unit ran: its state belongs to a holding that ended (SPEC
    /// F11).
    fn run_unit(&self, slot: &Slot<M::State>, me: u64) -> Result<bool> {
        let claim = Claim::new(&slot.gate, me);
        let _mark = restoring::mark(self.owner(), Kind::Restoring, Some(&slot.entity));
        let _span = crate::observe::span!("portcullis.restore", entity = slot.entity);
        self.units_run.fetch_add(1, Ordering::Relaxed);
        let clock = self.config.clock.clone();
        let started = clock.instant();
        let mut seal_first = !self.config.guards.unsealed_settlement
            && self.lost_answers.lock().contains(&slot.entity);
        let sealing = seal_first;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let hooks = (&self.metrics, self.checks.on(), self.fallback.on());
            unit::run(
                (&*self.store, self.owner()),
                &*self.machine,
                &slot.entity,
                &self.config,
                hooks,
                &mut seal_first,
            )
        }))
        .unwrap_or_else(|payload| {
            Err(UnitFailure::Contained(Containment::from_panic(
                "restore unit",
                &*payload,
            )))
        });
        let outcome = match outcome {
            Ok((mut loaded, mut report, (term, tail))) => {
                // The info line and the metrics hook, still inside the unit (no lock held, the
                // restoring mark set): a panic in telemetry leaves the claim unsettled, and the
                // gate becomes Damaged (SPEC R5).
                telemetry::restored(&self.metrics, &slot.entity, &report);
                // What the hook deferred to the entity is drained before it is served, and the
                // first-use mark goes.
                let drained = catch_unwind(AssertUnwindSafe(|| {
                    unit::finish(
                        &*self.store,
                        &*self.machine,
                        &slot.entity,
                        &self.config,
                        (&self.metrics, self.checks.on()),
                        (&mut loaded, &mut report, tail),
                    )
                }))
                .unwrap_or_else(|payload| {
                    Err(UnitFailure::Contained(Containment::from_panic(
                        "restore unit",
                        &*payload,
                    )))
                });
                drained.map(|()| (loaded, report, term))
            }
            Err(failure) => Err(failure),
        };
        if matches!(
            &outcome,
            Err(UnitFailure::Retry(Error::OutcomeUnknown { .. }))
        ) {
            ::log::warn!(
                "{}: a restore batch lost its answer; the entity stays pending, and its next \
                 restore seals its log first",
                slot.entity
            );
            self.lost_answers.lock().insert(slot.entity.clone());
        } else if sealing && !seal_first {
            self.lost_answers.lock().remove(&slot.entity);
        }
        let outcome = match outcome {
            Err(UnitFailure::Stale) => {
                ::log::debug!(
                    "{}: its namespace was adopted again while it was restored; restoring it again",
                    slot.entity
                );
                let _ = claim.settle(PENDING);
                return Ok(false);
            }
            Err(UnitFailure::Retry(error)) => {
                // Not a refusal (SPEC F11): the entity stays pending; a later touch retries.
                ::log::debug!("restoring {} must wait: {error}", slot.entity);
                let _ = claim.settle(PENDING);
                return Err(error);
            }
            Err(UnitFailure::Contained(reason)) => Err(reason),
            Ok(done) => Ok(done),
        };
        match outcome {
            Ok((_, _, term))
                if !self.config.guards.stale_holding_served
                    && (self.config.term_now)(slot.entity.namespace()) != Some(term) =>
            {
                ::log::debug!(
                    "{}: its namespace was adopted again while it was restored; restoring it again",
                    slot.entity
                );
                let _ = claim.settle(PENDING);
                Ok(false)
            }
            // The info line and the metrics hook ran inside the unit (`unit::run`).
            Ok((loaded, _, term)) => {
                slot.term.store(term, Ordering::Release);
                *slot.state.lock() = Some(Box::new(loaded));
                match claim.settle(Phase::Restored) {
                    Phase::Restored => Ok(true),
                    other => {
                        // Its destructor (application code) runs with no lock held.
                        let dropped = slot.state.lock().take();
                        drop(dropped);
                        Err(phase_error(&slot.entity, &other))
                    }
                }
            }
            Err(reason) => {
                telemetry::contained(
                    &self.metrics,
                    &slot.entity,
                    &reason,
                    clock.instant().saturating_duration_since(started),
                );
                let error = reason.to_error(&slot.entity);
                claim.settle(Phase::Contained(Arc::new(reason)));
                Err(error)
            }
        }
    }

    /// Contains a restored entity whose in-memory state can no longer be trusted (a write's
    /// `apply` refused or panicked after its records became durable). The caller holds the
    /// entity's state lock and has already emptied it; the gate's mutex is a leaf lock that
    /// no thread holds while waiting for state, so taking it here cannot deadlock. An entity
    /// already contained (or damaged) keeps its first reason.
    ///
    /// Telemetry is not called here: the caller reports the returned reason with
    /// [`report_contained`](Self::report_contained) once it has released the state lock
    /// (SPEC R11: no application code under an internal lock).
    pub(crate) fn contain_restored(
        &self,
        slot: &Slot<M::State>,
        reason: Containment,
    ) -> (Error, Arc<Containment>) {
        let error = reason.to_error(&slot.entity);
        let reason = Arc::new(reason);
        let mut phase = slot.gate.lock();
        if matches!(*phase, Phase::Restored) {
            *phase = Phase::Contained(Arc::clone(&reason));
            self.residency.left(&slot.life);
        }
        drop(phase);
        slot.gate.nudge();
        (error, reason)
    }

    /// Fails a restored entity closed (SPEC R5): a write unwound after its batch may have
    /// committed, so whether the state holds its records cannot be told. The caller holds the
    /// entity's state lock (the gate's mutex is a leaf).
    pub(crate) fn fail_closed(&self, slot: &Slot<M::State>) {
        let mut phase = slot.gate.lock();
        if matches!(*phase, Phase::Restored) {
            *phase = Phase::Damaged;
            self.residency.left(&slot.life);
        }
        drop(phase);
        slot.gate.nudge();
        ::log::warn!(
            "{}: a write unwound after its batch may have committed; the entity is refused until released",
            slot.entity
        );
    }

    /// Reports a containment found by [`contain_restored`](Self::contain_restored) (log line
    /// and metrics hook), with no lock held.
    pub(crate) fn report_contained(&self, entity: &EntityId, reason: &Containment) {
        telemetry::contained(&self.metrics, entity, reason, std::time::Duration::ZERO);
    }

    /// Contains an entity found damaged by an audit that ran off its lock, unless a restore
    /// unit is running for it right now (that unit records its own outcome, and checks the
    /// checkpoint itself). Returns the refusal either way.
    pub(crate) fn contain_unless_running(
        &self,
        slot: &Slot<M::State>,
        reason: Containment,
    ) -> Error {
        let error = reason.to_error(&slot.entity);
        let mut phase = slot.gate.lock();
        if matches!(*phase, Phase::Running { .. }) {
            return error;
        }
        *phase = Phase::Contained(Arc::new(reason.clone()));
        // Its state (if any) is no longer served; emptied when it is released.
        self.residency.left(&slot.life);
        drop(phase);
        slot.gate.nudge();
        telemetry::contained(
            &self.metrics,
            &slot.entity,
            &reason,
            std::time::Duration::ZERO,
        );
        error
    }

    /// Releases a contained (or fail-closed) entity so its next touch runs the whole unit again
    /// (SPEC R4). Returns whether it was contained.
    ///
    /// The release takes the entity's state lock first, so it never overlaps a call that is
    /// still using the entity (a write that committed a record and is about to contain the
    /// entity over it): a unit that ran meanwhile could miss that record and serve stale
    /// state (SPEC R4). While such a call runs, the release answers `Unavailable`; retry it.
    pub fn release(&self, entity: &EntityId) -> Result<bool> {
        let Some(slot) = self.existing(entity)? else {
            // Pending with no slot: nothing to release.
            return Ok(false);
        };
        let Some(mut state) = slot.state.try_lock() else {
            return Err(Error::Unavailable {
                reason: format!(
                    "a call is still using {entity} (a write may be about to contain it); it was not released"
                ),
                retry_after_ms: 10,
            });
        };
        let mut phase = slot.gate.lock();
        let released = matches!(*phase, Phase::Contained(_) | Phase::Damaged);
        let mut dropped = None;
        if released {
            *phase = PENDING;
            dropped = state.take();
            ::log::warn!("released {entity}: its next touch runs its restore unit again");
        }
        if self.config.guards.drop_state_under_locks {
            drop(dropped.take()); // the negative control: as before, under both locks
        }
        drop(phase);
        drop(state);
        // The state's destructor is application code: it runs with no lock held (SPEC R11).
        drop(dropped);
        // Pending now (or already): the ring's reference goes, and an idle slot leaves.
        self.unlist_unless_restored(std::slice::from_ref(&slot));
        self.retire(vec![slot]);
        Ok(released)
    }

    /// Why an entity is contained, if it is.
    pub fn containment(&self, entity: &EntityId) -> Result<Option<Containment>> {
        let Some(slot) = self.existing(entity)? else {
            // No slot: pending, so not contained.
            return Ok(None);
        };
        let phase = slot.gate.lock();
        Ok(match &*phase {
            Phase::Contained(reason) => Some((**reason).clone()),
            Phase::Damaged => Some(damaged_reason()),
            _ => None,
        })
    }

    /// The entities still pending, in name order. Lists partition names (O(entities)).
    /// The registry's lock is not held while gates are locked (SPEC R11).
    pub fn pending(&self) -> Result<Vec<EntityId>> {
        self.registered_where(|phase| matches!(phase, Phase::Pending { .. }))
    }

    /// Every registered entity not restored yet: pending, or with a unit running on another
    /// thread (a warm that lists these and touches each returns only once every one is
    /// restored or refused, even one another warm had started).
    pub(crate) fn not_restored(&self) -> Result<Vec<EntityId>> {
        self.registered_where(|phase| {
            matches!(phase, Phase::Pending { .. } | Phase::Running { .. })
        })
    }

    /// The registered entities whose phase `keep` accepts (one without a slot is pending).
    fn registered_where(&self, keep: impl Fn(&Phase) -> bool) -> Result<Vec<EntityId>> {
        let registered = self.registered()?;
        let slots: HashMap<EntityId, Arc<Slot<M::State>>> = self.slots.read().clone();
        Ok(registered
            .into_iter()
            .filter(|e| slots.get(e).is_none_or(|s| keep(&s.gate.lock())))
            .collect())
    }

    /// Every registered entity, in name order: lists partition names and reads each one's
    /// registration marker (a partition only the fence wrote, a lease for an entity never
    /// registered, is no entity). O(entities) small reads.
    pub fn entities(&self) -> Result<Vec<EntityId>> {
        let listed = self.registered()?;
        if self.config.guards.phantom_partitions_are_entities {
            return Ok(listed);
        }
        let mut entities = Vec::with_capacity(listed.len());
        for e in listed {
            if self
                .store
                .get(&e.partition(), &keys::entity_key())?
                .is_some()
            {
                entities.push(e);
            }
        }
        Ok(entities)
    }

    /// Counts entities by phase. Counting the registered entities lists partition names
    /// (O(entities), no rows); an entity never touched is pending.
    pub fn phase_counts(&self) -> PhaseCounts {
        let registered = self
            .store
            .list_partitions(b"e/")
            .map_or(0, |p| p.len() as u64);
        let slots: Vec<Arc<Slot<M::State>>> = self.slots.read().values().cloned().collect();
        let mut counts = PhaseCounts {
            entities: registered.max(slots.len() as u64),
            pending: registered.saturating_sub(slots.len() as u64),
            ..PhaseCounts::default()
        };
        for slot in slots {
            counts.waiting += slot.gate.waiters() as u64;
            match &*slot.gate.lock() {
                Phase::Pending { .. } => counts.pending += 1,
                Phase::Running { .. } => counts.running += 1,
                Phase::Restored => counts.restored += 1,
                Phase::Contained(_) | Phase::Damaged => counts.contained += 1,
            }
        }
        counts
    }

    /// How many restore units ran in this process (each entity once, plus reruns after release).
    pub fn units_run(&self) -> u64 {
        self.units_run.load(Ordering::Relaxed)
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire) > 0
    }

    /// A stop began: touches of running entities answer `Unavailable` until it ends (SPEC R6).
    pub(crate) fn begin_stop(&self) {
        self.stopping.fetch_add(1, Ordering::AcqRel);
        let slots: Vec<Arc<Slot<M::State>>> = self.slots.read().values().cloned().collect();
        for slot in slots {
            // Waiters re-check the stop flag when woken.
            slot.gate.nudge();
        }
    }

    /// A stop ended.
    pub(crate) fn end_stop(&self) {
        self.stopping.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many restore units in a row a touch runs whose holding ended meanwhile before it
/// answers `Unavailable` (a namespace adopted again and again during each).
const STALE_UNITS: usize = 3;

fn holding_changed(entity: &EntityId) -> Error {
    Error::Unavailable {
        reason: format!(
            "the namespace of {entity} was adopted again during each of {STALE_UNITS} restores; retry"
        ),
        retry_after_ms: 10,
    }
}

pub(super) fn stopping(entity: &EntityId) -> Error {
    Error::Unavailable {
        reason: format!("{entity} is being restored by another thread and a warm is stopping"),
        retry_after_ms: 100,
    }
}

/// The refusal for a phase that is not `Restored`.
fn phase_error(entity: &EntityId, phase: &Phase) -> Error {
    match phase {
        Phase::Contained(reason) => reason.to_error(entity),
        _ => fail_closed(entity),
    }
}

fn damaged_reason() -> Containment {
    Containment::new(
        ReasonKind::FailClosed,
        "a thread unwound while restoring it, so whether it is restored cannot be told",
    )
}

pub(super) fn fail_closed(entity: &EntityId) -> Error {
    damaged_reason().to_error(entity)
}

pub(crate) fn inside_own_unit(entity: &EntityId) -> Error {
    Error::WouldDeadlock {
        entity: entity.to_string(),
        detail: "it was touched from inside its own restore unit, whose state is not ready yet"
            .to_owned(),
    }
}
