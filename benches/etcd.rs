//! Durable single-row commits through `EtcdStore` against raw `ureq` transactions to the same
//! etcd in the same run (issue goal: the store at least 90% of raw at 1, 4 and 16 threads).
//! Feature `etcd`; needs the `etcd` binary (Debian's `etcd-server`).
//!
//! Each commit writes one fresh 128-byte row. Raw: one transaction with one put, built and sent
//! with `ureq` and `serde_json` as a hand-written client would. Store: `apply` of a one-put
//! batch (which also sets the client's commit-marker slot, compares it, and carries the failure
//! branch; the partition's registry key is written by its first batch only). Both are durable: etcd answers after its WAL fsync.
//! Each thread writes its own partition. Rounds of raw and store alternate, so a slow spell of
//! the shared disk hits both; the figure is the median of the rounds.
//!
//! Run: `cargo bench --features etcd --bench etcd` (ROUNDS and ROUND_MS override 5 and 2000).
//! `cargo test --features etcd --benches` runs it once with tiny rounds as a smoke test.
//!
//! Then, the cost of a fenced write on etcd: `Fence::write` under a usable lease (one lease
//! read, then the apply guarded on the lease) against `EtcdStore::apply` of the same batch.

#[path = "../tests/common/etcd.rs"]
#[allow(dead_code)]
mod etcd_support;

use std::sync::Arc;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_support::{EtcdServer, RawEtcd};
use portcullis::store::{Batch, EtcdStore, Partition, Store};

const VALUE_LEN: usize = 128;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `commit(thread, seq)` on `threads` threads for `duration`; returns commits per second.
fn round(threads: usize, duration: Duration, commit: &(dyn Fn(usize, u64) + Sync)) -> f64 {
    let barrier = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let seq = AtomicU64::new(0);
    let elapsed = std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, stop, done, seq) = (&barrier, &stop, &done, &seq);
            s.spawn(move || {
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    commit(t, seq.fetch_add(1, Ordering::Relaxed));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let started = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        barrier.wait();
        started.elapsed()
    });
    done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds = if full { env_u64("ROUNDS", 5) } else { 1 } as usize;
    let round_ms = if full { env_u64("ROUND_MS", 2000) } else { 100 };
    let duration = Duration::from_millis(round_ms);
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let store = Arc::new(
        EtcdStore::builder(etcd.endpoint())
            .prefix("bench/")
            .open()
            .expect("open the etcd store"),
    );
    let value = vec![0x5a; VALUE_LEN];
    let parts: Vec<Partition> = (0..16)
        .map(|t| Partition::new(format!("bench-{t:02}")).unwrap())
        .collect();
    let raw_commit = |t: usize, seq: u64| {
        let key = format!("raw/{t:02}/{seq:012}");
        raw.put_txn(key.as_bytes(), &value);
    };
    // Raw transactions that also write a per-thread marker key, without and with a compare of
    // its value (what EtcdStore's commit marker costs etcd, as a hand-written client would pay).
    let last: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(0)).collect();
    for t in 0..16 {
        raw.put_txn(format!("rawm/{t:02}").as_bytes(), &0u64.to_be_bytes());
    }
    let marked_commit = |compare: bool| {
        let last = &last;
        let raw = &raw;
        let value = &value;
        move |t: usize, seq: u64| {
            let key = format!("rawk/{t:02}/{seq:012}");
            let marker = format!("rawm/{t:02}");
            let before = last[t].load(Ordering::Relaxed).to_be_bytes();
            let expect = compare.then_some(&before[..]);
            raw.put_txn_marked(
                key.as_bytes(),
                value,
                marker.as_bytes(),
                &seq.to_be_bytes(),
                expect,
            );
            last[t].store(seq, Ordering::Relaxed);
        }
    };
    let raw_key_commit = marked_commit(false);
    let raw_cas_commit = marked_commit(true);
    let store_commit = |t: usize, seq: u64| {
        let batch = Batch::new().put(format!("{seq:012}").into_bytes(), value.clone());
        let outcome = store.apply(&parts[t], &batch).expect("apply");
        assert!(outcome.is_committed());
    };
    // Warm both paths (connections, the partitions' first batches).
    round(16, Duration::from_millis(200), &raw_commit);
    round(16, Duration::from_millis(200), &store_commit);

    println!();
    println!(
        "## etcd: durable single-row commits, {VALUE_LEN}-byte values, {rounds} alternating rounds of {round_ms} ms{}",
        if full { "" } else { " (smoke run)" }
    );
    println!(
        "| threads | raw txn | EtcdStore | EtcdStore / raw | raw + marker key | raw + marker key + compare |"
    );
    println!("|---|---|---|---|---|---|");
    let mut detail = Vec::new();
    for threads in [1usize, 4, 16] {
        let mut rates: [Vec<f64>; 4] = Default::default();
        for _ in 0..rounds {
            rates[0].push(round(threads, duration, &raw_commit));
            rates[1].push(round(threads, duration, &store_commit));
            rates[2].push(round(threads, duration, &raw_key_commit));
            rates[3].push(round(threads, duration, &raw_cas_commit));
        }
        let m: Vec<f64> = rates.iter().map(|r| median(r.clone())).collect();
        println!(
            "| {threads} | {:.0} | {:.0} | **{:.1}%** | {:.0} ({:.1}%) | {:.0} ({:.1}%) |",
            m[0],
            m[1],
            100.0 * m[1] / m[0],
            m[2],
            100.0 * m[2] / m[0],
            m[3],
            100.0 * m[3] / m[0]
        );
        let fmt = |xs: &[f64]| {
            xs.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        detail.push(format!(
            "{threads} threads, commits/s per round: raw {}; store {}; raw + key {}; raw + key + compare {}",
            fmt(&rates[0]),
            fmt(&rates[1]),
            fmt(&rates[2]),
            fmt(&rates[3])
        ));
    }
    println!();
    for line in detail {
        println!("{line}");
    }
    fenced_writes(&store, rounds, duration, &value);
    store.close().unwrap();
}

/// The cost of a fenced write on etcd (SPEC F3 without deadlines): `Fence::write` of a one-put
/// batch under a usable lease (a lease read, then the apply guarded on it) against
/// `EtcdStore::apply` of the same batch, each thread on its own entity, rounds alternating.
fn fenced_writes(store: &Arc<EtcdStore>, rounds: usize, duration: Duration, value: &[u8]) {
    use portcullis::fence::{Fence, FenceConfig, WriteOutcome};
    use portcullis::{EntityId, SystemClock};
    let fence = Fence::new(
        Arc::clone(store) as Arc<dyn Store>,
        Arc::new(SystemClock),
        FenceConfig::default(),
    );
    let entities: Vec<EntityId> = (0..16)
        .map(|t| EntityId::new("bench", format!("e{t:02}")).unwrap())
        .collect();
    let fenced_commit = |t: usize, seq: u64| {
        let batch = Batch::new().put(format!("{seq:012}").into_bytes(), value.to_vec());
        let outcome = fence.write(&entities[t], 0, batch).expect("fenced write");
        assert!(matches!(outcome, WriteOutcome::Committed { .. }));
    };
    let plain_commit = |t: usize, seq: u64| {
        let batch = Batch::new().put(format!("{seq:012}").into_bytes(), value.to_vec());
        let outcome = store
            .apply(&entities[t].partition(), &batch)
            .expect("apply");
        assert!(outcome.is_committed());
    };
    // Warm: every entity takes its lease (a renewal) before the rounds.
    round(16, Duration::from_millis(200), &fenced_commit);
    println!();
    println!("## etcd: a fenced write (lease read + guarded apply) against a plain apply");
    println!("| threads | EtcdStore::apply | Fence::write | fenced / plain |");
    println!("|---|---|---|---|");
    for threads in [1usize, 4, 16] {
        let (mut plain, mut fenced) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            plain.push(round(threads, duration, &plain_commit));
            fenced.push(round(threads, duration, &fenced_commit));
        }
        let (p, f) = (median(plain), median(fenced));
        println!(
            "| {threads} | {p:.0} | {f:.0} | **{:.1}%** |",
            100.0 * f / p
        );
    }
}
