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
