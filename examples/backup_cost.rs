//! What a backup costs (docs/DESIGN.md, "Backup"): loads a store with 250,000 values of 4,000
//! bytes (about 1.3 GB of journal, in batches of 50 over 1,000 partitions, compaction on), then
//! takes three backups in a row and prints, for each, its wall time and the files and bytes it
//! linked and copied, and the time the first copy takes to open.
//!
//! Run (the store and its backups go in a temporary directory under `DIR`, default `/tmp`, on
//! the same file system, so the sealed segments are linked):
//!
//! ```text
//! cargo run --release --example backup_cost -- [DIR]
//! ```

use std::time::Instant;

use portcullis::store::{Batch, FileStore, Partition, Store};

fn main() -> portcullis::Result<()> {
    let parent = std::env::args().nth(1).unwrap_or_else(|| "/tmp".into());
    let dir = tempfile::tempdir_in(parent).expect("a temporary directory");
    let store = FileStore::open(dir.path().join("live"))?;
    let value = vec![7u8; 4000];
    let started = Instant::now();
    let mut batch = Batch::new();
    for i in 0..250_000u64 {
        batch = batch.put(format!("k{i}"), value.clone());
        if i % 50 == 49 {
            let p = Partition::new(format!("p{}", i % 1000))?;
            assert!(store.apply(&p, &std::mem::take(&mut batch))?.is_committed());
        }
    }
    store.flush()?;
    let journal: u64 = std::fs::read_dir(dir.path().join("live/journal"))
        .expect("the journal")
        .map(|e| e.expect("an entry").metadata().expect("its size").len())
        .sum();
    println!(
        "loaded {} MB of journal in {:?}",
        journal >> 20,
        started.elapsed()
    );
    for n in 0..3 {
        let started = Instant::now();
        let r = store.backup(dir.path().join(format!("backup-{n}")))?;
        println!(
            "backup {n}: {:?}; linked {} files, {} MB; copied {} files, {} MB",
            started.elapsed(),
            r.files_linked,
            r.bytes_linked >> 20,
            r.files_copied,
            r.bytes_copied >> 20
        );
    }
    let started = Instant::now();
    let copy = FileStore::open(dir.path().join("backup-0"))?;
    println!(
        "opening backup-0: {:?}, {} journal bytes scanned",
        started.elapsed(),
        copy.open_report().journal_bytes_scanned
    );
    Ok(())
}
