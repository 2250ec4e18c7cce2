//! The store conformance suite (SPEC S9) on the in-memory backend.

#[macro_use]
mod conformance;

use std::sync::Arc;

use conformance::Fixture;
use portcullis::ManualClock;
use portcullis::store::MemoryStore;

fn open_memory(clock: ManualClock) -> Fixture {
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    Fixture::new(Arc::new(store), clock)
}

conformance_suite!(open_memory);

/// The same suite and model on an in-memory store with a distributed backend's shape (SPEC S11):
/// etcd-like count and size limits, and no server-side deadlines.
mod limited_without_deadlines {
    use super::*;
    use portcullis::store::StoreLimits;

    fn open_limited(clock: ManualClock) -> Fixture {
        let limits = StoreLimits::DEFAULT
            .with_max_batch_ops(63)
            .with_max_batch_bytes(1 << 20)
            .with_max_value_bytes((1 << 20) - 1024);
        let store = MemoryStore::with_clock(Arc::new(clock.clone()))
            .with_limits(limits)
            .without_deadlines();
        Fixture::new(Arc::new(store), clock)
    }

    conformance_suite!(open_limited);
    store_model_tests!(open_limited);
}
