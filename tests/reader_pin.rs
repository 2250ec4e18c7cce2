//! The journal's reader pin (SPEC S7): a reader that took values' locations out of an index
//! before compaction moved them still reads the right values, because compaction waits for it
//! before deleting the segments those locations point into.
//!
//! A reader's scan is paused inside its first value read (a file layer that blocks one chosen
//! read until the test lets it go) while compaction rewrites the partition and comes to delete
//! the segments. With the pin, compaction finds the reader pinned and waits (an observer tells
//! the test, which then lets the reader go); with the pin switched off (the negative control,
//! feature `fault-injection`), compaction deletes the segments and the reader's next value
//! read fails.
//!
//! Every wait for another thread is bounded ([`STEP`]): a reader that never reaches the gate or a
//! compaction that never answers fails the test with what it was waiting for, instead of
//! hanging it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::os_files::{ReadObserver, observed_os};
use crossbeam::channel::{Receiver, Sender, bounded, unbounded};
use portcullis::store::{
    Batch, FileStore, FileStoreBuilder, KeyRange, Partition, ScanPage, Store, SyncPolicy,
};

/// The length of the values the reader reads: the gate stops the first read of this length.
const VALUE_LEN: usize = 777;

/// How long the test waits for one step of another thread (a bound on a hang, far above what a
/// step takes; nothing waits for time to pass).
const STEP: Duration = Duration::from_secs(30);

/// The next message on `rx`, or a test failure naming `what` did not happen.
#[track_caller]
fn wait<T>(rx: &Receiver<T>, limit: Duration, what: &str) -> T {
    match rx.recv_timeout(limit) {
        Ok(message) => message,
        Err(e) => panic!("{what} within {limit:?} ({e}): the test would hang"),
    }
}

/// Stops the first read of [`VALUE_LEN`] bytes once armed: reports it, then waits to be let go.
#[derive(Debug)]
struct Gate {
    armed: AtomicBool,
    paused: Sender<()>,
    go: Receiver<()>,
}

impl Gate {
    fn pass(&self, len: usize) {
        if len == VALUE_LEN && self.armed.swap(false, Ordering::SeqCst) {
            self.paused.send(()).unwrap();
            wait(&self.go, STEP, "the test did not let the paused reader go");
        }
    }
}

impl ReadObserver for Gate {
    fn before_read(&self, len: usize) {
        self.pass(len);
    }
}

fn value(i: u8) -> Vec<u8> {
    vec![i; VALUE_LEN]
}

/// What happened in one run.
struct Run {
    /// The paused reader's scan.
    scan: portcullis::Result<ScanPage>,
    /// Whether compaction found the reader pinned and waited for it.
    compaction_waited: bool,
    segments_removed: u32,
}

enum Event {
    CompactionWaits,
    CompactionDone(portcullis::Result<portcullis::store::CompactionReport>),
}

/// Pauses a scan of partition `p` in its first value read, compacts meanwhile, and lets the
/// scan go once compaction either waits for it or is done.
fn scan_while_compacting(skip_pin: bool) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (paused_tx, paused) = bounded(1);
    let (go, go_rx) = bounded(1);
    let gate = Arc::new(Gate {
        armed: AtomicBool::new(false),
        paused: paused_tx,
        go: go_rx,
    });
    let (events_tx, events) = unbounded();
    let waits = events_tx.clone();
    let mut builder: FileStoreBuilder = FileStore::builder(dir.path())
        .vfs(Arc::new(observed_os(gate.clone())))
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .segment_bytes(4096)
        .snapshot_every_bytes(1 << 40)
        // A base after every batch: the load below reads bases only, so the scan reads every
        // value from the segments (none from the records a load has just read).
        .base_every_records(1)
        .auto_compact(false)
        .observe_reader_waits(move || waits.send(Event::CompactionWaits).unwrap());
    if skip_pin {
        builder = builder.skip_reader_pin();
    }
    let store = builder.open().unwrap();

    // Three keys in the first segments, each in a segment of its own (so the scan reads them
    // one at a time, not in one merged read), then enough of another partition to seal them.
    let p = Partition::new("read").unwrap();
    let other = Partition::new("other").unwrap();
    for i in 0..3u8 {
        let batch = Batch::new().put(vec![b'a' + i], value(i));
        assert!(store.apply(&p, &batch).unwrap().is_committed());
        for j in 0..5u32 {
            let batch = Batch::new().put(
                (100 + 5 * i as u32 + j).to_be_bytes().to_vec(),
                vec![1u8; 1000],
            );
            assert!(store.apply(&other, &batch).unwrap().is_committed());
        }
    }
    for i in 0..16u32 {
        let batch = Batch::new().put(i.to_be_bytes().to_vec(), vec![1u8; 1000]);
        assert!(store.apply(&other, &batch).unwrap().is_committed());
    }
    // Loaded now, so the scan below reads nothing before its values.
    assert_eq!(store.get(&p, b"a").unwrap(), Some(value(0)));

    gate.armed.store(true, Ordering::SeqCst);
    let (scanned_tx, scanned) = bounded(1);
    let reader = {
        let store = store.clone();
        let p = p.clone();
        std::thread::spawn(move || {
            let _ = scanned_tx.send(store.scan(&p, &KeyRange::all(), None, 10));
        })
    };
    wait(
        &paused,
        STEP,
        "the reader's scan did not reach its first value read",
    );
    let compactor = {
        let store = store.clone();
        std::thread::spawn(move || {
            events_tx
                .send(Event::CompactionDone(store.compact()))
                .unwrap()
        })
    };
    let mut compaction_waited = false;
    let compaction = "compaction neither waited for the reader nor finished";
    let report = match wait(&events, STEP, compaction) {
        Event::CompactionWaits => {
            compaction_waited = true;
            go.send(()).unwrap();
            match wait(
                &events,
                STEP,
                "compaction did not finish once the reader went on",
            ) {
                Event::CompactionDone(report) => report,
                Event::CompactionWaits => panic!("compaction waited twice"),
            }
        }
        Event::CompactionDone(report) => {
            go.send(()).unwrap();
            report
        }
    };
    let scan = wait(
        &scanned,
        STEP,
        "the reader's scan did not finish once let go",
    );
    reader.join().unwrap();
    compactor.join().unwrap();
    let report = report.unwrap();
    // Whatever the reader saw, the store itself still holds every value.
    for i in 0..3u8 {
        assert_eq!(store.get(&p, &[b'a' + i]).unwrap(), Some(value(i)));
    }
    store.close().unwrap();
    Run {
        scan,
        compaction_waited,
        segments_removed: report.segments_removed,
    }
}

fn expected() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..3u8).map(|i| (vec![b'a' + i], value(i))).collect()
}

#[test]
fn a_reader_paused_mid_scan_reads_the_right_values_while_compaction_retires_its_segments() {
    let run = scan_while_compacting(false);
    assert!(run.segments_removed >= 1, "compaction removed nothing");
    assert!(
        run.compaction_waited,
        "compaction did not wait for the pinned reader"
    );
    let page = run.scan.expect("the paused reader's scan failed");
    assert_eq!(page.entries, expected());
}

/// Negative control: without the pin, compaction deletes the segments the paused reader holds
/// locations into, and the reader's next value read fails.
#[test]
fn control_skipping_the_reader_pin_is_caught() {
    let run = scan_while_compacting(true);
    assert!(run.segments_removed >= 1, "compaction removed nothing");
    assert!(!run.compaction_waited);
    match run.scan {
        Err(e) => eprintln!("without the pin the paused reader's scan failed, as expected: {e}"),
        Ok(page) => assert_ne!(
            page.entries,
            expected(),
            "without the pin the paused reader still read the right values: the test has no teeth"
        ),
    }
}

/// The bound on every wait above: a step that never comes fails the test, naming what it was
/// waiting for, instead of hanging it.
#[test]
#[should_panic(expected = "the reader's scan did not reach its first value read within")]
fn a_step_that_never_comes_fails_instead_of_hanging() {
    let (_never, rx) = bounded::<()>(1);
    wait(
        &rx,
        Duration::from_millis(1),
        "the reader's scan did not reach its first value read",
    );
}
