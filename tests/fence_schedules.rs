//! Fixed schedules (a)-(f): one interleaving each, forced with pause hooks and manual clocks,
//! never with sleeps. Each checks SPEC F7 where it applies: no `Complete` while an entity's
//! lease can still carry a write planned under an older epoch, and no such write commits.

mod fence_support;

use std::thread;
use std::time::Duration;

use fence_support::*;
use portcullis::Error;
use portcullis::fence::{
    DriverLimits, GuardSwitches, HookPoint, RevokeBudget, RevokeProgress, WriteOutcome,
};
use portcullis::store::Batch;

fn put(key: &str) -> Batch {
    Batch::new().put(key.as_bytes().to_vec(), b"v".to_vec())
}

/// Runs slices until `Complete` (at most `max`), checking after every slice that `Complete`
/// is never reported while `entity`'s lease is usable below `epoch`.
fn revoke_checking(env: &Env, entity: &portcullis::EntityId, epoch: u64, max: usize) {
    for _ in 0..max {
        let progress = env
            .fence
            .revoke_step(&env.ns(), RevokeBudget::default())
            .unwrap();
        if progress == RevokeProgress::Complete {
            assert!(
                !env.lease_usable_below(entity, epoch),
                "Complete for {epoch} while the lease of {entity} is usable below it ({:?})",
                env.lease(entity)
            );
            return;
        }
    }
    panic!("revocation did not complete in {max} slices");
}

/// (a) A write planned under epoch n is paused before apply while a bump and a revocation
/// run; released, it must not commit.
#[test]
fn schedule_a_paused_write_does_not_commit_after_revocation() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        env.fence.bump_epoch(&ns, 1).unwrap();
        assert!(matches!(
            env.fence.write(&e, 1, put("k")).unwrap(),
            WriteOutcome::Committed { .. }
        ));

        let gate = env.hooks.arm(HookPoint::WriteBeforeApply);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let paused = thread::spawn(move || fence.write(&e2, 1, put("late")));
        gate.wait_reached();
        env.fence.bump_epoch(&ns, 2).unwrap();
        revoke_checking(env, &e, 2, 10);
        gate.release();
        let err = paused.join().unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                Error::Fenced {
                    grant: 1,
                    current: 2
                }
            ),
            "{err}"
        );
        assert_eq!(env.store.get(&e.partition(), b"late").unwrap(), None);
    });
}

/// (a, renewal variant) The paused write is a renewal: its leased-shard row committed, its
/// entity batch not yet. Revocation pushes to the row; the renewal's batch then fails.
#[test]
fn schedule_a_paused_renewal_does_not_commit_after_revocation() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        env.fence.bump_epoch(&ns, 1).unwrap();
        let gate = env.hooks.arm(HookPoint::RenewalAfterRow);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let paused = thread::spawn(move || fence.write(&e2, 1, put("late")));
        gate.wait_reached();
        env.fence.bump_epoch(&ns, 2).unwrap();
        revoke_checking(env, &e, 2, 10);
        assert_eq!(
            env.lease(&e).unwrap().epoch,
            2,
            "the push wrote the absent lease"
        );
        gate.release();
        assert!(matches!(
            paused.join().unwrap(),
            Err(Error::Fenced {
                grant: 1,
                current: 2
            })
        ));
        assert_eq!(env.store.get(&e.partition(), b"late").unwrap(), None);
    });
}

/// (b) Bump; revocation paused after its push commits and before its acknowledgement; a
/// write renews the lease; the acknowledgement is released (and fails); bump again. No
/// `Complete` while the lease is usable at an old epoch, and a write planned under it fails.
#[test]
fn schedule_b_renewal_between_push_and_ack() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        assert!(matches!(
            env.fence.write(&e, 0, put("k")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        env.fence.bump_epoch(&ns, 1).unwrap();

        let ack_gate = env.hooks.arm(HookPoint::PushBeforeAck);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let slice = thread::spawn(move || fence.revoke_step(&ns2, RevokeBudget::default()));
        ack_gate.wait_reached();
        assert_eq!(env.lease(&e).unwrap().epoch, 1, "the push committed");
        env.clock.advance(25_000); // the lease's budget is short: the next write renews
        assert!(matches!(
            env.fence.write(&e, 1, put("renewed")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        ack_gate.release();
        assert!(matches!(
            slice.join().unwrap().unwrap(),
            RevokeProgress::Pending { .. }
        ));
        assert_eq!(
            env.shard_row(&e).unwrap().acked_epoch,
            0,
            "the stale acknowledgement failed"
        );

        // A write planned under epoch 1 is in flight when epoch 2 arrives.
        let write_gate = env.hooks.arm(HookPoint::WriteBeforeApply);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let in_flight = thread::spawn(move || fence.write(&e2, 1, put("late")));
        write_gate.wait_reached();
        env.fence.bump_epoch(&ns, 2).unwrap();
        revoke_checking(env, &e, 2, 10);
        write_gate.release();
        assert!(matches!(
            in_flight.join().unwrap(),
            Err(Error::Fenced {
                grant: 1,
                current: 2
            })
        ));
        assert!(matches!(
            env.fence.write(&e, 1, put("late2")),
            Err(Error::Fenced { .. })
        ));
        assert_eq!(env.store.get(&e.partition(), b"late").unwrap(), None);
    });
}

/// (c) A renewal races a push: the push's lease write fails, it re-reads and retries, then
/// acknowledges; it never acknowledges without a committed push.
#[test]
fn schedule_c_push_retries_after_a_racing_renewal() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        assert!(matches!(
            env.fence.write(&e, 0, put("k")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        env.fence.bump_epoch(&ns, 1).unwrap();
        env.clock.advance(25_000);

        let gate = env.hooks.arm(HookPoint::PushBeforeLeaseWrite);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let slice = thread::spawn(move || fence.revoke_step(&ns2, RevokeBudget::default()));
        gate.wait_reached();
        let before = env.fence.stats();
        assert!(matches!(
            env.fence.write(&e, 1, put("renew")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        gate.release();
        assert_eq!(slice.join().unwrap().unwrap(), RevokeProgress::Complete);

        let after = env.fence.stats();
        assert_eq!(
            after.pushes - before.pushes,
            1,
            "one committed push, after one retry"
        );
        assert_eq!(after.acks - before.acks, 1);
        let seen = env.hooks.seen();
        let pushes: Vec<_> = seen
            .iter()
            .filter(|p| {
                matches!(
                    p,
                    HookPoint::PushBeforeLeaseWrite | HookPoint::PushBeforeAck
                )
            })
            .collect();
        assert_eq!(
            pushes,
            [
                &HookPoint::PushBeforeLeaseWrite,
                &HookPoint::PushBeforeLeaseWrite,
                &HookPoint::PushBeforeAck
            ],
            "the acknowledgement follows the second, committed push"
        );
        let (row, lease) = (env.shard_row(&e).unwrap(), env.lease(&e).unwrap());
        assert_eq!(
            (row.acked_epoch, lease.epoch, lease.expires_at_ms),
            (1, 1, row.expires_at_ms)
        );
    });
}

/// (d) An expired, unswept leased row: renewal acknowledges at the current epoch, and an
/// in-flight write planned under the old lease fails its deadline. The lease guard is
/// removed here so that the deadline alone is what stops the write.
#[test]
fn schedule_d_expired_row_and_a_write_that_misses_its_deadline() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        assert!(matches!(
            env.fence.write(&e, 0, put("k")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        env.clock.advance(20_000);
        env.fence.set_guard_switches(GuardSwitches {
            drop_lease_guard: true,
            ..GuardSwitches::default()
        });
        let gate = env.hooks.arm(HookPoint::WriteBeforeApply);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let in_flight = thread::spawn(move || fence.write(&e2, 0, put("late")));
        gate.wait_reached();

        env.fence.bump_epoch(&ns, 1).unwrap();
        env.clock.advance(10_000); // the row has expired; nobody swept it
        assert_eq!(
            env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
            RevokeProgress::Complete
        );
        assert!(matches!(
            env.fence.write(&e, 1, put("fresh")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        let row = env.shard_row(&e).unwrap();
        assert_eq!(
            (row.epoch, row.acked_epoch),
            (1, 1),
            "renewal acknowledges at the current epoch"
        );

        gate.release();
        assert!(in_flight.join().unwrap().is_err());
        assert_eq!(
            env.store.get(&e.partition(), b"late").unwrap(),
            None,
            "its deadline passed"
        );
    });
}

/// (e) Recovery marker at 100,000 ms, lease 30,000, margin 5,000: pending until 135,000,
/// complete from then on; with no marker and no rows, complete at once.
#[test]
fn schedule_e_recovery_hold_off() {
    each_backend(|env| {
        let ns = env.ns();
        assert_eq!(
            env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
            RevokeProgress::Complete
        );
        env.clock.set(100_000);
        env.fence.mark_lease_table_recovered(&ns).unwrap();
        for now in [100_000, 120_000, 130_000, 134_999] {
            env.clock.set(now);
            let progress = env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap();
            assert!(
                matches!(progress, RevokeProgress::Pending { remaining } if remaining >= 1),
                "{now}"
            );
        }
        for now in [135_000, 135_001, 200_000] {
            env.clock.set(now);
            assert_eq!(
                env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
                RevokeProgress::Complete
            );
        }
    });
}

/// (f) A frozen clock during a recovery hold-off: the background driver ends with
/// `Unavailable` after a bounded number of slices.
#[test]
fn schedule_f_frozen_clock_ends_the_driver_unavailable() {
    each_backend(|env| {
        let ns = env.ns();
        env.fence.mark_lease_table_recovered(&ns).unwrap();
        let before = env.fence.stats().slices;
        let limits = DriverLimits::default()
            .with_max_idle_slices(16)
            .with_idle_pause(Duration::ZERO);
        let handle = env.fence.revoke_in_background(&ns, limits);
        let result = handle
            .wait(Duration::from_secs(60))
            .expect("the driver ended");
        assert!(
            matches!(result, Err(Error::Unavailable { .. })),
            "{result:?}"
        );
        assert!(env.fence.stats().slices - before <= 17);
    });
}

/// A renewal planned before a bump commits its leased-shard row only under the epoch it read
/// (SPEC F2): otherwise a revocation that completed meanwhile would never see the new row.
#[test]
fn renewal_row_is_guarded_on_the_epoch_it_read() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        let gate = env.hooks.arm(HookPoint::RenewalBeforeRow);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let renewal = thread::spawn(move || fence.write(&e2, 0, put("late")));
        gate.wait_reached();
        env.fence.bump_epoch(&ns, 1).unwrap();
        revoke_checking(env, &e, 1, 10);
        gate.release();
        assert!(matches!(
            renewal.join().unwrap(),
            Err(Error::Fenced {
                grant: 0,
                current: 1
            })
        ));
        assert_eq!(env.store.get(&e.partition(), b"late").unwrap(), None);
        assert!(env.shard_row(&e).is_none());
    });
}

/// Two renewals race; the row's expiry never falls below the lease's (SPEC F2: the row is
/// guarded on the row as read), so revocation never treats a usable lease as expired.
#[test]
fn renewal_row_is_guarded_on_the_row_it_read() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        let gate = env.hooks.arm(HookPoint::RenewalBeforeRow);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let slow = thread::spawn(move || fence.write(&e2, 0, put("slow")));
        gate.wait_reached();
        env.clock.advance(10_000);
        assert!(matches!(
            env.fence.write(&e, 0, put("fast")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        gate.release();
        assert!(matches!(
            slow.join().unwrap().unwrap(),
            WriteOutcome::Committed { .. }
        ));
        let (row, lease) = (env.shard_row(&e).unwrap(), env.lease(&e).unwrap());
        assert!(
            row.expires_at_ms >= lease.expires_at_ms,
            "{row:?} {lease:?}"
        );
        // And so revocation cannot complete by expiry while the lease is usable: 20 s later the
        // slow renewal's expiry has passed but the fast one's has not, so the row (which
        // carries the fast expiry) is still live and must be pushed before `Complete`.
        env.fence.bump_epoch(&ns, 1).unwrap();
        env.clock.advance(20_000);
        assert!(
            env.lease_usable_below(&e, 1),
            "the scenario needs a usable lease"
        );
        revoke_checking(env, &e, 1, 10);
        assert!(!env.lease_usable_below(&e, 1), "{:?}", env.lease(&e));
        assert_eq!(env.lease(&e).unwrap().epoch, 1, "the lease was pushed");
        assert_eq!(env.shard_row(&e).unwrap().acked_epoch, 1);
    });
}

/// A push that started for an older epoch and finds a lease renewed at a newer epoch (or a
/// longer expiry) must not write (SPEC F4): otherwise it would downgrade the lease after the
/// newer epoch's revocation completed, and a write planned under the older epoch would commit.
#[test]
fn stale_push_never_downgrades_a_renewed_lease() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        assert!(matches!(
            env.fence.write(&e, 0, put("k")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        env.fence.bump_epoch(&ns, 1).unwrap();
        let gate = env.hooks.arm(HookPoint::PushBeforeLeaseRead);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let stale_slice = thread::spawn(move || fence.revoke_step(&ns2, RevokeBudget::default()));
        gate.wait_reached();
        env.fence.bump_epoch(&ns, 2).unwrap();
        env.clock.advance(21_000);
        assert!(matches!(
            env.fence.write(&e, 2, put("renew")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        revoke_checking(env, &e, 2, 10);
        gate.release();
        assert!(matches!(
            stale_slice.join().unwrap().unwrap(),
            RevokeProgress::Pending { .. }
        ));
        assert_eq!(
            env.lease(&e).unwrap().epoch,
            2,
            "the lease was not downgraded"
        );
        assert!(matches!(
            env.fence.write(&e, 1, put("late")),
            Err(Error::Fenced { .. })
        ));
        assert_eq!(env.store.get(&e.partition(), b"late").unwrap(), None);
    });
}
