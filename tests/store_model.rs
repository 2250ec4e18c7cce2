//! The randomized store model test (SPEC S1, S2) on the in-memory backend: random guarded
//! batches, clock moves, reads and paged scans checked against a `BTreeMap` model.

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

store_model_tests!(open_memory);
