//! A panic inside a background heads snapshot (SPEC S8) is caught: it must not unwind out of
//! the rayon task that runs it, which would abort the host process. The store keeps serving,
//! the next snapshot runs, and a reopen reads everything. (In its own test binary: before the
//! catch, the abort took the whole binary down.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};

fn open(dir: &std::path::Path) -> FileStore {
    FileStore::builder(dir)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .auto_compact(false)
        .max_loaded_partitions(1)
        .snapshot_every_bytes(4096)
        .open()
        .unwrap()
}

fn write(store: &FileStore, i: usize) {
    let p = Partition::new(format!("p{i}")).unwrap();
    let batch = Batch::new().put(b"k".to_vec(), vec![i as u8; 64]);
    assert!(store.apply(&p, &batch).unwrap().is_committed());
}

#[test]
fn s8_a_panic_in_a_background_snapshot_does_not_abort_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    store.set_before_fold_hook_for_test(Some(Arc::new(move |_| {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("a bug inside the background snapshot");
        }
    })));
    let mut written = 0;
    while calls.load(Ordering::SeqCst) == 0 && written < 10_000 {
        write(&store, written);
        written += 1;
        store.wait_for_background_snapshot_for_test();
    }
    assert!(
        calls.load(Ordering::SeqCst) >= 1,
        "no background snapshot ran"
    );
    // Still serving, and a later background snapshot runs to its end.
    let before = calls.load(Ordering::SeqCst);
    while calls.load(Ordering::SeqCst) == before && written < 20_000 {
        write(&store, written);
        written += 1;
        store.wait_for_background_snapshot_for_test();
    }
    assert!(
        calls.load(Ordering::SeqCst) > before,
        "no snapshot ran after the panic"
    );
    store.set_before_fold_hook_for_test(None);
    store.close().unwrap();
    let store = open(dir.path());
    for i in 0..written {
        let p = Partition::new(format!("p{i}")).unwrap();
        assert_eq!(store.get(&p, b"k").unwrap(), Some(vec![i as u8; 64]));
    }
    store.close().unwrap();
}
