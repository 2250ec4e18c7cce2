//! The per-entity gate: exactly one restore unit per entity per process (SPEC R2), with every
//! concurrent toucher parked on a condvar until it finishes, and an explicit damage flag so an
//! unwinding thread can never leave the gate looking healthy (SPEC R5).
//!
//! ```text
//!            claim                 unit succeeds
//! Pending ------------> Running ------------------> Restored
//!    ^                   |   |   unit refuses
//!    |  release          |   '--------------------> Contained(reason)
//!    +-------------------+------------------------------'  |
//!    |                   |   thread unwinds without         |
//!    |  release          v   recording an outcome           |
//!    '-------------- Damaged (fail closed) <----------------'
//! ```
//! (`release` moves Contained or Damaged back to Pending; nothing else ever goes back.)

use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::sync::{Condvar, Mutex, MutexGuard};

use super::containment::Containment;

/// Where an entity's restore stands.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    /// Not restored in this process; the first toucher runs the unit once no deferral is
    /// being written (`deferring` rows are in flight, written without the gate's mutex).
    Pending { deferring: u32 },
    /// A unit runs on the thread with token `by`; everyone else waits.
    Running { by: u64 },
    /// Restored; the state is in the slot.
    Restored,
    /// The unit refused; every toucher gets this reason until an operator releases it.
    Contained(Arc<Containment>),
    /// A thread unwound while it owned the gate: nobody can tell what happened (SPEC R5).
    Damaged,
}

/// A mutex-protected phase and the condvar touchers wait on.
#[derive(Debug)]
pub(crate) struct Gate {
    phase: Mutex<Phase>,
    changed: Condvar,
    /// Threads parked on `changed` right now (observability, and lets tests know a herd has
    /// formed without sleeping).
    waiters: AtomicUsize,
    /// The token of the thread running the unit (0: none). Mirrors `Running { by }`, readable
    /// without the mutex, so the wait-for graph can tell a live edge from a stale one.
    runner: AtomicU64,
}

/// A phase with no deferral in flight.
pub(crate) const PENDING: Phase = Phase::Pending { deferring: 0 };

impl Gate {
    pub(crate) fn new(phase: Phase) -> Self {
        Gate {
            phase: Mutex::new(phase),
            changed: Condvar::new(),
            waiters: AtomicUsize::new(0),
            runner: AtomicU64::new(0),
        }
    }

    /// The token of the thread running this entity's unit right now (0: none).
    pub(crate) fn runner(&self) -> u64 {
        self.runner.load(Ordering::Acquire)
    }

    /// Claims a pending gate for the thread with token `by` (the caller holds the mutex).
    pub(crate) fn claim(&self, phase: &mut Phase, by: u64) {
        *phase = Phase::Running { by };
        self.runner.store(by, Ordering::Release);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock()
    }

    /// Waits for the phase to change (spurious wakeups are fine: callers loop).
    pub(crate) fn wait(&self, guard: &mut MutexGuard<'_, Phase>) {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        self.changed.wait(guard);
        self.waiters.fetch_sub(1, Ordering::AcqRel);
    }

    /// Threads waiting on this gate right now.
    pub(crate) fn waiters(&self) -> usize {
        self.waiters.load(Ordering::Acquire)
    }

    /// Sets the phase and wakes every waiter.
    pub(crate) fn set(&self, phase: Phase) {
        let mut guard = self.phase.lock();
        *guard = phase;
        drop(guard);
        self.changed.notify_all();
    }

    /// Wakes every waiter without changing the phase (a stop began: they must re-check).
    pub(crate) fn nudge(&self) {
        let _guard = self.phase.lock();
        self.changed.notify_all();
    }
}

/// Owned by the thread that claimed a gate. If that thread unwinds before recording an outcome,
/// the drop marks the gate [`Phase::Damaged`] and wakes the waiters, who then refuse instead of
/// waiting forever or starting a second replay (SPEC R5).
pub(crate) struct Claim<'a> {
    gate: &'a Gate,
    by: u64,
    settled: bool,
}

impl<'a> Claim<'a> {
    pub(crate) fn new(gate: &'a Gate, by: u64) -> Self {
        Claim {
            gate,
            by,
            settled: false,
        }
    }

    /// Records the outcome and wakes the waiters. Only a gate still `Running` on this claim is
    /// settled: an outcome recorded meanwhile by someone else (a containment) is never
    /// overwritten, so a unit can never mark restored an entity contained under it (SPEC R4).
    /// Returns the phase the gate ends in.
    pub(crate) fn settle(mut self, outcome: Phase) -> Phase {
        self.settled = true;
        let mut phase = self.gate.phase.lock();
        self.gate.runner.store(0, Ordering::Release);
        if matches!(*phase, Phase::Running { by } if by == self.by) {
            *phase = outcome;
        }
        let settled = phase.clone();
        drop(phase);
        self.gate.changed.notify_all();
        settled
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.settled {
            ::log::warn!(
                "a thread unwound while owning a restore gate (panicking: {}); the entity is refused until released",
                std::thread::panicking()
            );
            self.gate.runner.store(0, Ordering::Release);
            self.gate.set(Phase::Damaged);
        }
    }
}
