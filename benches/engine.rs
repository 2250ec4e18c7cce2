//! Engine benchmarks (SPEC R1, R2, R6, L3): time to ready against an eager baseline (goal P2:
//! lazy ready >= 100x faster than eager; goal P1: ready time within 1.5x between ~10 MiB and
//! ~1 GiB of history), warm throughput on 1 and 2 threads (goal P4: 2 threads >= 1.7x of 1),
//! first-touch latency of a 10,000-record entity with and without a checkpoint, and a herd of
//! threads touching one pending entity at once.
//!
//! Stores are bulk-loaded once per run straight through the store (not the engine), with
//! `SyncPolicy::NeverSyncMayLoseRecent` and no compaction, in exactly the rows the engine
//! writes: `log::append_at` (record rows plus the log head, guarded on the head) and the
//! restore layer's `\0entity` registration marker. Appends go round-robin over the entities,
//! one record per batch, so an entity's records are spread through the journal as they would
//! be under live traffic. Then the store is closed, and every measurement opens the engine
//! afresh with `EngineBuilder::directory` (the default store configuration, durable syncs),
//! so every entity is pending again.
//!
//! Run: `cargo bench --bench engine -- --warm-up-time 1 --measurement-time 5`.
//! `PORTCULLIS_BENCH_ENTITIES` (default 100,000), `PORTCULLIS_BENCH_BIG_MIB` (default 1024),
//! `PORTCULLIS_BENCH_RECORD_BYTES` (record size in the big store, default 1,000) change the
//! sizes.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{
    dir_bytes, env_u64, full_run, last_segment_bytes, median, mib, open_for_loading, scratch, value,
};
use criterion::{Criterion, SamplingMode};
use parking_lot::Mutex;
use portcullis::EntityId;
use portcullis::engine::Engine;
use portcullis::log::{self, Guarded, HeadSnapshot};
use portcullis::restore::{
    self, ApplyContext, Metrics, Origin, Rejection, StateMachine, UnitReport,
};
use portcullis::store::{Batch, FileStore, Store};

/// Folds records into a count and a cheap running mix of their bytes.
struct Mix;

impl StateMachine for Mix {
    type State = [u64; 2];

    fn fresh(&self, _: &EntityId) -> [u64; 2] {
        [0, 0]
    }

    fn apply(
        &self,
        state: &mut [u64; 2],
        _: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        let mut word = [0u8; 8];
        let n = record.len().min(8);
        word[..n].copy_from_slice(&record[..n]);
        state[0] += 1;
        state[1] = state[1].rotate_left(5) ^ u64::from_le_bytes(word) ^ record.len() as u64;
        Ok(())
    }

    fn encode_checkpoint(&self, state: &[u64; 2]) -> Result<Vec<u8>, Rejection> {
        let mut out = state[0].to_le_bytes().to_vec();
        out.extend_from_slice(&state[1].to_le_bytes());
        Ok(out)
    }

    fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<[u64; 2], Rejection> {
        if bytes.len() != 16 {
            return Err(Rejection::new("a checkpoint is 16 bytes"));
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        Ok([word(0), word(8)])
    }
}

/// Counts what restore units replayed.
#[derive(Default)]
struct Replayed {
    units: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
}

impl Metrics for Replayed {
    fn entity_restored(&self, _: &EntityId, report: &UnitReport) {
        self.units.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(report.replayed, Ordering::Relaxed);
        self.bytes
            .fetch_add(report.replayed_bytes, Ordering::Relaxed);
    }
}

impl Replayed {
    fn take(&self) -> (u64, u64, u64) {
        (
            self.units.swap(0, Ordering::Relaxed),
            self.records.swap(0, Ordering::Relaxed),
            self.bytes.swap(0, Ordering::Relaxed),
        )
    }
}

fn entity(i: u64) -> EntityId {
    EntityId::new("bench", format!("entity-{i:06}")).expect("valid entity")
}

/// Opens the engine over a built store the way an application would. Restore never owes a
/// checkpoint here, so measuring changes nothing in the store but the incarnation rows.
fn open_engine(dir: &std::path::Path, threads: usize, metrics: &Arc<Replayed>) -> Engine<Mix> {
    Engine::builder(Mix)
        .directory(dir)
        .pool_threads(threads)
        .warm_parallelism(threads)
        .checkpoint_tail_bound(u64::MAX)
        .metrics(Arc::clone(metrics) as Arc<dyn Metrics>)
        .open()
        .expect("opening the engine")
}

struct Built {
    label: String,
    dir: tempfile::TempDir,
    entities: u64,
    records_per_entity: u64,
    payload_bytes: u64,
    journal_bytes: u64,
    disk_bytes: u64,
    build_time: Duration,
}

/// Heads of the logs being loaded, kept in memory so each append is one `apply`.
struct Loader {
    store: FileStore,
    heads: Vec<HeadSnapshot>,
    ids: Vec<EntityId>,
}

impl Loader {
    fn new(store: FileStore, ids: Vec<EntityId>) -> Self {
        let heads = ids
            .iter()
            .map(|e| HeadSnapshot::from_row(&e.partition(), None).expect("empty head"))
            .collect();
        Loader { store, heads, ids }
    }

    /// Appends records to entity `i` in one batch; the first append also writes the
    /// registration marker, as `Engine::register` does.
    fn append(&mut self, i: usize, records: &[Vec<u8>]) {
        let p = self.ids[i].partition();
        let mut extra = Batch::new();
        if self.heads[i].head.next_seq == 1 {
            extra = extra.put(restore::keys::entity_key(), 1u64.to_be_bytes().to_vec());
        }
        match log::append_at(&self.store, &p, &self.heads[i], records, extra).expect("append") {
            Guarded::Committed(appended) => self.heads[i] = appended.head,
            other => panic!("bulk append did not commit: {other:?}"),
        }
    }
}

/// Builds a store of `entities` entities with round-robin one-record appends of `record_len`
/// bytes until at least `bytes` of journal were written (at least one record each).
fn build_history(label: &str, entities: u64, record_len: usize, bytes: u64) -> Built {
    let dir = scratch(label);
    let started = Instant::now();
    let ids: Vec<EntityId> = (0..entities).map(entity).collect();
    let mut loader = Loader::new(open_for_loading(dir.path()), ids);
    let template = value(7, record_len);
    let mut rounds = 0u64;
    let mut last_report = Instant::now();
    loop {
        for i in 0..entities as usize {
            let mut record = template.clone();
            let stamp = (rounds << 32) ^ i as u64;
            record[..8.min(record_len)].copy_from_slice(&stamp.to_le_bytes()[..8.min(record_len)]);
            loader.append(i, &[record]);
        }
        rounds += 1;
        let written = loader.store.stats().bytes_written;
        if written >= bytes {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!("  ... {label}: {} MiB written", written >> 20);
        }
    }
    let journal_bytes = loader.store.stats().bytes_written;
    loader.store.close().expect("close");
    sync_files(dir.path());
    let build_time = started.elapsed();
    let disk_bytes = dir_bytes(dir.path());
    eprintln!(
        "built {label}: {entities} entities x {rounds} records of {record_len} B, \
         {:.1} MiB journal written, {:.1} MiB on disk, in {build_time:.1?}",
        mib(journal_bytes),
        mib(disk_bytes)
    );
    Built {
        label: label.to_owned(),
        dir,
        entities,
        records_per_entity: rounds,
        payload_bytes: rounds * entities * record_len as u64,
        journal_bytes,
        disk_bytes,
        build_time,
    }
}

/// A store with two deep entities (each `records` records of `record_len` bytes, appended
/// alternately), the second with a checkpoint at its last record, and one entity with a single
/// record.
struct Deep {
    dir: tempfile::TempDir,
    plain: EntityId,
    checkpointed: EntityId,
    single: EntityId,
    records: u64,
    build_time: Duration,
}

fn build_deep(records: u64, record_len: usize) -> Deep {
    let dir = scratch("deep");
    let started = Instant::now();
    let plain = EntityId::new("bench", "deep-plain").expect("valid");
    let checkpointed = EntityId::new("bench", "deep-checkpointed").expect("valid");
    let single = EntityId::new("bench", "single").expect("valid");
    let ids = vec![plain.clone(), checkpointed.clone(), single.clone()];
    let mut loader = Loader::new(open_for_loading(dir.path()), ids);
    let mut state = Mix.fresh(&checkpointed);
    let template = value(11, record_len);
    for seq in 1..=records {
        let mut record = template.clone();
        record[..8].copy_from_slice(&seq.to_le_bytes());
        loader.append(0, std::slice::from_ref(&record));
        let ctx = ApplyContext::new(&checkpointed, seq, Origin::Live);
        Mix.apply(&mut state, &ctx, &record).expect("apply");
        loader.append(1, &[record]);
    }
    loader.append(2, &[template]);
    let p = checkpointed.partition();
    let encoded = Mix.encode_checkpoint(&state).expect("a mix encodes");
    match log::write_checkpoint(
        &loader.store,
        &p,
        &loader.heads[1],
        records,
        encoded,
        Batch::new(),
    )
    .expect("checkpoint")
    {
        Guarded::Committed(_) => {}
        other => panic!("checkpoint did not commit: {other:?}"),
    }
    loader.store.close().expect("close");
    sync_files(dir.path());
    let build_time = started.elapsed();
    eprintln!("built deep store: 2 x {records} records + 1, in {build_time:.1?}");
    Deep {
        dir,
        plain,
        checkpointed,
        single,
        records,
        build_time,
    }
}

/// Starts `n` threads that touch `e` at once; returns the time from the first thread's start
/// to the last thread's answer, and records each thread's own latency under `per_thread`.
fn herd(
    engine: &Engine<Mix>,
    e: &EntityId,
    n: usize,
    count: u64,
    samples: &Samples,
    per_thread: &str,
) -> Duration {
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let engine = engine.clone();
            let barrier = Arc::clone(&barrier);
            let e = e.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let started = Instant::now();
                let seen = engine.read(&e, |s| s[0]).expect("read");
                (started, Instant::now(), seen)
            })
        })
        .collect();
    let results: Vec<(Instant, Instant, u64)> = handles
        .into_iter()
        .map(|h| h.join().expect("herd thread"))
        .collect();
    assert!(results.iter().all(|r| r.2 == count));
    for r in &results {
        samples.push(per_thread, r.1 - r.0);
    }
    let first = results.iter().map(|r| r.0).min().expect("n >= 1");
    let last = results.iter().map(|r| r.1).max().expect("n >= 1");
    last - first
}

/// Flushes every file of a built store to disk, so the kernel's writeback of a bulk load does
/// not compete with the syncs of the runs that follow.
fn sync_files(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).expect("listing") {
        let path = entry.expect("listing").path();
        if path.is_dir() {
            sync_files(&path);
        } else {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .expect("syncing a store file");
        }
    }
}

/// Scheduler counters summed over this process's threads (Linux): nanoseconds on a CPU,
/// nanoseconds runnable but waiting for a CPU, voluntary and involuntary context switches.
/// All zero where `/proc` is not available.
#[derive(Clone, Copy, Default, Debug)]
struct Sched {
    run_ns: u64,
    wait_ns: u64,
    voluntary: u64,
    involuntary: u64,
}

fn sched() -> Sched {
    let mut total = Sched::default();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return total;
    };
    for task in tasks.flatten() {
        let path = task.path();
        if let Ok(stat) = std::fs::read_to_string(path.join("schedstat")) {
            let mut fields = stat
                .split_whitespace()
                .map(|f| f.parse::<u64>().unwrap_or(0));
            total.run_ns += fields.next().unwrap_or(0);
            total.wait_ns += fields.next().unwrap_or(0);
        }
        if let Ok(status) = std::fs::read_to_string(path.join("status")) {
            for line in status.lines() {
                let value = |l: &str| l.split_whitespace().nth(1).and_then(|v| v.parse().ok());
                if line.starts_with("voluntary_ctxt_switches") {
                    total.voluntary += value(line).unwrap_or(0);
                } else if line.starts_with("nonvoluntary_ctxt_switches") {
                    total.involuntary += value(line).unwrap_or(0);
                }
            }
        }
    }
    total
}

/// Every timed figure of one case, for the table at the end.
#[derive(Default)]
struct Samples(Mutex<Vec<(String, Vec<Duration>)>>);

impl Samples {
    fn push(&self, case: &str, took: Duration) {
        let mut all = self.0.lock();
        match all.iter_mut().find(|(c, _)| c == case) {
            Some((_, v)) => v.push(took),
            None => all.push((case.to_owned(), vec![took])),
        }
    }

    fn median(&self, case: &str) -> Option<Duration> {
        let all = self.0.lock();
        all.iter()
            .find(|(c, _)| c == case)
            .map(|(_, v)| median(v.clone()))
    }
}

/// What a warm replayed, per run, for throughput.
#[derive(Default, Clone, Copy)]
struct WarmRun {
    entities: u64,
    records: u64,
    bytes: u64,
    /// Scheduler counters over the last warm: CPU time, time waiting for a CPU, switches.
    sched: Sched,
    wall: Duration,
}

fn size_label(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{}MiB", bytes >> 20)
    } else {
        format!("{}KiB", bytes >> 10)
    }
}

fn main() {
    let full = full_run();
    let n_entities = if full {
        env_u64("PORTCULLIS_BENCH_ENTITIES", 100_000)
    } else {
        200
    };
    let small_bytes = if full { 10 << 20 } else { 32 << 10 };
    let big_bytes = if full {
        env_u64("PORTCULLIS_BENCH_BIG_MIB", 1024) << 20
    } else {
        1 << 20
    };
    let big_record = env_u64("PORTCULLIS_BENCH_RECORD_BYTES", 1000) as usize;
    let deep_records = if full { 10_000 } else { 300 };
    let deep_record = 100;
    let herd_sizes: &[usize] = if full { &[1, 8, 64] } else { &[1, 4] };

    // ~100 bytes of history per entity: one record of 100 bytes each.
    let small = build_history(&size_label(small_bytes), n_entities, 100, small_bytes);
    let big = build_history(&size_label(big_bytes), n_entities, big_record, big_bytes);
    let deep = build_deep(deep_records, deep_record);
    let stores = [&small, &big];

    let samples = Samples::default();
    let metrics = Arc::new(Replayed::default());
    let mut warm_runs: Vec<(String, WarmRun)> = Vec::new();
    let mut c = Criterion::default().sample_size(10).configure_from_args();

    // 1. Time to ready: open returns with every entity pending.
    {
        let mut group = c.benchmark_group("ready_lazy");
        for built in stores {
            let case = format!("lazy {}", built.label);
            group.bench_function(built.label.as_str(), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let started = Instant::now();
                        let engine = open_engine(built.dir.path(), 2, &metrics);
                        let took = started.elapsed();
                        total += took;
                        samples.push(&case, took);
                        let phases = engine.stats().phases;
                        assert_eq!((phases.entities, phases.pending), (n_entities, n_entities));
                        engine.close().expect("close");
                    }
                    total
                })
            });
        }
        group.finish();
    }
    {
        let mut group = c.benchmark_group("store_open");
        for built in stores {
            let case = format!("store open {}", built.label);
            group.bench_function(built.label.as_str(), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let started = Instant::now();
                        let store = FileStore::open(built.dir.path()).expect("open");
                        let took = started.elapsed();
                        total += took;
                        samples.push(&case, took);
                        store.close().expect("close");
                    }
                    total
                })
            });
        }
        group.finish();
    }
    metrics.take();

    // 1 and 2. Eager: open, then a warm on N threads to completion. With 2 threads this is the
    // eager baseline for time to ready; the warm part alone gives the warm throughput.
    {
        let mut group = c.benchmark_group("ready_eager_warm");
        group.sampling_mode(SamplingMode::Flat);
        for built in stores {
            for threads in [1usize, 2] {
                let case = format!("eager {} {threads}t", built.label);
                let warm_case = format!("warm {} {threads}t", built.label);
                let mut per_run = WarmRun::default();
                group.bench_function(format!("{}/{threads}t", built.label), |b| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let started = Instant::now();
                            let engine = open_engine(built.dir.path(), threads, &metrics);
                            let before = sched();
                            let warm_started = Instant::now();
                            let progress = engine.warm().expect("warm").wait().expect("wait");
                            let took = started.elapsed();
                            let warm_took = warm_started.elapsed();
                            let after = sched();
                            total += took;
                            samples.push(&case, took);
                            samples.push(&warm_case, warm_took);
                            assert_eq!((progress.done, progress.refused), (n_entities, 0));
                            let (units, records, bytes) = metrics.take();
                            assert_eq!(units, n_entities);
                            per_run = WarmRun {
                                entities: units,
                                records,
                                bytes,
                                sched: Sched {
                                    run_ns: after.run_ns - before.run_ns,
                                    wait_ns: after.wait_ns - before.wait_ns,
                                    voluntary: after.voluntary - before.voluntary,
                                    involuntary: after.involuntary - before.involuntary,
                                },
                                wall: warm_took,
                            };
                            engine.close().expect("close");
                        }
                        total
                    })
                });
                warm_runs.push((warm_case, per_run));
            }
        }
        group.finish();
    }

    // 3. First touch of a deep entity, with and without a checkpoint.
    {
        let mut group = c.benchmark_group("first_touch");
        let cases = [
            ("no checkpoint", &deep.plain, deep.records, deep.records),
            ("checkpoint", &deep.checkpointed, deep.records, 0),
        ];
        for (label, e, count, replays) in cases {
            let case = format!("first touch, {} records, {label}", deep.records);
            group.bench_function(label, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let engine = open_engine(deep.dir.path(), 2, &metrics);
                        let started = Instant::now();
                        let seen = engine.read(e, |s| s[0]).expect("read");
                        let took = started.elapsed();
                        total += took;
                        samples.push(&case, took);
                        assert_eq!(seen, count);
                        let (units, records, _) = metrics.take();
                        assert_eq!((units, records), (1, replays));
                        engine.close().expect("close");
                    }
                    total
                })
            });
        }
        group.finish();
    }

    // 4. A herd: N threads touch one pending entity at once; the time from the first thread's
    // start to the last thread's answer. The unit must run once. The control does the same on
    // an entity restored before the threads start, which shows what starting and waking N
    // threads on this machine costs by itself.
    {
        let mut group = c.benchmark_group("herd");
        let targets = [
            (
                format!("{} records", deep.records),
                &deep.plain,
                deep.records,
            ),
            ("1 record".to_owned(), &deep.single, 1),
        ];
        for (target, e, count) in &targets {
            for restored_first in [false, true] {
                for &n in herd_sizes {
                    let kind = if restored_first {
                        "restored"
                    } else {
                        "pending"
                    };
                    let case = format!("herd {target}, {kind}, {n} threads");
                    let per_thread = format!("per-thread {target}, {kind}, {n} threads");
                    group.bench_function(format!("{target}/{kind}/{n}"), |b| {
                        b.iter_custom(|iters| {
                            let mut total = Duration::ZERO;
                            for _ in 0..iters {
                                let engine = open_engine(deep.dir.path(), 2, &metrics);
                                if restored_first {
                                    engine.read(e, |_| ()).expect("read");
                                }
                                let took = herd(&engine, e, n, *count, &samples, &per_thread);
                                total += took;
                                samples.push(&case, took);
                                assert_eq!(engine.stats().units_run, 1, "the unit ran once");
                                metrics.take();
                                engine.close().expect("close");
                            }
                            total
                        })
                    });
                }
            }
        }
        group.finish();
    }

    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    println!();
    println!("## engine: {n_entities} entities (medians of every timed call)");
    println!(
        "| store | entities | records/entity | payload MiB | journal MiB | on disk MiB | newest segment MiB | build |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for built in stores {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1?} |",
            built.label,
            built.entities,
            built.records_per_entity,
            mib(built.payload_bytes),
            mib(built.journal_bytes),
            mib(built.disk_bytes),
            mib(last_segment_bytes(built.dir.path())),
            built.build_time
        );
    }
    println!(
        "| deep | 3 | 2 x {} + 1 | | | {:.1} | | {:.1?} |",
        deep.records,
        mib(dir_bytes(deep.dir.path())),
        deep.build_time
    );
    println!();
    println!("| case | runs | median |");
    println!("|---|---|---|");
    for (case, v) in samples.0.lock().iter() {
        println!(
            "| {case} | {} | {:.3} ms |",
            v.len(),
            ms(Some(median(v.clone())))
        );
    }
    println!();
    println!(
        "| warm | entities/s | records/s | MB/s replayed (payload) | last run: CPUs busy | waiting for a CPU | voluntary / involuntary switches |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (case, run) in &warm_runs {
        let secs = samples.median(case).map_or(f64::NAN, |d| d.as_secs_f64());
        let wall = run.wall.as_secs_f64() * 1e9;
        println!(
            "| {case} | {:.0} | {:.0} | {:.1} | {:.2} | {:.2} | {} / {} |",
            run.entities as f64 / secs,
            run.records as f64 / secs,
            run.bytes as f64 / secs / 1e6,
            run.sched.run_ns as f64 / wall,
            run.sched.wait_ns as f64 / wall,
            run.sched.voluntary,
            run.sched.involuntary
        );
    }
    println!();
    let ratio = |a: &str, b: &str| ms(samples.median(a)) / ms(samples.median(b));
    let (s, g) = (&small.label, &big.label);
    println!(
        "P2 eager (open + warm, 2 threads) / lazy ready: {s} {:.0}x, {g} {:.0}x (goal >= 100x)",
        ratio(&format!("eager {s} 2t"), &format!("lazy {s}")),
        ratio(&format!("eager {g} 2t"), &format!("lazy {g}")),
    );
    println!(
        "P1 lazy ready {g} / {s}: {:.2}x (goal <= 1.5x)",
        ratio(&format!("lazy {g}"), &format!("lazy {s}"))
    );
    for built in stores {
        let l = &built.label;
        println!(
            "P4 warm {l}: 2 threads / 1 thread throughput {:.2}x (goal >= 1.7x)",
            ratio(&format!("warm {l} 1t"), &format!("warm {l} 2t"))
        );
    }
    println!(
        "first touch: no checkpoint / checkpoint {:.1}x",
        ratio(
            &format!("first touch, {} records, no checkpoint", deep.records),
            &format!("first touch, {} records, checkpoint", deep.records)
        )
    );
    for target in [format!("{} records", deep.records), "1 record".to_owned()] {
        for &n in herd_sizes.iter().skip(1) {
            let pending = ratio(
                &format!("herd {target}, pending, {n} threads"),
                &format!("herd {target}, pending, 1 threads"),
            );
            let restored = ratio(
                &format!("herd {target}, restored, {n} threads"),
                &format!("herd {target}, restored, 1 threads"),
            );
            println!(
                "herd {target}: {n} threads / 1 thread {pending:.2}x (pending), {restored:.2}x (restored control)"
            );
        }
    }
    drop(deep);
    drop(big);
    drop(small);
    c.final_summary();
}
