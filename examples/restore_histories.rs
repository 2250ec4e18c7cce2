//! Restoring every entity after open, to profile and to compare builds: fills a store shaped
//! like the peers' per-entity logs (`peers/`: registered entities, one record per append,
//! round-robin), then, in a fresh process, opens the engine over it and restores every entity
//! with `Engine::warm`, as the peers' restore row does (BENCHMARKS.md, "restore every entity
//! after open").
//!
//! Run:
//!
//! ```text
//! cargo run --release --example restore_histories -- fill DIR ENTITIES RECORDS LEN
//! perf record -g target/release/examples/restore_histories warm DIR RUNS
//! ```
//!
//! `warm` opens the engine (default options; `POOL_THREADS`, `WARM_PARALLELISM` and
//! `BACKGROUND_WARM` (0 or 1) override three), warms every entity to completion and closes it `RUNS` times, printing each run's wall
//! and CPU times and their medians; with `cold` it drops the page cache before each open
//! (root only). The same directory can be read
//! with `read_histories read DIR ENTITIES RECORDS RUNS` (same partition names).

use std::sync::Arc;
use std::time::Instant;

use portcullis::EntityId;
use portcullis::engine::Engine;
use portcullis::log;
use portcullis::restore::{ApplyContext, Rejection, StateMachine};
use portcullis::store::{Batch, FileStore, Store, SyncPolicy};

// Only the error type and the value bytes are shared with the other examples here; the
// engine writes its own logs.
#[path = "common/fill.rs"]
#[allow(dead_code)]
mod fill;

use fill::{R, value};

/// Counts records and bytes: the least an application's `apply` does.
struct Histories;

impl StateMachine for Histories {
    type State = [u64; 2];

    fn fresh(&self, _: &EntityId) -> [u64; 2] {
        [0, 0]
    }

    fn apply(
        &self,
        s: &mut [u64; 2],
        _: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        s[0] += 1;
        s[1] += record.len() as u64;
        Ok(())
    }

    fn encode_checkpoint(&self, s: &[u64; 2]) -> Result<Vec<u8>, Rejection> {
        Ok([s[0].to_le_bytes(), s[1].to_le_bytes()].concat())
    }

    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<[u64; 2], Rejection> {
        let word = |i: usize| -> Result<u64, Rejection> {
            let w = b
                .get(i..i + 8)
                .ok_or_else(|| Rejection::new("short checkpoint"))?;
            Ok(u64::from_le_bytes(w.try_into().expect("8 bytes")))
        };
        Ok([word(0)?, word(8)?])
    }
}

fn entity(e: u64) -> R<EntityId> {
    Ok(EntityId::new("logs", format!("{e:08}"))?)
}

fn fill(dir: &str, entities: u64, records: u64, len: usize) -> R<()> {
    let started = Instant::now();
    let store = Arc::new(
        FileStore::builder(dir)
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()?,
    );
    let engine = Engine::builder(Histories)
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .open()?;
    for e in 0..entities {
        engine.register(&entity(e)?)?;
    }
    engine.close()?;
    for s in 0..records {
        for e in 0..entities {
            let p = entity(e)?.partition();
            if log::append(&*store, &p, &[value(e, s, len)], Batch::new())?
                .committed()
                .is_none()
            {
                return Err("append refused".into());
            }
        }
    }
    store.close()?;
    println!("filled in {:?}", started.elapsed());
    Ok(())
}

/// The process's CPU time (user + system) in milliseconds, from `/proc/self/stat` (Linux; 0
/// elsewhere): on a shared machine it moves less with the load than wall time does.
fn cpu_ms() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which ends with the last ')'): utime and stime are the
    // 12th and 13th, in clock ticks of (on Linux, always) 10 ms.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) * 10.0
}

fn warm(dir: &str) -> R<(f64, f64)> {
    let started = Instant::now();
    let mut builder = Engine::builder(Histories).directory(dir);
    // Optional overrides, to compare configurations: the pool's threads and the warm's workers.
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    if let Some(n) = var("POOL_THREADS") {
        builder = builder.pool_threads(n);
    }
    if let Some(n) = var("WARM_PARALLELISM") {
        builder = builder.warm_parallelism(n);
    }
    if let Some(n) = var("BACKGROUND_WARM") {
        builder = builder.background_warm(n != 0);
    }
    let engine = builder.open()?;
    let opened = started.elapsed();
    let (t, cpu) = (Instant::now(), cpu_ms());
    let progress = engine.warm()?.wait()?;
    let warmed = t.elapsed().as_secs_f64() * 1e3;
    let cpu = cpu_ms() - cpu;
    engine.close()?;
    if progress.refused != 0 || progress.done != progress.total {
        return Err(format!("warm: {progress:?}").into());
    }
    println!(
        "open {:.2} ms, warm {warmed:.1} ms, CPU {cpu:.0} ms ({} entities)",
        opened.as_secs_f64() * 1e3,
        progress.done
    );
    Ok((warmed, cpu))
}

/// Drops the page cache (needs root), so the next warm reads from the disk.
fn drop_caches() -> R<()> {
    std::process::Command::new("sync").status()?;
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")?;
    Ok(())
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> R<u64> { Ok(args.get(i).ok_or("missing argument")?.parse()?) };
    match args.first().map(String::as_str) {
        Some("fill") if args.len() == 5 => fill(&args[1], num(2)?, num(3)?, num(4)? as usize),
        Some("warm") if args.len() == 3 || args.len() == 4 => {
            let cold = args.get(3).is_some_and(|a| a == "cold");
            let (mut times, mut cpus) = (Vec::new(), Vec::new());
            for _ in 0..num(2)? {
                if cold {
                    drop_caches()?;
                }
                let (wall, cpu) = warm(&args[1])?;
                times.push(wall);
                cpus.push(cpu);
            }
            times.sort_by(f64::total_cmp);
            cpus.sort_by(f64::total_cmp);
            println!(
                "median warm {:.1} ms, CPU {:.0} ms",
                times[times.len() / 2],
                cpus[cpus.len() / 2]
            );
            Ok(())
        }
        _ => Err("usage: fill DIR ENTITIES RECORDS LEN | warm DIR RUNS [cold]".into()),
    }
}
