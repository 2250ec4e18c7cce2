//! The randomized store model test (SPEC S1, S2) on the file-backed store. Small segments and
//! frequent base records make the model cross segment and chain boundaries.

#[macro_use]
mod conformance;

use std::sync::Arc;

use conformance::Fixture;
use portcullis::ManualClock;
use portcullis::store::{FileStore, SyncPolicy};

fn open_file(clock: ManualClock) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .segment_bytes(4096)
        .base_every_records(3)
        .open()
        .unwrap();
    Fixture::new(Arc::new(store), clock).keeping(dir)
}

store_model_tests!(open_file);
