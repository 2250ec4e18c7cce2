//! Zero-filled journal steps (docs/DESIGN.md, "Segments and records"): before records go into
//! new space of a segment, that space is written as zeros and synced, so a commit's `fdatasync`
//! overwrites blocks already allocated and has no block allocation or file size to commit.
//!
//! The journal's writes are recorded through a wrapping `Vfs` ([`Traced`]) over [`FaultFs`] and
//! checked in order: every record lands in bytes a write of zeros covered and a later sync made
//! durable.
//! On the operating system's files, the tail segment holds its blocks (it is not sparse).
//! `SkipSync::ZeroFill` (steps sized with `set_len`) is the negative control of both.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::disk::{Tally, builder};
use common::traced::{Change, Changes, Traced};
use portcullis::store::{FaultFs, FileStore, SkipSync, Store};

/// The segment header, written over the zeros of a new segment's first step.
const HEADER_LEN: u64 = 32;

/// Byte ranges of one file, kept sorted and merged.
#[derive(Default, Clone)]
struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    fn add(&mut self, from: u64, to: u64) {
        self.0.push((from, to));
        self.0.sort();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for &(a, b) in &self.0 {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.0 = merged;
    }
    fn cut_at(&mut self, len: u64) {
        self.0.retain(|r| r.0 < len);
        for r in &mut self.0 {
            r.1 = r.1.min(len);
        }
    }
    fn covers(&self, from: u64, to: u64) -> bool {
        self.0.iter().any(|&(a, b)| a <= from && to <= b)
    }
}

/// Replays the log: returns the record writes (path, offset, length) that went into bytes of
/// their segment no synced write of zeros had prepared. A segment's header is not a record.
fn records_outside_prepared_space(log: &[(PathBuf, Change)]) -> Vec<(PathBuf, u64, u64)> {
    #[derive(Default)]
    struct File {
        zeroed: Ranges,
        prepared: Ranges,
    }
    let mut files: std::collections::HashMap<PathBuf, File> = Default::default();
    let mut bad = Vec::new();
    let mut records = 0;
    for (path, op) in log {
        let f = files.entry(path.clone()).or_default();
        match *op {
            Change::Write { offset, len, zeros } if zeros => f.zeroed.add(offset, offset + len),
            Change::Write { offset, len, .. } => {
                if offset < HEADER_LEN {
                    continue;
                }
                records += 1;
                if !f.prepared.covers(offset, offset + len) {
                    bad.push((path.clone(), offset, len));
                }
            }
            Change::Sync => {
                for &(a, b) in &f.zeroed.0.clone() {
                    f.prepared.add(a, b);
                }
                f.zeroed = Ranges::default();
            }
            Change::SetLen(len) => {
                f.zeroed.cut_at(len);
                f.prepared.cut_at(len);
            }
        }
    }
    assert!(records > 0, "the workload wrote records");
    bad
}

/// Runs a workload that covers each way new space is made: the first write after open (a new
/// store, a clean reopen, a reopen after a killed process), rollovers into new segments
/// (4 KiB segments), and steps within a large segment (8 MiB segments, 64 KiB records).
/// Returns the log of the journal's writes.
fn run_workload(skip: Option<SkipSync>) -> Vec<(PathBuf, Change)> {
    let log: Changes = Default::default();
    let mut fs = FaultFs::new();
    let open = |fs: &FaultFs, segment_bytes: u64| {
        let traced = Traced::recording_changes(Arc::new(fs.clone()), log.clone());
        let mut b = builder(fs)
            .vfs(Arc::new(traced))
            .segment_bytes(segment_bytes);
        if let Some(skip) = skip {
            b = b.skip_sync(skip);
        }
        b.open().unwrap()
    };
    let mut tally = Tally::default();
    // Small segments: each rollover creates a segment whose only step is the whole segment.
    let store = open(&fs, 4096);
    for i in 0..40 {
        tally.put(&store, &format!("p{}", i % 3), 150);
    }
    store.close().unwrap();
    let store = open(&fs, 4096);
    for i in 0..10 {
        tally.put(&store, &format!("p{}", i % 3), 150);
    }
    let image = fs.crash_process();
    // The killed process's handle, dropped here, trims the tail of the old disk, not of the
    // image the next open reads: its writes are not part of the image's history.
    let killed_at = log.lock().len();
    drop(store);
    log.lock().truncate(killed_at);
    fs = image;
    let store = open(&fs, 4096);
    tally.put(&store, "after", 150);
    assert!(tally.refused(&store).is_empty());
    store.close().unwrap();
    // A large segment: it is prepared a step at a time, as its records reach each step.
    let fs = FaultFs::new();
    let store = open(&fs, 8 << 20);
    let mut tally = Tally::default();
    for i in 0..40 {
        tally.put(&store, &format!("q{}", i % 3), 64 << 10);
    }
    assert!(tally.refused(&store).is_empty());
    store.close().unwrap();
    // The journal's segment files only.
    let log = log.lock();
    log.iter()
        .filter(|(path, _)| path.extension().is_some_and(|e| e == "seg"))
        .cloned()
        .collect()
}

/// Every record is written into space a write of zeros covered and a sync made durable first:
/// a commit's sync never has to allocate blocks or commit a new file size.
#[test]
fn records_go_only_into_zeros_already_written_and_synced() {
    let log = run_workload(None);
    let bad = records_outside_prepared_space(&log);
    assert!(
        bad.is_empty(),
        "records written into unprepared space: {bad:?}"
    );
    let zero_bytes: u64 = log
        .iter()
        .filter_map(|(_, op)| match op {
            Change::Write { len, zeros, .. } if *zeros => Some(*len),
            _ => None,
        })
        .sum();
    // The large segment's 2.5 MiB of records (and their frames) were prepared a step
    // (256 KiB) at a time: up to the step past them.
    assert!(
        zero_bytes >= 11 << 18,
        "{zero_bytes} bytes of zeros written"
    );
}

/// Negative control: with steps sized by `set_len` alone, records go into holes the sync
/// must allocate, which the check above finds.
#[test]
fn without_the_zero_fill_records_go_into_holes() {
    let log = run_workload(Some(SkipSync::ZeroFill));
    let bad = records_outside_prepared_space(&log);
    assert!(
        !bad.is_empty(),
        "the check found nothing without the zero fill"
    );
}

/// Opens a store on the operating system's files, commits a few batches and returns how many
/// bytes the tail segment holds blocks for, and its length.
fn tail_allocation(skip: Option<SkipSync>) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut b = FileStore::builder(dir.path());
    if let Some(skip) = skip {
        b = b.skip_sync(skip);
    }
    let store = b.open().unwrap();
    let mut tally = Tally::default();
    for i in 0..20 {
        tally.put(&store, &format!("p{}", i % 3), 150);
    }
    let journal = dir.path().join("journal");
    let mut names: Vec<_> = std::fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let meta = std::fs::metadata(journal.join(names.last().unwrap())).unwrap();
    drop(store);
    (meta.blocks() * 512, meta.len())
}

/// Whether the file system under the temporary directory leaves a `set_len` extension
/// unallocated (a hole); if it does not, a sparse and a written file cannot be told apart.
fn holes_are_visible() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join("probe")).unwrap();
    f.set_len(1 << 20).unwrap();
    f.metadata().unwrap().blocks() * 512 < 1 << 20
}

/// On the operating system's files the tail segment's prepared step holds its blocks: written
/// zeros, not a hole.
#[test]
fn the_tail_segment_on_disk_holds_its_blocks() {
    if !holes_are_visible() {
        eprintln!("the file system allocates set_len extensions: nothing to tell apart");
        return;
    }
    let (allocated, len) = tail_allocation(None);
    assert_eq!(len, 256 << 10, "the tail is prepared one step ahead");
    assert!(allocated >= len, "{allocated} of {len} bytes allocated");
    // Negative control: sized with `set_len`, the tail is mostly a hole.
    let (allocated, len) = tail_allocation(Some(SkipSync::ZeroFill));
    assert_eq!(len, 256 << 10);
    assert!(allocated < len / 2, "{allocated} of {len} bytes allocated");
}

/// Opens a store on `fs` whose journal writes are logged to `log`, with 1 MiB segments.
fn open_logged(fs: &FaultFs, log: &Changes) -> FileStore {
    builder(fs)
        .vfs(Arc::new(Traced::recording_changes(
            Arc::new(fs.clone()),
            log.clone(),
        )))
        .segment_bytes(1 << 20)
        .open()
        .unwrap()
}

/// Whether `path` is one of the journal's segment files.
fn is_segment(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "seg")
}

/// The syncs of the journal's segment files in `log`.
fn syncs(log: &[(PathBuf, Change)]) -> usize {
    log.iter()
        .filter(|(path, op)| is_segment(path) && matches!(op, Change::Sync))
        .count()
}

/// The writes to the journal's segment files in `log` that are (or are not) all zeros.
fn writes(log: &[(PathBuf, Change)], zeros: bool) -> Vec<(u64, u64)> {
    log.iter()
        .filter(|(path, _)| is_segment(path))
        .filter_map(|(_, op)| match *op {
            Change::Write {
                offset,
                len,
                zeros: z,
            } if z == zeros => Some((offset, len)),
            _ => None,
        })
        .collect()
}

/// After a killed writer, open rewrites and syncs only the records no frame proves durable
/// (the last commit's, whose sync the kill may have cut), not everything it scanned; the
/// zeros it found after them, made durable by that sync, are not written again by the first
/// commit, which then syncs once.
#[test]
fn a_reopen_rewrites_only_unproven_records_and_its_first_commit_prepares_nothing() {
    let log: Changes = Default::default();
    let fs = FaultFs::new();
    let store = open_logged(&fs, &log);
    let mut tally = Tally::default();
    for i in 0..60 {
        tally.put(&store, &format!("p{}", i % 3), 150);
    }
    let image = fs.crash_process();
    drop(store);
    log.lock().clear();

    let store = open_logged(&image, &log);
    let scanned = store.open_report().journal_bytes_scanned;
    let opened = log.lock().clone();
    let rewritten = writes(&opened, false);
    assert_eq!(rewritten.len(), 1, "{opened:?}");
    assert!(
        rewritten[0].1 < 400 && scanned > 8 << 10,
        "rewrote {} of {scanned} bytes scanned",
        rewritten[0].1
    );
    assert!(writes(&opened, true).is_empty(), "{opened:?}");
    assert_eq!(syncs(&opened), 1, "{opened:?}");

    log.lock().clear();
    tally.put(&store, "after", 150);
    let first = log.lock().clone();
    assert!(
        writes(&first, true).is_empty(),
        "zeros written again: {first:?}"
    );
    assert_eq!(syncs(&first), 1, "{first:?}");
    assert_eq!(store.stats().syncs, 1);
    assert!(tally.refused(&store).is_empty());
}

/// `stats().syncs` counts every journal sync since open: the commits', and those that make a
/// new segment's header and each zero-filled step durable.
#[test]
fn stats_count_the_syncs_of_new_segments_and_steps() {
    let log: Changes = Default::default();
    let fs = FaultFs::new();
    let store = builder(&fs)
        .vfs(Arc::new(Traced::recording_changes(
            Arc::new(fs.clone()),
            log.clone(),
        )))
        .open()
        .unwrap();
    log.lock().clear();
    let mut tally = Tally::default();
    for i in 0..40 {
        tally.put(&store, &format!("p{}", i % 3), 150);
    }
    let stats = store.stats();
    assert!(stats.segments > 2, "the workload rolls over");
    let logged = syncs(&log.lock());
    assert!(logged as u64 > stats.batches, "steps and headers add syncs");
    assert_eq!(stats.syncs, logged as u64);
}
