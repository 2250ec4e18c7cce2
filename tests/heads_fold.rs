//! Folding the heads a snapshot wrote back out of memory (SPEC S8): after each heads snapshot
//! the partition table reads the new pages and drops the overlay heads they hold. Two rules
//! keep that exact, each with a negative control that breaks it and sees a wrong read:
//! - a head that changed while the snapshot was being written stays in memory;
//! - a lookup that read the old pages while the table changed pages starts again.
//!
//! Interleavings are forced with test hooks; no test sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};

fn open(dir: &std::path::Path) -> FileStore {
    FileStore::builder(dir)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .auto_compact(false)
        .max_loaded_partitions(1)
        .open()
        .unwrap()
}

fn write(store: &FileStore, p: &Partition, value: &[u8]) {
    let batch = Batch::new().put(b"k".to_vec(), value.to_vec());
    assert!(store.apply(p, &batch).unwrap().is_committed());
}

fn names() -> (Partition, Partition) {
    (Partition::new("p").unwrap(), Partition::new("q").unwrap())
}

/// P is written and its index dropped (its head in the overlay); a snapshot takes that head,
/// and while it is being written P is written again and dropped again. What does P read after
/// the fold, and after a reopen?
fn head_changed_during_the_snapshot(
    dir: &std::path::Path,
    unchecked: bool,
) -> [Option<Vec<u8>>; 2] {
    let (p, q) = names();
    let store = open(dir);
    store.set_heads_fold_unchecked_for_test(unchecked);
    write(&store, &p, b"v1");
    write(&store, &q, b"q");
    assert!(
        store.overlay_heads_for_test() >= 1,
        "p's index was not dropped"
    );
    let once = Arc::new(AtomicBool::new(false));
    let (hooked, once2) = (store.clone(), once.clone());
    store.set_before_fold_hook_for_test(Some(Arc::new(move |_| {
        if !once2.swap(true, Ordering::SeqCst) {
            write(&hooked, &p, b"v2");
            write(&hooked, &q, b"q");
        }
    })));
    store.write_heads_snapshot().unwrap();
    assert!(once.load(Ordering::SeqCst), "the hook did not run");
    store.set_before_fold_hook_for_test(None);
    let (p, _) = names();
    let read = store.get(&p, b"k").unwrap();
    store.close().unwrap();
    let store = open(dir);
    let reopened = store.get(&p, b"k").unwrap();
    store.close().unwrap();
    [read, reopened]
}

#[test]
fn a_head_that_changed_while_the_snapshot_was_written_stays_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let got = head_changed_during_the_snapshot(dir.path(), false);
    assert_eq!(got, [Some(b"v2".to_vec()), Some(b"v2".to_vec())]);
}

/// Negative control: a fold that drops the overlay head without checking it is still the one
/// the snapshot wrote serves the older value.
#[test]
fn negative_control_folding_a_changed_head_serves_an_older_value() {
    let dir = tempfile::tempdir().unwrap();
    let got = head_changed_during_the_snapshot(dir.path(), true);
    assert_eq!(got[0], Some(b"v1".to_vec()), "{got:?}");
}

/// P's head is in the overlay; a read of P finds it there, and before it creates P's state a
/// snapshot folds that head into the new pages. What does the read answer?
fn pages_changed_during_a_lookup(dir: &std::path::Path, recheck_off: bool) -> Option<Vec<u8>> {
    let (p, q) = names();
    let store = open(dir);
    store.set_lookup_recheck_off_for_test(recheck_off);
    write(&store, &p, b"v1");
    write(&store, &q, b"q");
    assert!(
        store.overlay_heads_for_test() >= 1,
        "p's index was not dropped"
    );
    let once = Arc::new(AtomicBool::new(false));
    let (hooked, once2) = (store.clone(), once.clone());
    store.set_lookup_hook_for_test(Some(Arc::new(move |name| {
        if name == b"p" && !once2.swap(true, Ordering::SeqCst) {
            hooked.write_heads_snapshot().unwrap();
            assert_eq!(
                hooked.overlay_heads_for_test(),
                0,
                "the snapshot folded nothing"
            );
        }
    })));
    let read = store.get(&p, b"k").unwrap();
    assert!(once.load(Ordering::SeqCst), "the hook did not run");
    store.set_lookup_hook_for_test(None);
    store.close().unwrap();
    read
}

#[test]
fn a_lookup_that_read_the_old_pages_starts_again() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        pages_changed_during_a_lookup(dir.path(), false),
        Some(b"v1".to_vec())
    );
}

/// Negative control: without the check the lookup trusts what it found before the fold (the
/// head was in the overlay, which no longer holds it) and answers that P has no record.
#[test]
fn negative_control_a_lookup_that_trusts_the_old_pages_loses_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(pages_changed_during_a_lookup(dir.path(), true), None);
}

/// Many partitions written once under a budget, snapshots folding their heads back between
/// writes and reads, then a reopen: every partition reads its one value, and the count of
/// partitions stays exact (a folded head is counted once, in the pages).
#[test]
fn partitions_read_back_and_count_once_across_folds_and_a_reopen() {
    const PARTS: usize = 3_000;
    let dir = tempfile::tempdir().unwrap();
    let part = |i: usize| Partition::new(format!("f/p{i:05}")).unwrap();
    let store = open(dir.path());
    store.set_overlay_bound_for_test(200);
    for i in 0..PARTS {
        write(&store, &part(i), &(i as u64).to_le_bytes());
        if i % 500 == 499 {
            // Overwrite some of the older ones, read others, then fold everything.
            write(&store, &part(i / 2), b"again");
            store.write_heads_snapshot().unwrap();
            assert_eq!(store.stats().partitions, i as u64 + 1);
        }
    }
    store.wait_for_background_snapshot_for_test();
    let want = |i: usize| -> Vec<u8> {
        if (0..PARTS).filter(|j| j % 500 == 499).any(|j| j / 2 == i) {
            b"again".to_vec()
        } else {
            (i as u64).to_le_bytes().to_vec()
        }
    };
    for i in 0..PARTS {
        assert_eq!(store.get(&part(i), b"k").unwrap(), Some(want(i)), "p{i}");
    }
    assert_eq!(store.stats().partitions, PARTS as u64);
    assert_eq!(store.list_partitions(b"f/").unwrap().len(), PARTS);
    store.close().unwrap();
    let store = open(dir.path());
    assert_eq!(store.stats().partitions, PARTS as u64);
    for i in (0..PARTS).step_by(7) {
        assert_eq!(store.get(&part(i), b"k").unwrap(), Some(want(i)), "p{i}");
    }
    store.close().unwrap();
}
