//! Open time versus stored history (SPEC S5, goal P1: open with ~1 GiB of history at most 1.5x
//! open with ~10 MiB, both with 10,000 partitions), after a clean close and after a crash.
//!
//! Each store is built once (one-row appends of 1,000-byte values, round-robin over the
//! partitions, without syncs), closed, and then reopened repeatedly. The crash case reopens the
//! store, appends a tail that no heads snapshot covers, flushes, copies the files while the
//! store is still open, and opens the copy.
//!
//! A second dimension, the partition count: stores of 10,000, 100,000 and 1,000,000 partitions
//! of one 100-byte row each, built once, closed, reopened repeatedly; the table gives each
//! open's ratio to the 10,000-partition one (goal: within 1.5x up to 1,000,000).
//!
//! Run: `cargo bench --bench open -- --warm-up-time 1 --measurement-time 5`.
//! `PORTCULLIS_BENCH_BIG_MIB` sets the large history (default 1024);
//! `PORTCULLIS_BENCH_TAIL_MIB` the crash tail (default 30, just under the default 32 MiB
//! snapshot interval, so near the most a crash can leave to scan);
//! `PORTCULLIS_BENCH_OPEN_PARTITIONS` the partition counts (default `10000,100000,1000000`;
//! the first is the one the ratios are to); `PORTCULLIS_BENCH_OPEN_GROUPS` which of the two
//! dimensions run (default `history,partitions`). `cargo test --benches` runs both on tiny
//! stores (100 and 1,000 partitions).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    append_history, copy_store_files, dir_bytes, env_u64, full_run, last_segment_bytes, median,
    mib, open_for_loading, partitions, scratch, seq_key, value,
};
use criterion::{Criterion, SamplingMode};
use portcullis::store::{Batch, FileStore, KeyRange, OpenReport, Partition, Store};

const VALUE_LEN: usize = 1000;

struct Built {
    label: String,
    dir: tempfile::TempDir,
    rows_per_partition: u64,
    build_time: Duration,
    disk_bytes: u64,
    last_segment: u64,
}

fn build(label: &str, parts: &[Partition], bytes: u64) -> Built {
    let dir = scratch(label);
    let started = Instant::now();
    let store = open_for_loading(dir.path());
    let rows = append_history(&store, parts, 0, VALUE_LEN, bytes);
    store.close().expect("close");
    let build_time = started.elapsed();
    let disk_bytes = dir_bytes(dir.path());
    let last_segment = last_segment_bytes(dir.path());
    eprintln!(
        "built {label}: {} partitions x {rows} rows, {:.1} MiB on disk, in {:.1?}",
        parts.len(),
        mib(disk_bytes),
        build_time
    );
    Built {
        label: label.to_owned(),
        dir,
        rows_per_partition: rows,
        build_time,
        disk_bytes,
        last_segment,
    }
}

/// A crashed copy of a store and the small files to restore before each open (an open
/// followed by a close writes a new heads snapshot, which would hide the tail from the next
/// open).
struct Crashed {
    label: String,
    dir: tempfile::TempDir,
    pristine: Vec<(PathBuf, Vec<u8>)>,
    tail_bytes: u64,
}

fn crash_copy(built: &Built, parts: &[Partition], tail_bytes: u64) -> Crashed {
    let store = open_for_loading(built.dir.path());
    let rows = built.rows_per_partition;
    append_history(&store, parts, rows, VALUE_LEN, tail_bytes);
    store.flush().expect("flush");
    let dir = scratch(&format!("{}-crash", built.label));
    copy_store_files(built.dir.path(), dir.path());
    store.close().expect("close");
    let pristine = top_level_files(dir.path())
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("reading");
            (p, bytes)
        })
        .collect();
    Crashed {
        label: built.label.clone(),
        dir,
        pristine,
        tail_bytes,
    }
}

fn top_level_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("listing")
        .map(|e| e.expect("listing").path())
        .filter(|p| p.is_file())
        .collect()
}

impl Crashed {
    fn restore(&self) {
        for p in top_level_files(self.dir.path()) {
            std::fs::remove_file(p).expect("removing");
        }
        for (p, bytes) in &self.pristine {
            std::fs::write(p, bytes).expect("restoring");
        }
    }
}

#[derive(Default)]
struct Observed {
    opens: Vec<Duration>,
    report: Option<OpenReport>,
}

fn timed_open(dir: &Path, observed: &mut Observed) -> (FileStore, Duration) {
    let started = Instant::now();
    let store = FileStore::open(dir).expect("open");
    let took = started.elapsed();
    observed.opens.push(took);
    observed.report = Some(store.open_report().clone());
    (store, took)
}

fn main() {
    let full = full_run();
    let groups = std::env::var("PORTCULLIS_BENCH_OPEN_GROUPS")
        .unwrap_or_else(|_| "history,partitions".into());
    let mut c = Criterion::default().sample_size(10).configure_from_args();
    if groups.split(',').any(|g| g == "history") {
        by_history(&mut c, full);
    }
    if groups.split(',').any(|g| g == "partitions") {
        by_partition_count(&mut c, full);
    }
    c.final_summary();
}

/// The partition counts of the second dimension.
fn partition_counts(full: bool) -> Vec<u64> {
    if !full {
        return vec![100, 1_000];
    }
    let spec = std::env::var("PORTCULLIS_BENCH_OPEN_PARTITIONS")
        .unwrap_or_else(|_| "10000,100000,1000000".into());
    spec.split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("PORTCULLIS_BENCH_OPEN_PARTITIONS: numbers")
        })
        .collect()
}

/// A store of `n` partitions with one 100-byte row each, closed.
fn build_partitions(n: u64) -> Built {
    let label = format!("{n}-partitions");
    let dir = scratch(&label);
    let started = Instant::now();
    let store = open_for_loading(dir.path());
    for (i, p) in partitions(n).iter().enumerate() {
        let outcome = store
            .apply(p, &Batch::new().put(seq_key(0), value(i as u64, 100)))
            .expect("apply");
        assert!(outcome.is_committed());
    }
    store.close().expect("close");
    let build_time = started.elapsed();
    let disk_bytes = dir_bytes(dir.path());
    eprintln!(
        "built {label}: {:.1} MiB on disk, in {build_time:.1?}",
        mib(disk_bytes)
    );
    let last_segment = last_segment_bytes(dir.path());
    Built {
        label,
        dir,
        rows_per_partition: 1,
        build_time,
        disk_bytes,
        last_segment,
    }
}

/// Open time against the number of partitions (clean close, warm page cache).
fn by_partition_count(c: &mut Criterion, full: bool) {
    let counts = partition_counts(full);
    let mut results: Vec<(u64, u64, Duration, Observed)> = Vec::new();
    for &n in &counts {
        // One store at a time on disk: the biggest is the one that matters.
        let built = build_partitions(n);
        let mut observed = Observed::default();
        let mut group = c.benchmark_group("open_by_partition_count");
        group.sampling_mode(SamplingMode::Flat);
        group.bench_function(format!("{n}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (store, took) = timed_open(built.dir.path(), &mut observed);
                    assert_eq!(store.stats().partitions, n);
                    total += took;
                    store.close().expect("close");
                }
                total
            })
        });
        group.finish();
        results.push((n, built.disk_bytes, built.build_time, observed));
    }
    let base = results
        .first()
        .map(|(_, _, _, o)| median(o.opens.clone()).as_secs_f64())
        .unwrap_or(0.0);
    println!();
    println!(
        "## open by partition count: one 100-byte row per partition, clean close, warm cache (medians of every open timed)"
    );
    println!(
        "| partitions | on disk MiB | build | clean open | snapshot bytes | journal scanned | open / open of {} |",
        counts.first().copied().unwrap_or(0)
    );
    println!("|---|---|---|---|---|---|---|");
    for (n, disk_bytes, build_time, observed) in &results {
        let r = observed.report.clone().unwrap_or_default();
        let open = median(observed.opens.clone());
        println!(
            "| {n} | {:.1} | {:.1?} | {open:.2?} | {} | {} | {:.2}x |",
            mib(*disk_bytes),
            build_time,
            r.snapshot_bytes,
            r.journal_bytes_scanned,
            open.as_secs_f64() / base
        );
    }
    if let (Some(first), Some(last)) = (results.first(), results.last()) {
        println!(
            "ratio {} / {} partitions: clean open {:.2}x (goal <= 1.5)",
            last.0,
            first.0,
            median(last.3.opens.clone()).as_secs_f64() / base
        );
    }
}

/// Open time against stored history, clean and after a crash, and the time to first answer.
fn by_history(c: &mut Criterion, full: bool) {
    let n_parts = if full { 10_000 } else { 100 };
    let small_bytes = if full { 10 << 20 } else { 256 << 10 };
    let big_bytes = if full {
        env_u64("PORTCULLIS_BENCH_BIG_MIB", 1024) << 20
    } else {
        1 << 20
    };
    let tail_bytes = if full {
        env_u64("PORTCULLIS_BENCH_TAIL_MIB", 30) << 20
    } else {
        64 << 10
    };
    let parts = partitions(n_parts);

    let small = build(&format!("{}MiB", small_bytes >> 20), &parts, small_bytes);
    let big = build(&format!("{}MiB", big_bytes >> 20), &parts, big_bytes);
    // A control: about 31 MiB of history, all in one nearly full segment. Open reads the whole
    // newest segment, so this shows how open time follows that segment's size.
    let one_segment_bytes = if full { 30 << 20 } else { 512 << 10 };
    let one_segment = build(
        &format!("{}MiB-one-segment", one_segment_bytes >> 20),
        &parts,
        one_segment_bytes,
    );
    let stores = [&small, &big, &one_segment];

    let mut clean: Vec<Observed> = Vec::new();
    {
        let mut group = c.benchmark_group("open_clean");
        for built in stores {
            let mut observed = Observed::default();
            group.bench_function(built.label.as_str(), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let (store, took) = timed_open(built.dir.path(), &mut observed);
                        total += took;
                        store.close().expect("close");
                    }
                    total
                })
            });
            clean.push(observed);
        }
        group.finish();
    }

    // Time to first answer: open, then read one entity's whole history (every row, in pages
    // of 100), on a store whose page cache is warm.
    let mut first_answer: Vec<Vec<Duration>> = Vec::new();
    {
        let mut group = c.benchmark_group("open_then_read_one_entity");
        for built in stores {
            let mut samples = Vec::new();
            let p = &parts[n_parts as usize / 2];
            group.bench_function(built.label.as_str(), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let started = Instant::now();
                        let store = FileStore::open(built.dir.path()).expect("open");
                        let mut rows = 0;
                        let mut cursor = None;
                        loop {
                            let page = store
                                .scan(p, &KeyRange::all(), cursor.as_ref(), 100)
                                .expect("scan");
                            rows += page.entries.len() as u64;
                            cursor = page.next;
                            if cursor.is_none() {
                                break;
                            }
                        }
                        let took = started.elapsed();
                        assert_eq!(rows, built.rows_per_partition);
                        samples.push(took);
                        total += took;
                        store.close().expect("close");
                    }
                    total
                })
            });
            first_answer.push(samples);
        }
        group.finish();
    }

    let crashed: Vec<Crashed> = stores
        .iter()
        .map(|b| crash_copy(b, &parts, tail_bytes))
        .collect();
    let mut after_crash: Vec<Observed> = Vec::new();
    {
        let mut group = c.benchmark_group("open_after_crash");
        for crash in &crashed {
            let mut observed = Observed::default();
            group.bench_function(crash.label.as_str(), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        crash.restore();
                        let (store, took) = timed_open(crash.dir.path(), &mut observed);
                        total += took;
                        let report = store.open_report();
                        assert!(report.journal_bytes_scanned > 0, "the tail was scanned");
                        assert!(report.torn_tail.is_none() && report.damaged.is_empty());
                        store.close().expect("close");
                    }
                    total
                })
            });
            after_crash.push(observed);
        }
        group.finish();
    }

    println!();
    println!(
        "## open: {n_parts} partitions, one-row appends of {VALUE_LEN}-byte values (medians of every open timed)"
    );
    println!(
        "| store | rows/partition | on disk MiB | newest segment MiB | build | clean open | snapshot bytes | journal scanned | open + read one entity | crash open (tail MiB) | crash: journal scanned, records |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, built) in stores.iter().enumerate() {
        let r = clean[i].report.clone().unwrap_or_default();
        let cr = after_crash[i].report.clone().unwrap_or_default();
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1?} | {:.2?} | {} | {} | {:.2?} | {:.2?} ({:.1}) | {:.1} MiB, {} |",
            built.label,
            built.rows_per_partition,
            mib(built.disk_bytes),
            mib(built.last_segment),
            built.build_time,
            median(clean[i].opens.clone()),
            r.snapshot_bytes,
            r.journal_bytes_scanned,
            median(first_answer[i].clone()),
            median(after_crash[i].opens.clone()),
            mib(crashed[i].tail_bytes),
            mib(cr.journal_bytes_scanned),
            cr.records_scanned,
        );
    }
    let ratio = |v: &[Vec<Duration>]| {
        median(v[1].clone()).as_secs_f64() / median(v[0].clone()).as_secs_f64()
    };
    let clean_opens: Vec<Vec<Duration>> = clean.iter().map(|o| o.opens.clone()).collect();
    let crash_opens: Vec<Vec<Duration>> = after_crash.iter().map(|o| o.opens.clone()).collect();
    println!(
        "ratio {} / {}: clean open {:.2}x (goal P1 <= 1.5), open + read one entity {:.2}x, crash open {:.2}x",
        big.label,
        small.label,
        ratio(&clean_opens),
        ratio(&first_answer),
        ratio(&crash_opens)
    );
    println!(
        "ratio {} / {}: clean open {:.2}x",
        one_segment.label,
        small.label,
        median(clean_opens[2].clone()).as_secs_f64() / median(clean_opens[0].clone()).as_secs_f64()
    );
    for (i, o) in clean.iter().chain(after_crash.iter()).enumerate() {
        if let Some(r) = &o.report {
            eprintln!("report {i}: {r:?}");
        }
    }
    drop(crashed);
    drop(one_segment);
    drop(big);
    drop(small);
}
