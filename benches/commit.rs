//! Durable commits under group commit (SPEC S3, goal P3: 16 threads commit at least 8x as
//! many batches per second as 1 thread).
//!
//! Each commit is `apply` of one 128-byte put under the default `SyncPolicy::SyncEveryCommit`.
//! Criterion asks for a number of commits; `iter_custom` spreads them over N threads that start
//! together and times until the last one finishes, so criterion's time per iteration is wall
//! time per commit and its throughput is commits per second. Keys are fresh (an append-only
//! log), so no value is overwritten; only the records a newer base supersedes die, and
//! compaction can start only once a run fills a segment (32 MiB).
//!
//! Two layouts: every thread writes its own partition, and all threads write one partition.
//!
//! Run: `cargo bench --bench commit -- --warm-up-time 1 --measurement-time 5`.

mod common;

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{full_run, partitions, scratch, value};
use criterion::{Criterion, Throughput};
use portcullis::store::{Batch, FileStore, Partition, Store};

const VALUE_LEN: usize = 128;
/// Criterion's samples per benchmark; the summary's median uses the last this many timed calls
/// (criterion's warm-up calls come first).
const SAMPLES: usize = 10;

#[derive(Clone, Copy)]
enum Layout {
    OwnPartition,
    OnePartition,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::OwnPartition => "own_partition",
            Layout::OnePartition => "one_partition",
        }
    }
}

struct Row {
    layout: &'static str,
    threads: usize,
    commits: u64,
    batches: u64,
    syncs: u64,
    /// Commits per second of each timed call, for the median.
    rates: Vec<f64>,
}

/// Commits `commits` puts spread over `threads` threads; returns the wall time.
fn run(
    store: &FileStore,
    parts: &[Partition],
    layout: Layout,
    threads: usize,
    commits: u64,
    next_key: &AtomicU64,
) -> Duration {
    let barrier = Barrier::new(threads + 1);
    let payload = value(7, VALUE_LEN);
    let per = commits / threads as u64;
    let extra = commits % threads as u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let n = per + u64::from((t as u64) < extra);
            let p = match layout {
                Layout::OwnPartition => &parts[t],
                Layout::OnePartition => &parts[0],
            };
            let barrier = &barrier;
            let payload = &payload;
            s.spawn(move || {
                barrier.wait();
                for _ in 0..n {
                    let key = next_key.fetch_add(1, Ordering::Relaxed).to_be_bytes();
                    let outcome = store
                        .apply(p, &Batch::new().put(key.to_vec(), payload.clone()))
                        .expect("apply");
                    assert!(outcome.is_committed());
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let started = Instant::now();
        barrier.wait();
        started.elapsed()
    })
}

fn main() {
    let full = full_run();
    let thread_counts: &[usize] = &[1, 4, 16, 64];
    let mut c = Criterion::default()
        .sample_size(SAMPLES)
        .configure_from_args();
    let mut rows: Vec<Row> = Vec::new();
    for layout in [Layout::OwnPartition, Layout::OnePartition] {
        let mut group = c.benchmark_group(format!("durable_commit_{}", layout.name()));
        group.throughput(Throughput::Elements(1));
        for &threads in thread_counts {
            // A fresh store per configuration, with the default (durable) sync policy.
            let dir = scratch("commit");
            let store = FileStore::open(dir.path()).expect("open");
            let parts = partitions(threads as u64);
            let next_key = AtomicU64::new(0);
            let before = store.stats();
            let mut rates = Vec::new();
            let mut commits = 0;
            group.bench_function(format!("{threads}_threads"), |b| {
                b.iter_custom(|iters| {
                    let took = run(&store, &parts, layout, threads, iters, &next_key);
                    commits += iters;
                    rates.push(iters as f64 / took.as_secs_f64());
                    took
                })
            });
            let after = store.stats();
            rows.push(Row {
                layout: layout.name(),
                threads,
                commits,
                batches: after.batches - before.batches,
                syncs: after.syncs - before.syncs,
                rates,
            });
            store.close().expect("close");
        }
        group.finish();
    }

    println!();
    println!(
        "## durable commits: one {VALUE_LEN}-byte put per batch, SyncEveryCommit{}",
        if full { "" } else { " (smoke run)" }
    );
    println!(
        "| layout | threads | commits/s (median of timed calls) | vs 1 thread | batches per sync | commits timed |"
    );
    println!("|---|---|---|---|---|---|");
    let median = |xs: &[f64]| {
        let mut xs = xs[xs.len().saturating_sub(SAMPLES)..].to_vec();
        xs.sort_by(f64::total_cmp);
        xs.get(xs.len() / 2).copied().unwrap_or(0.0)
    };
    for row in rows.iter().filter(|r| r.commits > 0) {
        let base = rows
            .iter()
            .find(|r| r.layout == row.layout && r.threads == 1)
            .map_or(1.0, |r| median(&r.rates));
        println!(
            "| {} | {} | {:.0} | {:.2}x | {:.2} ({} batches, {} syncs) | {} |",
            row.layout,
            row.threads,
            median(&row.rates),
            median(&row.rates) / base,
            row.batches as f64 / row.syncs.max(1) as f64,
            row.batches,
            row.syncs,
            row.commits
        );
    }
    c.final_summary();
}
