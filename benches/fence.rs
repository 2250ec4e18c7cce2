//! Fencing costs (SPEC P5, P6, F11): bump plus revocation to `Complete` over 100, 1,000 and
//! 10,000 live leases, a fenced write with a usable lease and with a renewal, and what fencing
//! costs an engine write: the first and a steady-state write to an entity, in a fenced and in
//! an unfenced namespace, on `MemoryStore` and on `FileStore`, in the same run.
//!
//! Before criterion's timings it prints the counted figures: slices, store calls and store
//! calls per push for each revocation, and store calls per write. After them it prints the
//! medians of the engine writes (every timed write, not criterion's estimate) and the
//! fenced/unfenced ratios.

mod common;
mod engine_writes;

use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion};
use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress};
use portcullis::store::{Batch, MemoryStore};
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

fn main() {
    print_counts();
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    engine_writes::bench(&mut c, common::full_run());
    c.final_summary();
}
