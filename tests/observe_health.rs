//! SPEC E8: a store or an engine that fails in the background never reports healthy. Each
//! failure sets `degraded` with its reason: a latched sync failure, a background heads snapshot
//! that failed, the periodic sync thread or the engine's background thread dying, an owner
//! lease that could not be renewed. Each test's negative control turns the flag off
//! (`set_health_off_for_test`) and finds the failure reported as health.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::engine::{TestEngine, TestMachine, TestStore, builder};
use crossbeam::channel::unbounded;
use portcullis::observe::{DegradedCause, Event};
use portcullis::store::{Batch, FailMode, FaultFs, FileStore, Partition, Store, SyncPolicy};

fn put(store: &FileStore, i: usize) -> portcullis::Result<()> {
    let p = Partition::new(format!("p{i}")).unwrap();
    store
        .apply(&p, &Batch::new().put(b"k".to_vec(), vec![i as u8; 64]))
        .map(|_| ())
}

/// Whether the store's stats report `cause`.
fn reports(store: &FileStore, cause: DegradedCause) -> Result<(), String> {
    match store.stats().degraded {
        Some(d) if d.cause == cause => Ok(()),
        other => Err(format!("the stats say {other:?}, not {cause:?}")),
    }
}

fn engine_reports(engine: &TestEngine, cause: DegradedCause) -> Result<(), String> {
    match engine.stats().degraded {
        Some(d) if d.cause == cause => Ok(()),
        other => Err(format!("the stats say {other:?}, not {cause:?}")),
    }
}

/// A store whose journal sync failed: degraded (SyncFailed) for as long as it is open.
fn latched_sync_failure(health_off: bool) -> Result<(), String> {
    let fs = FaultFs::new();
    let store = FileStore::builder("/store")
        .vfs(Arc::new(fs.clone()))
        .open()
        .unwrap();
    store.set_health_off_for_test(health_off);
    put(&store, 1).unwrap();
    reports(&store, DegradedCause::SyncFailed).unwrap_err();
    fs.fail_syncs();
    assert!(put(&store, 2).is_err());
    fs.clear_faults();
    reports(&store, DegradedCause::SyncFailed)
}

#[test]
fn e8_a_latched_sync_failure_degrades_the_store() {
    latched_sync_failure(false).unwrap();
}

#[test]
fn control_with_the_flag_off_a_latched_sync_failure_looks_healthy() {
    assert!(latched_sync_failure(true).is_err());
}

/// A background heads snapshot that fails (here it panics inside its fold) degrades the store
/// until a later snapshot succeeds.
fn failed_background_snapshot(health_off: bool) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = unbounded();
    let store = FileStore::builder(dir.path())
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .auto_compact(false)
        .snapshot_every_bytes(4096)
        .listener(Arc::new(move |e: &Event| drop(tx.send(e.clone()))))
        .open()
        .unwrap();
    store.set_health_off_for_test(health_off);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    store.set_before_fold_hook_for_test(Some(Arc::new(move |_| {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("a bug inside the background snapshot");
        }
    })));
    let mut i = 0;
    while calls.load(Ordering::SeqCst) == 0 {
        put(&store, i).unwrap();
        i += 1;
        assert!(i < 10_000, "no background snapshot ran");
        store.wait_for_background_snapshot_for_test();
    }
    let told = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the failure is told");
    assert!(matches!(told, Event::SnapshotFailed { .. }), "{told:?}");
    let degraded = reports(&store, DegradedCause::SnapshotFailed);
    // A snapshot that succeeds ends it.
    store.write_heads_snapshot().unwrap();
    assert_eq!(store.stats().degraded, None);
    degraded
}

#[test]
fn e8_a_failed_background_snapshot_degrades_the_store_until_one_succeeds() {
    failed_background_snapshot(false).unwrap();
}

#[test]
fn control_with_the_flag_off_a_failed_background_snapshot_looks_healthy() {
    assert!(failed_background_snapshot(true).is_err());
}

/// A compaction fails at one operation that does not latch the journal (the first of the
/// compaction's operations whose failure fails it and leaves the journal serving): told, and
/// degraded until a compaction succeeds.
fn failed_compaction(health_off: bool) -> Result<(), String> {
    for k in 1..=400 {
        let fs = FaultFs::new();
        let (tx, rx) = unbounded();
        let store = FileStore::builder("/store")
            .vfs(Arc::new(fs.clone()))
            .segment_bytes(4096)
            .auto_compact(false)
            .listener(Arc::new(move |e: &Event| drop(tx.send(e.clone()))))
            .open()
            .unwrap();
        store.set_health_off_for_test(health_off);
        for i in 0..100 {
            put(&store, i % 3).unwrap();
        }
        fs.fail_at(fs.ops() + k, FailMode::Once);
        let failed = store.compact().is_err();
        fs.clear_faults();
        if !failed || put(&store, 1000).is_err() {
            continue; // the compaction got past that operation, or the journal latched
        }
        let told: Vec<Event> = rx.try_iter().collect();
        assert!(
            told.iter()
                .any(|e| matches!(e, Event::CompactionFailed { .. })),
            "{told:?}"
        );
        assert_eq!(store.stats().compactions_failed, 1);
        let degraded = reports(&store, DegradedCause::CompactionFailed);
        store.compact().unwrap();
        assert_eq!(
            store.stats().degraded,
            None,
            "cleared by a compaction that succeeded"
        );
        return degraded;
    }
    panic!("no operation of the compaction failed it without latching the journal");
}

#[test]
fn e8_a_failed_compaction_degrades_the_store_until_one_succeeds() {
    failed_compaction(false).unwrap();
}

#[test]
fn control_with_the_flag_off_a_failed_compaction_looks_healthy() {
    assert!(failed_compaction(true).is_err());
}

/// The periodic sync thread dies: commits are no longer synced on a timer.
fn dead_periodic_sync(health_off: bool) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = unbounded();
    let store = FileStore::builder(dir.path())
        .sync_policy(SyncPolicy::PeriodicMayLoseRecent { interval_ms: 1 })
        .listener(Arc::new(move |e: &Event| drop(tx.send(e.clone()))))
        .open()
        .unwrap();
    store.set_health_off_for_test(health_off);
    put(&store, 1).unwrap();
    reports(&store, DegradedCause::BackgroundThreadEnded).unwrap_err();
    store.kill_periodic_sync_for_test();
    let told = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the thread's end is told");
    assert!(
        matches!(&told, Event::BackgroundThreadEnded { thread, .. } if thread == "portcullis-sync"),
        "{told:?}"
    );
    reports(&store, DegradedCause::BackgroundThreadEnded)
}

#[test]
fn e8_a_dead_periodic_sync_thread_degrades_the_store() {
    dead_periodic_sync(false).unwrap();
}

#[test]
fn control_with_the_flag_off_a_dead_periodic_sync_thread_looks_healthy() {
    assert!(dead_periodic_sync(true).is_err());
}

/// The engine's background thread (renewals, sweeps, the background warm) dies: the death is
/// told, and the engine is degraded until its next call starts the thread again.
fn dead_background_thread(health_off: bool) -> Result<(), String> {
    let (tx, rx) = unbounded();
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .listener(Arc::new(move |e: &Event| drop(tx.send(e.clone()))))
        .open()
        .unwrap();
    engine.set_health_off_for_test(health_off);
    engine_reports(&engine, DegradedCause::BackgroundThreadEnded).unwrap_err();
    engine.kill_background_for_test();
    let told = rx
        .iter()
        .find(|e| matches!(e, Event::BackgroundThreadEnded { .. }))
        .expect("the thread's end is told");
    assert!(
        matches!(&told, Event::BackgroundThreadEnded { thread, .. } if thread == "portcullis-engine"),
        "{told:?}"
    );
    // `stats` is not a call that starts the thread again: the death stands until one is.
    let degraded = engine_reports(&engine, DegradedCause::BackgroundThreadEnded);
    engine.register(&common::engine::entity(1)).unwrap();
    assert_eq!(engine.stats().degraded, None, "started again by the call");
    assert!(engine.stats().background.running);
    engine.close().unwrap();
    degraded
}

#[test]
fn e8_a_dead_background_thread_degrades_the_engine_until_it_is_started_again() {
    dead_background_thread(false).unwrap();
}

#[test]
fn control_with_the_flag_off_a_dead_background_thread_looks_healthy() {
    assert!(dead_background_thread(true).is_err());
}

/// Renewals of the owner lease fail (the store refuses the lease row's write).
fn failing_renewals(health_off: bool) -> Result<(), String> {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .renew_owner_lease(false)
        .open()
        .unwrap();
    engine.set_health_off_for_test(health_off);
    *store.fail_writes_of.lock() = Some(Partition::new("s/engine").unwrap());
    assert!(engine.renew_owner_lease().is_err());
    let degraded = engine_reports(&engine, DegradedCause::OwnerLeaseNotRenewed);
    *store.fail_writes_of.lock() = None;
    degraded
}

#[test]
fn e8_an_owner_lease_that_could_not_be_renewed_degrades_the_engine() {
    failing_renewals(false).unwrap();
}

#[test]
fn control_with_the_flag_off_a_failing_renewal_looks_healthy() {
    assert!(failing_renewals(true).is_err());
}

/// An engine over a file store it opened reports the store's degradation too.
#[test]
fn e8_an_engine_reports_the_degradation_of_the_store_it_opened() {
    let fs = FaultFs::new();
    let disk = fs.clone();
    let engine = portcullis::Engine::builder(Arc::new(TestMachine::default()))
        .directory("/engine")
        .file_store(move |b| b.vfs(Arc::new(disk)))
        .pool_threads(2)
        .open()
        .unwrap();
    let e = common::engine::entity(1);
    engine.register(&e).unwrap();
    assert_eq!(engine.stats().degraded, None);
    fs.fail_syncs();
    assert!(engine.append(&e, common::engine::recs(&["a"])).is_err());
    let degraded = engine.stats().degraded.expect("degraded");
    assert_eq!(degraded.cause, DegradedCause::SyncFailed);
    assert_eq!(engine.stats().store.degraded, Some(degraded));
}
