//! Reads (SPEC S1, S5, S8): point gets and pages of 100 on a loaded partition of 10,000 rows,
//! and the first access of a partition (which builds its index) versus its row count.
//!
//! Rows are 128-byte values under 8-byte sequence keys, one row per append (an entity log),
//! written without syncs. A "cold" partition is one the store has not touched since open; the
//! operating system's page cache stays warm. To time many cold loads without reopening for
//! each, the store holds several copies of each size; once every copy has been touched the
//! store is closed and reopened, outside the timing.
//!
//! Run: `cargo bench --bench read -- --warm-up-time 1 --measurement-time 5`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{full_run, median, open_for_loading, scratch, seq_key, value};
use criterion::{BenchmarkId, Criterion, Throughput};
use portcullis::store::{Batch, FileStore, KeyRange, Partition, Store};

const VALUE_LEN: usize = 128;
const LOADED_ROWS: u64 = 10_000;

fn part(rows: u64, copy: u64) -> Partition {
    Partition::new(format!("read/rows-{rows}/copy-{copy:03}")).expect("valid name")
}

/// How many copies of a partition of `rows` rows the store holds.
fn copies(rows: u64, full: bool) -> u64 {
    let budget = if full { 200_000 } else { 2_000 };
    (budget / rows).clamp(1, 200)
}

fn build(dir: &Path, sizes: &[u64], full: bool) {
    let store = open_for_loading(dir);
    let template = value(3, VALUE_LEN);
    for &rows in sizes {
        for copy in 0..copies(rows, full) {
            let p = part(rows, copy);
            for seq in 0..rows {
                let mut v = template.clone();
                v[..8].copy_from_slice(&seq.to_le_bytes());
                let outcome = store
                    .apply(&p, &Batch::new().put(seq_key(seq), v))
                    .expect("apply");
                assert!(outcome.is_committed());
            }
        }
    }
    store.close().expect("close");
}

/// A small xorshift generator, so the keys read are spread but the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn main() {
    let full = full_run();
    let sizes: &[u64] = if full {
        &[100, 1_000, 10_000, 100_000]
    } else {
        &[100, 1_000]
    };
    let loaded_rows = if full { LOADED_ROWS } else { 1_000 };
    let dir = scratch("read");
    let started = Instant::now();
    build(dir.path(), sizes, full);
    eprintln!("built the read store in {:.1?}", started.elapsed());

    let mut c = Criterion::default().configure_from_args();

    // Loaded partition: get and a page of 100.
    let mut get_times = Vec::new();
    let mut scan_times = Vec::new();
    {
        let store = FileStore::open(dir.path()).expect("open");
        let p = part(loaded_rows, 0);
        assert!(store.get(&p, &seq_key(0)).expect("get").is_some());
        let mut group = c.benchmark_group(format!("loaded_partition_{loaded_rows}_rows"));
        let mut rng = Rng(0x1234_5678);
        group.bench_function("get", |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    let key = seq_key(rng.below(loaded_rows));
                    let v = store.get(&p, &key).expect("get");
                    assert_eq!(v.map(|v| v.len()), Some(VALUE_LEN));
                }
                let took = started.elapsed();
                get_times.push(took / iters.max(1) as u32);
                took
            })
        });
        group.bench_function("scan_page_of_100", |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    let from = seq_key(rng.below(loaded_rows - 100));
                    let page = store
                        .scan(&p, &KeyRange::from(from), None, 100)
                        .expect("scan");
                    assert_eq!(page.entries.len(), 100);
                }
                let took = started.elapsed();
                scan_times.push(took / iters.max(1) as u32);
                took
            })
        });
        group.finish();
        store.close().expect("close");
    }

    // First access of a cold partition: the index build plus one get.
    let mut loads: Vec<(u64, Vec<Duration>)> = Vec::new();
    {
        let mut group = c.benchmark_group("first_access");
        group.sample_size(10);
        for &rows in sizes {
            let n_copies = copies(rows, full);
            let mut samples = Vec::new();
            let mut store = FileStore::open(dir.path()).expect("open");
            let mut next_copy = 0;
            group.throughput(Throughput::Elements(rows));
            group.bench_with_input(BenchmarkId::new("rows", rows), &rows, |b, &rows| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        if next_copy == n_copies {
                            store.close().expect("close");
                            store = FileStore::open(dir.path()).expect("reopen");
                            next_copy = 0;
                        }
                        let p = part(rows, next_copy);
                        next_copy += 1;
                        let loaded_before = store.stats().partitions_loaded;
                        let started = Instant::now();
                        let v = store.get(&p, &seq_key(rows / 2)).expect("get");
                        let took = started.elapsed();
                        assert!(v.is_some());
                        assert_eq!(store.stats().partitions_loaded, loaded_before + 1);
                        samples.push(took);
                        total += took;
                    }
                    total
                })
            });
            store.close().expect("close");
            loads.push((rows, samples));
        }
        group.finish();
    }

    println!();
    println!(
        "## reads: {VALUE_LEN}-byte values, 8-byte keys, one row per append{}",
        if full { "" } else { " (smoke run)" }
    );
    println!(
        "loaded partition of {loaded_rows} rows: get {:.2?}, scan page of 100 {:.2?} (medians of per-call means)",
        median(get_times),
        median(scan_times)
    );
    println!("| rows | first access (median) | per row | vs 100 rows |");
    println!("|---|---|---|---|");
    let base = loads.first().map(|(_, s)| median(s.clone()));
    for (rows, samples) in &loads {
        let m = median(samples.clone());
        println!(
            "| {rows} | {m:.2?} | {:.0} ns | {:.1}x |",
            m.as_nanos() as f64 / *rows as f64,
            base.map_or(0.0, |b| m.as_secs_f64() / b.as_secs_f64())
        );
    }
    c.final_summary();
}
