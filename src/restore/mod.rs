//! Lazy restore (SPEC R1-R9).
//!
//! Owns: the registry of entities ([`Restorer`]), the pending set with one gate per entity
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
//!   toucher, until [`Restorer::release`] (R4);
//! - a thread that unwinds while owning a gate leaves the entity refused, never silently
//!   re-replayed (R5);
//! - the warm runs with bounded parallelism and can be waited on or stopped (R6);
//! - deferred work is durable when accepted and applied inside the unit (R8);
//! - one info line per restored entity, one warn per refusal, a summary per warm (R9).
//!
//! The full state machine and lock order are in `docs/restore.md`.

mod containment;
mod defer;
mod gate;
pub mod keys;
mod machine;
mod registry;
mod restoring;
mod telemetry;
mod unit;
mod waits;
mod warm;

pub use containment::{Containment, ReasonKind};
pub use machine::{ApplyContext, Origin, Rejection, StateMachine};
pub use registry::{Deferral, PhaseCounts, Restorer, Slot};
pub(crate) use restoring::Mark as CallMark;
pub use telemetry::Metrics;
pub use unit::{Loaded, UnitReport};
pub(crate) use warm::start as start_warm;
pub use warm::{REFUSED_NAMED, Warm, WarmProgress};

/// What the restore unit needs to know about this incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreConfig {
    /// A checkpoint is owed when a unit folds more records than this (SPEC R3).
    pub checkpoint_tail_bound: u64,
    /// This incarnation's number (1, 2, 3 ...).
    pub incarnation: u64,
    /// The previous incarnation, if it ended without a clean shutdown: the unit then runs the
    /// application's repair for it (SPEC R3).
    pub unclean_previous: Option<u64>,
}
