//! A tour of Portcullis on a temporary directory: `cargo run --release --example tour`.
//!
//! It writes guarded batches into many partitions, closes, reopens, and shows that opening
//! reads only a small snapshot, not the history, and that a partition's index is built on its
//! first touch.

use std::time::Instant;

use portcullis::store::{Batch, FileStore, KeyRange, Outcome, Partition, Store, SyncPolicy};

fn main() -> portcullis::Result<()> {
    let dir = tempfile::tempdir().map_err(|e| portcullis::Error::Io {
        context: "creating a temporary directory".into(),
        source: e,
    })?;
    println!("Portcullis tour in {}\n", dir.path().display());

    // 1. Write history: 2,000 partitions, 50 batches each, every batch guarded.
    let started = Instant::now();
    let store = FileStore::builder(dir.path())
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent) // fast bulk load; synced at close
        .open()?;
    let partitions = 2_000;
    for i in 0..partitions {
        let p = Partition::new(format!("conversation/{i}"))?;
        for seq in 1..=50u32 {
            // Compare-and-set on a head row: the batch commits only if the head is what we
            // last wrote, so concurrent writers could never interleave the log.
            let head = seq - 1;
            let guard = if head == 0 {
                Batch::new().absent(b"head".to_vec())
            } else {
                Batch::new().equals(b"head".to_vec(), head.to_be_bytes().to_vec())
            };
            let batch = guard
                .put(b"head".to_vec(), seq.to_be_bytes().to_vec())
                .put(format!("msg/{seq:08}").into_bytes(), vec![b'x'; 200]);
            assert_eq!(store.apply(&p, &batch)?, Outcome::Committed);
        }
    }
    let written = store.stats();
    store.close()?;
    println!(
        "wrote {} batches into {partitions} partitions ({:.1} MiB of journal) in {:.2?}",
        written.batches,
        written.bytes_written as f64 / (1 << 20) as f64,
        started.elapsed()
    );

    // 2. A guard that does not hold changes nothing.
    let store = FileStore::open(dir.path())?;
    let report = store.open_report().clone();
    println!(
        "\nreopened in {:.2?}: read a {} byte snapshot, scanned {} journal bytes, knows {} partitions, loaded {}",
        report.elapsed,
        report.snapshot_bytes,
        report.journal_bytes_scanned,
        report.partitions,
        store.stats().partitions_loaded
    );
    let p = Partition::new("conversation/7")?;
    let stale = Batch::new()
        .equals(b"head".to_vec(), 3u32.to_be_bytes().to_vec())
        .put(b"head".to_vec(), 4u32.to_be_bytes().to_vec());
    println!(
        "a stale compare-and-set answers {:?}",
        store.apply(&p, &stale)?
    );

    // 3. First touch builds one partition's index; the others stay untouched.
    let touched = Instant::now();
    let page = store.scan(&p, &KeyRange::prefix(b"msg/"), None, 10)?;
    println!(
        "first touch of {p} took {:.2?}: {} messages on the first page, next cursor {:?}; partitions loaded: {}",
        touched.elapsed(),
        page.entries.len(),
        page.next
            .as_ref()
            .map(|c| String::from_utf8_lossy(c.last_key()).into_owned()),
        store.stats().partitions_loaded
    );

    // 4. Durable commits from many threads share syncs (group commit).
    let store_ref = &store;
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..16 {
            s.spawn(move || {
                let p = Partition::new(format!("durable/{t}")).unwrap();
                for i in 0..100u32 {
                    let batch = Batch::new().put(i.to_be_bytes().to_vec(), vec![0u8; 128]);
                    assert!(store_ref.apply(&p, &batch).unwrap().is_committed());
                }
            });
        }
    });
    let stats = store.stats();
    println!(
        "\n16 threads made 1,600 durable commits in {:.2?} with {} syncs ({:.1} batches per sync)",
        started.elapsed(),
        stats.syncs,
        1600.0 / stats.syncs.max(1) as f64
    );
    store.close()?;
    Ok(())
}
