//! The store conformance suite (SPEC S9) on the file-backed store, with every commit synced.

#[macro_use]
mod conformance;

use std::sync::Arc;

use conformance::Fixture;
use portcullis::ManualClock;
use portcullis::store::FileStore;

fn open_file(clock: ManualClock) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    Fixture::new(Arc::new(store), clock).keeping(dir)
}

conformance_suite!(open_file);
