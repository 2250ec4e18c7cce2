//! Fencing on a store without server-side deadlines (SPEC S11, F7), such as etcd: fenced
//! writes carry no `NotAfter`, so an expiry proves nothing and only an overwritten lease stops
//! a held write. Each schedule holds a write planned under epoch 0 before its apply, lets its
//! lease expire, bumps, revokes to `Complete`, then releases the write: it must not commit.
//! Each rule has a negative control: with its guard switch set, the same schedule commits the
//! held write after `Complete` (the violation is found).
//!
//! The rules with deadlines have their own tests (`fence_rules.rs`, `fence_schedules.rs`); the
//! fencing property test runs on a deadline-less store too (`fence_property.rs`).

mod fence_support;

use fence_support::*;
use portcullis::fence::{GuardSwitches, PlannedWrite, WriteOutcome};
use portcullis::store::Batch;

fn put(key: &str) -> Batch {
    Batch::new().put(key.as_bytes().to_vec(), b"v".to_vec())
}

fn committed(outcome: WriteOutcome) {
    assert!(
        matches!(outcome, WriteOutcome::Committed { .. }),
        "{outcome:?}"
    );
}

/// Plans a write under epoch 0 to `e` and holds it before its apply.
fn hold(env: &Env, e: &portcullis::EntityId, key: &str) -> PlannedWrite {
    env.fence
        .plan_write_once(e, 0, put(key))
        .unwrap()
        .expect("the write was planned")
}

/// Releases `held` after a `Complete` for epoch 1: whether it committed (an F7 violation).
fn committed_after_complete(env: &Env, held: PlannedWrite, key: &str) -> bool {
    let e = env.entity("a");
    let outcome = held.apply().unwrap();
    let landed = env.store.get(&e.partition(), key.as_bytes()).unwrap();
    assert_eq!(
        matches!(outcome, Some(WriteOutcome::Committed { .. })),
        landed.is_some()
    );
    landed.is_some()
}

/// The lease has expired and nobody swept its row; revocation must still push to it.
fn expired_row_schedule(env: &Env) -> bool {
    let (ns, e) = (env.ns(), env.entity("a"));
    committed(env.fence.write(&e, 0, put("k")).unwrap());
    let held = hold(env, &e, "late");
    env.fence.bump_epoch(&ns, 1).unwrap();
    env.clock.advance(40_000); // the row and the lease have expired
    revoke_to_complete(env, 5);
    committed_after_complete(env, held, "late")
}

/// The sweeper deletes the expired row; it must retire the lease first.
fn swept_row_schedule(env: &Env) -> bool {
    let (ns, e) = (env.ns(), env.entity("a"));
    committed(env.fence.write(&e, 0, put("k")).unwrap());
    let held = hold(env, &e, "late");
    env.clock.advance(40_000);
    assert_eq!(env.fence.sweep_step(&ns).unwrap().deleted, 1);
    assert!(env.shard_row(&e).is_none());
    env.fence.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(env, 1);
    committed_after_complete(env, held, "late")
}

/// The held write is a renewal of an entity with no lease (its row committed, its entity
/// batch guarded on the lease being absent); the sweeper must retire the absent lease too.
fn swept_absent_lease_schedule(env: &Env) -> bool {
    let (ns, e) = (env.ns(), env.entity("a"));
    let held = hold(env, &e, "late");
    assert!(env.lease(&e).is_none() && env.shard_row(&e).is_some());
    env.clock.advance(40_000);
    assert_eq!(env.fence.sweep_step(&ns).unwrap().deleted, 1);
    env.fence.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(env, 1);
    committed_after_complete(env, held, "late")
}

/// A renewal under the new epoch replaces the expired row; it must keep the row's
/// acknowledgement (0), so revocation still pushes to the entity.
fn renewed_expired_row_schedule(env: &Env) -> bool {
    let (ns, e) = (env.ns(), env.entity("a"));
    committed(env.fence.write(&e, 0, put("k")).unwrap());
    let held = hold(env, &e, "late");
    env.clock.advance(40_000);
    env.fence.bump_epoch(&ns, 1).unwrap();
    // The renewal's row commits; its entity batch is held too.
    let renewal = env
        .fence
        .plan_write_once(&e, 1, put("fresh"))
        .unwrap()
        .expect("the renewal was planned");
    assert_eq!(env.shard_row(&e).unwrap().epoch, 1);
    revoke_to_complete(env, 5);
    let violated = committed_after_complete(env, held, "late");
    drop(renewal);
    violated
}

type Schedule = fn(&Env) -> bool;

const SCHEDULES: [(&str, Schedule); 4] = [
    ("expired row", expired_row_schedule),
    ("swept row", swept_row_schedule),
    ("swept row of an absent lease", swept_absent_lease_schedule),
    ("renewed expired row", renewed_expired_row_schedule),
];

#[test]
fn a_fenced_write_on_a_store_without_deadlines_commits_and_carries_no_deadline() {
    each_deadline_less_backend(|env| {
        let e = env.entity("a");
        let mut deadlines = Vec::new();
        let outcome = env
            .fence
            .write_with(&e, 0, |plan| {
                deadlines.push(plan.deadline_ms);
                Some(put("k"))
            })
            .unwrap();
        committed(outcome);
        assert_eq!(deadlines, [u64::MAX], "no NotAfter on such a store");
        // A usable lease: the next write costs 2 store calls, as with deadlines.
        let before = env.fence.stats().store_calls;
        committed(env.fence.write(&e, 0, put("k2")).unwrap());
        assert_eq!(env.fence.stats().store_calls - before, 2);
    });
}

#[test]
fn no_held_write_commits_after_complete_without_deadlines() {
    for (name, schedule) in SCHEDULES {
        each_deadline_less_backend(|env| {
            assert!(!schedule(env), "{name} on {}: F7 violated", env.name);
        });
    }
}

#[test]
fn a_pushed_lease_is_never_usable_so_the_next_write_renews() {
    each_deadline_less_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        env.fence.bump_epoch(&ns, 1).unwrap();
        revoke_to_complete(env, 2);
        let lease = env.lease(&e).unwrap();
        assert_eq!((lease.epoch, lease.expires_at_ms), (1, 0));
        assert_eq!(env.shard_row(&e).unwrap().acked_epoch, 1);
        let renewals = env.fence.stats().renewals;
        committed(env.fence.write(&e, 1, put("k2")).unwrap());
        assert_eq!(env.fence.stats().renewals, renewals + 1);
        let row = env.shard_row(&e).unwrap();
        assert_eq!(
            (row.epoch, row.acked_epoch),
            (1, 1),
            "the renewal kept the ack"
        );
    });
}

#[test]
fn the_sweeper_retires_a_lease_with_a_never_usable_value_before_deleting_its_row() {
    each_deadline_less_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let before = env.lease(&e).unwrap();
        env.clock.advance(30_000);
        assert_eq!(env.fence.sweep_step(&ns).unwrap().deleted, 1);
        let retired = env.lease(&e).unwrap();
        assert_eq!((retired.epoch, retired.expires_at_ms), (0, 0));
        assert_ne!(retired.grant_id, before.grant_id);
        // A later write renews from nothing and commits.
        committed(env.fence.write(&e, 0, put("k2")).unwrap());
        assert_eq!(env.shard_row(&e).unwrap().acked_epoch, 0);
    });
}

/// Runs `schedule` with one guard removed: the held write must commit after `Complete`.
fn must_violate(schedule: Schedule, switches: GuardSwitches) {
    each_deadline_less_backend(|env| {
        env.fence.set_guard_switches(switches);
        assert!(
            schedule(env),
            "the schedule found no violation with {switches:?} on {}",
            env.name
        );
    });
}

#[test]
fn negative_control_an_expired_row_done_without_a_push_is_caught() {
    must_violate(
        expired_row_schedule,
        GuardSwitches {
            expired_row_done_without_push: true,
            ..GuardSwitches::default()
        },
    );
}

#[test]
fn negative_control_a_sweep_that_does_not_retire_the_lease_is_caught() {
    must_violate(
        swept_row_schedule,
        GuardSwitches {
            sweep_without_retiring_lease: true,
            ..GuardSwitches::default()
        },
    );
}

#[test]
fn negative_control_a_sweep_that_skips_an_absent_lease_is_caught() {
    must_violate(
        swept_absent_lease_schedule,
        GuardSwitches {
            retire_only_present_leases: true,
            ..GuardSwitches::default()
        },
    );
}

#[test]
fn negative_control_a_renewal_that_acknowledges_an_expired_row_is_caught() {
    must_violate(
        renewed_expired_row_schedule,
        GuardSwitches {
            renewal_acks_expired_row: true,
            ..GuardSwitches::default()
        },
    );
}
