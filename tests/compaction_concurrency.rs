//! Nothing acknowledged is lost while compaction runs beside many committers (SPEC S3, S4, S7,
//! S14).
//!
//! Sixteen writer threads each commit one batch to each of many fresh partitions (so most
//! partitions have exactly one record) and, every third time, one more record to a partition of
//! their own that grows long; meanwhile compaction runs, either in a loop of explicit
//! `compact()` calls or only as the store starts it by itself. Every batch `apply` acknowledged
//! must read back, with its value, while compaction may still be running, once it has settled,
//! and after a reopen. Shapes: 4 KiB segments with 700-byte values, 64 KiB segments with 20 KB
//! values, and the default segment size with 20 KB values.
//!
//! The same lane runs on the fault-injecting disk, with a power cut at operations chosen by a
//! seed while compaction runs: every image opens with no damage and holds every batch
//! acknowledged before the cut, each with its whole value.
//!
//! Each run is bounded by its batch count; nothing waits for time to pass.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use common::rng::Rng;
use portcullis::ManualClock;
use portcullis::store::{Batch, FaultFs, FileStore, FileStoreBuilder, Partition, Store};

/// How compaction runs beside the writers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compaction {
    /// A thread calls `compact()` again and again until the writers are done.
    Loop,
    /// Only what the store starts by itself (scattered segments, garbage).
    Background,
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    /// `None`: the default.
    segment_bytes: Option<u64>,
    value_len: usize,
    compaction: Compaction,
    writers: usize,
    /// Fresh partitions each writer commits one batch to.
    partitions: usize,
}

/// One acknowledged batch: where its value lives.
#[derive(Clone, Debug)]
struct Acked {
    partition: String,
    key: String,
    len: usize,
    /// The fault-injecting disk's operation count read after `apply` returned (0 on the
    /// operating system's files).
    at_op: u64,
}

/// The value a batch writes: recognisably its own, the length the shape asks for.
fn value(partition: &str, key: &str, len: usize) -> Vec<u8> {
    let mut v = format!("{partition}/{key};").into_bytes();
    let seed = v
        .iter()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(*b));
    v.extend((0..len.saturating_sub(v.len())).map(|i| seed.wrapping_add(i as u8)));
    v.truncate(len.max(1));
    v
}

/// The batches writer `t` commits, in order: one to each fresh partition, and after every third
/// one a record to its long partition.
fn writes(shape: &Shape, t: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for j in 0..shape.partitions {
        out.push((format!("w{t:02}-one-{j:04}"), "k".to_owned()));
        if j % 3 == 2 {
            out.push((format!("w{t:02}-long"), format!("r{j:04}")));
        }
    }
    out
}

/// Runs the writers and compaction on `store`; returns what was acknowledged and how many
/// segments compaction removed. `ops` reads the disk's operation count (for power cuts).
fn run_lane(store: &Arc<FileStore>, shape: &Shape, ops: &(dyn Fn() -> u64 + Sync)) -> Run {
    let done = AtomicBool::new(false);
    let removed = AtomicU64::new(0);
    let compactions = AtomicU64::new(0);
    let acked = thread::scope(|s| {
        let compactor = (shape.compaction == Compaction::Loop).then(|| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    let report = store.compact().expect("compaction on a healthy disk");
                    removed.fetch_add(report.segments_removed as u64, Ordering::Relaxed);
                    compactions.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        let writers: Vec<_> = (0..shape.writers)
            .map(|t| {
                s.spawn(move || {
                    let mut acked = Vec::new();
                    for (partition, key) in writes(shape, t) {
                        let p = Partition::new(&partition).unwrap();
                        let v = value(&partition, &key, shape.value_len);
                        let outcome = store
                            .apply(&p, &Batch::new().put(key.clone().into_bytes(), v))
                            .unwrap_or_else(|e| panic!("{partition}/{key}: {e}"));
                        assert!(outcome.is_committed(), "{partition}/{key}: {outcome:?}");
                        acked.push(Acked {
                            partition,
                            key,
                            len: shape.value_len,
                            at_op: ops(),
                        });
                    }
                    acked
                })
            })
            .collect();
        let acked: Vec<Acked> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        done.store(true, Ordering::Release);
        if let Some(c) = compactor {
            c.join().unwrap();
        }
        acked
    });
    Run {
        acked,
        removed: removed.load(Ordering::Relaxed),
        compactions: compactions.load(Ordering::Relaxed),
    }
}

struct Run {
    acked: Vec<Acked>,
    removed: u64,
    compactions: u64,
}

/// Every acknowledged batch whose stamp is below `before_op` that does not read back whole.
fn missing(store: &FileStore, acked: &[Acked], before_op: u64) -> Vec<String> {
    acked
        .iter()
        .filter(|a| a.at_op < before_op)
        .filter_map(|a| {
            let p = Partition::new(&a.partition).unwrap();
            match store.get(&p, a.key.as_bytes()) {
                Ok(Some(v)) if v == value(&a.partition, &a.key, a.len) => None,
                Ok(Some(v)) => Some(format!(
                    "{}/{}: a wrong value of {} bytes",
                    a.partition,
                    a.key,
                    v.len()
                )),
                other => Some(format!("{}/{}: {other:?}", a.partition, a.key)),
            }
        })
        .collect()
}

#[track_caller]
fn assert_none_missing(what: &str, missing: Vec<String>) {
    assert!(
        missing.is_empty(),
        "{what}: {} acknowledged batches do not read back, first: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

fn builder(dir: &std::path::Path, shape: &Shape) -> FileStoreBuilder {
    let b = FileStore::builder(dir).auto_compact(shape.compaction == Compaction::Background);
    match shape.segment_bytes {
        Some(bytes) => b.segment_bytes(bytes),
        None => b,
    }
}

/// The lane on the operating system's files: reads back every acknowledged batch before
/// compaction settles, after, and after a reopen.
fn on_os_files(shape: Shape) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(builder(dir.path(), &shape).open().unwrap());
    let run = run_lane(&store, &shape, &|| 0);
    assert_eq!(
        run.acked.len(),
        shape.writers * writes(&shape, 0).len(),
        "every batch was acknowledged"
    );
    assert_none_missing("while compaction may run", missing(&store, &run.acked, 1));
    store.wait_for_background_compactions();
    match shape.compaction {
        Compaction::Loop => assert!(
            run.compactions > 0 && run.removed > 0,
            "toothless: no compaction removed a segment"
        ),
        Compaction::Background => assert!(
            store.background_compactions() > 0,
            "toothless: no compaction started by itself"
        ),
    }
    assert_none_missing("once compaction settled", missing(&store, &run.acked, 1));
    Arc::try_unwrap(store)
        .unwrap_or_else(|_| panic!("a thread still holds the store"))
        .close()
        .unwrap();
    let reopened = builder(dir.path(), &shape).open().unwrap();
    assert!(
        reopened.open_report().damaged.is_empty(),
        "{:?}",
        reopened.open_report()
    );
    assert_none_missing("after a reopen", missing(&reopened, &run.acked, 1));
    reopened.close().unwrap();
}

#[test]
fn small_segments_small_values_compaction_in_a_loop() {
    on_os_files(Shape {
        segment_bytes: Some(4096),
        value_len: 700,
        compaction: Compaction::Loop,
        writers: 16,
        partitions: 150,
    });
}

#[test]
fn larger_segments_large_values_compaction_in_a_loop() {
    on_os_files(Shape {
        segment_bytes: Some(65536),
        value_len: 20_000,
        compaction: Compaction::Loop,
        writers: 16,
        partitions: 150,
    });
}

#[test]
fn small_segments_background_compaction_only() {
    on_os_files(Shape {
        segment_bytes: Some(4096),
        value_len: 700,
        compaction: Compaction::Background,
        writers: 16,
        partitions: 150,
    });
}

#[test]
fn default_segments_large_values_compaction_in_a_loop() {
    on_os_files(Shape {
        segment_bytes: None,
        value_len: 20_000,
        compaction: Compaction::Loop,
        writers: 16,
        partitions: 150,
    });
}

/// The lane on the fault-injecting disk, then a power cut at `cuts` operations chosen by
/// `seed` from those the run made: each image opens without damage and holds every batch
/// acknowledged before its cut.
fn power_cuts(shape: Shape, cuts: usize, seed: u64) {
    let fs = FaultFs::new();
    fs.record_crash_points();
    let clock = Arc::new(ManualClock::new(1_000));
    let open = |fs: &FaultFs| {
        builder(std::path::Path::new("/db"), &shape)
            .vfs(Arc::new(fs.clone()))
            .clock(clock.clone())
            .snapshot_every_bytes(64 << 10)
            .open()
    };
    let store = Arc::new(open(&fs).unwrap());
    let counter = fs.clone();
    let run = run_lane(&store, &shape, &move || counter.ops());
    assert!(
        run.compactions > 0 && run.removed > 0,
        "toothless: no compaction removed a segment"
    );
    Arc::try_unwrap(store)
        .unwrap_or_else(|_| panic!("a thread still holds the store"))
        .close()
        .unwrap();
    let points = fs.take_crash_points();
    let mut rng = Rng::new(seed);
    for _ in 0..cuts {
        let point = &points[rng.below(points.len() as u64) as usize];
        let image_seed = rng.next_u64();
        let what = format!("power cut {point:?}, image seed {image_seed:#x} (lane seed {seed:#x})");
        let image = point.power_cut(image_seed);
        let store = open(&image).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
        assert!(
            store.open_report().damaged.is_empty(),
            "{what}: a power cut left damage: {:?}",
            store.open_report().damaged
        );
        assert_none_missing(&what, missing(&store, &run.acked, point.op));
        store
            .close()
            .unwrap_or_else(|e| panic!("{what}: close failed: {e}"));
    }
}

/// The seed of the power-cut lane: `PORTCULLIS_CRASH_SEED` picks another.
fn lane_seed() -> u64 {
    std::env::var("PORTCULLIS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_C0DE)
}

#[test]
fn a_power_cut_while_compaction_runs_beside_sixteen_writers_loses_nothing_acknowledged() {
    let shape = Shape {
        segment_bytes: Some(4096),
        value_len: 700,
        compaction: Compaction::Loop,
        writers: 16,
        partitions: 30,
    };
    power_cuts(shape, 24, lane_seed());
}

#[test]
#[ignore = "long: more writers' batches and hundreds of power cuts"]
fn power_cuts_while_compaction_runs_long_lane() {
    let shape = Shape {
        segment_bytes: Some(4096),
        value_len: 700,
        compaction: Compaction::Loop,
        writers: 16,
        partitions: 120,
    };
    for round in 0..4 {
        power_cuts(shape, 100, lane_seed().wrapping_add(round));
    }
}
