//! Reading every entity's history after open, to profile and to compare builds: fills a store
//! shaped like the peers' data sets (`peers/`), then, in a fresh process, opens it and reads
//! every entity's log with `visit_log` pages of 1,024 records, as the peers' Portcullis reader
//! does (BENCHMARKS.md, "read every entity's history after open").
//!
//! Run:
//!
//! ```text
//! cargo run --release --example read_histories -- fill logs DIR ENTITIES RECORDS LEN  # interleaved
//! cargo run --release --example read_histories -- fill big DIR ENTITIES RECORDS LEN   # entity by entity
//! perf record -g target/release/examples/read_histories read DIR ENTITIES RECORDS RUNS
//! cargo run --release --example read_histories -- compact DIR
//! ```
//!
//! `read` opens the store, reads every history and closes it `RUNS` times, printing each
//! run's time and the median. `compact` compacts the store whole (every history then one base
//! and its values laid out together), to measure what the layout costs a read against a fill
//! as the background compactions left it.

use std::time::Instant;

use portcullis::log;
use portcullis::store::{FileStore, Store, SyncPolicy};

#[path = "common/fill.rs"]
mod fill;

use fill::{R, partition};

fn fill(kind: &str, dir: &str, entities: u64, records: u64, len: usize) -> R<()> {
    let started = Instant::now();
    let store = FileStore::builder(dir)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .open()?;
    match kind {
        // One record per append, round-robin over the entities.
        "logs" => fill::interleaved(&store, entities, records, len)?,
        // Each entity's whole history in one append.
        "big" => fill::entity_by_entity(&store, entities, records, len)?,
        other => return Err(format!("unknown data set {other}").into()),
    }
    store.close()?;
    println!("filled in {:?}", started.elapsed());
    Ok(())
}

fn read_all(dir: &str, entities: u64, records: u64) -> R<f64> {
    let started = Instant::now();
    let store = FileStore::builder(dir)
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .open()?;
    let opened = started.elapsed();
    let t = Instant::now();
    let mut bytes = 0usize;
    for e in 0..entities {
        let p = partition(e)?;
        let (mut n, mut from) = (0u64, Some(1u64));
        while let Some(seq) = from {
            // Each payload is lent, not copied out, as the peers' readers borrow each blob.
            from = log::visit_log(&store, &p, seq, 1024, |r| {
                if r.seq != n + 1 {
                    return Err(format!("entity {e}: records out of order").into());
                }
                n += 1;
                bytes += r.payload.len();
                Ok::<(), Box<dyn std::error::Error>>(())
            })?;
        }
        if n != records {
            return Err(format!("entity {e} has {n} records, not {records}").into());
        }
    }
    let all = t.elapsed().as_secs_f64() * 1e3;
    store.close()?;
    println!(
        "open {:.2} ms, read all {all:.1} ms ({} MiB of payload)",
        opened.as_secs_f64() * 1e3,
        bytes >> 20
    );
    Ok(all)
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> R<u64> { Ok(args.get(i).ok_or("missing argument")?.parse()?) };
    match args.first().map(String::as_str) {
        Some("fill") if args.len() == 6 => {
            fill(&args[1], &args[2], num(3)?, num(4)?, num(5)? as usize)
        }
        Some("compact") if args.len() == 2 => {
            // Compaction syncs everything it copied before it deletes anything, whatever the
            // policy; a sync per copied record would only make this slow.
            let store = FileStore::builder(&args[1])
                .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
                .open()?;
            let started = Instant::now();
            let report = store.compact()?;
            store.close()?;
            println!("compacted in {:?}: {report:?}", started.elapsed());
            Ok(())
        }
        Some("read") if args.len() == 5 => {
            let mut times = Vec::new();
            for _ in 0..num(4)? {
                times.push(read_all(&args[1], num(2)?, num(3)?)?);
            }
            times.sort_by(f64::total_cmp);
            println!("median read all {:.1} ms", times[times.len() / 2]);
            Ok(())
        }
        _ => Err(concat!(
            "usage: fill logs|big DIR ENTITIES RECORDS LEN | read DIR ENTITIES RECORDS RUNS",
            " | compact DIR"
        )
        .into()),
    }
}
