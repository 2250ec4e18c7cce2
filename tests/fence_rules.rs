//! One or more tests per fencing rule (SPEC F1-F10, E1, E4), on every backend, with manual
//! clocks and pause hooks (never sleeps).

mod fence_support;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use fence_support::*;
use portcullis::fence::{
    DriverLimits, Fence, FenceConfig, FenceGrant, FenceKind, GuardSwitches, HookPoint, LeaseRow,
    RevokeBudget, RevokeProgress, ScanPosition, WriteOutcome, decode_row, encode_row, write_under,
};
use portcullis::store::{Batch, KeyRange, Partition, Store};
use portcullis::{Error, Namespace};

fn put(key: &str) -> Batch {
    Batch::new().put(key.as_bytes().to_vec(), b"v".to_vec())
}

fn committed(outcome: WriteOutcome) {
    assert!(
        matches!(outcome, WriteOutcome::Committed { .. }),
        "{outcome:?}"
    );
}

// ---------------------------------------------------------------- configuration (F header)

#[test]
fn config_refuses_bad_parameters() {
    assert!(FenceConfig::builder().build().is_ok());
    assert!(matches!(
        FenceConfig::builder().lease_margin_ms(0).build(),
        Err(Error::InvalidArgument(_))
    ));
    // epoch_lease_ms must exceed margin + budget: 6,000 = 5,000 + 1,000 is refused.
    assert!(
        FenceConfig::builder()
            .epoch_lease_ms(6_000)
            .build()
            .is_err()
    );
    assert!(FenceConfig::builder().epoch_lease_ms(6_001).build().is_ok());
    assert!(
        FenceConfig::builder()
            .lease_margin_ms(u64::MAX)
            .min_lease_budget_ms(2)
            .build()
            .is_err()
    );
}

// ---------------------------------------------------------------- F1

#[test]
fn f1_bump_compare_and_sets_within_step_limits() {
    each_backend(|env| {
        let ns = env.ns();
        env.fence.bump_epoch(&ns, 1).unwrap();
        assert_eq!(env.fence.current_epoch(&ns).unwrap(), 1);
        for bad in [0, 1, 1 + 1025] {
            let err = env.fence.bump_epoch(&ns, bad).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{bad}: {err}");
        }
        assert_eq!(env.fence.current_epoch(&ns).unwrap(), 1);
        env.fence.bump_epoch(&ns, 1 + 1024).unwrap();
        assert_eq!(env.fence.current_epoch(&ns).unwrap(), 1025);
    });
}

/// The interposing store answers for the store it wraps (SPEC S11): a fence over it on a
/// backend without deadlines must know, or it would put `NotAfter` on its fenced writes.
#[test]
fn the_interposer_forwards_the_limits_and_deadline_support_of_the_store_it_wraps() {
    each_backend(|env| {
        let interposer = Interposer {
            inner: env.store.clone(),
            before_apply: Box::new(|_| {}),
        };
        assert_eq!(interposer.limits(), env.store.limits(), "{}", env.name);
        assert_eq!(
            interposer.evaluates_deadlines(),
            env.store.evaluates_deadlines(),
            "{}",
            env.name
        );
    });
}

fn install_epoch(store: &dyn Store, fence: &Fence, epoch: u64) {
    let p = Namespace::new("ns").unwrap().coordinator_partition();
    let outcome = store
        .apply(
            &p,
            &Batch::new().put(fence.keys().current(), encode_row(&epoch)),
        )
        .unwrap();
    assert!(outcome.is_committed());
}

#[test]
fn f1_losing_to_the_same_value_is_success_and_contention_is_unavailable() {
    each_backend(|env| {
        let probe = env.fence.clone();
        // A concurrent winner installs 7 just before our compare-and-set.
        let racing = Arc::new(Interposer {
            inner: env.store.clone(),
            before_apply: Box::new(move |s| install_epoch(s, &probe, 7)),
        });
        let fence = Fence::new(racing, Arc::new(env.clock.clone()), env.config);
        let ns = env.ns();
        fence.bump_epoch(&ns, 7).unwrap();
        assert_eq!(fence.current_epoch(&ns).unwrap(), 7);

        // A winner that keeps moving the epoch: the bump gives up with a retry hint.
        let probe = env.fence.clone();
        let counter = Arc::new(std::sync::atomic::AtomicU64::new(100));
        let moving = Arc::new(Interposer {
            inner: env.store.clone(),
            before_apply: Box::new(move |s| {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                install_epoch(s, &probe, n)
            }),
        });
        let fence = Fence::new(moving, Arc::new(env.clock.clone()), env.config);
        let err = fence.bump_epoch(&ns, 1000).unwrap_err();
        assert!(
            matches!(err, Error::Unavailable { retry_after_ms, .. } if retry_after_ms > 0),
            "{err}"
        );
    });
}

// ---------------------------------------------------------------- F2

#[test]
fn f2_first_write_commits_row_then_lease_with_one_grant() {
    each_backend(|env| {
        let e = env.entity("a");
        let before = env.fence.stats();
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let renewal_calls = env.fence.stats().store_calls - before.store_calls;
        assert_eq!(renewal_calls, 4, "P6: a renewal costs 4 store calls");
        let row = env.shard_row(&e).expect("a leased-shard row");
        let lease = env.lease(&e).expect("a lease");
        assert_eq!(row.expires_at_ms, START_MS + 30_000);
        assert_eq!((row.epoch, row.acked_epoch), (0, 0));
        assert_eq!(
            lease,
            LeaseRow {
                epoch: 0,
                expires_at_ms: row.expires_at_ms,
                grant_id: row.grant_id
            }
        );

        let before = env.fence.stats();
        committed(env.fence.write(&e, 0, put("k2")).unwrap());
        assert_eq!(
            env.fence.stats().store_calls - before.store_calls,
            2,
            "P6: a usable lease costs 2"
        );
    });
}

#[test]
fn f2_lease_is_renewed_only_when_its_budget_is_short() {
    each_backend(|env| {
        let e = env.entity("a");
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        // 30,000 - 5,000 - 24,000 = 1,000 >= min budget: still usable.
        env.clock.advance(24_000);
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        assert_eq!(env.fence.stats().renewals, 1);
        // 999 left: renew, to now + 30,000.
        env.clock.advance(1);
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        assert_eq!(env.fence.stats().renewals, 2);
        assert_eq!(
            env.lease(&e).unwrap().expires_at_ms,
            START_MS + 24_001 + 30_000
        );
    });
}

#[test]
fn f2_renewal_keeps_a_live_rows_ack_and_expiry_is_the_maximum() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        env.fence.bump_epoch(&ns, 1).unwrap();
        // The planner's clock stands earlier (another planner): now + lease < previous expiry.
        env.clock.set(START_MS - 5_000);
        committed(env.fence.write(&e, 1, put("k")).unwrap());
        let row = env.shard_row(&e).unwrap();
        assert_eq!(
            row.expires_at_ms,
            START_MS + 30_000,
            "max(previous, now + lease)"
        );
        assert_eq!(row.acked_epoch, 0, "a live row keeps its acknowledgement");
        assert_eq!(row.epoch, 1);
        assert_eq!(env.lease(&e).unwrap().epoch, 1);
    });
}

#[test]
fn f2_renewal_of_an_expired_row_acknowledges_at_the_current_epoch() {
    each_backend_with_deadlines(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        env.fence.bump_epoch(&ns, 3).unwrap();
        env.clock.advance(30_000);
        committed(env.fence.write(&e, 3, put("k")).unwrap());
        let row = env.shard_row(&e).unwrap();
        assert_eq!((row.epoch, row.acked_epoch), (3, 3));
    });
}

#[test]
fn f2_declined_write_leaves_no_lease_state() {
    each_backend(|env| {
        let e = env.entity("a");
        let before = snapshot(&*env.store);
        let outcome = env.fence.write_with(&e, 0, |_| None).unwrap();
        assert_eq!(outcome, WriteOutcome::Declined);
        assert_eq!(snapshot(&*env.store), before);
    });
}

/// SPEC F2: a write refused on the caller's own precondition leaves no lease state behind,
/// even when it would have needed a renewal.
#[test]
fn f2_refused_write_leaves_no_lease_state() {
    each_backend(|env| {
        let e = env.entity("a");
        let before = snapshot(&*env.store);
        let refused = Batch::new()
            .absent(b"free".to_vec())
            .present(b"missing".to_vec())
            .put(b"k".to_vec(), b"v".to_vec());
        let outcome = env.fence.write(&e, 0, refused).unwrap();
        assert_eq!(outcome, WriteOutcome::PreconditionFailed { index: 1 });
        assert_eq!(snapshot(&*env.store), before);
    });
}

#[test]
fn f2_grant_ids_are_unique() {
    each_backend(|env| {
        let mut ids = std::collections::HashSet::new();
        for i in 0..50 {
            let e = env.entity(&format!("e{i}"));
            committed(env.fence.write(&e, 0, put("k")).unwrap());
            assert!(ids.insert(env.lease(&e).unwrap().grant_id));
        }
        let other = Fence::new(env.store.clone(), Arc::new(env.clock.clone()), env.config);
        let e = env.entity("other");
        committed(other.write(&e, 0, put("k")).unwrap());
        assert!(ids.insert(env.lease(&e).unwrap().grant_id));
    });
}

#[test]
fn f2_a_delayed_batch_never_commits_against_a_later_lease_of_the_same_epoch() {
    each_backend(|env| {
        let e = env.entity("a");
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let first = env.lease(&e).unwrap();
        let gate = env.hooks.arm(HookPoint::WriteBeforeApply);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let delayed = thread::spawn(move || fence.write(&e2, 0, put("delayed")));
        gate.wait_reached();
        // A later grant of the same epoch and the same expiry: only the grant id differs.
        let later = LeaseRow {
            grant_id: first.grant_id ^ 1,
            ..first
        };
        let outcome = env
            .store
            .apply(
                &e.partition(),
                &Batch::new().put(env.fence.keys().lease().to_vec(), encode_row(&later)),
            )
            .unwrap();
        assert!(outcome.is_committed());
        gate.release();
        // The delayed batch's guard fails; it re-plans under the new lease (never the old one).
        committed(delayed.join().unwrap().unwrap());
        assert_eq!(
            env.hooks
                .seen()
                .iter()
                .filter(|p| **p == HookPoint::WriteBeforeApply)
                .count(),
            3
        );
    });
}

// ---------------------------------------------------------------- F3

#[test]
fn f3_grant_older_than_the_lease_is_fenced() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        env.fence.bump_epoch(&ns, 2).unwrap();
        committed(env.fence.write(&e, 2, put("k")).unwrap());
        let before = snapshot(&*env.store);
        let err = env.fence.write(&e, 1, put("stale")).unwrap_err();
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
        assert_eq!(err.code(), 9);
        assert_eq!(snapshot(&*env.store), before);
        // A grant ahead of the epoch is a caller error.
        assert!(matches!(
            env.fence.write(&e, 9, put("x")),
            Err(Error::InvalidArgument(_))
        ));
    });
}

#[test]
fn f3_user_precondition_failure_is_reported_with_the_callers_index() {
    each_backend(|env| {
        let e = env.entity("a");
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let batch = Batch::new()
            .present(b"k".to_vec())
            .absent(b"k".to_vec())
            .put(b"z".to_vec(), b"1".to_vec());
        assert_eq!(
            env.fence.write(&e, 0, batch).unwrap(),
            WriteOutcome::PreconditionFailed { index: 1 }
        );
        assert_eq!(env.store.get(&e.partition(), b"z").unwrap(), None);
    });
}

#[test]
fn f3_passed_deadline_replans_a_bounded_number_of_times_then_is_unavailable() {
    each_backend_with_deadlines(|env| {
        let e = env.entity("a");
        // The store's clock runs ahead by more than the apply window: every deadline passes.
        env.skew_store_clock(10_001);
        let err = env.fence.write(&e, 0, put("k")).unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert_eq!(env.store.get(&e.partition(), b"k").unwrap(), None);
        assert_eq!(env.fence.stats().writes_committed, 0);
    });
}

#[test]
fn f3_deadline_is_lease_expiry_minus_margin_and_apply_window() {
    each_backend_with_deadlines(|env| {
        let e = env.entity("a");
        let mut seen = Vec::new();
        committed(
            env.fence
                .write_with(&e, 0, |plan| {
                    seen.push(plan.deadline_ms);
                    Some(put("k"))
                })
                .unwrap(),
        );
        // min(now + 30,000 - 5,000, now + 10,000)
        assert_eq!(seen, vec![START_MS + 10_000]);
        env.clock.advance(19_000);
        let mut seen = Vec::new();
        committed(
            env.fence
                .write_with(&e, 0, |plan| {
                    seen.push(plan.deadline_ms);
                    Some(put("k"))
                })
                .unwrap(),
        );
        assert_eq!(seen, vec![START_MS + 25_000]);
    });
}

#[test]
fn f3_a_write_paused_past_its_deadline_does_not_commit() {
    each_backend_with_deadlines(|env| {
        let e = env.entity("a");
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let gate = env.hooks.arm(HookPoint::WriteBeforeApply);
        let fence = env.fence.clone();
        let e2 = e.clone();
        let clock = env.clock.clone();
        let late = thread::spawn(move || {
            fence.write_with(&e2, 0, |plan| {
                // Re-plans are allowed, but only the first attempt may carry the old deadline.
                if plan.attempt == 0 {
                    Some(put("late"))
                } else {
                    None
                }
            })
        });
        gate.wait_reached();
        clock.advance(10_001); // past plan_time + max_apply_window_ms
        gate.release();
        assert_eq!(late.join().unwrap().unwrap(), WriteOutcome::Declined);
        assert_eq!(env.store.get(&e.partition(), b"late").unwrap(), None);
    });
}

#[test]
fn f3_the_fence_lease_row_is_off_limits_to_callers() {
    each_backend(|env| {
        let e = env.entity("a");
        let batch = Batch::new().delete(env.fence.keys().lease().to_vec());
        assert!(matches!(
            env.fence.write(&e, 0, batch),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            env.fence
                .write(&e, 0, Batch::new().delete_range(KeyRange::all())),
            Err(Error::InvalidArgument(_))
        ));
    });
}

// ---------------------------------------------------------------- F4

fn lease_many(env: &Env, n: usize) {
    for i in 0..n {
        committed(
            env.fence
                .write(&env.entity(&format!("e{i:04}")), 0, put("k"))
                .unwrap(),
        );
    }
}

#[test]
fn f4_a_slice_is_bounded_by_pages_pushes_and_time() {
    each_backend(|env| {
        let ns = env.ns();
        lease_many(env, 40);
        env.fence.bump_epoch(&ns, 1).unwrap();
        let before = env.fence.stats();
        let progress = env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap();
        let after = env.fence.stats();
        assert_eq!(after.pushes - before.pushes, 4);
        assert!(after.scans - before.scans <= 8);
        assert!(matches!(progress, RevokeProgress::Pending { remaining } if remaining >= 1));

        // A time budget spent during the first push allows no second one (the first push of a
        // slice is always made, so every slice makes progress).
        let before = env.fence.stats();
        let gate = env.hooks.arm(HookPoint::PushBeforeAck);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let slice = thread::spawn(move || {
            fence.revoke_step(&ns2, RevokeBudget::default().with_time_ms(10))
        });
        gate.wait_reached();
        env.clock.advance(10);
        gate.release();
        let progress = slice.join().unwrap().unwrap();
        assert_eq!(env.fence.stats().pushes - before.pushes, 1);
        assert!(matches!(progress, RevokeProgress::Pending { .. }));

        // Rows already acknowledged only cost scanning: at most 8 pages of 4.
        let slices = revoke_to_complete(env, 100);
        assert_eq!(slices, 9, "35 remaining pushes at 4 per slice");
    });
}

#[test]
fn f4_push_writes_the_lease_even_when_absent_then_acknowledges() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        // A leased-shard row whose entity has no lease (as a renewal leaves when its entity
        // batch fails after the row committed): write, then remove the entity's lease.
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let lease_key = env.fence.keys().lease().to_vec();
        let removed = env
            .store
            .apply(&e.partition(), &Batch::new().delete(lease_key))
            .unwrap();
        assert!(removed.is_committed());
        let row = env.shard_row(&e).unwrap();
        assert!(env.lease(&e).is_none());
        env.fence.bump_epoch(&ns, 1).unwrap();
        revoke_to_complete(env, 3);
        let lease = env.lease(&e).unwrap();
        let expiry = env.pushed_expiry(row.expires_at_ms);
        assert_eq!((lease.epoch, lease.expires_at_ms), (1, expiry));
        assert_eq!(env.shard_row(&e).unwrap().acked_epoch, 1);
    });
}

#[test]
fn f4_checkpoint_resumes_and_is_valid_only_for_the_same_epoch_and_marker() {
    each_backend(|env| {
        let ns = env.ns();
        lease_many(env, 12);
        env.fence.bump_epoch(&ns, 1).unwrap();
        let _ = env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap();
        let cp = checkpoint(env);
        assert_eq!(cp.epoch, 1);
        assert_eq!(
            cp.cursor,
            ScanPosition::After(env.fence.keys().shard(&env.entity("e0003")))
        );
        // A second slice resumes after it: it pushes e0004..e0007.
        let _ = env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap();
        assert_eq!(
            checkpoint(env).cursor,
            ScanPosition::After(env.fence.keys().shard(&env.entity("e0007")))
        );
        assert_eq!(env.shard_row(&env.entity("e0000")).unwrap().acked_epoch, 1);
        assert_eq!(env.shard_row(&env.entity("e0008")).unwrap().acked_epoch, 0);
        // A new epoch starts over.
        env.fence.bump_epoch(&ns, 2).unwrap();
        let _ = env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap();
        assert_eq!(
            checkpoint(env).cursor,
            ScanPosition::After(env.fence.keys().shard(&env.entity("e0003")))
        );
        assert_eq!(env.shard_row(&env.entity("e0000")).unwrap().acked_epoch, 2);
        // A new recovery marker starts over too.
        env.fence.mark_lease_table_recovered(&ns).unwrap();
        let _ = env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap();
        let cp = checkpoint(env);
        assert_eq!(cp.recovery, Some(START_MS));
        assert_eq!(
            cp.cursor,
            ScanPosition::After(env.fence.keys().shard(&env.entity("e0007")))
        );
    });
}

fn checkpoint(env: &Env) -> portcullis::fence::CheckpointRow {
    let raw = env
        .store
        .get(
            &env.ns().coordinator_partition(),
            &env.fence.keys().checkpoint(),
        )
        .unwrap()
        .unwrap();
    decode_row("checkpoint", &raw).unwrap()
}

/// SPEC F4: the checkpoint advances only over a prefix of complete rows. Here the middle row
/// of three stays incomplete (its push meets a racing renewal) while the row after it is
/// acknowledged: the cursor must stop before the incomplete row, and the next slice must
/// resume there, finish it, and end with the cursor at `Done`.
#[test]
fn f4_checkpoint_advances_only_over_a_complete_prefix() {
    each_backend(|env| {
        let ns = env.ns();
        lease_many(env, 3);
        let (e0, e1, e2) = (
            env.entity("e0000"),
            env.entity("e0001"),
            env.entity("e0002"),
        );
        env.fence.bump_epoch(&ns, 1).unwrap();
        // 25 s on: every lease is still live, but short enough that a write renews it.
        env.clock.advance(25_000);
        let gate = env.hooks.arm_for(HookPoint::PushBeforeLeaseRead, &e1);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let slice = thread::spawn(move || fence.revoke_step(&ns2, RevokeBudget::default()));
        gate.wait_reached();
        // e0001 renews at epoch 1 with a longer expiry: the push that read the older row must
        // not acknowledge it.
        committed(env.fence.write(&e1, 1, put("renew")).unwrap());
        gate.release();
        let progress = slice.join().unwrap().unwrap();
        assert!(matches!(progress, RevokeProgress::Pending { remaining } if remaining >= 1));
        assert_eq!(env.shard_row(&e0).unwrap().acked_epoch, 1);
        assert_eq!(
            env.shard_row(&e1).unwrap().acked_epoch,
            0,
            "not acknowledged"
        );
        assert_eq!(
            env.shard_row(&e2).unwrap().acked_epoch,
            1,
            "complete, after e0001"
        );
        assert_eq!(
            checkpoint(env).cursor,
            ScanPosition::After(env.fence.keys().shard(&e0)),
            "the cursor stops before the incomplete row"
        );

        // The next slice resumes at e0001, pushes it, and passes e0002 without a push.
        let before = env.fence.stats();
        assert_eq!(
            env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
            RevokeProgress::Complete
        );
        assert_eq!(env.fence.stats().pushes - before.pushes, 1);
        assert_eq!(env.shard_row(&e1).unwrap().acked_epoch, 1);
        assert_eq!(checkpoint(env).cursor, ScanPosition::Done);
    });
}

// ---------------------------------------------------------------- F5

#[test]
fn f5_no_complete_if_the_epoch_changed_during_the_slice() {
    each_backend(|env| {
        let ns = env.ns();
        env.fence.bump_epoch(&ns, 1).unwrap();
        let gate = env.hooks.arm(HookPoint::SliceBeforeCheckpoint);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let slice = thread::spawn(move || fence.revoke_step(&ns2, RevokeBudget::default()));
        gate.wait_reached();
        env.fence.bump_epoch(&ns, 2).unwrap();
        gate.release();
        let progress = slice.join().unwrap().unwrap();
        assert_eq!(progress, RevokeProgress::Pending { remaining: 1 });
        assert_eq!(
            env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
            RevokeProgress::Complete
        );
    });
}

#[test]
fn f5_complete_needs_every_row_acknowledged_or_expired() {
    each_backend_with_deadlines(|env| {
        let ns = env.ns();
        lease_many(env, 3);
        env.fence.bump_epoch(&ns, 1).unwrap();
        // One push per slice: two rows stay unacknowledged and live.
        let p = env
            .fence
            .revoke_step(&ns, RevokeBudget::default().with_max_pushes(1))
            .unwrap();
        assert!(
            matches!(p, RevokeProgress::Pending { remaining } if remaining >= 2),
            "{p:?}"
        );
        assert_eq!(env.fence.stats().pushes, 1);
        // Once the other rows have expired, completion needs no push.
        env.clock.advance(30_000);
        assert_eq!(
            env.fence
                .revoke_step(&ns, RevokeBudget::default().with_max_pushes(1))
                .unwrap(),
            RevokeProgress::Complete
        );
        assert_eq!(env.fence.stats().pushes, 1);
    });
}

// ---------------------------------------------------------------- F6

#[test]
fn f6_recovery_holds_off_completion() {
    each_backend(|env| {
        let ns = env.ns();
        env.clock.set(100_000);
        env.fence.mark_lease_table_recovered(&ns).unwrap();
        env.fence.bump_epoch(&ns, 1).unwrap();
        env.clock.set(134_999);
        assert!(matches!(
            env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
            RevokeProgress::Pending { remaining: 1 }
        ));
        env.clock.set(135_000);
        assert_eq!(
            env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap(),
            RevokeProgress::Complete
        );
    });
}

/// A second planner whose clock lags the first's by 3 s (within the 5 s margin) marks the same
/// lease table recovered right after the first; answers what a slice says once the first
/// planner's clock reads 132,500 (past the lagging mark's hold-off, before the first's).
fn f6_mark_from_a_lagging_planner(env: &Env, switches: GuardSwitches) -> RevokeProgress {
    let ns = env.ns();
    env.clock.set(100_000);
    env.fence.mark_lease_table_recovered(&ns).unwrap();
    env.fence.bump_epoch(&ns, 1).unwrap();
    let lagging = portcullis::fence::Fence::new(
        Arc::clone(&env.store),
        Arc::new(portcullis::ManualClock::new(97_000)),
        env.config,
    );
    lagging.set_guard_switches(switches);
    lagging.mark_lease_table_recovered(&ns).unwrap();
    env.clock.set(132_500);
    env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap()
}

/// F6: the recovery marker never moves backwards: a mark from a planner whose clock lags
/// (within the margin), or a mark racing another, keeps the later hold-off (and still
/// invalidates every revocation checkpoint). Before, the last writer won: the lagging mark
/// shortened the hold-off by the lag, and revocation completed before every lease granted
/// before the first mark had expired.
#[test]
fn f6_the_recovery_marker_never_moves_backwards() {
    each_backend(|env| {
        assert!(matches!(
            f6_mark_from_a_lagging_planner(env, GuardSwitches::default()),
            RevokeProgress::Pending { .. }
        ));
        env.clock.set(135_001);
        assert_eq!(
            env.fence
                .revoke_step(&env.ns(), RevokeBudget::default())
                .unwrap(),
            RevokeProgress::Complete
        );
    });
}

/// The negative control: an unguarded marker (`GuardSwitches::unguarded_recovery_marker`)
/// moves backwards, and revocation completes inside the first mark's hold-off.
#[test]
fn f6_negative_control_an_unguarded_marker_moves_backwards() {
    each_backend(|env| {
        let switches = GuardSwitches {
            unguarded_recovery_marker: true,
            ..GuardSwitches::default()
        };
        assert_eq!(
            f6_mark_from_a_lagging_planner(env, switches),
            RevokeProgress::Complete
        );
    });
}

// ---------------------------------------------------------------- F8

#[test]
fn f8_frozen_clock_cannot_hang_a_slice_or_a_write() {
    each_backend(|env| {
        let ns = env.ns();
        lease_many(env, 100);
        env.fence.bump_epoch(&ns, 1).unwrap();
        // The clock never moves: each slice still ends, bounded by pages and pushes.
        let slices = revoke_to_complete(env, 1_000);
        assert_eq!(slices, 25);
        // A write whose deadline always passes ends Unavailable after bounded re-plans (a
        // store without deadlines has none to pass).
        env.skew_store_clock(1_000_000);
        if env.deadlines() {
            assert!(matches!(
                env.fence.write(&env.entity("x"), 1, put("k")),
                Err(Error::Unavailable { .. })
            ));
        }
    });
}

// ---------------------------------------------------------------- F9

#[test]
fn f9_background_revocation_completes_and_can_be_cancelled() {
    each_backend(|env| {
        let ns = env.ns();
        lease_many(env, 30);
        env.fence.bump_epoch(&ns, 1).unwrap();
        let handle = env.fence.revoke_in_background(&ns, DriverLimits::default());
        let report = handle
            .wait(Duration::from_secs(60))
            .expect("finished")
            .unwrap();
        assert!(report.complete);
        assert_eq!(report.slices, 8);
        assert!(
            handle.wait(Duration::ZERO).unwrap().is_err(),
            "the result is given once"
        );

        // Cancel a driver that is waiting out a recovery hold-off (the clock stands still).
        env.fence.mark_lease_table_recovered(&ns).unwrap();
        let gate = env.hooks.arm(HookPoint::SliceBeforeCheckpoint);
        let limits = DriverLimits::default().with_idle_pause(Duration::from_secs(30));
        let handle = env.fence.revoke_in_background(&ns, limits);
        gate.wait_reached();
        assert!(handle.wait(Duration::ZERO).is_none());
        handle.cancel();
        gate.release();
        let report = handle
            .wait(Duration::from_secs(60))
            .expect("finished")
            .unwrap();
        assert!(!report.complete);
    });
}

#[test]
fn f9_driver_survives_a_panic_in_a_slice() {
    #[derive(Debug)]
    struct Boom;
    impl portcullis::fence::FenceHooks for Boom {
        fn at(&self, point: HookPoint, _: Option<&portcullis::EntityId>) {
            if point == HookPoint::SliceBeforeCheckpoint {
                panic!("injected");
            }
        }
    }
    each_backend(|env| {
        env.fence.set_hooks(Arc::new(Boom));
        let handle = env
            .fence
            .revoke_in_background(&env.ns(), DriverLimits::default());
        let err = handle.wait(Duration::from_secs(60)).unwrap().unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }) && err.to_string().contains("injected"));
    });
}

#[test]
fn f9_sweeper_deletes_only_expired_rows_guarded_on_the_row() {
    each_backend(|env| {
        let ns = env.ns();
        let (a, b) = (env.entity("a"), env.entity("b"));
        committed(env.fence.write(&a, 0, put("k")).unwrap());
        env.clock.advance(10_000);
        committed(env.fence.write(&b, 0, put("k")).unwrap());
        env.clock.advance(20_000); // a expired, b live
        let report = env.fence.sweep_step(&ns).unwrap();
        assert_eq!((report.deleted, report.raced), (1, 0));
        assert!(env.shard_row(&a).is_none() && env.shard_row(&b).is_some());

        // A renewal that races the sweep wins: the guarded delete fails.
        env.clock.advance(10_000); // b expired
        let gate = env.hooks.arm(HookPoint::SweepBeforeDelete);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let sweep = thread::spawn(move || fence.sweep_step(&ns2));
        gate.wait_reached();
        committed(env.fence.write(&b, 0, put("renew")).unwrap());
        gate.release();
        let report = sweep.join().unwrap().unwrap();
        assert_eq!((report.deleted, report.raced), (0, 1));
        assert!(env.shard_row(&b).is_some());
    });
}

// ---------------------------------------------------------------- F10

#[test]
fn f10_authority_generation_is_a_second_independent_fence() {
    each_backend(|env| {
        let ns = env.ns();
        let e = env.entity("a");
        let authority = Fence::with_kind(
            env.store.clone(),
            Arc::new(env.clock.clone()),
            env.config,
            FenceKind::Authority,
        );
        let both = |epoch: u64, generation: u64, key: &str| {
            let grants = [
                FenceGrant {
                    fence: &env.fence,
                    grant: epoch,
                },
                FenceGrant {
                    fence: &authority,
                    grant: generation,
                },
            ];
            write_under(&grants, &e, |_| Some(put(key)))
        };
        committed(both(0, 0, "k").unwrap());
        authority.bump_epoch(&ns, 1).unwrap();
        assert_eq!(
            env.fence.current_epoch(&ns).unwrap(),
            0,
            "the epoch is untouched"
        );
        let mut slices = 0;
        while authority.revoke_step(&ns, RevokeBudget::default()).unwrap()
            != RevokeProgress::Complete
        {
            slices += 1;
            assert!(slices < 10);
        }
        // The authority fence has its own acknowledgement; the epoch fence's row is untouched.
        assert_eq!(env.shard_row(&e).unwrap().acked_epoch, 0);
        let err = both(0, 0, "stale").unwrap_err();
        assert!(
            matches!(
                err,
                Error::Fenced {
                    grant: 0,
                    current: 1
                }
            ),
            "{err}"
        );
        committed(both(0, 1, "fresh").unwrap());
        // And the epoch fence still fences on its own.
        env.fence.bump_epoch(&ns, 1).unwrap();
        revoke_to_complete(env, 10);
        assert!(matches!(both(0, 1, "stale"), Err(Error::Fenced { .. })));
        committed(both(1, 1, "fresh2").unwrap());
    });
}

// ---------------------------------------------------------------- bad input (E1)

#[test]
fn bad_input_is_refused_clearly_and_changes_nothing() {
    each_backend(|env| {
        let ns = env.ns();
        assert!(matches!(
            Namespace::new("Bad/NS"),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            portcullis::EntityId::new("", "x"),
            Err(Error::InvalidArgument(_))
        ));
        env.fence.bump_epoch(&ns, 5).unwrap();
        let before = snapshot(&*env.store);
        for result in [
            env.fence.bump_epoch(&ns, 5),
            env.fence.bump_epoch(&ns, 4),
            env.fence.bump_epoch(&ns, 5 + 1025),
            env.fence.advance_epoch(&ns, 0).map(drop),
            env.fence.advance_epoch(&ns, 1025).map(drop),
        ] {
            let err = result.unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
            assert!(!err.to_string().is_empty());
        }
        assert_eq!(snapshot(&*env.store), before);

        install_epoch(&*env.store, &env.fence, u64::MAX - 1);
        let before = snapshot(&*env.store);
        assert!(matches!(
            env.fence.advance_epoch(&ns, 2),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            env.fence.bump_epoch(&ns, u64::MAX - 1),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(snapshot(&*env.store), before);
        assert_eq!(env.fence.advance_epoch(&ns, 1).unwrap(), u64::MAX);
    });
}

#[test]
fn corrupt_fence_rows_give_corrupt_and_change_nothing() {
    each_backend(|env| {
        let ns = env.ns();
        let e = env.entity("a");
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let coordinator = ns.coordinator_partition();
        let keys = env.fence.keys().clone();
        let damage = |p: &Partition, key: Vec<u8>| {
            let outcome = env
                .store
                .apply(p, &Batch::new().put(key, b"\xff\xff\xff".to_vec()))
                .unwrap();
            assert!(outcome.is_committed());
        };
        let is_corrupt = |r: portcullis::Result<()>| matches!(r, Err(Error::Corrupt { .. }));

        // A damaged lease.
        damage(&e.partition(), keys.lease().to_vec());
        let before = snapshot(&*env.store);
        assert!(is_corrupt(env.fence.write(&e, 0, put("x")).map(drop)));
        assert_eq!(snapshot(&*env.store), before);

        // A damaged leased-shard row.
        env.fence.bump_epoch(&ns, 1).unwrap();
        damage(&coordinator, keys.shard(&env.entity("b")));
        let before = snapshot(&*env.store);
        assert!(is_corrupt(
            env.fence
                .revoke_step(&ns, RevokeBudget::default())
                .map(drop)
        ));
        assert!(is_corrupt(env.fence.sweep_step(&ns).map(drop)));
        assert!(is_corrupt(
            env.fence.write(&env.entity("b"), 1, put("x")).map(drop)
        ));
        assert_eq!(snapshot(&*env.store), before);

        // A damaged epoch row: even a plausible small byte string is refused.
        for bad in [
            b"\xff\xff\xff".to_vec(),
            b"x".to_vec(),
            encode_row(&1u64).into_iter().chain([0]).collect(),
        ] {
            assert!(
                env.store
                    .apply(&coordinator, &Batch::new().put(keys.current(), bad))
                    .unwrap()
                    .is_committed()
            );
            let before = snapshot(&*env.store);
            assert!(is_corrupt(env.fence.current_epoch(&ns).map(drop)));
            assert!(is_corrupt(env.fence.bump_epoch(&ns, 2)));
            assert!(is_corrupt(
                env.fence
                    .revoke_step(&ns, RevokeBudget::default())
                    .map(drop)
            ));
            assert!(is_corrupt(
                env.fence.write(&env.entity("c"), 1, put("x")).map(drop)
            ));
            assert_eq!(snapshot(&*env.store), before);
        }

        // A damaged recovery marker or checkpoint.
        for key in [keys.recovery(), keys.checkpoint()] {
            install_epoch(&*env.store, &env.fence, 1);
            damage(&coordinator, key);
            let before = snapshot(&*env.store);
            assert!(is_corrupt(
                env.fence
                    .revoke_step(&ns, RevokeBudget::default())
                    .map(drop)
            ));
            assert_eq!(snapshot(&*env.store), before);
        }
    });
}

#[test]
fn gated_revocation_is_stuck_only_while_paused() {
    // Sanity check of the pause hooks themselves (no sleeps): a paused slice stays paused.
    each_backend(|env| {
        let ns = env.ns();
        let gate = env.hooks.arm(HookPoint::SliceBeforeCheckpoint);
        let fence = env.fence.clone();
        let ns2 = ns.clone();
        let slice = thread::spawn(move || fence.revoke_step(&ns2, RevokeBudget::default()));
        gate.wait_reached();
        assert!(!slice.is_finished());
        gate.release();
        assert_eq!(slice.join().unwrap().unwrap(), RevokeProgress::Complete);
        let _ = GuardSwitches::default();
    });
}

// ---------------------------------------------------------------- error messages (E1)

/// A deposed owner must learn to stop serving the namespace: re-planning under the current
/// epoch would silently take the shard back from its new owner.
#[test]
fn fenced_error_tells_a_deposed_owner_to_stop_serving() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        env.fence.bump_epoch(&ns, 1).unwrap();
        revoke_to_complete(env, 10);
        let err = env.fence.write(&e, 0, put("stale")).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Fenced {
                    grant: 0,
                    current: 1
                }
            ),
            "{err}"
        );
        let message = err.to_string();
        assert!(message.contains("stop serving"), "{message}");
        assert!(message.contains("new owner"), "{message}");
        assert!(!message.contains("re-plan"), "{message}");
    });
}

// ---------------------------------------------------------------- budgets (F4, F5)

/// A zero time or push budget must not silently mean "never push": it is clamped to the least
/// that makes progress, one push per slice.
#[test]
fn f4_a_zero_budget_still_makes_progress() {
    for budget in [
        RevokeBudget::default().with_time_ms(0),
        RevokeBudget::default().with_max_pushes(0),
        RevokeBudget::default().with_time_ms(0).with_max_pushes(0),
    ] {
        each_backend(|env| {
            let ns = env.ns();
            lease_many(env, 3);
            env.fence.bump_epoch(&ns, 1).unwrap();
            let mut slices = 0;
            while env.fence.revoke_step(&ns, budget).unwrap() != RevokeProgress::Complete {
                slices += 1;
                assert!(slices <= 10, "{budget:?} never completes on {}", env.name);
            }
            assert_eq!(env.fence.stats().pushes, 3, "{budget:?}");
        });
    }
    assert_eq!(RevokeBudget::default().with_max_pushes(0).max_pushes(), 1);
    assert!(RevokeBudget::default().with_time_ms(0).time_ms() >= 1);
}

/// A row acknowledged at an epoch above the current one (a coordinator restored from an older
/// copy) vouches for nothing at the current epoch: it is outstanding, and is pushed.
#[test]
fn f5_a_row_acknowledged_above_the_current_epoch_is_outstanding() {
    each_backend(|env| {
        let (ns, e) = (env.ns(), env.entity("a"));
        committed(env.fence.write(&e, 0, put("k")).unwrap());
        let mut row = env.shard_row(&e).unwrap();
        row.acked_epoch = 5;
        let coordinator = ns.coordinator_partition();
        let outcome = env
            .store
            .apply(
                &coordinator,
                &Batch::new().put(env.fence.keys().shard(&e), encode_row(&row)),
            )
            .unwrap();
        assert!(outcome.is_committed());
        env.fence.bump_epoch(&ns, 1).unwrap();
        revoke_to_complete(env, 10);
        assert!(!env.lease_usable_below(&e, 1), "{:?}", env.lease(&e));
        assert_eq!(env.fence.stats().pushes, 1);
        assert!(matches!(
            env.fence.write(&e, 0, put("stale")),
            Err(Error::Fenced { .. })
        ));
    });
}
