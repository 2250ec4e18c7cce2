//! SPEC F7 as a property over random interleavings, driving the real implementation (not a
//! model): planned writes, renewals, bumps, pushes and acknowledgements as separate steps,
//! applies, revocation slices, sweeps, clock advances and store-clock skew. Checked: once a
//! slice reports `Complete` for epoch n, no write planned under an epoch below n commits, and
//! no entity's lease is still usable below n.
//!
//! Negative controls run the same checker with one thing broken and must find a violation:
//! skew beyond the margin, acknowledging before pushing, and the lease guard removed; on a
//! store without deadlines, an expired row treated as done without a push and a sweep that
//! does not retire the lease. On such a store F7 also holds with any skew.

mod fence_support;

use fence_support::*;
use portcullis::Error;
use portcullis::fence::{
    FenceConfig, GuardSwitches, PendingAck, PlannedWrite, RevokeBudget, RevokeProgress,
    WriteOutcome,
};
use portcullis::store::Batch;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const ENTITIES: usize = 2;

#[derive(Clone, Debug)]
enum Step {
    /// Plan a write under the current epoch minus `lag`, and hold it before apply.
    PlanWrite { entity: usize, lag: u64 },
    /// Apply one held write.
    Apply { slot: usize },
    /// A complete write under the current epoch (renews the lease when needed).
    Renew { entity: usize },
    /// Advance the epoch by one.
    Bump,
    /// The push half of a revocation for one entity, acknowledgement held.
    Push { entity: usize },
    /// Acknowledge one held push.
    Acknowledge { slot: usize },
    /// One whole revocation slice.
    Revoke,
    /// One sweep step.
    Sweep,
    /// Advance both clocks.
    Advance { ms: u64 },
    /// Set the store clock's skew against the planner's.
    Skew { ms: i64 },
}

fn step(max_skew: i64) -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..ENTITIES, 0..2u64).prop_map(|(entity, lag)| Step::PlanWrite { entity, lag }),
        3 => any::<usize>().prop_map(|slot| Step::Apply { slot }),
        2 => (0..ENTITIES).prop_map(|entity| Step::Renew { entity }),
        2 => Just(Step::Bump),
        2 => (0..ENTITIES).prop_map(|entity| Step::Push { entity }),
        2 => any::<usize>().prop_map(|slot| Step::Acknowledge { slot }),
        3 => Just(Step::Revoke),
        1 => Just(Step::Sweep),
        3 => (0..12_000u64).prop_map(|ms| Step::Advance { ms }),
        1 => (-max_skew..=max_skew).prop_map(|ms| Step::Skew { ms }),
    ]
}

fn schedules(max_skew: i64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(max_skew), 1..40)
}

fn put(n: usize) -> Batch {
    Batch::new().put(format!("w{n}").into_bytes(), b"v".to_vec())
}

/// Only these refusals are expected along the way; anything else fails the case.
fn expected(err: &Error) -> bool {
    matches!(
        err,
        Error::Fenced { .. } | Error::Unavailable { .. } | Error::InvalidArgument(_)
    )
}

/// Which backends a lane runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    /// Every backend of `backends()`.
    Every,
    /// Only the backends without server-side deadlines (SPEC S11).
    DeadlineLess,
    /// Only the backend of this name; the others' stores are not even made (a file store's
    /// creation and close sync the directory, which dominates a long lane's time).
    Only(&'static str),
}

/// Runs one schedule against the real fence on the lane's backends; `Err` describes a
/// violation.
fn run(steps: &[Step], switches: GuardSwitches, lane: Lane) -> Result<(), TestCaseError> {
    for (name, factory) in backends() {
        if matches!(lane, Lane::Only(only) if only != name) {
            continue;
        }
        let env = Env::new(name, factory, FenceConfig::default());
        let skip = match lane {
            Lane::Every | Lane::Only(_) => false,
            Lane::DeadlineLess => env.deadlines(),
        };
        if skip {
            continue;
        }
        env.fence.set_guard_switches(switches);
        run_on(&env, steps)?;
    }
    Ok(())
}

fn run_on(env: &Env, steps: &[Step]) -> Result<(), TestCaseError> {
    let ns = env.ns();
    let entities: Vec<_> = (0..ENTITIES)
        .map(|i| env.entity(&format!("e{i}")))
        .collect();
    let mut held_writes: Vec<(PlannedWrite, u64)> = Vec::new();
    let mut held_acks: Vec<PendingAck> = Vec::new();
    let mut completed = 0u64; // the highest epoch a slice reported Complete for
    let mut writes = 0usize;
    let unexpected = |what: &str, e: Error| TestCaseError::fail(format!("{what}: unexpected {e}"));
    let check_commit = |grant: u64, completed: u64, what: &str| {
        if grant < completed {
            Err(TestCaseError::fail(format!(
                "F7 violated: {what} planned under epoch {grant} committed after Complete for {completed}"
            )))
        } else {
            Ok(())
        }
    };
    for step in steps {
        match *step {
            Step::PlanWrite { entity, lag } => {
                let current = env.fence.current_epoch(&ns).unwrap();
                let grant = current.saturating_sub(lag);
                writes += 1;
                match env
                    .fence
                    .plan_write_once(&entities[entity], grant, put(writes))
                {
                    Ok(Some(planned)) => held_writes.push((planned, grant)),
                    Ok(None) => {}
                    Err(e) if expected(&e) => {}
                    Err(e) => return Err(unexpected("plan", e)),
                }
            }
            Step::Apply { slot } => {
                if held_writes.is_empty() {
                    continue;
                }
                let (planned, grant) = held_writes.remove(slot % held_writes.len());
                match planned.apply() {
                    Ok(Some(WriteOutcome::Committed { .. })) => {
                        check_commit(grant, completed, "a held write")?
                    }
                    Ok(_) => {}
                    Err(e) => return Err(unexpected("apply", e)),
                }
            }
            Step::Renew { entity } => {
                let grant = env.fence.current_epoch(&ns).unwrap();
                writes += 1;
                match env.fence.write(&entities[entity], grant, put(writes)) {
                    Ok(WriteOutcome::Committed { .. }) => {
                        check_commit(grant, completed, "a write")?
                    }
                    Ok(_) => {}
                    Err(e) if expected(&e) => {}
                    Err(e) => return Err(unexpected("write", e)),
                }
            }
            Step::Bump => {
                env.fence.advance_epoch(&ns, 1).unwrap();
            }
            Step::Push { entity } => {
                if let Some(pending) = env.fence.push_without_ack(&entities[entity]).unwrap() {
                    held_acks.push(pending);
                }
            }
            Step::Acknowledge { slot } => {
                if held_acks.is_empty() {
                    continue;
                }
                let pending = held_acks.remove(slot % held_acks.len());
                let _ = env.fence.acknowledge_pushed(&pending).unwrap();
            }
            Step::Revoke => {
                let progress = env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap();
                if progress == RevokeProgress::Complete {
                    let epoch = env.fence.current_epoch(&ns).unwrap();
                    completed = completed.max(epoch);
                    for e in &entities {
                        if env.lease_usable_below(e, epoch) {
                            return Err(TestCaseError::fail(format!(
                                "F7 violated: Complete for {epoch} while {e}'s lease {:?} is usable",
                                env.lease(e)
                            )));
                        }
                    }
                }
            }
            Step::Sweep => {
                env.fence.sweep_step(&ns).unwrap();
            }
            Step::Advance { ms } => env.clock.advance(ms),
            Step::Skew { ms } => env.skew_store_clock(ms),
        }
    }
    Ok(())
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// The largest skew the safe lanes use: strictly below the margin (SPEC F header).
const SAFE_SKEW: i64 = 4_999;

fn safe_lane(cases: u32) {
    safe_lane_on(cases, Lane::Every)
}

fn safe_lane_on(cases: u32, lane: Lane) {
    if let Lane::Only(only) = lane {
        assert!(
            backends().iter().any(|(name, _)| *name == only),
            "no fencing backend is named {only:?} here (long lanes run on the in-process backends, \
             not with PORTCULLIS_FENCE_BACKEND=etcd)"
        );
    }
    let result = runner(cases).run(&schedules(SAFE_SKEW), |steps| {
        run(&steps, GuardSwitches::default(), lane)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The default lane's cases: 1,000, or 200 on a real etcd (every step is a durable etcd
/// transaction).
fn default_cases() -> u32 {
    if on_etcd() { 200 } else { 1_000 }
}

#[test]
fn f7_no_write_planned_under_an_older_epoch_commits_after_complete() {
    safe_lane(default_cases());
}

/// The long lanes. Each case makes a fresh store; a file store's creation and close make
/// about 17 directory and file syncs even under `NeverSyncMayLoseRecent`, so 100,000 cases on
/// it took most of 950 s on a machine with slow syncs. The file store takes 10,000 cases, the
/// in-memory stores the rest of CI's budget.
#[test]
#[ignore = "long lane: 100,000 cases on the in-memory store with deadlines"]
fn f7_long_lane() {
    safe_lane_on(100_000, Lane::Only("memory"));
}

#[test]
#[ignore = "long lane: 10,000 cases on the file store"]
fn f7_long_lane_on_the_file_store() {
    safe_lane_on(10_000, Lane::Only("file"));
}

#[test]
#[ignore = "long lane: 10,000 cases on the store without deadlines"]
fn f7_long_lane_without_deadlines() {
    safe_lane_on(10_000, Lane::Only("memory-no-deadlines"));
}

/// Without server-side deadlines F7 rests on overwritten leases alone, never on a clock: it
/// holds even with the store's clock skewed far beyond the margin.
#[test]
fn f7_without_deadlines_holds_whatever_the_skew() {
    let result = runner(default_cases()).run(&schedules(20_000), |steps| {
        run(&steps, GuardSwitches::default(), Lane::DeadlineLess)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A negative control: with `switches` (or an unsafe skew), the checker must find a violation.
fn must_find_violation(max_skew: i64, switches: GuardSwitches) {
    must_find_violation_on(max_skew, switches, Lane::Every)
}

fn must_find_violation_on(max_skew: i64, switches: GuardSwitches, lane: Lane) {
    if on_etcd() {
        // The controls check the checker, not the backend; 20,000 cases are for in-process
        // stores.
        return;
    }
    let config = Config {
        cases: 20_000,
        failure_persistence: None,
        max_shrink_iters: 0,
        ..Config::default()
    };
    // A fixed seed: a control must find its violation on every run, not on most.
    let rng = proptest::test_runner::TestRng::deterministic_rng(config.rng_algorithm);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&schedules(max_skew), |steps| run(&steps, switches, lane));
    match result {
        Err(proptest::test_runner::TestError::Fail(reason, _)) => {
            assert!(reason.to_string().contains("F7 violated"), "{reason}");
        }
        other => panic!("the checker found no violation: {other:?}"),
    }
}

#[test]
fn negative_control_skew_beyond_the_margin_is_caught() {
    must_find_violation(20_000, GuardSwitches::default());
}

#[test]
fn negative_control_acknowledge_before_push_is_caught() {
    must_find_violation(
        SAFE_SKEW,
        GuardSwitches {
            ack_before_push: true,
            ..GuardSwitches::default()
        },
    );
}

#[test]
fn negative_control_removed_lease_guard_is_caught() {
    must_find_violation(
        SAFE_SKEW,
        GuardSwitches {
            drop_lease_guard: true,
            ..GuardSwitches::default()
        },
    );
}

// Without deadlines, two of the four rules of `deadline_less.rs` have negative controls here;
// the other two (a sweep over an absent lease, a renewal of an expired row) need longer
// schedules than random search finds in a bounded time, and have fixed schedules as their
// negative controls in `tests/fence_deadline_less.rs`.

#[test]
fn negative_control_without_deadlines_an_expired_row_done_without_a_push_is_caught() {
    must_find_violation_on(
        SAFE_SKEW,
        GuardSwitches {
            expired_row_done_without_push: true,
            ..GuardSwitches::default()
        },
        Lane::DeadlineLess,
    );
}

#[test]
fn negative_control_without_deadlines_a_sweep_that_does_not_retire_the_lease_is_caught() {
    must_find_violation_on(
        SAFE_SKEW,
        GuardSwitches {
            sweep_without_retiring_lease: true,
            ..GuardSwitches::default()
        },
        Lane::DeadlineLess,
    );
}
