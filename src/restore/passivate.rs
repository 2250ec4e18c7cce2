//! Passivation (SPEC R10): dropping idle restored entities from memory under a budget, or on
//! request, so memory follows the entities in use rather than every entity ever touched.
//!
//! Owns: each slot's residency marks ([`SlotLife`]: calls using it, last touch, resident), the
//! ring of resident entities in activation order, the budget, and the counters.
//!
//! A passivated entity goes back to `Pending`; its next touch runs the whole restore unit again
//! behind the same gate (exactly once per activation, concurrent touches share it), from its
//! newest checkpoint plus the log tail. Passivation publishes no checkpoint: everything the
//! state folded is durable in the log already, and the next unit publishes one if the tail it
//! replays is longer than the bound (SPEC R3), as any unit does. An unclean-restart repair
//! does not run again: the entity's `\0repair` row records it was done.
//!
//! Only an entity that is `Restored`, not in use by a call (no pin, its state lock free) and
//! with no write whose answer was lost is passivated. A contained, damaged or running entity
//! never is. The state is taken out under the locks and dropped after they are released (its
//! destructor is application code, SPEC R11).
//!
//! Choosing whom to drop: a ring of resident entities in activation order with a second chance
//! (CLOCK): the entry at the front is dropped if its entity was not touched since it was queued,
//! otherwise it goes to the back with its newer touch. This is least-recently-touched first
//! for entities touched once, and an approximation of it otherwise; each step is O(1).
//!
//! A passivated entity's slot then leaves the registry if nothing uses it (`retire.rs`), so
//! memory follows the budget, not the entities ever touched. The ring holds a reference to
//! each slot it lists, which keeps that slot in the registry until the ring lets it go: a walk
//! lets go of the entries it passivates, and an explicit passivation, a release and a
//! namespace adopted anew take the entries of the entities they leave pending out at once
//! (leaving holes, swept by the ring's compaction).

use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::Arc;

use crate::sync::Mutex;

use super::gate::{PENDING, Phase};
use super::machine::StateMachine;
use super::registry::{Restorer, Slot};
use super::unit::Loaded;
use crate::entity::EntityId;
use crate::error::{Error, Result};

/// Counters of passivation (SPEC R10).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PassivationStats {
    /// The budget of resident entities, if one is set.
    pub budget: Option<u64>,
    /// Entities whose state is in memory now.
    pub resident: u64,
    /// Entities passivated so far (by the budget or by `Engine::passivate`).
    pub passivations: u64,
    /// Restore units that restored an entity passivated before whose slot was still in the
    /// registry (it was in use when it was passivated, or its namespace still owed repairs).
    /// An idle passivated entity leaves the registry (`retired`), and its next restore is
    /// then counted as a first activation, since nothing in memory remembers it.
    pub reactivations: u64,
    /// Entities with a slot in the registry now (touched and not yet retired). An entity
    /// without a slot costs nothing in the registry.
    pub slots: u64,
    /// Slots removed from the registry so far: pending entities nobody was using, most of
    /// them just passivated.
    pub retired: u64,
}

/// One slot's residency marks.
#[derive(Debug, Default)]
pub(crate) struct SlotLife {
    /// Its entry's number in the ring while `listed` (changed only under the ring's mutex).
    ring_seq: AtomicU64,
    /// Calls using the slot right now (between their touch and the end of their closure).
    pins: AtomicUsize,
    /// The registry's touch counter at this entity's last touch.
    last_touch: AtomicU64,
    /// Whether its state is in memory (counted in `resident`).
    resident: AtomicBool,
    /// Whether it has an entry in the ring (changed only under the ring's mutex).
    listed: AtomicBool,
    /// Whether it was passivated and not restored since.
    passivated: AtomicBool,
}

impl SlotLife {
    /// Calls using the slot right now.
    pub(super) fn pins(&self) -> usize {
        self.pins.load(Ordering::SeqCst)
    }
}

impl SlotLife {
    /// The namespace was adopted anew: a later restore is a first activation under it.
    pub(crate) fn forgotten(&self) {
        self.passivated.store(false, Ordering::Release);
    }

    /// Passivated under this holding and not restored since: its unit ran (SPEC R3 duties
    /// done), so it counts as restored for dropping owed repairs.
    pub(crate) fn was_passivated(&self) -> bool {
        self.passivated.load(Ordering::Acquire)
    }
}

/// The ring of resident entities in activation order: entries of `(last touch when queued,
/// slot)`. An entry taken out of the middle (its entity passivated on request, released or
/// forgotten) leaves a hole, so the slot's reference goes at once in O(1) and the order of the
/// rest is kept; holes are skipped at the front and swept by the ring's compaction.
struct Ring<S> {
    /// The number of the entry at the front; entry `n` is at index `n - base`.
    base: u64,
    entries: VecDeque<Option<(u64, Arc<Slot<S>>)>>,
}

impl<S> Ring<S> {
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Queues `slot` at the back and marks it listed there.
    fn push_back(&mut self, stamp: u64, slot: Arc<Slot<S>>) {
        let seq = self.base + self.entries.len() as u64;
        slot.life.ring_seq.store(seq, Ordering::Relaxed);
        slot.life.listed.store(true, Ordering::Release);
        self.entries.push_back(Some((stamp, slot)));
    }

    /// The entry at the front, skipping holes; the caller marks it unlisted or queues it again.
    fn pop_front(&mut self) -> Option<(u64, Arc<Slot<S>>)> {
        while let Some(entry) = self.entries.pop_front() {
            self.base += 1;
            if entry.is_some() {
                return entry;
            }
        }
        None
    }

    /// Takes `slot`'s entry out, leaving a hole; `None` if it has none.
    fn take(&mut self, slot: &Arc<Slot<S>>) -> Option<Arc<Slot<S>>> {
        if !slot.life.listed.load(Ordering::Acquire) {
            return None;
        }
        let at = slot
            .life
            .ring_seq
            .load(Ordering::Relaxed)
            .checked_sub(self.base)?;
        let entry = self.entries.get_mut(usize::try_from(at).ok()?)?;
        if !entry.as_ref().is_some_and(|(_, s)| Arc::ptr_eq(s, slot)) {
            return None;
        }
        slot.life.listed.store(false, Ordering::Release);
        entry.take().map(|(_, s)| s)
    }

    /// Every entry, in order, emptying the ring (holes dropped).
    fn drain(&mut self) -> Vec<(u64, Arc<Slot<S>>)> {
        self.base += self.entries.len() as u64;
        self.entries.drain(..).flatten().collect()
    }
}

/// The budget, the ring and the counters of one registry.
pub(crate) struct Residency<S> {
    budget: Option<usize>,
    ring: Mutex<Ring<S>>,
    touches: AtomicU64,
    resident: AtomicU64,
    passivations: AtomicU64,
    reactivations: AtomicU64,
    /// Slots removed from the registry (`retire.rs`).
    pub(super) retired: AtomicU64,
    /// Test-only negative control: passivate whatever phase the entity is in.
    unguarded: AtomicBool,
    /// Test-only negative control: remove pending slots even while they are in use.
    pub(super) retire_unguarded: AtomicBool,
    /// Test-only: an explicit passivation leaves the slot's ring entry in place (the
    /// behaviour before such entries were taken out at once).
    unlist_skipped: AtomicBool,
    /// Test-only negative control: entities without a slot count as repaired, unread.
    pub(super) repairs_assumed: AtomicBool,
}

impl<S> Residency<S> {
    pub(crate) fn new(budget: Option<usize>) -> Self {
        Residency {
            budget,
            ring: Mutex::new(Ring {
                base: 0,
                entries: VecDeque::new(),
            }),
            touches: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            passivations: AtomicU64::new(0),
            reactivations: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            unguarded: AtomicBool::new(false),
            retire_unguarded: AtomicBool::new(false),
            unlist_skipped: AtomicBool::new(false),
            repairs_assumed: AtomicBool::new(false),
        }
    }

    /// Records a touch of a slot (its place in least-recently-touched order).
    pub(crate) fn touched(&self, life: &SlotLife) {
        if self.budget.is_some() {
            let now = self.touches.fetch_add(1, Ordering::Relaxed) + 1;
            life.last_touch.store(now, Ordering::Relaxed);
        }
    }

    /// Test-only negative control: passivate whatever phase the entity is in.
    pub(crate) fn unguarded(&self) -> bool {
        self.unguarded.load(Ordering::Relaxed)
    }

    /// A slot left `Restored` (contained, failed closed, forgotten, passivated). Called under
    /// the slot's gate mutex, as [`Restorer::activated`] sets the mark.
    pub(crate) fn left(&self, life: &SlotLife) {
        if life.resident.swap(false, Ordering::AcqRel) {
            self.resident.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A slot pinned for the length of a call: the budget never passivates it meanwhile, so the
/// state a call's touch restored is still there when the call takes its lock.
pub struct Pinned<S>(Arc<Slot<S>>);

impl<S> Pinned<S> {
    pub(crate) fn new(slot: Arc<Slot<S>>) -> Self {
        slot.life.pins.fetch_add(1, Ordering::SeqCst);
        Pinned(slot)
    }
}

impl<S> Deref for Pinned<S> {
    type Target = Arc<Slot<S>>;
    fn deref(&self) -> &Arc<Slot<S>> {
        &self.0
    }
}

impl<S> Drop for Pinned<S> {
    fn drop(&mut self) {
        self.0.life.pins.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A passivation's outcome: the state taken out, or why the slot kept it.
type Passivated<S> = std::result::Result<Box<Loaded<S>>, Kept>;

/// Why a slot was not passivated.
enum Kept {
    /// Not restored (pending, contained, damaged): nothing to drop.
    NotResident,
    /// In use or being restored: try again later.
    Busy(&'static str),
}

impl<M: StateMachine> Restorer<M> {
    /// Touches an entity and pins it for the caller's call (see [`Pinned`]).
    pub(crate) fn touch_pinned(&self, entity: &EntityId) -> Result<Pinned<M::State>> {
        self.check_reentry(entity)?;
        // Pinned before the gate is looked at: a passivation either sees the pin or runs
        // wholly before this touch's look at the gate, which then finds it pending.
        let slot = Pinned::new(self.slot(entity)?);
        self.ensure(&slot)?;
        Ok(slot)
    }

    /// A unit restored `slot` (the gate says `Restored`): counts it resident, queues it, and
    /// passivates others if the budget is exceeded. Called with no lock held.
    pub(crate) fn activated(&self, slot: &Arc<Slot<M::State>>) {
        let residency = &self.residency;
        residency.touched(&slot.life);
        {
            // Under the gate's mutex, like every change out of `Restored` (which clears the
            // mark): a passivation between the unit's end and here leaves nothing counted.
            let phase = slot.gate.lock();
            if !matches!(*phase, Phase::Restored) {
                return;
            }
            if !slot.life.resident.swap(true, Ordering::AcqRel) {
                residency.resident.fetch_add(1, Ordering::AcqRel);
            }
            if slot.life.passivated.swap(false, Ordering::AcqRel) {
                residency.reactivations.fetch_add(1, Ordering::Relaxed);
            }
        }
        let Some(budget) = residency.budget else {
            return;
        };
        let mut dropped = Vec::new();
        // Slots that left the ring not resident: each may now leave the registry too.
        let mut leaving = Vec::new();
        {
            let mut ring = residency.ring.lock();
            if !slot.life.listed.load(Ordering::Acquire) {
                let stamp = slot.life.last_touch.load(Ordering::Relaxed);
                ring.push_back(stamp, Arc::clone(slot));
            }
            // Each entry is looked at most twice (a second chance, then a verdict), and busy
            // ones are skipped: bounded work even when nothing can be dropped.
            let mut looks = ring.len() * 2;
            while residency.resident.load(Ordering::Acquire) > budget as u64 && looks > 0 {
                looks -= 1;
                let Some((stamp, candidate)) = ring.pop_front() else {
                    break;
                };
                if !candidate.life.resident.load(Ordering::Acquire) {
                    candidate.life.listed.store(false, Ordering::Release);
                    leaving.push(candidate);
                    continue;
                }
                let last = candidate.life.last_touch.load(Ordering::Relaxed);
                if last > stamp {
                    ring.push_back(last, candidate);
                    continue;
                }
                match self.try_passivate(&candidate) {
                    Ok(state) => {
                        candidate.life.listed.store(false, Ordering::Release);
                        dropped.push(state);
                        leaving.push(candidate);
                    }
                    Err(Kept::NotResident) => {
                        candidate.life.listed.store(false, Ordering::Release);
                        leaving.push(candidate);
                    }
                    Err(Kept::Busy(_)) => ring.push_back(last, candidate),
                }
            }
            // Holes (entries taken out on request) and entries of entities no longer
            // resident (contained, say) stay in the ring until a walk reaches them; once they
            // outnumber the resident ones, one pass drops them all, keeping the order of the
            // rest (amortised O(1) per activation).
            let resident = residency.resident.load(Ordering::Acquire) as usize;
            if ring.len() > 2 * resident + 16 {
                for (stamp, entry) in ring.drain() {
                    if entry.life.resident.load(Ordering::Acquire) {
                        ring.push_back(stamp, entry);
                    } else {
                        entry.life.listed.store(false, Ordering::Release);
                        leaving.push(entry);
                    }
                }
            }
        }
        if !dropped.is_empty() {
            ::log::debug!(
                "passivated {} idle entities (budget {budget})",
                dropped.len()
            );
        }
        // The states' destructors run here, with no lock held (SPEC R11).
        drop(dropped);
        // Idle ones leave the registry (taken with no other lock held).
        self.retire(leaving);
    }

    /// Takes a restored, idle slot's state and makes it pending again.
    fn try_passivate(
        &self,
        slot: &Slot<M::State>,
    ) -> std::result::Result<Box<Loaded<M::State>>, Kept> {
        let unguarded = self.residency.unguarded();
        // Lock order: the state (never waited for here), then the gate's mutex (a leaf).
        let Some(mut state) = slot.state_lock().try_lock() else {
            return Err(Kept::Busy("a call holds its state"));
        };
        if state.as_ref().is_some_and(|l| l.unsettled.is_some()) {
            return Err(Kept::Busy(
                "a write whose answer was lost is not settled yet",
            ));
        }
        let mut phase = slot.gate.lock();
        match &*phase {
            Phase::Restored => {}
            Phase::Running { .. } | Phase::Pending { .. } if !unguarded => {
                return Err(Kept::NotResident);
            }
            Phase::Contained(_) | Phase::Damaged if !unguarded => return Err(Kept::NotResident),
            _ => {}
        }
        // Checked under the gate's mutex: a touch pins before it looks at the gate.
        if slot.life.pins.load(Ordering::SeqCst) > 0 {
            return Err(Kept::Busy("a call is using it"));
        }
        *phase = PENDING;
        let taken = state.take();
        self.residency.left(&slot.life);
        slot.life.passivated.store(true, Ordering::Release);
        drop(phase);
        drop(state);
        self.residency.passivations.fetch_add(1, Ordering::Relaxed);
        slot.gate.nudge();
        taken.ok_or(Kept::NotResident)
    }

    /// Passivates one entity now (SPEC R10): drops its restored state; its next touch restores
    /// it again from its newest checkpoint. Answers `false` if it was not restored (pending,
    /// or contained: a containment stays visible), and `Unavailable` while a call uses it or a
    /// unit restores it.
    pub fn passivate(&self, entity: &EntityId) -> Result<bool> {
        let slot = match self.slots.read().get(entity) {
            Some(slot) => Arc::clone(slot),
            None => {
                if self.is_registered(entity)? {
                    return Ok(false);
                }
                return Err(Error::UnknownEntity(entity.to_string()));
            }
        };
        if matches!(*slot.gate.lock(), Phase::Running { .. }) {
            return Err(busy(entity, "it is being restored"));
        }
        // The ring's reference goes now, so the slot can leave the registry below.
        match self.passivate_and_unlist(&slot) {
            Ok(state) => {
                // Dropped with no lock held (SPEC R11).
                drop(state);
                ::log::debug!("passivated {entity}");
                // Now pending: its slot leaves the registry unless something still uses it.
                self.retire(vec![slot]);
                Ok(true)
            }
            Err(Kept::NotResident) => {
                // Pending already (or contained, which keeps its slot): an idle pending slot
                // leaves the registry, so the entity costs what an untouched one does.
                self.retire(vec![slot]);
                Ok(false)
            }
            Err(Kept::Busy(why)) => Err(busy(entity, why)),
        }
    }

    /// [`try_passivate`](Self::try_passivate), then takes the slot's ring entry out unless the
    /// slot was kept busy (so still resident), so the ring's reference does not keep the slot in
    /// the registry until a walk or the ring's compaction reaches it: memory is freed when the
    /// application asks.
    ///
    /// Both under the ring's mutex (lock order: ring, state, gate, as a walk takes them): the
    /// entity was not resident when looked at, and a unit that restores it meanwhile reaches
    /// the ring only after this and finds it unlisted, so queues it again; a resident entity
    /// never goes missing from the ring.
    fn passivate_and_unlist(&self, slot: &Arc<Slot<M::State>>) -> Passivated<M::State> {
        if self.residency.budget.is_none() {
            // No budget, no ring: nothing is ever queued.
            return self.try_passivate(slot);
        }
        let mut ring = self.residency.ring.lock();
        let passivated = self.try_passivate(slot);
        let unlisted = match passivated {
            Err(Kept::Busy(_)) => None,
            _ if self.residency.unlist_skipped.load(Ordering::Relaxed) => None,
            _ => ring.take(slot),
        };
        drop(ring);
        // The ring's reference goes with no lock held (the caller holds another).
        drop(unlisted);
        passivated
    }

    /// Takes the ring entries of those of `slots` that are not restored (pending after a
    /// release or after their namespace was adopted anew), so the ring's reference does not
    /// keep their slots in the registry until a walk or the ring's compaction reaches them.
    ///
    /// Each phase is looked at under its gate while the ring's mutex is held (lock order:
    /// ring, gate, as a walk takes them): an entity not restored then is not resident, and a
    /// unit that restores it afterwards reaches the ring in [`activated`](Self::activated)
    /// only after this, finds it unlisted and queues it again; a resident entity never goes
    /// missing from the ring. Called with no lock held.
    pub(crate) fn unlist_unless_restored(&self, slots: &[Arc<Slot<M::State>>]) {
        if self.residency.budget.is_none() || self.residency.unlist_skipped.load(Ordering::Relaxed)
        {
            // No budget, no ring (or the test-only switch leaves the entries in place).
            return;
        }
        let mut ring = self.residency.ring.lock();
        let taken: Vec<_> = slots
            .iter()
            .filter(|slot| !matches!(*slot.gate.lock(), Phase::Restored))
            .filter_map(|slot| ring.take(slot))
            .collect();
        drop(ring);
        // The ring's references go with no lock held.
        drop(taken);
    }

    /// Makes every restored entity of `ns` pending again, dropping its state: the namespace
    /// was adopted anew, and state restored under an earlier holding may be stale (another
    /// owner may have written since). This frees the memory at once; it is not what keeps stale
    /// state from serving (a restored entity whose holding ended is restored again at its
    /// next touch, and a unit running across the re-adoption installs nothing: see
    /// `Restorer::ensure`). So it waits for nothing: an entity in use (its state locked by a
    /// call) is left for its next touch, and entities being restored right now are left to
    /// finish. It runs with no lock of the engine's held (SPEC R11).
    /// `wait` waits for entities in use instead (only a negative control does).
    pub(crate) fn forget_namespace(&self, ns: &crate::entity::Namespace, wait: bool) {
        let slots: Vec<Arc<Slot<M::State>>> = self
            .slots
            .read()
            .iter()
            .filter(|(e, _)| e.namespace() == ns)
            .map(|(_, s)| Arc::clone(s))
            .collect();
        for slot in &slots {
            // Lock order: state, then the gate's mutex (a leaf). Only tried: a call holding
            // the state finishes first, and its next touch finds the state stale.
            let locked = if wait {
                Some(slot.state_lock().lock())
            } else {
                slot.state_lock().try_lock()
            };
            let Some(mut state) = locked else {
                continue;
            };
            let mut phase = slot.gate.lock();
            let mut dropped = None;
            if matches!(*phase, Phase::Restored) {
                *phase = PENDING;
                dropped = state.take();
                self.residency.left(&slot.life);
            }
            drop(phase);
            drop(state);
            // The state's destructor runs with no lock held (SPEC R11).
            drop(dropped);
            // Restored under an earlier holding: not a reactivation of this one.
            slot.life.forgotten();
        }
        // The ring's references go now, so the pending slots can leave below.
        self.unlist_unless_restored(&slots);
        // Pending now: idle ones leave the registry.
        self.retire(slots);
    }

    /// The passivation counters.
    pub fn passivation_stats(&self) -> PassivationStats {
        let r = &self.residency;
        PassivationStats {
            budget: r.budget.map(|b| b as u64),
            resident: r.resident.load(Ordering::Acquire),
            passivations: r.passivations.load(Ordering::Relaxed),
            reactivations: r.reactivations.load(Ordering::Relaxed),
            slots: self.slots.read().len() as u64,
            retired: r.retired.load(Ordering::Relaxed),
        }
    }

    /// Test-only negative control: an explicit passivation, a release and a namespace adopted
    /// anew leave the ring's entry (and so the slot) in place until a walk reaches it.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_unlist_skipped(&self, skipped: bool) {
        self.residency
            .unlist_skipped
            .store(skipped, Ordering::Relaxed);
    }

    /// Test-only negative control: passivate entities in any phase (contained ones too).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_passivate_unguarded(&self, unguarded: bool) {
        self.residency.unguarded.store(unguarded, Ordering::Relaxed);
    }
}

fn busy(entity: &EntityId, why: &str) -> Error {
    Error::Unavailable {
        reason: format!("{entity} was not passivated: {why}; retry when the call ends"),
        retry_after_ms: 10,
    }
}
