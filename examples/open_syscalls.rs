//! What open does, to count under `strace`: builds stores shaped like the peers' data sets
//! (`peers/`), and opens one in a fresh process followed by one point read. Lines `-- opened`
//! and `-- read` on standard error mark the end of each phase in a trace (docs/benchmarks-history.md,
//! "Open's system calls").
//!
//! Run:
//!
//! ```text
//! cargo run --release --example open_syscalls -- fill logs DIR     # 10,000 x 100 x 200 B, interleaved
//! cargo run --release --example open_syscalls -- fill big DIR      # 16,384 x 16 x 4096 B
//! cargo run --release --example open_syscalls -- fill crash DIR    # 8,192 x 16 x 4096 B, then a writer that never closes
//! strace -f target/release/examples/open_syscalls open DIR ENTITY SEQ
//! strace -f target/release/examples/open_syscalls open DIR ENTITY 0 100  # the whole history
//! ```
//!
//! A fourth argument reads that many records from `SEQ` on in one `read_log` page (the peers'
//! time to first answer reads an entity's whole history).
//!
//! `fill crash` ends the process without closing the store after 100 durable single-record
//! appends to entity 1,000,000, as a writer killed with SIGKILL would; read its record 99.

use std::time::Instant;

use portcullis::log;
use portcullis::store::{FileStore, Store, SyncPolicy};

#[path = "common/fill.rs"]
mod fill;

use fill::{R, append, partition, value};

fn fill(kind: &str, dir: &str) -> R<()> {
    let store = FileStore::builder(dir)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .open()?;
    match kind {
        "logs" => fill::interleaved(&store, 10_000, 100, 200)?,
        "big" => fill::entity_by_entity(&store, 16_384, 16, 4096)?,
        "crash" => fill::entity_by_entity(&store, 8_192, 16, 4096)?,
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

fn open(dir: &str, entity: u64, seq: u64, limit: usize) -> R<()> {
    let started = Instant::now();
    let store = FileStore::builder(dir)
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .open()?;
    let opened = started.elapsed();
    // Markers between the phases in a system-call trace.
    eprintln!("-- opened");
    let page = log::read_log(&store, &partition(entity)?, seq + 1, limit)?;
    let took = started.elapsed();
    eprintln!("-- read");
    let got: usize = page.records.iter().map(|r| r.payload.len()).sum();
    println!(
        "opened in {opened:?}, open and read in {took:?}, {} records of {got} bytes",
        page.records.len()
    );
    store.close()?;
    Ok(())
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> R<u64> { Ok(args.get(i).ok_or("missing argument")?.parse()?) };
    match args.first().map(String::as_str) {
        Some("fill") if args.len() == 3 => fill(&args[1], &args[2]),
        Some("open") if args.len() == 4 => open(&args[1], num(2)?, num(3)?, 1),
        Some("open") if args.len() == 5 => open(&args[1], num(2)?, num(3)?, num(4)? as usize),
        _ => Err("usage: fill logs|big|crash DIR | open DIR ENTITY SEQ [LIMIT]".into()),
    }
}
