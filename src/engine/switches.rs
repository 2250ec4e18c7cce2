//! Test-only guard switches of ownership and owner liveness (SPEC F12): each turns one guard
//! off, so a test can show it catches the guard's removal (a negative control, listed in the
//! teeth table of docs/fencing.md). Public only with the cargo feature `test-hooks`, set with
//! `EngineBuilder::owner_switches_for_test`; without the feature every switch is off.

/// Which ownership guards are off (all on by default). Test-only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnerSwitches {
    /// Adoption on first use takes a namespace from another owner whose row is at an epoch
    /// below the current one, with no proof of completion (as before SPEC F12).
    pub first_use_takes_over: bool,
    /// An explicit adoption takes a namespace from another owner without proof that revocation
    /// completed at the current epoch.
    pub adopt_without_completion: bool,
    /// The adoption's owner-row write is not guarded on the coordinator rows the completion
    /// proof was read from.
    pub unguarded_proof: bool,
    /// The warm and `fold_all` touch the entities of every namespace, served or not.
    pub touch_foreign_namespaces: bool,
    /// An engine opens with the owner id of a live incarnation (taking it for crashed).
    pub ignore_live_incarnation: bool,
    /// `take_over` takes a namespace from a live holder without `force`.
    pub take_over_ignores_liveness: bool,
    /// An engine keeps serving after its lease lapsed, without renewing first.
    pub ignore_lease_expiry: bool,
    /// A renewal does not re-read the epochs and owner rows of the namespaces held.
    pub skip_held_recheck: bool,
    /// A renewal writes the lease without checking the incarnation row is still this one's.
    pub unguarded_renewal: bool,
    /// The `deferred` metrics hook runs while its deferral still counts in the entity's gate
    /// (SPEC R11), so a hook that touches that entity waits for itself.
    pub deferred_hook_under_gate: bool,
    /// State restored under an earlier holding of a namespace is installed and served after
    /// the namespace was adopted again (SPEC F11): a restore unit that spans a re-adoption
    /// installs stale state, its owed repairs counted done.
    pub stale_holding_served: bool,
    /// A re-adoption forgets the state restored under the old holding while it still holds the
    /// `adopting` mutex, waiting for each entity's state lock (as before), so a closure that
    /// adopts another namespace (a first use, `verify_checkpoint`) closes a cycle.
    pub readopt_under_adopting: bool,
    /// A revocation push restores a pending entity inside the slice (or waits there for the
    /// unit another thread runs), as before, so a slice is as long as a restore (SPEC F4).
    pub revocation_restores_inline: bool,
    /// A warm worker never yields to other work queued on the engine's pool between entities,
    /// so a background revocation waits for the whole warm when `pool_threads <=
    /// warm_parallelism` (SPEC F9, R6).
    pub warm_never_yields: bool,
    /// The engine's background thread is not started again once it died (SPEC R11): its
    /// duties (owner lease renewals, sweeps, the background warm) stop for good, unnoticed
    /// but for the log.
    pub background_death_unwatched: bool,
    /// Close does not stop the engine's background thread, which keeps holding the owners, the
    /// sweeper and through them the store (SPEC R11).
    pub close_leaves_background: bool,
    /// A write whose answer was lost is taken for not committed when the log's head is
    /// unchanged, without sealing the log (as before), so a delayed copy of it can still commit
    /// (SPEC F12).
    pub unsealed_settlement: bool,
    /// `release` runs a contained entity's state destructor under the entity's locks (SPEC
    /// R11).
    pub drop_state_under_locks: bool,
    /// Close reads the repair row of every entity of a namespace that owes repairs, however
    /// long that takes (SPEC R11: close is not bounded).
    pub unbounded_repair_check: bool,
    /// A restore unit drains deferred work again only after a repair (as before), so work
    /// deferred to the entity from inside its unit after its last drain (by the checkpoint's
    /// encoding, or the `entity_restored` hook) is left undrained (SPEC R3, R8).
    pub late_deferrals_undrained: bool,
    /// A deferred or repair record appended but not known folded (a crash, a retried unit)
    /// comes back as `Origin::Replay` (as before), so its side effects never happen (SPEC R3,
    /// R8).
    pub first_use_origin_forgotten: bool,
    /// Any entity partition is an entity, registration marker or not (as before), so a lease
    /// the fence writes for an entity never registered makes a phantom one (SPEC R1).
    pub phantom_partitions_are_entities: bool,
    /// A write whose answer was lost and whose settlement finds the log moved is taken for
    /// damage (the entity contained, as before) even when the namespace's next holder moved
    /// it after a take-over fenced this engine (SPEC F11, F12).
    pub settle_contains_deposed: bool,
    /// Close waits for the warm, the drivers, the background thread and calls in flight
    /// without its deadline, as if `close_timeout` were endless (SPEC R11: close is not
    /// bounded). Not a defect fixed earlier: the negative control of the simulator's
    /// bounded-wait check.
    pub close_waits_unbounded: bool,
}

impl OwnerSwitches {
    /// The switches the restore layer reads.
    pub(crate) fn restore_guards(&self) -> crate::restore::Guards {
        crate::restore::Guards {
            deferred_hook_under_gate: self.deferred_hook_under_gate,
            stale_holding_served: self.stale_holding_served,
            warm_never_yields: self.warm_never_yields,
            unsealed_settlement: self.unsealed_settlement,
            drop_state_under_locks: self.drop_state_under_locks,
            late_deferrals_undrained: self.late_deferrals_undrained,
            first_use_origin_forgotten: self.first_use_origin_forgotten,
            phantom_partitions_are_entities: self.phantom_partitions_are_entities,
        }
    }
}
