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
    pub max_latency_ms: f64,
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
                s.spawn(move || -> R<(u64, u64, Duration)> {
                    let worker = bench.worker(t);
                    barrier.wait();
                    let mut worker = worker?;
                    let deadline = deadline.lock().unwrap().ok_or("no deadline")?;
                    let (mut wins, mut attempts, mut worst) = (0u64, 0u64, Duration::ZERO);
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let won = worker(i)?;
                        let done = Instant::now();
                        i += 1;
                        if done <= deadline {
                            attempts += 1;
                            wins += u64::from(won);
                            worst = worst.max(done - started);
                        }
                    }
                    Ok((wins, attempts, worst))
                })
            })
            .collect();
        *deadline.lock().unwrap() = Some(Instant::now() + dur);
        let before = bench.counters();
        barrier.wait();
        std::thread::sleep(dur);
        let after = bench.counters();
        stop.store(true, Ordering::Relaxed);
        let out: Vec<R<(u64, u64, Duration)>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect();
        (out, before, after)
    });
    let (mut wins, mut attempts, mut worst) = (0, 0, Duration::ZERO);
    for r in results {
        let (w, a, l) = r?;
        wins += w;
        attempts += a;
        worst = worst.max(l);
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
        max_latency_ms: worst.as_secs_f64() * 1000.0,
    })
}
