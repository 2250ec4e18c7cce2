//! SPEC E8 for the file store: its listener hears of commit stalls, failed syncs, compactions
//! and what open recovered, with no lock of the store held (a listener that calls back into the
//! store does not deadlock; the negative control, which hands each event over where it is
//! emitted, does); and its stats say when it is degraded.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam::channel::{Receiver, unbounded};
use parking_lot::Mutex;
use portcullis::Error;
use portcullis::observe::{CompactionTrigger, DegradedCause, Event, Listener, StallPhase};
use portcullis::store::{Batch, FaultFs, FileStore, FileStoreBuilder, Partition, Store};

/// A listener that sends every event down a channel.
fn channel_listener() -> (Arc<dyn Listener>, Receiver<Event>) {
    let (tx, rx) = unbounded();
    (Arc::new(move |e: &Event| drop(tx.send(e.clone()))), rx)
}

fn names(rx: &Receiver<Event>) -> Vec<&'static str> {
    rx.try_iter().map(|e| e.name()).collect()
}

fn put(store: &FileStore, p: &str, i: u32) -> portcullis::Result<()> {
    let batch = Batch::new().put(format!("k{i}").into_bytes(), vec![7; 200]);
    store.apply(&Partition::new(p).unwrap(), &batch).map(|_| ())
}

#[test]
fn e8_a_healthy_store_tells_nothing_and_reports_no_degradation() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, rx) = channel_listener();
    let store = FileStore::builder(dir.path())
        .listener(listener)
        .open()
        .unwrap();
    for i in 0..20 {
        put(&store, "p", i).unwrap();
    }
    store.flush().unwrap();
    let stats = store.stats();
    assert_eq!(stats.degraded, None);
    assert_eq!(names(&rx), Vec::<&str>::new());
    assert!(stats.sync_latency.count >= 20, "{stats:?}");
    assert_eq!(
        stats.sync_latency.buckets.iter().sum::<u64>(),
        stats.sync_latency.count
    );
    assert!(stats.sync_latency.max >= stats.sync_latency.mean());
}

#[test]
fn e8_a_compaction_is_told_started_then_finished_with_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, rx) = channel_listener();
    let store = FileStore::builder(dir.path())
        .segment_bytes(4096)
        .auto_compact(false)
        .listener(listener)
        .open()
        .unwrap();
    for i in 0..100 {
        put(&store, "p", i % 3).unwrap();
    }
    let report = store.compact().unwrap();
    assert!(report.segments_removed > 0, "{report:?}");
    let events: Vec<Event> = rx.try_iter().collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(
        &events[0],
        Event::CompactionStarted { trigger: CompactionTrigger::OnDemand, victims, .. } if *victims >= report.segments_removed
    ));
    assert!(matches!(
        &events[1],
        Event::CompactionFinished { trigger: CompactionTrigger::OnDemand, report: told, .. } if *told == report
    ));
    let stats = store.stats();
    assert_eq!(stats.compaction_bytes_removed, report.bytes_removed);
    assert_eq!(stats.compactions_failed, 0);
}

#[test]
fn e8_a_background_compaction_is_told_from_its_own_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, rx) = channel_listener();
    let store = FileStore::builder(dir.path())
        .segment_bytes(64 << 10)
        .listener(listener)
        .open()
        .unwrap();
    // One key overwritten: sealed segments go dead, and compaction starts by itself.
    let mut i = 0;
    let finished = loop {
        put(&store, "p", 0).unwrap();
        i += 1;
        if let Ok(Event::CompactionFinished { trigger, .. }) = rx.try_recv() {
            break trigger;
        }
        assert!(i < 20_000, "no background compaction was told");
        if i % 100 == 0 {
            store.wait_for_background_compactions();
        }
    };
    assert_eq!(finished, CompactionTrigger::Background);
}

#[test]
fn e8_a_failed_sync_is_told_before_the_commit_answers_and_the_store_is_degraded() {
    let fs = FaultFs::new();
    let (listener, rx) = channel_listener();
    let store = FileStore::builder("/store")
        .vfs(Arc::new(fs.clone()))
        .listener(listener)
        .open()
        .unwrap();
    put(&store, "p", 1).unwrap();
    assert_eq!(store.stats().degraded, None);
    fs.fail_syncs();
    assert!(put(&store, "p", 2).is_err());
    let told: Vec<Event> = rx.try_iter().collect();
    assert!(
        matches!(told.as_slice(), [Event::SyncFailed { .. }]),
        "{told:?}"
    );
    fs.clear_faults();
    assert!(matches!(put(&store, "p", 3), Err(Error::SyncFailed(_))));
    let degraded = store
        .stats()
        .degraded
        .expect("a latched sync failure is degraded");
    assert_eq!(degraded.cause, DegradedCause::SyncFailed);
    assert!(degraded.reason.contains("reopen"), "{degraded}");
}

#[test]
fn e8_syncs_over_the_stall_threshold_are_counted_and_told() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, rx) = channel_listener();
    let store = FileStore::builder(dir.path())
        .stall_threshold(Duration::ZERO) // every sync is slower than nothing
        .listener(listener)
        .open()
        .unwrap();
    put(&store, "p", 1).unwrap();
    let stalls: Vec<Event> = rx.try_iter().collect();
    assert!(!stalls.is_empty());
    assert!(stalls.iter().all(|e| matches!(
        e,
        Event::CommitStall { phase: StallPhase::Sync, threshold, .. } if threshold.is_zero()
    )));
    assert_eq!(store.stats().stalls, stalls.len() as u64);
}

#[test]
fn e8_open_tells_the_torn_tail_it_truncated() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = FileStore::open(dir.path()).unwrap();
        put(&store, "p", 1).unwrap();
        store.close().unwrap();
    }
    // A record cut short after the last one: a torn write.
    let journal = dir.path().join("journal");
    let mut segments: Vec<_> = std::fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segments.sort();
    let tail = segments.last().unwrap();
    let mut bytes = std::fs::read(tail).unwrap();
    bytes.extend_from_slice(&[0xAB; 40]);
    std::fs::write(tail, bytes).unwrap();
    let (listener, rx) = channel_listener();
    let store = FileStore::builder(dir.path())
        .listener(listener)
        .open()
        .unwrap();
    let torn = store.open_report().torn_tail.clone().expect("a torn tail");
    let told: Vec<Event> = rx.try_iter().collect();
    assert!(
        matches!(told.as_slice(), [Event::TornTail { tail, .. }] if *tail == torn),
        "{told:?}"
    );
}

/// A store whose listener calls back into it on every event (bounded), and a workload that
/// emits events from the commit path (a stall), compaction (on demand and in the background)
/// and the journal's failure latch.
fn calls_back(at_emit: bool) {
    let fs = FaultFs::new();
    let slot: Arc<OnceLock<FileStore>> = Arc::new(OnceLock::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (me, log) = (Arc::clone(&slot), Arc::clone(&seen));
    let (failure_told, sync_failed) = unbounded();
    let listener = Arc::new(move |e: &Event| {
        if matches!(e, Event::SyncFailed { .. }) {
            let _ = failure_told.send(());
        }
        let mut seen = log.lock();
        seen.push(e.name());
        let n = seen.len();
        drop(seen);
        let Some(store) = me.get() else { return };
        // Every lock a call can take: the journal's (stats, apply), the table's and a
        // partition's (get, apply), compaction's (compact).
        let _ = store.stats();
        let side = Partition::new("side").unwrap();
        let _ = store.get(&side, b"k");
        // Bounded: each call back may emit more events (a stall, another compaction).
        if n < 50 {
            let _ = store.apply(&side, &Batch::new().put("k", n.to_string()));
            if matches!(
                e,
                Event::CompactionStarted { .. } | Event::SyncFailed { .. }
            ) {
                let _ = store.compact();
            }
        }
    });
    let builder: FileStoreBuilder = FileStore::builder("/store")
        .vfs(Arc::new(fs.clone()))
        .segment_bytes(4096)
        .stall_threshold(Duration::from_nanos(1));
    let builder = if at_emit {
        builder.listener_at_emit_for_test(listener)
    } else {
        builder.listener(listener)
    };
    let store = builder.open().unwrap();
    let _ = slot.set(store.clone());
    for i in 0..200 {
        put(&store, &format!("p{}", i % 5), i % 7).unwrap();
    }
    store.compact().unwrap();
    store.wait_for_background_compactions();
    fs.fail_syncs();
    assert!(put(&store, "p0", 1).is_err());
    assert!(store.stats().degraded.is_some());
    // Told, but maybe on another thread: one that was handing events to the listener when the
    // failure was queued takes it too, after the failed put returned. A bound, not a
    // synchronisation: the event must come.
    assert!(
        sync_failed.recv_timeout(Duration::from_secs(30)).is_ok(),
        "sync_failed was never told: {:?}",
        seen.lock()
    );
    let seen = seen.lock().clone();
    for name in [
        "commit_stall",
        "compaction_started",
        "compaction_finished",
        "sync_failed",
    ] {
        assert!(seen.contains(&name), "{name} was not told: {seen:?}");
    }
}

#[test]
fn e8_a_listener_that_calls_back_into_the_store_does_not_deadlock() {
    common::engine::within("a store whose listener calls back into it", || {
        calls_back(false)
    });
}

/// The negative control of the lock rule: handed over where they are emitted (under the
/// journal's, or compaction's, lock), the same events deadlock the same listener.
#[test]
fn control_events_handed_over_under_the_emitters_lock_deadlock_a_listener_that_calls_back() {
    common::engine::stays_deadlocked(|| calls_back(true));
}

/// What open recovered is told: a damaged manifest (so open rebuilds by a full scan) and a
/// damaged record in a sealed segment (which the scan finds), one event each, as the open
/// report says.
#[test]
fn e8_open_tells_the_rebuild_and_the_damage_it_found() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = FileStore::builder(dir.path())
            .segment_bytes(4096)
            .auto_compact(false)
            .open()
            .unwrap();
        for i in 0..60 {
            put(&store, &format!("p{}", i % 4), i).unwrap();
        }
        store.close().unwrap();
    }
    let flip = |path: &std::path::Path, at: usize| {
        let mut bytes = std::fs::read(path).unwrap();
        let at = at.min(bytes.len() - 1);
        bytes[at] ^= 0x04;
        std::fs::write(path, bytes).unwrap();
    };
    flip(&dir.path().join("MANIFEST"), 18);
    let mut segments: Vec<_> = std::fs::read_dir(dir.path().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segments.sort();
    assert!(segments.len() > 2, "{segments:?}");
    flip(&segments[0], 2048); // inside a record of the first (sealed) segment
    let (listener, rx) = channel_listener();
    let store = FileStore::builder(dir.path())
        .segment_bytes(4096)
        .auto_compact(false)
        .listener(listener)
        .open()
        .unwrap();
    let report = store.open_report().clone();
    assert!(report.rebuild_reason.is_some(), "{report:?}");
    assert!(!report.damaged.is_empty(), "{report:?}");
    let told: Vec<Event> = rx.try_iter().collect();
    let rebuilt: Vec<&String> = told
        .iter()
        .filter_map(|e| match e {
            Event::Rebuilt { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        rebuilt,
        [report.rebuild_reason.as_ref().unwrap()],
        "{told:?}"
    );
    let damaged: Vec<_> = told
        .iter()
        .filter_map(|e| match e {
            Event::Damaged { record, .. } => Some(record.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(damaged, report.damaged, "{told:?}");
}

/// The budgets are in the stats beside what they bound.
#[test]
fn e8_the_stats_carry_the_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path())
        .max_loaded_partitions(2)
        .open()
        .unwrap();
    assert_eq!(store.stats().max_loaded_partitions, Some(2));
    let unbounded = FileStore::open(tempfile::tempdir().unwrap().path()).unwrap();
    assert_eq!(unbounded.stats().max_loaded_partitions, None);
}
