//! Online backup on the fault-injecting disk (SPEC S12, S3, S4).
//!
//! A store with many sealed segments, a heads snapshot and compaction's gaps is backed up while
//! two writers keep committing; the disk keeps a crash point before every operation of the
//! backup (and of the writers meanwhile). At every point, a killed process and power cuts
//! (several seeds) must leave either no destination, or one that opens with no damage and
//! holds exactly the batches below the backup's point; the store itself must open; and after a
//! kill, backing up again to the same destination (taking over what the first attempt left)
//! must give a whole copy. A power cut right after `backup` returns must lose nothing of it.
//!
//! Negative controls: writing straight into the destination (`SkipSync::BackupRename`) leaves a
//! destination that looks whole and is not; skipping the backup's file syncs, directory syncs
//! or the parent's sync after the rename loses the backup after a power cut.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use common::backup::{Calls, Ledger};
use parking_lot::Mutex;
use portcullis::ManualClock;
use portcullis::store::{
    BackupReport, CrashPoint, FaultFs, FileStore, FileStoreBuilder, KeyRange, PathKind, SkipSync,
    Store, Vfs,
};

const DIR: &str = "/db";
const DEST: &str = "/backups/copy";
/// Power cuts per crash point.
const SEEDS: u64 = 3;
/// Power cuts right after the backup returned.
const AFTER_SEEDS: u64 = 64;
/// Batches acknowledged after the backup's point before the backup goes on.
const AFTER_POINT: usize = 3;

fn builder(fs: &FaultFs, dir: &str) -> FileStoreBuilder {
    FileStore::builder(dir)
        .vfs(Arc::new(fs.clone()))
        .clock(Arc::new(ManualClock::new(1_000)))
        .segment_bytes(4096)
        .snapshot_every_bytes(1 << 40)
        .base_every_records(4)
        .auto_compact(false)
}

struct Run {
    points: Vec<CrashPoint>,
    /// The disk right after `backup` returned.
    after: FaultFs,
    report: BackupReport,
    ledger: Ledger,
}

/// Fills a store, then backs it up to [`DEST`] while two writers commit, keeping a crash point
/// before every operation from just before the backup to the writers' end.
fn run(skip: Option<SkipSync>) -> Run {
    let fs = FaultFs::new();
    let ledger = Ledger::default();
    let calls = Calls::default();
    let (acks, acked) = mpsc::channel::<()>();
    let acked = Mutex::new(acked);
    let mut b = ledger
        .observe(builder(&fs, DIR))
        .observe_backup_point(move || {
            let acked = acked.lock();
            while acked.try_recv().is_ok() {}
            for _ in 0..AFTER_POINT {
                acked
                    .recv()
                    .expect("the writers run until the backup returns");
            }
        });
    if let Some(skip) = skip {
        b = b.skip_sync(skip);
    }
    let store = b.open().unwrap();
    for t in 0..3 {
        ledger.write(&store, t, 0..30, 300, &calls, |_| {});
    }
    store.write_heads_snapshot().unwrap();
    assert!(store.compact().unwrap().segments_removed > 0);
    for t in 0..3 {
        ledger.write(&store, t, 30..34, 300, &calls, |_| {});
    }
    fs.record_crash_points();
    let stop = AtomicBool::new(false);
    let (report, after) = std::thread::scope(|s| {
        for t in 3..5 {
            let (store, ledger, calls, stop, acks) = (&store, &ledger, &calls, &stop, acks.clone());
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Acquire) {
                    ledger.write(store, t, i..i + 1, 300, calls, |_| {
                        let _ = acks.send(());
                    });
                    i += 1;
                }
            });
        }
        let report = calls.run(|| store.backup(DEST));
        let after = fs.fork();
        stop.store(true, Ordering::Release);
        (report.expect("the backup"), after)
    });
    store.close().unwrap();
    Run {
        points: fs.take_crash_points(),
        after,
        report,
        ledger,
    }
}

/// A row: its partition, key and value.
type Row = (String, Vec<u8>, Vec<u8>);

/// Every row of every partition, or why they cannot be read.
fn rows(store: &FileStore) -> Result<Vec<Row>, String> {
    let mut out = Vec::new();
    for p in store.list_partitions(b"").map_err(|e| e.to_string())? {
        for row in store.entries(&p, KeyRange::all()) {
            let (k, v) = row.map_err(|e| format!("{p}: {e}"))?;
            out.push((p.to_string(), k, v));
        }
    }
    Ok(out)
}

/// What an image holds at [`DEST`]: nothing (`Ok(false)`), or the whole backup (`Ok(true)`).
fn check_dest(image: &FaultFs, run: &Run) -> Result<bool, String> {
    match image.kind(Path::new(DEST)) {
        Ok(None) => return Ok(false),
        Ok(Some(PathKind::Dir)) => {}
        other => return Err(format!("the destination is {other:?}")),
    }
    let copy = builder(image, DEST)
        .open()
        .map_err(|e| format!("the destination exists but does not open: {e}"))?;
    let report = copy.open_report();
    if !report.damaged.is_empty() || report.torn_tail.is_some() || !report.refused.is_empty() {
        return Err(format!("the destination opens with damage: {report:?}"));
    }
    let wrong = run.ledger.check(&copy, 0, &run.report);
    if !wrong.is_empty() {
        return Err(format!(
            "the destination exists but is not the backup ({} findings): {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(3)]
        ));
    }
    Ok(true)
}

/// After a kill: the store opens, and a second backup to the same destination (taking over
/// what the first left) copies all of it.
fn check_retry(image: &FaultFs) -> Result<(), String> {
    let store = builder(image, DIR)
        .open()
        .map_err(|e| format!("the store does not open: {e}"))?;
    if !store.open_report().damaged.is_empty() {
        return Err(format!(
            "the store opens with damage: {:?}",
            store.open_report()
        ));
    }
    store
        .backup(DEST)
        .map_err(|e| format!("backing up again failed: {e}"))?;
    let copy = builder(image, DEST)
        .open()
        .map_err(|e| format!("the second backup does not open: {e}"))?;
    if rows(&copy)? != rows(&store)? {
        return Err("the second backup differs from the store".into());
    }
    Ok(())
}

/// Checks every crash point; returns the findings (stopping at the first unless `all`) and how
/// many images held the destination.
fn sweep(run: &Run, retry: bool, all: bool) -> (Vec<String>, u64, u64) {
    let (mut found, mut present, mut absent) = (Vec::new(), 0, 0);
    for point in &run.points {
        let mut images = vec![("kill".to_owned(), point.kill())];
        images.extend((0..SEEDS).map(|s| (format!("power cut {s}"), point.power_cut(s))));
        for (how, image) in images {
            match check_dest(&image, run) {
                Ok(true) => present += 1,
                Ok(false) => {
                    absent += 1;
                    if retry
                        && how == "kill"
                        && let Err(e) = check_retry(&image)
                    {
                        found.push(format!("{point:?}, {how}, retry: {e}"));
                    }
                }
                Err(e) => found.push(format!("{point:?}, {how}: {e}")),
            }
            if !found.is_empty() && !all {
                return (found, present, absent);
            }
        }
    }
    (found, present, absent)
}

#[test]
fn a_backup_cut_short_at_any_operation_leaves_no_destination_that_is_not_whole() {
    let run = run(None);
    assert!(run.report.files_linked > 3, "{:?}", run.report);
    let (found, present, absent) = sweep(&run, true, false);
    assert!(found.is_empty(), "{found:#?}");
    assert!(
        present > 0 && absent > 0,
        "toothless: {present} images held the destination, {absent} did not"
    );
    println!(
        "{} crash points: {present} images with the whole backup, {absent} without",
        run.points.len()
    );
}

#[test]
fn control_a_backup_written_in_place_is_caught() {
    let run = run(Some(SkipSync::BackupRename));
    let (found, _, _) = sweep(&run, false, true);
    assert!(
        !found.is_empty(),
        "a destination written in place always opened whole or not at all"
    );
    println!("{} findings, first: {}", found.len(), found[0]);
}

/// Power cuts right after `backup` returned: findings.
fn power_cuts_after(run: &Run) -> Vec<String> {
    (0..AFTER_SEEDS)
        .filter_map(|seed| match check_dest(&run.after.crash(seed), run) {
            Ok(true) => None,
            Ok(false) => Some(format!("seed {seed}: the destination is gone")),
            Err(e) => Some(format!("seed {seed}: {e}")),
        })
        .collect()
}

#[test]
fn a_power_cut_right_after_a_backup_loses_nothing_it_held() {
    let run = run(None);
    let found = power_cuts_after(&run);
    assert!(found.is_empty(), "{found:#?}");
}

fn control(skip: SkipSync) {
    let run = run(Some(skip));
    let found = power_cuts_after(&run);
    assert!(
        !found.is_empty(),
        "{skip:?}: every power cut kept the backup whole"
    );
    println!(
        "{skip:?}: {} of {AFTER_SEEDS} power cuts caught, first: {}",
        found.len(),
        found[0]
    );
}

#[test]
fn control_skipping_the_backups_file_syncs_is_caught() {
    control(SkipSync::BackupFileSyncs);
}

#[test]
fn control_skipping_the_backups_directory_syncs_is_caught() {
    control(SkipSync::BackupDirectorySyncs);
}

#[test]
fn control_skipping_the_sync_of_the_backups_parent_is_caught() {
    control(SkipSync::BackupParentSync);
}
