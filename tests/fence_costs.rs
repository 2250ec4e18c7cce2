//! The cost goals of fencing (SPEC P5, P6), counted rather than timed: revocation over
//! 10,000 live leases in at most 2,500 slices and 5 store calls per push; a fenced write with
//! a usable lease in 2 store calls, and with a renewal in 4.

mod fence_support;

use fence_support::*;
use portcullis::fence::{RevokeBudget, RevokeProgress};
use portcullis::store::Batch;

#[test]
fn p5_revocation_of_10000_leases() {
    each_backend(|env| {
        let ns = env.ns();
        for i in 0..10_000 {
            let _ = env
                .fence
                .write(&env.entity(&format!("e{i:05}")), 0, Batch::new())
                .unwrap();
        }
        env.fence.bump_epoch(&ns, 1).unwrap();
        let before = env.fence.stats();
        let mut slices = 0u64;
        while env.fence.revoke_step(&ns, RevokeBudget::default()).unwrap()
            != RevokeProgress::Complete
        {
            slices += 1;
            assert!(slices <= 2_500, "P5: at most 2,500 slices");
        }
        slices += 1;
        let after = env.fence.stats();
        let (calls, pushes) = (
            after.store_calls - before.store_calls,
            after.pushes - before.pushes,
        );
        println!(
            "{}: {slices} slices, {calls} store calls, {pushes} pushes",
            env.name
        );
        assert_eq!(pushes, 10_000);
        assert!(slices <= 2_500);
        assert!(
            calls <= 5 * pushes,
            "P5: at most 5 store calls per push, got {calls} for {pushes}"
        );
    });
}

#[test]
fn p6_store_calls_per_fenced_write() {
    each_backend(|env| {
        let e = env.entity("a");
        let before = env.fence.stats().store_calls;
        let _ = env.fence.write(&e, 0, Batch::new()).unwrap();
        assert_eq!(env.fence.stats().store_calls - before, 4, "P6: renewal");
        let before = env.fence.stats().store_calls;
        let _ = env.fence.write(&e, 0, Batch::new()).unwrap();
        assert_eq!(
            env.fence.stats().store_calls - before,
            2,
            "P6: usable lease"
        );
    });
}
