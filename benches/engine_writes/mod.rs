//! What fencing costs an engine write (SPEC F11, issue 9 item 3): the first write to an entity
//! (registration on first write, its restore unit and the append) and a steady-state append to
//! a restored entity, in a fenced namespace (`EngineBuilder::own`) and in an unfenced one
//! (`EngineBuilder::own_unfenced`), served by one engine over one store, so both are measured
//! in the same run. On `MemoryStore` and on `FileStore` (default sync policy: every commit is
//! synced). A wrapper counts every store call the engine makes, including the fence's. After
//! criterion's runs it also times fenced and unfenced writes alternately (20,000 pairs on
//! `MemoryStore`, 300 on `FileStore`) and prints their medians, so that a load that drifts
//! during the run (the machine is shared) weighs on both alike.
//!
//! The background sweeper is off, so no sweep pass lands among the counted calls; with the
//! system clock a fenced entity renews its lease every ~24 s (30 s lease, 5 s margin, 1 s
//! budget), which the steady-state figure includes, as an application would see it, and so is
//! the engine's owner lease renewal (SPEC F12: one batch and one read per namespace held, every
//! 2.5 s, on a thread of its own).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use parking_lot::Mutex;
use portcullis::restore::{ApplyContext, Rejection, StateMachine};
use portcullis::store::{
    Batch, Cursor, FileStore, KeyRange, MemoryStore, Outcome, Partition, ScanPage, Store,
    StoreLimits, StoreStats,
};
use portcullis::{Engine, EntityId, Namespace};

use crate::common::{median, scratch};

/// Counts records; its checkpoint is the count.
struct Count;

impl StateMachine for Count {
    type State = u64;
    fn fresh(&self, _: &EntityId) -> u64 {
        0
    }
    fn apply(&self, s: &mut u64, _: &ApplyContext<'_>, _: &[u8]) -> Result<(), Rejection> {
        *s += 1;
        Ok(())
    }
    fn encode_checkpoint(&self, s: &u64) -> Result<Vec<u8>, Rejection> {
        Ok(s.to_le_bytes().to_vec())
    }
    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<u64, Rejection> {
        b.try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| Rejection::new("bad checkpoint"))
    }
}

/// A store that counts every call made to it.
struct Counting {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
}

impl Counting {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

impl Store for Counting {
    fn get(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.count();
        self.inner.get(p, key)
    }
    fn get_for_update(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.count();
        self.inner.get_for_update(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> portcullis::Result<Vec<Option<Vec<u8>>>> {
        self.count();
        self.inner.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> portcullis::Result<ScanPage> {
        self.count();
        self.inner.scan(p, range, cursor, limit)
    }
    fn apply(&self, p: &Partition, batch: &Batch) -> portcullis::Result<Outcome> {
        self.count();
        self.inner.apply(p, batch)
    }
    fn list_partitions(&self, prefix: &[u8]) -> portcullis::Result<Vec<Partition>> {
        self.count();
        self.inner.list_partitions(prefix)
    }
    fn contains_partition(&self, p: &Partition) -> portcullis::Result<bool> {
        self.count();
        self.inner.contains_partition(p)
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }
    fn evaluates_deadlines(&self) -> bool {
        self.inner.evaluates_deadlines()
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
    fn close(&self) -> portcullis::Result<()> {
        self.inner.close()
    }
}

const MODES: [&str; 2] = ["fenced", "unfenced"];

/// One engine over one store, serving a fenced and an unfenced namespace.
struct Rig {
    label: &'static str,
    engine: Engine<Count>,
    store: Arc<Counting>,
    namespaces: [Namespace; 2],
    next: AtomicU64,
    _dir: Option<tempfile::TempDir>,
}

impl Rig {
    fn new(label: &'static str) -> Rig {
        let (inner, dir): (Arc<dyn Store>, _) = match label {
            "memory" => (Arc::new(MemoryStore::new()), None),
            _ => {
                let dir = scratch("fence-writes");
                let store = FileStore::builder(dir.path()).open().expect("file store");
                (Arc::new(store), Some(dir))
            }
        };
        let store = Arc::new(Counting {
            inner,
            calls: AtomicU64::new(0),
        });
        let namespaces = MODES.map(|m| Namespace::new(m).unwrap());
        let engine = Engine::builder(Count)
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .register_on_first_write(true)
            .sweep_expired_leases(false)
            .pool_threads(1)
            .own(namespaces[0].clone())
            .own_unfenced(namespaces[1].clone())
            .open()
            .expect("engine");
        Rig {
            label,
            engine,
            store,
            namespaces,
            next: AtomicU64::new(0),
            _dir: dir,
        }
    }

    fn fresh_entity(&self, mode: usize) -> EntityId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        EntityId::in_namespace(self.namespaces[mode].clone(), format!("e{n:09}")).unwrap()
    }

    fn write(&self, e: &EntityId) {
        self.engine.append(e, vec![b"r".to_vec()]).expect("append");
    }

    /// Store calls one write makes, on average over `n` writes.
    fn calls_per(&self, n: u64, mut write: impl FnMut()) -> f64 {
        let before = self.store.calls.load(Ordering::Relaxed);
        for _ in 0..n {
            write();
        }
        (self.store.calls.load(Ordering::Relaxed) - before) as f64 / n as f64
    }
}

/// Every timed write, per case.
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

    fn median(&self, case: &str) -> Duration {
        let all = self.0.lock();
        let v = all.iter().find(|(c, _)| c == case).map(|(_, v)| v.clone());
        median(v.unwrap_or_default())
    }
}

/// Runs the benchmarks and prints the counts, medians and ratios.
pub fn bench(c: &mut Criterion, full: bool) {
    let rigs = [Rig::new("memory"), Rig::new("file")];
    for rig in &rigs {
        let n = if full { 100 } else { 3 };
        for (mode, name) in MODES.iter().enumerate() {
            let first = rig.calls_per(n, || rig.write(&rig.fresh_entity(mode)));
            let hot = rig.fresh_entity(mode);
            rig.write(&hot);
            let steady = rig.calls_per(n, || rig.write(&hot));
            println!(
                "fence counts: engine write on {}, {name}: {first:.2} store calls for the first \
                 write to an entity, {steady:.2} per steady-state write",
                rig.label
            );
        }
    }
    let samples = Samples::default();
    for rig in &rigs {
        let mut group = c.benchmark_group(format!("engine_write/{}", rig.label));
        if rig.label == "file" {
            group.sample_size(20);
        }
        for (mode, name) in MODES.iter().enumerate() {
            let case = format!("{} first {name}", rig.label);
            group.bench_function(format!("first/{name}"), |b| {
                b.iter_custom(|iters| timed(iters, &samples, &case, || rig.fresh_entity(mode), rig))
            });
            let hot = rig.fresh_entity(mode);
            rig.write(&hot);
            let case = format!("{} steady {name}", rig.label);
            group.bench_function(format!("steady/{name}"), |b| {
                b.iter_custom(|iters| timed(iters, &samples, &case, || hot.clone(), rig))
            });
        }
        group.finish();
    }
    paired(&rigs, full);
    println!("engine write medians (every timed write):");
    for rig in &rigs {
        for kind in ["first", "steady"] {
            let fenced = samples.median(&format!("{} {kind} fenced", rig.label));
            let unfenced = samples.median(&format!("{} {kind} unfenced", rig.label));
            println!(
                "  {} {kind}: fenced {fenced:?}, unfenced {unfenced:?}, fenced/unfenced {:.2}x",
                rig.label,
                fenced.as_secs_f64() / unfenced.as_secs_f64().max(1e-12)
            );
        }
    }
}

/// Times fenced and unfenced writes alternately, so that a load that drifts during the run (the
/// machine is shared) weighs on both alike, and prints their medians and ratio.
fn paired(rigs: &[Rig], full: bool) {
    println!("engine write medians, fenced and unfenced writes interleaved:");
    for rig in rigs {
        let rounds = match (full, rig.label) {
            (false, _) => 3,
            (true, "memory") => 20_000,
            (true, _) => 300,
        };
        let hot = [rig.fresh_entity(0), rig.fresh_entity(1)];
        for e in &hot {
            rig.write(e);
        }
        for kind in ["first", "steady"] {
            let mut took: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..rounds {
                for (mode, samples) in took.iter_mut().enumerate() {
                    let e = match kind {
                        "first" => rig.fresh_entity(mode),
                        _ => hot[mode].clone(),
                    };
                    let started = Instant::now();
                    rig.write(&e);
                    samples.push(started.elapsed());
                }
            }
            let [fenced, unfenced] = took.map(median);
            println!(
                "  {} {kind} ({rounds} pairs): fenced {fenced:?}, unfenced {unfenced:?}, \
                 fenced/unfenced {:.2}x",
                rig.label,
                fenced.as_secs_f64() / unfenced.as_secs_f64().max(1e-12)
            );
        }
    }
}

/// Times `iters` writes, each to the entity `pick` answers, recording each one.
fn timed(
    iters: u64,
    samples: &Samples,
    case: &str,
    pick: impl Fn() -> EntityId,
    rig: &Rig,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let e = pick();
        let started = Instant::now();
        rig.write(&e);
        let took = started.elapsed();
        samples.push(case, took);
        total += took;
    }
    total
}
