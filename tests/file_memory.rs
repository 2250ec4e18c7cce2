//! What opening, loading a partition and compacting hold in memory (SPEC S8): open scans the
//! journal after the snapshot through a bounded window, never a whole segment at once; a load
//! holds keys and value locations plus one record, never every body of its chain; compaction
//! reads a segment through a bounded window too.
//!
//! A counting global allocator (`stats_alloc`) gives the heap in use; a file layer samples it
//! at every read, which is where each used to hold the most. The tests of this binary take
//! turns (`ONE_AT_A_TIME`), so no other test's allocations blur the figures.

mod common;

use std::alloc::System;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use common::os_files::{ReadObserver, observed_os};
use portcullis::inspect::Inspector;
use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn heap_in_use() -> i64 {
    let s = GLOBAL.stats();
    // stats_alloc adds a realloc's growth to `bytes_allocated` and a shrink to
    // `bytes_deallocated`.
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

/// The most heap in use seen at any read since the last reset.
static PEAK: AtomicI64 = AtomicI64::new(0);

fn reset_peak() -> i64 {
    let now = heap_in_use();
    PEAK.store(now, Ordering::SeqCst);
    now
}

fn sample() {
    PEAK.fetch_max(heap_in_use(), Ordering::SeqCst);
}

/// Samples the heap at every read of the operating system's files.
#[derive(Debug)]
struct Sampling;

impl ReadObserver for Sampling {
    fn before_read(&self, _len: usize) {
        sample();
    }
}

/// The tests of this binary measure one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const MIB: i64 = 1 << 20;
/// Batches of one 1 MiB value each: a chain of 60 records (no base falls due below 64) in one
/// 80 MiB segment.
const BATCHES: u32 = 60;

#[test]
fn loading_and_compacting_hold_one_record_not_a_chain_or_a_segment() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("big").unwrap();
    let open = || {
        FileStore::builder(dir.path())
            .vfs(Arc::new(observed_os(Arc::new(Sampling))))
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .segment_bytes(80 << 20)
            .auto_compact(false)
            .open()
            .unwrap()
    };
    {
        let store = open();
        for i in 0..BATCHES {
            let value = vec![i as u8; 1 << 20];
            let batch = Batch::new().put(format!("k{i:03}").into_bytes(), value);
            assert!(store.apply(&p, &batch).unwrap().is_committed());
        }
        // Another partition moves the journal to a second segment, sealing the first.
        let other = Partition::new("other").unwrap();
        for i in 0..30u32 {
            let batch = Batch::new().put(format!("o{i}").into_bytes(), vec![1u8; 1 << 20]);
            assert!(store.apply(&other, &batch).unwrap().is_committed());
        }
        store.close().unwrap();
    }

    let store = open();
    let before = reset_peak();
    // The first read loads the partition by walking its 60-record chain.
    assert_eq!(store.get(&p, b"k007").unwrap().unwrap()[0], 7);
    let load_peak = PEAK.load(Ordering::SeqCst) - before;
    assert!(
        load_peak < 16 * MIB,
        "loading a 60 MiB chain held {} MiB at once",
        load_peak / MIB
    );

    let before = reset_peak();
    let report = store.compact().unwrap();
    let compaction_peak = PEAK.load(Ordering::SeqCst) - before;
    assert!(report.segments_removed >= 1, "{report:?}");
    assert!(
        compaction_peak < 40 * MIB,
        "compacting an 80 MiB segment held {} MiB at once",
        compaction_peak / MIB
    );
    for i in [0, BATCHES - 1] {
        let value = store
            .get(&p, format!("k{i:03}").as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(value, vec![i as u8; 1 << 20]);
    }
    store.close().unwrap();
}

/// Copies the files of a store directory (and its journal) as they are now: a crash image of a
/// store that is still open, so what was written after its last heads snapshot stays to scan.
fn copy_store(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&target).unwrap();
            copy_store(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn open_scans_the_journal_after_the_snapshot_through_a_bounded_window() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // 64 MiB of batches after the last heads snapshot, all in one segment: 256 records of
    // 256 KiB values, over four partitions.
    const RECORDS: u32 = 256;
    let written = tempfile::tempdir().unwrap();
    let builder = |dir: &Path| {
        FileStore::builder(dir)
            .vfs(Arc::new(observed_os(Arc::new(Sampling))))
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .segment_bytes(128 << 20)
            .snapshot_every_bytes(1 << 40)
            .auto_compact(false)
    };
    let store = builder(written.path()).open().unwrap();
    for i in 0..RECORDS {
        let p = Partition::new(format!("p{}", i % 4)).unwrap();
        let batch = Batch::new().put(format!("k{i:03}").into_bytes(), vec![i as u8; 256 << 10]);
        assert!(store.apply(&p, &batch).unwrap().is_committed());
    }
    store.flush().unwrap();
    let image = tempfile::tempdir().unwrap();
    copy_store(written.path(), image.path());
    store.close().unwrap();

    let before = reset_peak();
    let reopened = builder(image.path()).open().unwrap();
    let open_peak = PEAK.load(Ordering::SeqCst) - before;
    let report = reopened.open_report();
    assert!(
        report.journal_bytes_scanned >= 64 << 20 && report.records_scanned >= RECORDS as u64,
        "open did not scan the journal the test wrote: {report:?}"
    );
    assert!(
        open_peak < 4 * MIB,
        "opening a store with 64 MiB of journal after its snapshot held {} MiB at once",
        open_peak / MIB
    );
    for i in [0, RECORDS - 1] {
        let p = Partition::new(format!("p{}", i % 4)).unwrap();
        let value = reopened.get(&p, format!("k{i:03}").as_bytes()).unwrap();
        assert_eq!(value, Some(vec![i as u8; 256 << 10]));
    }
    reopened.close().unwrap();
}

/// The inspection tool opens a store through a layer that keeps every change in memory; open's
/// rewrite of the journal it scanned changes no byte, so it must not copy the journal there.
#[test]
fn inspecting_a_crashed_store_keeps_no_copy_of_the_journal_it_only_rewrote() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let written = tempfile::tempdir().unwrap();
    let store = FileStore::builder(written.path())
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .segment_bytes(128 << 20)
        .snapshot_every_bytes(1 << 40)
        .auto_compact(false)
        .open()
        .unwrap();
    let p = Partition::new("p").unwrap();
    for i in 0..128u32 {
        let batch = Batch::new().put(format!("k{i:03}").into_bytes(), vec![i as u8; 256 << 10]);
        assert!(store.apply(&p, &batch).unwrap().is_committed());
    }
    store.flush().unwrap();
    let image = tempfile::tempdir().unwrap();
    copy_store(written.path(), image.path());
    store.close().unwrap();

    let before = heap_in_use();
    let inspector = Inspector::open(image.path()).unwrap();
    let held = heap_in_use() - before;
    assert!(
        inspector.summary().unwrap().open.journal_bytes_scanned >= 32 << 20,
        "open did not scan the journal the test wrote"
    );
    assert!(
        held < 4 * MIB,
        "inspecting a store with 32 MiB of journal after its snapshot kept {} MiB",
        held / MIB
    );
    assert!(inspector.verify().unwrap().is_clean());
}

/// A loaded key costs at most 48 bytes plus its own length (SPEC S8): the load builds the index
/// from the partition's base in bulk, with full B-tree nodes, where inserting ascending keys one
/// at a time leaves the nodes half full (about 80 bytes a key here).
#[test]
fn a_loaded_key_costs_at_most_48_bytes_plus_the_key() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const KEYS: u32 = 20_000;
    const KEY_LEN: i64 = 16;
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("keys").unwrap();
    let open = || {
        FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .auto_compact(false)
            .open()
            .unwrap()
    };
    let key = |i: u32| format!("key-{i:012}").into_bytes();
    {
        let store = open();
        for i in 0..KEYS {
            let batch = Batch::new().put(key(i), vec![2u8; 16]);
            assert!(store.apply(&p, &batch).unwrap().is_committed());
        }
        store.close().unwrap();
    }
    let store = open();
    let before = heap_in_use();
    assert!(store.get(&p, &key(0)).unwrap().is_some());
    let per_key = (heap_in_use() - before) / i64::from(KEYS);
    assert!(
        per_key <= 48 + KEY_LEN,
        "a loaded key holds {per_key} B, over 48 B plus its {KEY_LEN}-byte key"
    );
    store.close().unwrap();
}

/// Partitions written once each under a budget of loaded indexes: what the store holds must
/// not grow with their number (SPEC S8). Each written partition's index is dropped, leaving
/// its head in the table's overlay until a heads snapshot holds it; a snapshot falls due when
/// the overlay reaches its bound, and folds the heads it wrote back into its pages.
///
/// Returns the heap held after the first sixth of the partitions and at the end (after each
/// chunk the background snapshot is waited for, so the figures do not depend on scheduling),
/// and the most overlay heads seen.
fn write_once_under_a_budget(fold_off: bool) -> (i64, i64, usize) {
    const PARTS: u32 = 60_000;
    const CHUNK: u32 = 1_000;
    const BOUND: usize = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path())
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .auto_compact(false)
        .max_loaded_partitions(64)
        .open()
        .unwrap();
    store.set_overlay_bound_for_test(BOUND);
    store.set_heads_fold_off_for_test(fold_off);
    let before = heap_in_use();
    let (mut early, mut most_overlay) = (0, 0);
    for i in 0..PARTS {
        let p = Partition::new(format!("e/memory/p{i:07}")).unwrap();
        let batch = Batch::new().put(b"k".to_vec(), vec![7u8; 16]);
        assert!(store.apply(&p, &batch).unwrap().is_committed());
        if (i + 1) % CHUNK == 0 {
            store.wait_for_background_snapshot_for_test();
            most_overlay = most_overlay.max(store.overlay_heads_for_test());
            if i + 1 == PARTS / 6 {
                early = heap_in_use() - before;
            }
        }
    }
    let end = heap_in_use() - before;
    let stats = store.stats();
    assert_eq!(stats.partitions, PARTS as u64, "{stats:?}");
    assert!(stats.partitions_loaded <= 64, "{stats:?}");
    // Every partition still reads back.
    for i in (0..PARTS).step_by(997) {
        let p = Partition::new(format!("e/memory/p{i:07}")).unwrap();
        assert_eq!(store.get(&p, b"k").unwrap(), Some(vec![7u8; 16]), "p{i}");
    }
    store.close().unwrap();
    (early, end, most_overlay)
}

#[test]
fn writing_many_partitions_once_under_a_budget_holds_flat_memory() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (early, end, most_overlay) = write_once_under_a_budget(false);
    println!(
        "heap held after 10,000 partitions {early} B, after 60,000 {end} B; at most {most_overlay} overlay heads"
    );
    // 50,000 more partitions: without the fold about 80 B each (4 MiB) would stay.
    assert!(
        end - early < MIB,
        "memory grew by {} KiB over 50,000 partitions written once",
        (end - early) >> 10
    );
    assert!(
        most_overlay <= 5_000 + 1_000 + 64,
        "{most_overlay} heads in the overlay"
    );
}

/// Negative control: with the fold switched off the overlay keeps every head written since
/// open, and the same measurement grows with the partitions.
#[test]
fn negative_control_without_the_fold_memory_grows_with_the_partitions_written() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (early, end, most_overlay) = write_once_under_a_budget(true);
    println!(
        "without the fold: heap held after 10,000 partitions {early} B, after 60,000 {end} B; at most {most_overlay} overlay heads"
    );
    assert!(
        end - early >= MIB,
        "grew by only {} KiB",
        (end - early) >> 10
    );
    assert!(most_overlay > 50_000, "{most_overlay}");
}
