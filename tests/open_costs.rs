//! What an open asks of the file system, counted rather than timed (SPEC S5): after a clean
//! close it lists the journal once, opens no sealed segment and no file twice, and writes and
//! syncs nothing; after a killed writer it still makes what it found durable (SPEC S4), and
//! only that.

mod common;

use std::sync::Arc;

use common::disk::{builder, written_after_keeper};
use common::traced::Traced;
use portcullis::store::{Batch, FileStore, Partition, Store};

fn count(calls: &[String], what: &str) -> usize {
    calls.iter().filter(|c| c.starts_with(what)).count()
}

#[test]
fn a_clean_reopen_lists_once_opens_each_file_once_and_writes_and_syncs_nothing() {
    let fs = written_after_keeper(true);
    let traced = Traced::new(Arc::new(fs.clone()));
    let store = builder(&fs).vfs(Arc::new(traced.clone())).open().unwrap();
    let calls = traced.take();
    assert_eq!(count(&calls, "list "), 1, "{calls:#?}");
    for what in ["write ", "sync_data ", "sync_dir ", "rename ", "remove "] {
        assert_eq!(count(&calls, what), 0, "{what}: {calls:#?}");
    }
    let mut opened: Vec<&String> = calls.iter().filter(|c| c.starts_with("open ")).collect();
    let all = opened.len();
    opened.sort();
    opened.dedup();
    assert_eq!(opened.len(), all, "a file opened twice: {calls:#?}");
    drop(store);
}

#[test]
fn a_reopen_after_a_killed_writer_still_syncs_what_it_found() {
    let fs = written_after_keeper(true);
    let store = builder(&fs).open().unwrap();
    let p = Partition::new("late").unwrap();
    let put = Batch::new().put(b"v".to_vec(), b"after the snapshot".to_vec());
    assert!(store.apply(&p, &put).unwrap().is_committed());
    let image = fs.crash_process();
    drop(store);

    let traced = Traced::new(Arc::new(image.clone()));
    let store: FileStore = builder(&image)
        .vfs(Arc::new(traced.clone()))
        .open()
        .unwrap();
    let calls = traced.take();
    assert!(store.open_report().records_scanned > 0);
    // The scanned bytes are written over themselves and synced once. The directories are not
    // synced: the tail held records, so its directory entry was synced before they were
    // written, and the store directory and its parent were synced before the manifest open
    // read existed (a cut-short segment is the control
    // `control_skipping_the_empty_tail_check_is_caught` in tests/crash_sweep.rs).
    assert_eq!(count(&calls, "write "), 1, "{calls:#?}");
    assert_eq!(count(&calls, "sync_data "), 1, "{calls:#?}");
    assert_eq!(count(&calls, "sync_dir "), 0, "{calls:#?}");
    assert_eq!(
        store.get(&p, b"v").unwrap().as_deref(),
        Some(&b"after the snapshot"[..])
    );
}
