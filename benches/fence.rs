//! Fencing costs (SPEC P5, P6, F11, F12): bump plus revocation to `Complete` over 100, 1,000 and
//! 10,000 live leases, a fenced write with a usable lease and with a renewal, what fencing
//! costs an engine write: the first and a steady-state write to an entity, in a fenced and in
//! an unfenced namespace, on `MemoryStore` and on `FileStore`, in the same run; and what an
//! engine's owner lease costs (SPEC F12): one renewal of an engine holding 1, 16 and 256
//! namespaces (the lease write, plus one read per namespace held), on both stores.
//!
//! Before criterion's timings it prints the counted figures: slices, store calls and store
//! calls per push for each revocation, and store calls per write. After them it prints the
//! medians of the engine writes (every timed write, not criterion's estimate) and the
//! fenced/unfenced ratios.

mod common;
mod engine_writes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion};
use portcullis::Engine;
use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress};
use portcullis::restore::{ApplyContext, Rejection, StateMachine};
use portcullis::store::{Batch, MemoryStore};
use portcullis::store::{FileStore, Store};
use portcullis::{EntityId, ManualClock, Namespace};

struct Setup {
    fence: Fence,
    ns: Namespace,
    clock: ManualClock,
}

fn setup(leases: usize) -> Setup {
    let clock = ManualClock::new(1_000_000);
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let fence = Fence::new(store, Arc::new(clock.clone()), FenceConfig::default());
    let ns = Namespace::new("bench").unwrap();
    for i in 0..leases {
        let e = EntityId::in_namespace(ns.clone(), format!("entity-{i:06}")).unwrap();
        let _ = fence.write(&e, 0, Batch::new()).unwrap();
    }
    Setup { fence, ns, clock }
}

/// Bumps, then runs slices to `Complete`; answers the number of slices.
fn bump_and_revoke(s: &Setup) -> u64 {
    let epoch = s.fence.advance_epoch(&s.ns, 1).unwrap();
    let mut slices = 0;
    loop {
        slices += 1;
        if s.fence.revoke_step(&s.ns, RevokeBudget::default()).unwrap() == RevokeProgress::Complete
        {
            assert!(epoch > 0);
            return slices;
        }
    }
}

fn print_counts() {
    for leases in [100usize, 1_000, 10_000] {
        let s = setup(leases);
        let before = s.fence.stats();
        let slices = bump_and_revoke(&s);
        let after = s.fence.stats();
        let calls = after.store_calls - before.store_calls;
        let pushes = after.pushes - before.pushes;
        println!(
            "fence counts: {leases} leases: {slices} slices, {calls} store calls, {pushes} pushes, {:.2} store calls per push",
            calls as f64 / pushes.max(1) as f64
        );
    }
    let s = setup(0);
    let e = EntityId::in_namespace(s.ns.clone(), "w").unwrap();
    let before = s.fence.stats().store_calls;
    let _ = s.fence.write(&e, 0, Batch::new()).unwrap();
    let renewal = s.fence.stats().store_calls - before;
    let before = s.fence.stats().store_calls;
    let _ = s.fence.write(&e, 0, Batch::new()).unwrap();
    let usable = s.fence.stats().store_calls - before;
    s.clock.advance(0);
    println!(
        "fence counts: store calls per fenced write: usable lease {usable}, renewal {renewal}"
    );
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("fence/bump_and_revoke");
    group.sample_size(10);
    for leases in [100usize, 1_000, 10_000] {
        group.bench_with_input(
            BenchmarkId::from_parameter(leases),
            &leases,
            |b, &leases| {
                b.iter_batched(
                    || setup(leases),
                    |s| bump_and_revoke(&s),
                    BatchSize::PerIteration,
                )
            },
        );
    }
    group.finish();

    let mut group = c.benchmark_group("fence/write");
    let s = setup(0);
    let e = EntityId::in_namespace(s.ns.clone(), "hot").unwrap();
    let _ = s.fence.write(&e, 0, Batch::new()).unwrap();
    let value = Batch::new().put(b"k".to_vec(), b"v".to_vec());
    group.bench_function("usable_lease", |b| {
        b.iter(|| s.fence.write(&e, 0, value.clone()).unwrap())
    });
    let mut n = 0u64;
    group.bench_function("renewal", |b| {
        b.iter_batched(
            || {
                n += 1;
                EntityId::in_namespace(s.ns.clone(), format!("cold-{n}")).unwrap()
            },
            |cold| s.fence.write(&cold, 0, value.clone()).unwrap(),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// A state machine with nothing to restore: the lease renewal is all that is measured.
struct Nothing;

impl StateMachine for Nothing {
    type State = ();
    fn fresh(&self, _: &EntityId) {}
    fn apply(&self, _: &mut (), _: &ApplyContext<'_>, _: &[u8]) -> Result<(), Rejection> {
        Ok(())
    }
    fn encode_checkpoint(&self, _: &()) -> Result<Vec<u8>, Rejection> {
        Ok(Vec::new())
    }
    fn decode_checkpoint(&self, _: &EntityId, _: &[u8]) -> Result<(), Rejection> {
        Ok(())
    }
}

/// The namespace counts the owner lease benchmark holds.
const HELD: [usize; 3] = [1, 16, 256];

/// An engine over `store` holding `held` namespaces, its background renewal off (each
/// renewal measured is one `renew_owner_lease` call).
fn lease_engine(store: Arc<dyn Store>, held: usize) -> Engine<Nothing> {
    let engine = Engine::builder(Nothing)
        .store(store)
        .pool_threads(1)
        .sweep_expired_leases(false)
        .renew_owner_lease(false)
        .open()
        .unwrap();
    for i in 0..held {
        engine
            .own(&Namespace::new(format!("held-{i:03}")).unwrap())
            .unwrap();
    }
    engine
}

/// The stores the owner lease benchmark runs on; the directory lives as long as the store.
fn lease_stores() -> Vec<(&'static str, Arc<dyn Store>, Option<tempfile::TempDir>)> {
    let dir = common::scratch("owner-lease");
    let file = FileStore::open(dir.path()).unwrap();
    vec![
        ("memory", Arc::new(MemoryStore::new()), None),
        ("file", Arc::new(file), Some(dir)),
    ]
}

/// Times `rounds` renewals one by one and prints their median, and the store calls one makes
/// (the store's own count of reads and batches).
fn print_lease_costs(full: bool) {
    for (name, store, _dir) in lease_stores() {
        let rounds = match (name, full) {
            ("file", true) => 300,
            ("file", false) => 20,
            (_, true) => 5_000,
            _ => 100,
        };
        let mut medians = Vec::new();
        for held in HELD {
            let engine = lease_engine(Arc::clone(&store), held);
            // The re-reading of the namespaces goes through the engine's fence, which counts
            // its store calls; the lease write goes to the store, which counts its batches.
            let (before, reads_before) = (store.stats(), engine.fence().stats().store_calls);
            engine.renew_owner_lease().unwrap();
            let batches = store.stats().batches - before.batches;
            let reads = engine.fence().stats().store_calls - reads_before;
            let mut times = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let started = Instant::now();
                engine.renew_owner_lease().unwrap();
                times.push(started.elapsed());
            }
            let median = common::median(times);
            medians.push((held, median));
            println!(
                "owner lease on {name}: {held} namespaces held: {batches} batch and {reads} reads \
                 per renewal, median {median:.1?} over {rounds} renewals"
            );
            engine.close().unwrap();
        }
        let (first, last) = (medians[0], medians[medians.len() - 1]);
        let per_ns = last.1.saturating_sub(first.1).as_nanos() as f64 / (last.0 - first.0) as f64;
        println!(
            "owner lease on {name}: about {:.2} us more per namespace held ({} to {} namespaces)",
            per_ns / 1_000.0,
            first.0,
            last.0
        );
    }
}

fn lease_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine/owner_lease");
    group.measurement_time(Duration::from_secs(3));
    for (name, store, _dir) in lease_stores() {
        for held in HELD {
            let engine = lease_engine(Arc::clone(&store), held);
            group.bench_function(BenchmarkId::new(name, held), |b| {
                b.iter(|| engine.renew_owner_lease().unwrap())
            });
            engine.close().unwrap();
        }
    }
    group.finish();
}

fn main() {
    print_counts();
    let full = common::full_run();
    print_lease_costs(full);
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    lease_benches(&mut c);
    engine_writes::bench(&mut c, full);
    c.final_summary();
}
