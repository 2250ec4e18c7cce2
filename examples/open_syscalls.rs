//! What open does, to count under `strace`: builds stores shaped like the peers' data sets
//! (`peers/`), and opens one in a fresh process followed by one point read. Lines `-- opened`
//! and `-- read` on standard error mark the end of each phase in a trace (BENCHMARKS.md,
//! "Open's system calls").
//!
//! Run:
//!
//! ```text
//! cargo run --release --example open_syscalls -- fill logs DIR     # 10,000 x 100 x 200 B, interleaved
//! cargo run --release --example open_syscalls -- fill big DIR      # 16,384 x 16 x 4096 B
//! cargo run --release --example open_syscalls -- fill crash DIR    # 8,192 x 16 x 4096 B, then a writer that never closes
//! strace -f target/release/examples/open_syscalls open DIR ENTITY SEQ
//! ```
//!
//! `fill crash` ends the process without closing the store after 100 durable single-record
//! appends to entity 1,000,000, as a writer killed with SIGKILL would; read its record 99.

use std::time::Instant;

use portcullis::log;
use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};

type R<T> = Result<T, Box<dyn std::error::Error>>;

fn partition(entity: u64) -> R<Partition> {
    Ok(Partition::new(format!("e/logs/{entity:08}"))?)
}

/// Pseudo-random bytes, so nothing compresses.
fn value(entity: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut x = entity
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seq.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn append(store: &FileStore, entity: u64, records: &[Vec<u8>]) -> R<()> {
    match log::append(store, &partition(entity)?, records, Batch::new())?.committed() {
        Some(_) => Ok(()),
        None => Err("append refused".into()),
    }
}

fn fill(kind: &str, dir: &str) -> R<()> {
    let store = FileStore::builder(dir)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .open()?;
    let per_entity = |entities: u64, records: u64, len: usize| -> R<()> {
        for e in 0..entities {
            let rs: Vec<Vec<u8>> = (0..records).map(|s| value(e, s, len)).collect();
            append(&store, e, &rs)?;
        }
        Ok(())
    };
    match kind {
        "logs" => {
            for s in 0..100 {
                for e in 0..10_000 {
                    append(&store, e, &[value(e, s, 200)])?;
                }
            }
        }
        "big" => per_entity(16_384, 16, 4096)?,
        "crash" => per_entity(8_192, 16, 4096)?,
        other => return Err(format!("unknown data set {other}").into()),
    }
    store.close()?;
    if kind == "crash" {
        let store = FileStore::builder(dir)
            .sync_policy(SyncPolicy::SyncEveryCommit)
            .open()?;
        for s in 0..100 {
            append(&store, 1_000_000, &[value(1_000_000, s, 100)])?;
        }
        // No close, no destructors: what a writer killed with SIGKILL leaves.
        std::process::exit(0);
    }
    Ok(())
}

fn open(dir: &str, entity: u64, seq: u64) -> R<()> {
    let started = Instant::now();
    let store = FileStore::builder(dir)
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .open()?;
    let opened = started.elapsed();
    // Markers between the phases in a system-call trace.
    eprintln!("-- opened");
    let page = log::read_log(&store, &partition(entity)?, seq + 1, 1)?;
    let took = started.elapsed();
    eprintln!("-- read");
    let got = page.records.first().map(|r| r.payload.len());
    println!("opened in {opened:?}, open and read in {took:?}, record of {got:?} bytes");
    store.close()?;
    Ok(())
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> R<u64> { Ok(args.get(i).ok_or("missing argument")?.parse()?) };
    match args.first().map(String::as_str) {
        Some("fill") if args.len() == 3 => fill(&args[1], &args[2]),
        Some("open") if args.len() == 4 => open(&args[1], num(2)?, num(3)?),
        _ => Err("usage: fill logs|big|crash DIR | open DIR ENTITY SEQ".into()),
    }
}
