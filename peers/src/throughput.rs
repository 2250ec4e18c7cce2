//! Throughput runs: N threads each running a worker for a fixed time; counts what completed
//! before the deadline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::common::{self, R};

pub struct ThroughputRun {
    pub per_second: f64,
    pub attempts_per_second: f64,
    pub syncs_per_commit: Option<f64>,
    pub commits: u64,
    /// Every commit that succeeded, those that ended after the deadline included (what the
    /// disk wrote for: see [`bytes_written`]).
    pub all_commits: u64,
    pub max_latency_ms: f64,
}

/// Bytes this process has handed to write calls so far (`wchar` of `/proc/self/io`): every
/// thread of the process counts, a system's background threads included (flushes,
/// compactions, checkpoints), and so does every file it writes (journals, logs, tables, the
/// zeros that prepare space). Not `write_bytes`, which the kernel charges a whole page-cache
/// folio each time a write dirties one: 190 bytes written and synced into a file region an
/// earlier 256 KiB write made are charged 262,144 bytes by the kernel this was measured on
/// (Linux 6.18), which the disk does not write. `None` where the kernel does not tell.
pub fn bytes_written() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs `threads` workers of `bench` for `seconds`; counts the operations that completed (and
/// succeeded) before the deadline.
pub fn run_threads(bench: &dyn common::Bench, threads: usize, seconds: f64) -> R<ThroughputRun> {
    let barrier = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let dur = Duration::from_secs_f64(seconds);
    let deadline = Mutex::new(None::<Instant>);
    let (results, before, after) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, stop, deadline) = (&barrier, &stop, &deadline);
                s.spawn(move || -> R<(u64, u64, Duration, u64)> {
                    let worker = bench.worker(t);
                    barrier.wait();
                    let mut worker = worker?;
                    let deadline = deadline.lock().unwrap().ok_or("no deadline")?;
                    let (mut wins, mut attempts, mut worst) = (0u64, 0u64, Duration::ZERO);
                    let mut all = 0u64;
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let won = worker(i)?;
                        let done = Instant::now();
                        i += 1;
                        all += u64::from(won);
                        if done <= deadline {
                            attempts += 1;
                            wins += u64::from(won);
                            worst = worst.max(done - started);
                        }
                    }
                    Ok((wins, attempts, worst, all))
                })
            })
            .collect();
        *deadline.lock().unwrap() = Some(Instant::now() + dur);
        let before = bench.counters();
        barrier.wait();
        std::thread::sleep(dur);
        let after = bench.counters();
        stop.store(true, Ordering::Relaxed);
        let out: Vec<R<(u64, u64, Duration, u64)>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect();
        (out, before, after)
    });
    let (mut wins, mut attempts, mut worst, mut all_commits) = (0, 0, Duration::ZERO, 0);
    for r in results {
        let (w, a, l, all) = r?;
        wins += w;
        attempts += a;
        worst = worst.max(l);
        all_commits += all;
    }
    let syncs_per_commit = match (before, after) {
        (Some((batches0, syncs0)), Some((batches1, syncs1))) if batches1 > batches0 => {
            Some((syncs1 - syncs0) as f64 / (batches1 - batches0) as f64)
        }
        _ => None,
    };
    Ok(ThroughputRun {
        per_second: wins as f64 / seconds,
        attempts_per_second: attempts as f64 / seconds,
        syncs_per_commit,
        commits: wins,
        all_commits,
        max_latency_ms: worst.as_secs_f64() * 1000.0,
    })
}
