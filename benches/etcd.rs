//! Durable single-row commits through `EtcdStore` against raw `ureq` transactions to the same
//! etcd in the same run (issue goal: the store at least 90% of raw at 1, 4 and 16 threads).
//! Feature `etcd`; needs the `etcd` binary (Debian's `etcd-server`).
//!
//! Each commit writes one fresh 128-byte row. Raw: one transaction with one put, built and sent
//! with `ureq` and `serde_json` as a hand-written client would. Store: `apply` of a one-put
//! batch (which also compares and sets the client's commit-marker slot; the partition's registry
//! key is written by its first batch only). Both are durable: etcd answers after its WAL fsync.
//! Each thread writes its own partition. Rounds of raw and store alternate, so a slow spell of
//! the shared disk hits both; the figure is the median of the rounds. The store is measured
//! with its default group commit, and with grouping off (`group_commit(0)`: every batch in its
//! own transaction at once).
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

/// What one round measured: commits per second, and CPU time per commit spent by the client's
/// threads and by the etcd process (from the kernel's per-thread run-time accounting, so a busy
/// machine changes it far less than the rate).
#[derive(Clone, Copy, Default)]
struct Measured {
    rate: f64,
    client_us: f64,
    etcd_us: f64,
}

/// Nanoseconds the calling thread has run on a CPU (`/proc/thread-self/schedstat`), or 0.
fn thread_cpu_ns() -> u64 {
    schedstat_ns("/proc/thread-self/schedstat")
}

fn schedstat_ns(path: impl AsRef<std::path::Path>) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Nanoseconds every thread of process `pid` has run on a CPU, or 0.
fn process_cpu_ns(pid: Option<u32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .map(|t| schedstat_ns(t.path().join("schedstat")))
        .sum()
}

/// Runs `commit(thread, seq)` on `threads` threads for `duration`; `etcd` is the server's process
/// id.
fn round(
    threads: usize,
    duration: Duration,
    etcd: Option<u32>,
    commit: &(dyn Fn(usize, u64) + Sync),
) -> Measured {
    let barrier = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let seq = AtomicU64::new(0);
    let client_ns = AtomicU64::new(0);
    let (elapsed, etcd_ns) = std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, stop, done, seq, client_ns) = (&barrier, &stop, &done, &seq, &client_ns);
            s.spawn(move || {
                barrier.wait();
                let cpu = thread_cpu_ns();
                while !stop.load(Ordering::Relaxed) {
                    commit(t, seq.fetch_add(1, Ordering::Relaxed));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                client_ns.fetch_add(thread_cpu_ns() - cpu, Ordering::Relaxed);
                barrier.wait();
            });
        }
        let etcd_before = process_cpu_ns(etcd);
        barrier.wait();
        let started = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        barrier.wait();
        let elapsed = started.elapsed();
        (elapsed, process_cpu_ns(etcd) - etcd_before)
    });
    let commits = done.load(Ordering::Relaxed).max(1) as f64;
    Measured {
        rate: commits / elapsed.as_secs_f64(),
        client_us: client_ns.load(Ordering::Relaxed) as f64 / 1e3 / commits,
        etcd_us: etcd_ns as f64 / 1e3 / commits,
    }
}

/// The thread counts to measure: `THREADS` (comma-separated), else 1, 4 and 16 (at most 16).
fn thread_counts() -> Vec<usize> {
    std::env::var("THREADS")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|t| t.trim().parse().ok())
                .filter(|t| (1..=16).contains(t))
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![1, 4, 16])
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
    let alone = EtcdStore::builder(etcd.endpoint())
        .prefix("bench0/")
        .group_commit(0)
        .open()
        .expect("open the etcd store");
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
    let alone_commit = |t: usize, seq: u64| {
        let batch = Batch::new().put(format!("{seq:012}").into_bytes(), value.clone());
        let outcome = alone.apply(&parts[t], &batch).expect("apply");
        assert!(outcome.is_committed());
    };
    let pid = etcd.pid();
    // Warm every path (connections, the partitions' first batches).
    round(16, Duration::from_millis(200), pid, &raw_commit);
    round(16, Duration::from_millis(200), pid, &store_commit);
    round(16, Duration::from_millis(200), pid, &alone_commit);

    println!();
    println!(
        "## etcd: durable single-row commits, {VALUE_LEN}-byte values, {rounds} alternating rounds of {round_ms} ms{}",
        if full { "" } else { " (smoke run)" }
    );
    println!(
        "| threads | raw txn | EtcdStore | EtcdStore / raw | EtcdStore, grouping off | raw + marker key | raw + marker key + compare |"
    );
    println!("|---|---|---|---|---|---|---|");
    let kinds: [&(dyn Fn(usize, u64) + Sync); 5] = [
        &raw_commit,
        &store_commit,
        &raw_key_commit,
        &raw_cas_commit,
        &alone_commit,
    ];
    let mut detail = Vec::new();
    let mut cpu = Vec::new();
    for threads in thread_counts() {
        let mut runs: [Vec<Measured>; 5] = Default::default();
        for _ in 0..rounds {
            for (kind, commit) in kinds.iter().enumerate() {
                runs[kind].push(round(threads, duration, pid, commit));
            }
        }
        let pick =
            |kind: usize, f: fn(&Measured) -> f64| median(runs[kind].iter().map(f).collect());
        let m: Vec<f64> = (0..5).map(|k| pick(k, |r| r.rate)).collect();
        println!(
            "| {threads} | {:.0} | {:.0} | **{:.1}%** | {:.0} ({:.1}%) | {:.0} ({:.1}%) | {:.0} ({:.1}%) |",
            m[0],
            m[1],
            100.0 * m[1] / m[0],
            m[4],
            100.0 * m[4] / m[0],
            m[2],
            100.0 * m[2] / m[0],
            m[3],
            100.0 * m[3] / m[0]
        );
        let cpu_cells = |f: fn(&Measured) -> f64| {
            [0, 1, 4, 2, 3]
                .iter()
                .map(|&k| format!("{:.0}", pick(k, f)))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        cpu.push(format!(
            "| {threads} | {} | {} |",
            cpu_cells(|r| r.client_us),
            cpu_cells(|r| r.etcd_us)
        ));
        let fmt = |kind: usize| {
            runs[kind]
                .iter()
                .map(|r| format!("{:.0}", r.rate))
                .collect::<Vec<_>>()
                .join(" ")
        };
        detail.push(format!(
            "{threads} threads, commits/s per round: raw {}; store {}; store, grouping off {}; raw + key {}; raw + key + compare {}",
            fmt(0),
            fmt(1),
            fmt(4),
            fmt(2),
            fmt(3)
        ));
    }
    println!();
    println!(
        "CPU time per commit, microseconds (medians; raw / store / store, grouping off / raw + key / raw + key + compare):"
    );
    println!("| threads | client threads | etcd process |");
    println!("|---|---|---|");
    for line in cpu {
        println!("{line}");
    }
    println!();
    for line in detail {
        println!("{line}");
    }
    alone.close().unwrap();
    if env_u64("FENCED", 1) == 0 {
        store.close().unwrap();
        return;
    }
    fenced_writes(&store, pid, rounds, duration, &value);
    store.close().unwrap();
}

/// The cost of a fenced write on etcd (SPEC F3 without deadlines): `Fence::write` of a one-put
/// batch under a usable lease (a lease read, then the apply guarded on it) against
/// `EtcdStore::apply` of the same batch, each thread on its own entity, rounds alternating.
fn fenced_writes(
    store: &Arc<EtcdStore>,
    pid: Option<u32>,
    rounds: usize,
    duration: Duration,
    value: &[u8],
) {
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
    round(16, Duration::from_millis(200), pid, &fenced_commit);
    println!();
    println!("## etcd: a fenced write (lease read + guarded apply) against a plain apply");
    println!("| threads | EtcdStore::apply | Fence::write | fenced / plain |");
    println!("|---|---|---|---|");
    for threads in thread_counts() {
        let (mut plain, mut fenced) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            plain.push(round(threads, duration, pid, &plain_commit).rate);
            fenced.push(round(threads, duration, pid, &fenced_commit).rate);
        }
        let (p, f) = (median(plain), median(fenced));
        println!(
            "| {threads} | {p:.0} | {f:.0} | **{:.1}%** |",
            100.0 * f / p
        );
    }
}
