//! Lazy restore (SPEC R1-R10).
//!
//! Owns: the registry of entities (`Restorer`), the pending set with one gate per entity
//! (`Pending -> Running -> Restored | Contained`, plus a fail-closed `Damaged`), the restore
//! unit (checkpoint, tail replay, deferred work, unclean-restart repair, owed checkpoint),
//! containment with named reasons ([`Containment`]), the background [`Warm`], and telemetry
//! ([`Metrics`]). It calls only [`log`](crate::log) and the [`Store`](crate::store::Store).
//!
//! Guarantees, with the SPEC ids they meet:
//! - opening records entities as pending from partition names alone (R1);
//! - the first touch of a pending entity runs its unit, at most once per process; concurrent
//!   touches wait on that entity's gate only and share its outcome (R2);
//! - code inside a unit that touches its own entity is answered at once, never deadlocked
//!   (R3); a touch that would wait for something its own thread holds (a state lock, its own
//!   unit) or close a cycle of units waiting for each other is refused with
//!   [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) (R11);
//! - a refusing unit contains only its entity, with the same named refusal for every later
//!   toucher, until [`Engine::release`](crate::Engine::release) (R4);
//! - a thread that unwinds while owning a gate leaves the entity refused, never silently
//!   re-replayed (R5);
//! - the warm runs with bounded parallelism and can be waited on or stopped (R6);
//! - deferred work is durable when accepted and applied inside the unit (R8), after the
//!   state machine's `check` accepted it against the state it meets; a record it refuses is
//!   set aside, durably and visibly, never appended (R12);
//! - idle restored entities can be passivated, under a budget or on request, and restore again
//!   on their next touch, exactly once per activation (R10); an idle pending entity's slot
//!   leaves the registry, so memory follows the entities in use, not those ever touched;
//! - one info line per restored entity, one warn per refusal, a summary per warm (R9).
//!
//! The full state machine and lock order are in `docs/restore.md`.

mod containment;
mod defer;
mod fresh;
mod gate;
#[cfg(feature = "test-hooks")]
pub mod keys;
#[cfg(not(feature = "test-hooks"))]
pub(crate) mod keys;
mod machine;
mod passivate;
mod refused;
mod registry;
mod restoring;
mod retire;
mod telemetry;
mod unit;
mod waits;
mod warm;

use std::sync::Arc;

use crate::entity::Namespace;

pub use containment::{Containment, ReasonKind};
pub use machine::{ApplyContext, Origin, Rejection, StateMachine};
pub use passivate::PassivationStats;
pub(crate) use passivate::Pinned;
pub use refused::RefusedDeferral;
pub use registry::PhaseCounts;
pub(crate) use registry::{Deferral, Restorer, Slot};
pub(crate) use restoring::Mark as CallMark;
pub use telemetry::Metrics;
pub use unit::UnitReport;
pub(crate) use unit::{Loaded, Unsettled};
pub use warm::{REFUSED_NAMED, Warm, WarmProgress};
pub(crate) use warm::{WarmPlan, pending_in, start as start_warm, start_over as start_warm_over};

/// Answers, for an entity's namespace, the term of the holding the engine serves it under and
/// the terms whose holders ended without releasing it: each is owed one unclean-restart repair
/// per entity, in increasing order (SPEC R3, F11). An error means the engine does not serve the
/// namespace now; the restore is then retried later, never contained.
pub(crate) type OwedRepairs =
    Arc<dyn Fn(&Namespace) -> crate::Result<(u64, Arc<Vec<u64>>)> + Send + Sync>;

/// The term of the holding the engine serves a namespace under now, from memory (`None`: not
/// served). State restored under another term is stale (SPEC F11): it is never installed, and a
/// restored entity whose term is no longer the current one is restored again before it serves.
pub(crate) type TermNow = Arc<dyn Fn(&Namespace) -> Option<u64> + Send + Sync>;

/// Answers the term of the namespace holding a deferral is accepted under (SPEC R8, F11):
/// deferred rows are keyed by it, so rows of different owners never collide and sort in
/// acceptance order. An error means the engine does not serve the namespace now.
pub(crate) type DeferTerm = Arc<dyn Fn(&Namespace) -> crate::Result<u64> + Send + Sync>;

/// The unclean-restart repairs owed under this engine's current holding of a namespace (SPEC
/// R3, F11), from memory; never adopts. `None` when it does not serve the namespace now.
pub(crate) type OwedNow = Arc<dyn Fn(&Namespace) -> Option<Arc<Vec<u64>>> + Send + Sync>;

/// Test-only guard switches of the restore layer: each turns one guard off, so a test can show
/// it catches the guard's removal (a negative control, listed in docs/restore.md and the teeth
/// table of docs/fencing.md). Set from the engine's `OwnerSwitches`; all off outside tests.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Guards {
    /// The `deferred` metrics hook runs while the deferral still counts in the entity's gate
    /// (as before): a hook that touches the entity waits for its own deferral.
    pub(crate) deferred_hook_under_gate: bool,
    /// State restored under an earlier holding of the namespace is installed and served (as
    /// before): a unit that spans a re-adoption installs stale state.
    pub(crate) stale_holding_served: bool,
    /// A warm worker never yields to other work queued on the pool between entities (as
    /// before): a background revocation waits for the whole warm when the warm occupies every
    /// thread of the pool.
    pub(crate) warm_never_yields: bool,
    /// A restore unit after one that lost a batch's answer does not seal the log first (as
    /// before, such a unit contained the entity; with retries and no seal, a delayed copy of
    /// the lost batch could commit under the restored state).
    pub(crate) unsealed_settlement: bool,
    /// `release` drops a contained entity's state under its state lock and gate (as before),
    /// so a destructor that calls back into the engine for that entity deadlocks.
    pub(crate) drop_state_under_locks: bool,
    /// A restore unit drains again only if a repair ran (as before): work deferred to the
    /// entity from inside its unit after its last drain (by `encode_checkpoint`, a metrics
    /// hook, `apply` of a repair record with no repair... ) is left undrained.
    pub(crate) late_deferrals_undrained: bool,
    /// Records a unit appended with a first-use origin (deferred, repair) whose fold is not
    /// known to have happened are folded as `Replay` by the next unit (as before): after a
    /// crash or a retried unit their side effects never happen.
    pub(crate) first_use_origin_forgotten: bool,
    /// A partition is an entity whether or not it holds the registration marker (as before):
    /// one only the fence wrote (a lease for an entity never registered) is listed, restored and
    /// served, and cannot be registered.
    pub(crate) phantom_partitions_are_entities: bool,
}

/// What the restore unit needs to know about this incarnation.
#[derive(Clone)]
pub(crate) struct RestoreConfig {
    /// A checkpoint is owed when a unit folds more records than this (SPEC R3).
    pub checkpoint_tail_bound: u64,
    /// This incarnation's number (1, 2, 3 ...).
    pub incarnation: u64,
    /// The repairs owed to an entity's namespace; asked at the start of each unit.
    pub owed_repairs: OwedRepairs,
    /// The term deferred rows of an entity's namespace are keyed by; asked per deferral.
    pub defer_term: DeferTerm,
    /// The repairs owed under the current holding of a namespace; asked when it is released,
    /// to tell from their `\0repair` rows whether entities without a slot were repaired.
    pub owed_now: OwedNow,
    /// The engine's clock: elapsed times and the warm's waits read it (SPEC E9).
    pub clock: crate::clock::SharedClock,
    /// Where the warm tells of entities it failed to restore (SPEC E8), and delivers them.
    pub events: crate::observe::Events,
    /// The term of the current holding of a namespace; asked when a unit installs its state
    /// and when a restored entity is touched.
    pub term_now: TermNow,
    /// Test-only guard switches (all off outside tests).
    pub guards: Guards,
}

impl std::fmt::Debug for RestoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreConfig")
            .field("checkpoint_tail_bound", &self.checkpoint_tail_bound)
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    /// E2: the registry is shared by every engine thread and the warm's workers.
    #[test]
    fn e2_the_registry_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        fn for_any_machine<M: super::StateMachine>() {
            assert_send_sync::<super::Restorer<M>>();
        }
        for_any_machine::<crate::typed::Typed<Never>>();
    }

    struct Never;

    impl crate::typed::TypedMachine for Never {
        type Record = ();
        type State = ();
        fn fresh(&self, _: &crate::EntityId) {}
        fn apply(
            &self,
            _: &mut (),
            _: &super::ApplyContext<'_>,
            _: (),
        ) -> Result<(), super::Rejection> {
            Ok(())
        }
    }
}
