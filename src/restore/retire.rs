//! Slots leaving the registry (SPEC R1, R2, R10): an entity that is pending and that nobody is
//! using costs what an untouched entity costs, nothing in the registry. Passivation makes an
//! entity pending; this removes its slot, so the registry holds the entities in use and the
//! resident ones, not every entity ever touched.
//!
//! Owns: the rule for when a slot may leave, the removal, the lookup that makes no slot, and
//! the test-only switch that removes slots in use (a negative control).
//!
//! Exactly one restore per activation (R2) rests on every toucher of an entity meeting the same
//! gate. A slot leaves only under the registry map's write lock, and only while the map's
//! reference and the remover's are the only ones: every touch, deferral, waiter, pin, closure,
//! wait-for edge and ring entry holds a reference to the slot it uses, and the only way to a
//! slot nobody holds is the map, which the write lock closes. So a touch racing the removal
//! either took its reference first (the slot stays) or looks after it (it finds no slot and
//! makes a fresh pending one, with no other gate left for that entity). Nothing else is lost:
//! a pending slot holds no state; a deferral in flight holds a reference (and counts itself in
//! the gate); deferred rows, the log and the repair mark are in the store.
//!
//! What stays: a slot that is not pending (running, restored, contained with its named reason,
//! damaged), one in use, and a passivated one while its namespace owes unclean-restart repairs
//! under this holding: the slot remembers that the entity's unit (and repair) ran, which
//! releasing the namespace needs to drop the owed repairs (`all_restored_in`).
//!
//! Lock order: the map's write lock, then each candidate's gate mutex (a leaf), then its state
//! with `try_lock` only (never waited for). Nothing here runs application code, and removed
//! slots are dropped after the map's lock is released.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::gate::Phase;
use super::machine::StateMachine;
use super::registry::{Restorer, Slot};
use crate::entity::EntityId;
use crate::error::{Error, Result};

/// References to a slot that is idle: the registry map's and the remover's own.
const IDLE_REFERENCES: usize = 2;

impl<M: StateMachine> Restorer<M> {
    /// The slot of a registered entity if it has one, without making one: `None` means the
    /// entity is registered and pending with no slot. `UnknownEntity` if it is not registered.
    pub(crate) fn existing(&self, entity: &EntityId) -> Result<Option<Arc<Slot<M::State>>>> {
        if let Some(slot) = self.slots.read().get(entity) {
            return Ok(Some(Arc::clone(slot)));
        }
        if self.store.contains_partition(&entity.partition())? {
            Ok(None)
        } else {
            Err(Error::UnknownEntity(entity.to_string()))
        }
    }

    /// Removes from the registry each of `slots` that is pending and idle (see the module
    /// docs). Each element must be the caller's only reference to that slot; the others are
    /// kept. Returns how many left. Called with no lock held.
    pub(crate) fn retire(&self, slots: Vec<Arc<Slot<M::State>>>) -> usize {
        if slots.is_empty() {
            return 0;
        }
        // Asked before the map's lock is taken (the owner table has locks of its own).
        let unguarded = self.residency.retire_unguarded.load(Ordering::Relaxed);
        let remembered: Vec<bool> = slots
            .iter()
            .map(|s| {
                !unguarded
                    && s.life.was_passivated()
                    && (self.config.owes_repairs)(s.entity.namespace())
            })
            .collect();
        let mut removed = Vec::new();
        {
            let mut map = self.slots.write();
            for (slot, remembered) in slots.into_iter().zip(remembered) {
                if remembered {
                    continue;
                }
                let listed = map.get(&slot.entity).is_some_and(|s| Arc::ptr_eq(s, &slot));
                if !listed || !idle(&slot, unguarded) {
                    continue;
                }
                if let Some(entry) = map.remove(&slot.entity) {
                    removed.push(entry);
                }
                removed.push(slot);
            }
            // The table does not shrink by itself: after a burst of slots it would keep its
            // largest size. Halving it once it is a quarter full costs O(1) amortised.
            if map.capacity() > 64 && map.capacity() > 4 * map.len() {
                let len = map.len();
                map.shrink_to(2 * len);
            }
        }
        let left = removed.len() / 2;
        self.residency
            .retired
            .fetch_add(left as u64, Ordering::Relaxed);
        // Dropped with no lock held.
        drop(removed);
        left
    }

    /// Test-only negative control: remove slots whatever they hold (a toucher's or a waiter's
    /// use, a deferral in flight, a containment, the memory of an owed repair done).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_retire_unguarded(&self, unguarded: bool) {
        self.residency
            .retire_unguarded
            .store(unguarded, Ordering::Relaxed);
    }
}

/// Whether `slot` may leave the registry: pending, and used by nobody but the caller. The
/// caller holds the map's write lock, so no new reference can be taken meanwhile.
fn idle<S>(slot: &Arc<Slot<S>>, unguarded: bool) -> bool {
    if unguarded {
        return true;
    }
    if Arc::strong_count(slot) != IDLE_REFERENCES {
        return false;
    }
    let phase = slot.gate.lock();
    let Phase::Pending { deferring } = &*phase else {
        // Running, restored, contained (its reason must stay visible) or damaged.
        return false;
    };
    // Implied by the count (each holds a reference); checked too, as they are cheap.
    if *deferring > 0 || slot.gate.waiters() > 0 || slot.life.pins() > 0 {
        return false;
    }
    // The state lock is only tried (lock order: state before gate); a pending slot holds none.
    slot.state_lock().try_lock().is_some_and(|s| s.is_none())
}
