//! What reading a history allocates: reading a log page allocates each record's payload once
//! (the store's own copy of the row, its header cut off in place), not a second copy.
//!
//! A counting global allocator (`stats_alloc`) counts allocations; the tests of this binary
//! take turns (`ONE_AT_A_TIME`), so no other test's allocations blur the counts.

use std::alloc::System;
use std::sync::Mutex;

use portcullis::log;
use portcullis::store::{Batch, FileStore, MemoryStore, Partition, Store, SyncPolicy};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const RECORDS: usize = 200;

fn fill(store: &dyn Store, p: &Partition) {
    for i in 0..RECORDS {
        let record = vec![i as u8; 100 + i];
        let appended = log::append(store, p, &[record], Batch::new()).unwrap();
        assert!(appended.committed().is_some());
    }
}

/// Allocations made by reading the whole log in one page, and the records read.
fn allocations_of_one_page(store: &dyn Store, p: &Partition) -> usize {
    let region = Region::new(GLOBAL);
    let page = log::read_log(store, p, 1, RECORDS).unwrap();
    let made = region.change().allocations;
    assert_eq!(page.records.len(), RECORDS);
    for (i, r) in page.records.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1);
        assert_eq!(r.payload, vec![i as u8; 100 + i]);
    }
    made
}

#[test]
fn a_log_page_allocates_each_payload_once_on_the_memory_store() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = MemoryStore::new();
    let p = Partition::new("e/logs/1").unwrap();
    fill(&store, &p);
    // The store allocates each row's key and value; the log adds nothing per record.
    let made = allocations_of_one_page(&store, &p);
    assert!(
        made <= 2 * RECORDS + 16,
        "{made} allocations for {RECORDS} records"
    );
}

#[test]
fn a_log_page_allocates_each_payload_once_on_the_file_store() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("e/logs/1").unwrap();
    {
        let store = FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()
            .unwrap();
        fill(&store, &p);
        store.close().unwrap();
    }
    let store = FileStore::builder(dir.path()).open().unwrap();
    // The first read loads the partition's index; the second reads only values.
    log::read_log(&store, &p, 1, RECORDS).unwrap();
    let made = allocations_of_one_page(&store, &p);
    assert!(
        made <= 2 * RECORDS + 32,
        "{made} allocations for {RECORDS} records"
    );
    store.close().unwrap();
}
