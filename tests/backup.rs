//! Online backup on the operating system's files (SPEC S12, S14).
//!
//! Sixteen writers commit recognisable batches while compaction runs in a loop and heads
//! snapshots are written by themselves; three backups are taken along the way, each holding
//! its point until sixteen more batches are acknowledged after it. Each backup must hold
//! exactly the batches the journal numbered below its point (known through the store's append
//! observer): every batch acknowledged before the call, none started after it returned; it
//! must open as an ordinary store and verify clean, and live apart from the store.
//!
//! Also: the refusals (a destination that exists, one inside the store), the leftover of a
//! backup cut short, a file system that cannot link, and compaction held back by a backup,
//! with its negative control (`SkipSync::BackupCompactionLock`). Nothing waits for time to
//! pass: the backups start when the writers report progress, and the hooks hand over with
//! channels.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;

use common::backup::{Calls, Ledger, value};
use parking_lot::Mutex;
use portcullis::store::{
    Batch, FileStore, OpenMode, OsFs, Partition, PathKind, SkipSync, Store, Vfs, VfsFile, VfsLock,
};

const WRITERS: usize = 16;
const BATCHES: usize = 200;
/// Backups start once every writer has written this many batches.
const BACKUP_AT: [usize; 3] = [40, 90, 140];
/// Batches acknowledged after a backup's point before the backup goes on.
const AFTER_POINT: usize = 16;
/// Writers wait after this many batches past a backup's start until it has taken its point,
/// so each backup has batches to hold its point for.
const SLACK: usize = 10;

/// How many backups have taken their point, for the writers to wait on.
#[derive(Default)]
struct Points {
    taken: parking_lot::Mutex<usize>,
    changed: parking_lot::Condvar,
}

impl Points {
    fn took(&self) {
        *self.taken.lock() += 1;
        self.changed.notify_all();
    }

    fn wait_for(&self, n: usize) {
        let mut taken = self.taken.lock();
        while *taken < n {
            self.changed.wait(&mut taken);
        }
    }
}

#[test]
fn backups_under_sixteen_writers_and_compaction_hold_exactly_the_journal_before_their_point() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::default();
    let calls = Calls::default();
    // Every acknowledged batch, told to the backup's point hook.
    let (acks, acked) = mpsc::channel::<()>();
    let acked = Mutex::new(acked);
    let points = Arc::new(Points::default());
    let taken = points.clone();
    let store = ledger
        .observe(FileStore::builder(dir.path().join("live")))
        .segment_bytes(4096)
        .snapshot_every_bytes(64 << 10)
        .auto_compact(false)
        .observe_backup_point(move || {
            // Hold the point until writers acknowledge batches after it.
            let acked = acked.lock();
            while acked.try_recv().is_ok() {}
            taken.took();
            for _ in 0..AFTER_POINT {
                acked.recv().expect("writers outlive the backups");
            }
        })
        .open()
        .unwrap();
    let (progress, reached) = mpsc::channel::<usize>();
    let done = AtomicBool::new(false);
    let removed = AtomicU64::new(0);
    let reports = thread::scope(|s| {
        let (store, ledger, calls, done, removed) = (&store, &ledger, &calls, &done, &removed);
        let points = &points;
        s.spawn(move || {
            while !done.load(Ordering::Acquire) {
                let report = store.compact().expect("compaction on a healthy disk");
                removed.fetch_add(report.segments_removed as u64, Ordering::Relaxed);
            }
        });
        for t in 0..WRITERS {
            let (progress, acks) = (progress.clone(), acks.clone());
            s.spawn(move || {
                ledger.write(store, t, 0..BATCHES, 700, calls, |n| {
                    let _ = acks.send(());
                    if BACKUP_AT.contains(&n) {
                        progress.send(n).unwrap();
                    }
                    if let Some(c) = BACKUP_AT.iter().position(|&at| at + SLACK == n) {
                        points.wait_for(c + 1);
                    }
                });
            });
        }
        let mut reports = Vec::new();
        let mut arrived = std::collections::HashMap::<usize, usize>::new();
        for (call, at) in BACKUP_AT.iter().enumerate() {
            // Every writer got this far.
            while arrived.get(at).copied().unwrap_or(0) < WRITERS {
                *arrived.entry(reached.recv().unwrap()).or_default() += 1;
            }
            let dest = dir.path().join(format!("backup-{call}"));
            let report = calls.run(|| store.backup(&dest)).expect("backup");
            reports.push((dest, report));
        }
        // The writers finish by themselves; then the compactor stops.
        drop(progress);
        while reached.recv().is_ok() {}
        done.store(true, Ordering::Release);
        reports
    });
    assert!(
        removed.load(Ordering::Relaxed) > 0,
        "toothless: compaction never removed a segment"
    );
    let written = ledger.written();
    assert_eq!(written.len(), WRITERS * BATCHES);
    assert!(written.iter().all(|w| w.acked.is_some()), "a batch failed");
    for (call, (dest, report)) in reports.iter().enumerate() {
        assert!(
            report.files_linked > 0 && report.bytes_linked > 0,
            "backup {call} linked nothing: {report:?}"
        );
        let in_flight = written
            .iter()
            .filter(|w| w.acked.is_some_and(|a| a == 2 * call as u64 + 1))
            .count();
        assert!(
            in_flight >= AFTER_POINT,
            "backup {call}: only {in_flight} batches acknowledged during it"
        );
        let copy = FileStore::open(dest).unwrap();
        assert!(copy.open_report().damaged.is_empty() && copy.open_report().torn_tail.is_none());
        let wrong = ledger.check(&copy, call as u64, report);
        assert!(wrong.is_empty(), "backup {call}: {wrong:#?}");
        copy.close().unwrap();
        let verification = portcullis::inspect::verify(dest).unwrap();
        assert!(verification.is_clean(), "backup {call}: {verification}");
    }
    store.close().unwrap();
    let verification = portcullis::inspect::verify(dir.path().join("live")).unwrap();
    assert!(verification.is_clean(), "the store: {verification}");
}

fn fill(store: &FileStore, partitions: usize, batches: usize) {
    for i in 0..batches {
        let p = Partition::new(format!("p{}", i % partitions)).unwrap();
        let k = format!("k{}", i % (3 * partitions));
        let batch = Batch::new().put(k.clone(), value(&k, &i.to_string(), 300));
        assert!(store.apply(&p, &batch).unwrap().is_committed());
    }
}

/// Every row of every partition.
fn rows(store: &FileStore) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for p in store.list_partitions(b"").unwrap() {
        for row in store.entries(&p, portcullis::store::KeyRange::all()) {
            let (k, v) = row.unwrap();
            out.push((p.to_string(), k, v));
        }
    }
    out
}

#[test]
fn a_backup_and_its_store_live_apart() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let store = FileStore::builder(&live)
        .segment_bytes(4096)
        .auto_compact(false)
        .open()
        .unwrap();
    fill(&store, 10, 300);
    store.write_heads_snapshot().unwrap();
    fill(&store, 10, 50);
    let before = rows(&store);
    let dest = dir.path().join("nested/copy");
    let report = store.backup(&dest).unwrap();
    assert!(report.files_linked > 1, "{report:?}");
    assert!(
        report.files_copied >= 2,
        "the manifest and the tail: {report:?}"
    );
    assert!(!dir.path().join("nested/copy.partial").exists());
    // The store moves on and compacts away the segments the backup links.
    fill(&store, 10, 100);
    assert!(store.compact().unwrap().segments_removed > 0);
    let after = rows(&store);
    let copy = FileStore::open(&dest).unwrap();
    assert_eq!(rows(&copy), before);
    // The backup moves on and compacts too; the store is unaffected.
    fill(&copy, 3, 200);
    assert!(copy.compact().unwrap().segments_removed > 0);
    copy.close().unwrap();
    assert_eq!(rows(&store), after);
    store.close().unwrap();
    for d in [&live, &dest] {
        let v = portcullis::inspect::verify(d).unwrap();
        assert!(v.is_clean(), "{}: {v}", d.display());
    }
    let store = FileStore::open(&live).unwrap();
    assert_eq!(rows(&store), after);
}

#[test]
fn a_backup_refuses_a_destination_that_exists_or_lies_inside_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path().join("live")).unwrap();
    fill(&store, 2, 10);
    std::fs::create_dir(dir.path().join("taken")).unwrap();
    for (dest, says) in [
        (dir.path().join("taken"), "exists"),
        (dir.path().join("live/inside"), "inside the store"),
    ] {
        match store.backup(&dest) {
            Err(portcullis::Error::InvalidArgument(why)) => {
                assert!(why.contains(says), "{why}")
            }
            other => panic!("{}: {other:?}", dest.display()),
        }
    }
    assert!(
        std::fs::read_dir(dir.path().join("taken"))
            .unwrap()
            .next()
            .is_none()
    );
    assert!(!dir.path().join("live/inside").exists());
    store.close().unwrap();
    assert!(matches!(
        store.backup(dir.path().join("late")),
        Err(portcullis::Error::Closed)
    ));
}

#[test]
fn a_backup_takes_over_what_a_backup_cut_short_left_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path().join("live"))
        .segment_bytes(4096)
        .open()
        .unwrap();
    fill(&store, 4, 60);
    // What a backup leaves when it is cut short: some of its files, no destination.
    let first = dir.path().join("first");
    store.backup(&first).unwrap();
    let partial = dir.path().join("again.partial");
    std::fs::create_dir_all(partial.join("journal")).unwrap();
    for name in ["MANIFEST", "LOCK"] {
        std::fs::copy(first.join(name), partial.join(name)).unwrap();
    }
    let segment = std::fs::read_dir(first.join("journal"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    std::fs::write(partial.join("journal").join(segment), b"torn").unwrap();
    fill(&store, 4, 20);
    let dest = dir.path().join("again");
    store.backup(&dest).unwrap();
    assert!(!partial.exists());
    assert_eq!(rows(&FileStore::open(&dest).unwrap()), rows(&store));
    // A file a backup does not write is not the backup's to remove.
    let foreign = dir.path().join("other.partial");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), b"mine").unwrap();
    match store.backup(dir.path().join("other")) {
        Err(portcullis::Error::InvalidArgument(why)) => {
            assert!(why.contains("did not write it"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(foreign.join("notes.txt")).unwrap(), b"mine");
    assert!(!dir.path().join("other").exists());
}

/// The operating system's files, except that nothing can be linked (another file system).
#[derive(Debug)]
struct NoLinks;

impl Vfs for NoLinks {
    fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Arc<dyn VfsFile>> {
        OsFs.open(path, mode)
    }
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        OsFs.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        OsFs.list(dir)
    }
    fn kind(&self, path: &Path) -> std::io::Result<Option<PathKind>> {
        OsFs.kind(path)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        OsFs.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        OsFs.rename(from, to)
    }
    fn hard_link(&self, _: &Path, _: &Path) -> std::io::Result<()> {
        Err(std::io::ErrorKind::CrossesDevices.into())
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        OsFs.sync_dir(dir)
    }
    fn try_lock(&self, path: &Path) -> std::io::Result<Box<dyn VfsLock>> {
        OsFs.try_lock(path)
    }
}

#[test]
fn where_files_cannot_be_linked_a_backup_copies_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path().join("live"))
        .vfs(Arc::new(NoLinks))
        .segment_bytes(4096)
        .open()
        .unwrap();
    fill(&store, 5, 200);
    let dest = dir.path().join("copy");
    let report = store.backup(&dest).unwrap();
    assert_eq!((report.files_linked, report.bytes_linked), (0, 0));
    assert!(report.files_copied > 3, "{report:?}");
    let on_disk: u64 = std::fs::read_dir(dest.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        report.bytes_copied >= on_disk,
        "{report:?}, {on_disk} bytes"
    );
    assert_eq!(rows(&FileStore::open(&dest).unwrap()), rows(&store));
    store.close().unwrap();
    assert!(portcullis::inspect::verify(&dest).unwrap().is_clean());
}

enum Event {
    /// The compaction found compaction's lock held and waits.
    Waits,
    /// The compaction finished, removing this many segments.
    Compacted(u32),
}

/// A backup that starts a compaction at its point and goes on once the compaction is held back
/// (or, without the backup's hold on compaction's lock, finished): the backup must still hold
/// every batch and verify clean, and the compaction must remove segments once it runs.
fn backup_with_a_compaction_at_its_point(skip: Option<SkipSync>) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let (events, received) = mpsc::channel::<Event>();
    let received = Arc::new(Mutex::new(received));
    let slot: Arc<Mutex<Option<FileStore>>> = Arc::default();
    let compactor: Arc<Mutex<Option<thread::JoinHandle<()>>>> = Arc::default();
    // A compaction that finished inside the backup's hook (only without the lock).
    let early: Arc<Mutex<Option<u32>>> = Arc::default();
    let waits = events.clone();
    let mut builder = FileStore::builder(dir.path().join("live"))
        .segment_bytes(4096)
        .auto_compact(false)
        .observe_compaction_waits(move || waits.send(Event::Waits).unwrap())
        .observe_backup_point({
            let (slot, compactor, received) = (slot.clone(), compactor.clone(), received.clone());
            let early = early.clone();
            move || {
                let store = slot.lock().clone().expect("the store is in its slot");
                let events = events.clone();
                *compactor.lock() = Some(thread::spawn(move || {
                    let removed = store.compact().map_or(0, |r| r.segments_removed);
                    events.send(Event::Compacted(removed)).unwrap();
                }));
                // Held back, or (without the lock) done.
                let first = received.lock().recv().unwrap();
                if let Event::Compacted(removed) = first {
                    *early.lock() = Some(removed);
                }
            }
        });
    if let Some(skip) = skip {
        builder = builder.skip_sync(skip);
    }
    let store = builder.open().unwrap();
    fill(&store, 8, 300);
    let expected = rows(&store);
    *slot.lock() = Some(store.clone());
    let dest = dir.path().join("copy");
    let backup = store.backup(&dest);
    compactor.lock().take().unwrap().join().unwrap();
    let removed = loop {
        match received.lock().try_recv() {
            Ok(Event::Compacted(removed)) => break Some(removed),
            Ok(Event::Waits) => continue,
            Err(_) => break early.lock().take(),
        }
    };
    slot.lock().take();
    store.close().unwrap();
    if removed.unwrap_or(0) == 0 {
        panic!("toothless: the compaction removed no segment");
    }
    backup.map_err(|e| format!("the backup failed: {e}"))?;
    let copy = FileStore::open(&dest).map_err(|e| format!("the backup does not open: {e}"))?;
    let mut got = Vec::new();
    for p in copy.list_partitions(b"").unwrap() {
        for row in copy.entries(&p, portcullis::store::KeyRange::all()) {
            let (k, v) = row.map_err(|e| format!("{p}: {e}"))?;
            got.push((p.to_string(), k, v));
        }
    }
    if got != expected {
        return Err(format!(
            "the backup holds {} rows of {}",
            got.len(),
            expected.len()
        ));
    }
    copy.close().unwrap();
    let v = portcullis::inspect::verify(&dest).unwrap();
    if !v.is_clean() {
        return Err(format!("the backup does not verify: {v}"));
    }
    Ok(())
}

#[test]
fn compaction_waits_until_a_backup_has_taken_its_segments() {
    backup_with_a_compaction_at_its_point(None).unwrap();
}

#[test]
fn control_a_backup_that_does_not_hold_compaction_back_is_caught() {
    let found = backup_with_a_compaction_at_its_point(Some(SkipSync::BackupCompactionLock))
        .expect_err("a compaction that deleted the backup's segments went unnoticed");
    println!("caught: {found}");
}

struct Total; // the sum of the numbers appended

impl portcullis::TypedMachine for Total {
    type Record = u64;
    type State = u64;
    fn fresh(&self, _: &portcullis::EntityId) -> u64 {
        0
    }
    fn apply(
        &self,
        total: &mut u64,
        _: &portcullis::ApplyContext,
        n: u64,
    ) -> Result<(), portcullis::Rejection> {
        *total += n;
        Ok(())
    }
}

#[test]
fn an_engine_backs_up_its_file_store_and_the_copy_restores_as_after_an_unclean_stop() {
    use portcullis::{Engine, EntityId, Typed};
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::builder(Typed(Total))
        .directory(dir.path().join("live"))
        .open()
        .unwrap();
    let entities: Vec<EntityId> = (0..20)
        .map(|i| EntityId::new("counters", format!("c{i}")).unwrap())
        .collect();
    for (i, e) in entities.iter().enumerate() {
        engine.register(e).unwrap();
        engine.append_typed(e, &[i as u64, 1]).unwrap();
    }
    let dest = dir.path().join("backup");
    engine.backup(&dest).unwrap();
    for e in &entities {
        engine.append_typed(e, &[1000]).unwrap();
    }
    engine.close().unwrap();
    let restored = Engine::builder(Typed(Total))
        .directory(&dest)
        .open()
        .unwrap();
    assert!(
        restored.unclean_previous().is_some(),
        "the copy was taken while the engine ran"
    );
    for (i, e) in entities.iter().enumerate() {
        assert_eq!(restored.read(e, |t| *t).unwrap(), i as u64 + 1, "{e}");
    }
    restored.close().unwrap();
    let v = portcullis::inspect::verify(&dest).unwrap();
    assert!(v.is_clean(), "{v}");
    assert!(matches!(
        engine.backup(dir.path().join("late")),
        Err(portcullis::Error::Closed)
    ));
}

#[test]
fn an_engine_on_the_in_memory_store_says_why_it_cannot_back_up() {
    let dir = tempfile::tempdir().unwrap();
    let engine = portcullis::Engine::builder(portcullis::Typed(Total))
        .store(Arc::new(portcullis::store::MemoryStore::new()))
        .open()
        .unwrap();
    let dest = dir.path().join("backup");
    match engine.backup(&dest) {
        Err(portcullis::Error::InvalidArgument(why)) => {
            assert!(
                why.contains("in-memory store keeps nothing on disk"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(!dest.exists());
}
