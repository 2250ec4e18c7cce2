//! Test-only fault hooks and guard switches.
//!
//! Public only with the cargo feature `test-hooks` (the crate's own tests enable it); without
//! it the fence never calls a hook and every guard is in place. Tests use them to pause a step
//! at a named point (with barriers or channels, never sleeps) and to remove one guard at a
//! time, so negative controls can show that the checks would catch a broken protocol. With the
//! defaults nothing changes.

#[cfg(feature = "test-hooks")]
use crate::entity::EntityId;

/// A named point in the protocol where a test may pause or observe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookPoint {
    /// A write has planned its batch and is about to apply it to the entity.
    WriteBeforeApply,
    /// A renewal has read the coordinator and is about to commit the leased-shard row.
    RenewalBeforeRow,
    /// A renewal has committed the leased-shard row and not yet written the entity's lease.
    RenewalAfterRow,
    /// A push is about to read the entity's lease (the slice has already read the row).
    PushBeforeLeaseRead,
    /// A push has read the entity's lease and is about to write it.
    PushBeforeLeaseWrite,
    /// A push has committed the entity's lease and not yet acknowledged it.
    PushBeforeAck,
    /// A revocation slice is about to write its checkpoint (and decide completion).
    SliceBeforeCheckpoint,
    /// The sweeper has found an expired row and is about to delete it.
    SweepBeforeDelete,
}

/// Called by the fence at every [`HookPoint`]. The default does nothing.
#[cfg(feature = "test-hooks")]
pub trait FenceHooks: Send + Sync + std::fmt::Debug {
    /// The fence reached `point` (for `entity`, when one is involved).
    fn at(&self, point: HookPoint, entity: Option<&EntityId>);
}

/// Hooks that do nothing.
#[cfg(feature = "test-hooks")]
#[derive(Debug, Default)]
pub struct NoHooks;

#[cfg(feature = "test-hooks")]
impl FenceHooks for NoHooks {
    fn at(&self, _point: HookPoint, _entity: Option<&EntityId>) {}
}

/// Switches that remove one guard each, for negative controls and teeth checks. Every field
/// defaults to `false` (all guards in place). Never set them outside tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardSwitches {
    /// Drop the `Equals` guard on the entity's lease from fenced writes (SPEC F3).
    pub drop_lease_guard: bool,
    /// Drop the `NotAfter` deadline from fenced writes (SPEC F3); an engine's writes then
    /// carry no owner-lease deadline either (SPEC F12).
    pub drop_deadline: bool,
    /// Acknowledge a row before (and without) pushing the entity's lease (SPEC F4).
    pub ack_before_push: bool,
    /// Drop the guard on the row as read from acknowledgements (SPEC F4).
    pub drop_ack_row_guard: bool,
    /// Ignore the recovery hold-off when deciding completion (SPEC F6).
    pub ignore_recovery_hold_off: bool,
    /// On a store without deadlines, treat an expired leased-shard row as done without
    /// pushing to its entity, as a store with deadlines may (SPEC S11, F7).
    pub expired_row_done_without_push: bool,
    /// On a store without deadlines, let the sweeper delete an expired row without first
    /// retiring the entity's lease (SPEC S11, F9).
    pub sweep_without_retiring_lease: bool,
    /// On a store without deadlines, let the sweeper retire a lease only when one is present,
    /// not over an absent one (SPEC S11, F9).
    pub retire_only_present_leases: bool,
    /// On a store without deadlines, let a renewal of an expired row acknowledge it at the
    /// current epoch, as a store with deadlines may (SPEC S11, F2).
    pub renewal_acks_expired_row: bool,
    /// Write the recovery marker as `now`, unguarded, even when it moves the marker backwards
    /// (a lagging clock, or a racing mark) (SPEC F6).
    pub unguarded_recovery_marker: bool,
}
