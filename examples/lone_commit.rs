//! A lone durable committer, to profile (`perf record`, `perf stat`, `strace -c -f`): N commits
//! of one 100-byte put each from one thread under `SyncPolicy::SyncEveryCommit`, as the peers'
//! 1-thread commit workload makes them. Prints the rate and the store's syncs and journal bytes
//! per commit.
//!
//! With `vs-bare`, it alternates blocks of 200 commits with blocks of 200 bare `pwrite` +
//! `fdatasync` pairs of the same record size into a file of the same directory whose space was
//! written and synced first (the floor a durable commit cannot go below), and prints the median
//! of the ratios of the two blocks' times: a shared, noisy disk slows both alike.
//!
//! Run: `cargo run --release --example lone_commit -- DIR N [vs-bare]` (DIR must not exist). On
//! a tmpfs directory `fdatasync` costs nothing, which leaves the CPU of the commit path to
//! measure.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// A journal record of one 100-byte put with an 8-byte key (as `bytes_written` counts it).
const RECORD: usize = 174;
const BLOCK: u64 = 200;

fn main() -> R<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("DIR")?;
    let n: u64 = args.next().map_or(Ok(10_000), |s| s.parse())?;
    let vs_bare = args.next().as_deref() == Some("vs-bare");
    let store = FileStore::builder(&dir)
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .open()?;
    let p = Partition::new("commits/0")?;
    let value = vec![7u8; 100];
    let mut next = 0u64;
    let mut commit = |count: u64| -> R<Duration> {
        let started = Instant::now();
        for _ in 0..count {
            let b = Batch::new().put(next.to_be_bytes().to_vec(), value.clone());
            next += 1;
            assert!(store.apply(&p, &b)?.is_committed());
        }
        Ok(started.elapsed())
    };
    if vs_bare {
        let bare = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(std::path::Path::new(&dir).join("bare"))?;
        let space = (n as usize * RECORD).next_multiple_of(4096);
        bare.write_all_at(&vec![0u8; space], 0)?;
        bare.sync_data()?;
        let record = [7u8; RECORD];
        let mut at = 0u64;
        let (mut ratios, mut store_time, mut bare_time) =
            (Vec::new(), Duration::ZERO, Duration::ZERO);
        for _ in 0..n / BLOCK {
            let ours = commit(BLOCK)?;
            let started = Instant::now();
            for _ in 0..BLOCK {
                bare.write_all_at(&record, at)?;
                bare.sync_data()?;
                at += RECORD as u64;
            }
            let floor = started.elapsed();
            ratios.push(ours.as_secs_f64() / floor.as_secs_f64());
            store_time += ours;
            bare_time += floor;
        }
        ratios.sort_by(f64::total_cmp);
        let done = (n / BLOCK * BLOCK) as f64;
        eprintln!(
            "{} blocks of {BLOCK}: store {:.1} us per commit, bare pwrite+fdatasync {:.1} us; median block ratio store/bare {:.3} (quartiles {:.3}, {:.3})",
            ratios.len(),
            store_time.as_secs_f64() * 1e6 / done,
            bare_time.as_secs_f64() * 1e6 / done,
            ratios[ratios.len() / 2],
            ratios[ratios.len() / 4],
            ratios[ratios.len() * 3 / 4],
        );
        store.close()?;
        return Ok(());
    }
    let before = store.stats();
    let took = commit(n)?;
    let after = store.stats();
    eprintln!(
        "{n} commits in {took:?}: {:.0}/s, {:.1} us each, {:.4} syncs and {:.0} journal bytes per commit",
        n as f64 / took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / n as f64,
        (after.syncs - before.syncs) as f64 / n as f64,
        (after.bytes_written - before.bytes_written) as f64 / n as f64
    );
    store.close()?;
    Ok(())
}
