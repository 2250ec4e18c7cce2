//! Slots leaving the registry (SPEC R1, R2, R3, R8, R10): an entity that is pending and that nobody is
//! using costs what an untouched entity costs, nothing in the registry. Passivation makes an
//! entity pending; this removes its slot, so the registry holds the entities in use and the
//! resident ones, not every entity ever touched.
//!
//! Owns: the rule for when a slot may leave, the removal, the lookup that makes no slot, the
//! check at a namespace's release that every entity had its owed repairs (from the slots, or
//! the `\0repair` rows of entities without one), and the test-only switches that disable the
//! guards (negative controls).
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
//! damaged) and one in use. That a passivated entity's unclean-restart repairs ran is not kept
//! in memory: its `\0repair` row says so, and releasing the namespace reads it for entities
//! without a slot ([`all_repaired_in`](Restorer::all_repaired_in)).
//!
//! Lock order: the map's write lock, then each candidate's gate mutex (a leaf), then its state
//! with `try_lock` only (never waited for). Nothing here runs application code, and removed
//! slots are dropped after the map's lock is released.

use crate::sync::HashMap;
use crate::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::gate::Phase;
use super::keys;
use super::machine::StateMachine;
use super::registry::{Restorer, Slot};
use crate::entity::{EntityId, Namespace};
use crate::error::{Error, Result};

/// References to a slot that is idle: the registry map's and the remover's own.
const IDLE_REFERENCES: usize = 2;

impl<M: StateMachine> Restorer<M> {
    /// The slot of a registered entity if it has one, without making one: `None` means the
    /// entity is registered and pending with no slot. `UnknownEntity` if it is not registered.
    pub(crate) fn existing(&self, entity: &EntityId) -> Result<Option<Arc<Slot<M::State>>>> {
        let slot = self.slots.read().get(entity).map(Arc::clone);
        if let Some(slot) = slot {
            // A pending slot may have been made for a partition only the fence wrote (a
            // touch makes it before its unit finds no registration marker).
            if !matches!(*slot.gate.lock(), Phase::Pending { .. }) || self.is_registered(entity)? {
                return Ok(Some(slot));
            }
            return Err(Error::UnknownEntity(entity.to_string()));
        }
        if self.is_registered(entity)? {
            Ok(None)
        } else {
            Err(Error::UnknownEntity(entity.to_string()))
        }
    }

    /// Whether the entity is registered: its partition holds the registration marker (a
    /// partition only the fence wrote, a lease for an entity never registered, is no entity,
    /// SPEC R1). One small read.
    pub(crate) fn is_registered(&self, entity: &EntityId) -> Result<bool> {
        let p = entity.partition();
        if self.config.guards.phantom_partitions_are_entities {
            return self.store.contains_partition(&p);
        }
        Ok(self.store.get(&p, &keys::entity_key())?.is_some())
    }

    /// Removes from the registry each of `slots` that is pending and idle (see the module
    /// docs). Each element must be the caller's only reference to that slot; the others are
    /// kept. Returns how many left. Called with no lock held.
    pub(crate) fn retire(&self, slots: Vec<Arc<Slot<M::State>>>) -> usize {
        if slots.is_empty() {
            return 0;
        }
        let unguarded = self.residency.retire_unguarded.load(Ordering::Relaxed);
        let mut removed = Vec::new();
        // Kept ones are dropped after the lock too (a reference may be the last one).
        let mut kept = Vec::new();
        {
            let mut map = self.slots.write();
            for slot in slots {
                let listed = map.get(&slot.entity).is_some_and(|s| Arc::ptr_eq(s, &slot));
                if !listed || !idle(&slot, unguarded) {
                    kept.push(slot);
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
        drop(kept);
        left
    }

    /// Whether every registered entity of `ns` had its owed unclean-restart repairs done under
    /// this holding, so releasing the namespace may drop them (SPEC R3, F11): restored here, or
    /// passivated after its unit ran, or (an entity without a slot, or pending) its `\0repair`
    /// row names the newest owed term. Rows are read only while repairs are owed, in name
    /// order, and only until an entity is found not repaired. An error listing the entities
    /// or reading a row answers `false`, so an owed repair is never dropped on a guess; so does
    /// reaching `deadline` before every entity was looked at (a close is bounded, SPEC R11: the
    /// rows are read one entity at a time, and the next holder runs what stays owed).
    pub(crate) fn all_repaired_in(&self, ns: &Namespace, deadline: Option<Instant>) -> bool {
        let Ok(partitions) = self.store.list_partitions(&EntityId::partition_prefix(ns)) else {
            return false;
        };
        let newest_owed = (self.config.owed_now)(ns).and_then(|owed| owed.iter().max().copied());
        // Only state restored under the current holding had its repairs: one restored under
        // an earlier holding ran that holding's (SPEC F11).
        let term = (self.config.term_now)(ns);
        let this_holding =
            |s: &Slot<M::State>| self.config.guards.stale_holding_served || term == Some(s.term());
        let slots: HashMap<EntityId, Arc<Slot<M::State>>> = self.slots.read().clone();
        let in_time = || deadline.is_none_or(|d| self.config.clock.instant() < d);
        partitions
            .iter()
            .filter_map(EntityId::from_partition)
            .all(|e| match slots.get(&e) {
                Some(s) => match *s.gate.lock() {
                    Phase::Restored if this_holding(s) => true,
                    // Its unit (and repair) ran under this holding (SPEC R10); or, never
                    // restored here, its row tells.
                    Phase::Restored | Phase::Pending { .. } => {
                        (s.life.was_passivated() && this_holding(s))
                            || (in_time() && self.repaired_in_store(&e, newest_owed))
                    }
                    _ => false,
                },
                None => in_time() && self.repaired_in_store(&e, newest_owed),
            })
    }

    /// Whether `entity`'s `\0repair` row names `newest_owed` or a later term.
    fn repaired_in_store(&self, entity: &EntityId, newest_owed: Option<u64>) -> bool {
        let Some(newest) = newest_owed else {
            // Nothing owed (or not served): nothing to tell from the rows.
            return false;
        };
        if self.residency.repairs_assumed.load(Ordering::Relaxed) {
            return true;
        }
        match self.store.get(&entity.partition(), &keys::repair_key()) {
            Ok(Some(row)) => {
                <[u8; 8]>::try_from(row.as_slice()).is_ok_and(|b| u64::from_be_bytes(b) >= newest)
            }
            // No repair row: unrepaired, unless it is no entity (only the fence wrote there),
            // which has nothing to repair.
            Ok(None) => {
                !self.config.guards.phantom_partitions_are_entities
                    && self
                        .is_registered(entity)
                        .is_ok_and(|registered| !registered)
            }
            Err(_) => false,
        }
    }

    /// Test-only negative control: an entity without a slot counts as repaired without its
    /// row being read.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_repairs_assumed(&self, assumed: bool) {
        self.residency
            .repairs_assumed
            .store(assumed, Ordering::Relaxed);
    }

    /// Test-only negative control: remove slots whatever they hold (a toucher's or a waiter's
    /// use, a deferral in flight, a containment).
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
