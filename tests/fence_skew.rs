//! Clock skew between the planner and the store, below the margin (SPEC F header, F2, F3): a
//! planner whose clock lags the store's by more than `min_lease_budget_ms` still writes.

mod fence_support;

use fence_support::*;
use portcullis::fence::WriteOutcome;
use portcullis::store::Batch;

fn put(key: &str) -> Batch {
    Batch::new().put(key.as_bytes().to_vec(), b"v".to_vec())
}

/// A planner that lags the store by more than the budget (but less than the margin) sees a
/// lease as usable that the store already finds past its deadline. Before the fix every
/// re-plan used the same lease and the write answered `Unavailable` ("the lease kept changing
/// or expiring"); now the re-plan takes the store's clock into account, renews and writes.
#[test]
fn a_planner_lagging_the_store_beyond_the_budget_renews_and_writes() {
    each_backend(|env| {
        let c = env.config;
        let e = env.entity("a");
        // The store runs ahead of the planner: budget < lag < margin.
        let lag = c.min_lease_budget_ms() + (c.lease_margin_ms() - c.min_lease_budget_ms()) / 2;
        env.skew_store_clock(lag as i64);
        assert!(matches!(
            env.fence.write(&e, 0, put("first")).unwrap(),
            WriteOutcome::Committed { .. }
        ));
        let lease = env.lease(&e).unwrap();
        // Planner time at which the lease still has budget + (lag - budget) / 2 left: usable to
        // the planner, but its deadline (expiry - margin) has passed on the store's clock.
        let left = c.min_lease_budget_ms() + (lag - c.min_lease_budget_ms()) / 2;
        env.clock
            .set(lease.expires_at_ms - c.lease_margin_ms() - left);
        let outcome = env.fence.write(&e, 0, put("second"));
        assert!(
            matches!(outcome, Ok(WriteOutcome::Committed { .. })),
            "{}: a lagging planner could not write: {outcome:?}",
            env.name
        );
        // A store without deadlines has no deadline to pass: the lease is used as it is.
        let renewed = env.lease(&e).unwrap().expires_at_ms > lease.expires_at_ms;
        assert_eq!(
            renewed,
            env.deadlines(),
            "it renewed only where a deadline passed"
        );
    });
}
