//! Open time against the number of partitions (SPEC S5; issue goal: open independent of the
//! number of partitions within 1.5x from 10,000 to 1,000,000).
//!
//! For each size, builds a store of that many partitions (one 16-byte row each), closes it,
//! then reopens it repeatedly and prints the median open time, the median time of the first
//! read of one partition after open, and the snapshot bytes open read.
//!
//! Run: `cargo run --release --example open_partitions` (sizes 10,000, 100,000, 1,000,000;
//! `PORTCULLIS_OPEN_SIZES=10000,50000` picks others, `PORTCULLIS_OPEN_RUNS` the reopens).

use std::time::{Duration, Instant};

use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};

fn name(i: u64) -> Partition {
    Partition::new(format!("bench/entity-{i:07}")).expect("a valid name")
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let sizes: Vec<u64> = std::env::var("PORTCULLIS_OPEN_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);
    let runs: u64 = std::env::var("PORTCULLIS_OPEN_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(21);
    println!(
        "| partitions | build | snapshot bytes | open (median) | first read after open (median) |"
    );
    println!("|---|---|---|---|---|");
    for n in sizes {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let started = Instant::now();
        {
            let store = FileStore::builder(dir.path())
                .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
                .auto_compact(false)
                .max_loaded_partitions(1_000)
                .open()
                .expect("open");
            for i in 0..n {
                let outcome = store
                    .apply(&name(i), &Batch::new().put(b"k".to_vec(), vec![7u8; 16]))
                    .expect("apply");
                assert!(outcome.is_committed());
            }
            store.close().expect("close");
        }
        let build = started.elapsed();
        let mut opens = Vec::new();
        let mut reads = Vec::new();
        let mut snapshot_bytes = 0;
        for run in 0..runs {
            let started = Instant::now();
            let store = FileStore::open(dir.path()).expect("open");
            opens.push(started.elapsed());
            snapshot_bytes = store.open_report().snapshot_bytes;
            let p = name((run * 7_919) % n);
            let started = Instant::now();
            assert!(store.get(&p, b"k").expect("get").is_some());
            reads.push(started.elapsed());
            drop(store);
        }
        println!(
            "| {n} | {build:.1?} | {snapshot_bytes} | {:.1?} | {:.1?} |",
            median(opens),
            median(reads)
        );
    }
}
