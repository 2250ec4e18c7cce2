//! Behaviour of the file-backed store beyond the shared contract: persistence across reopen,
//! lazy open (S5), group commit (S3), the directory lock (S6), format versions (S10),
//! compaction (S7) and recovery (S4).

use std::sync::Arc;
use std::sync::Barrier;

use portcullis::Error;
use portcullis::store::{Batch, FileStore, KeyRange, Partition, Store, SyncPolicy};

fn part(name: &str) -> Partition {
    Partition::new(name).unwrap()
}

fn put(store: &FileStore, p: &Partition, k: &str, v: &str) {
    let outcome = store
        .apply(p, &Batch::new().put(k.as_bytes(), v.as_bytes()))
        .unwrap();
    assert!(outcome.is_committed());
}

#[test]
fn data_survives_reopen_with_and_without_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let p = part("p");
    {
        let store = FileStore::open(dir.path()).unwrap();
        for i in 0..200 {
            put(&store, &p, &format!("k{i:03}"), &format!("v{i}"));
        }
        assert!(
            store
                .apply(&p, &Batch::new().delete(b"k000".to_vec()))
                .unwrap()
                .is_committed()
        );
        store.close().unwrap();
    }
    {
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(
            store.open_report().journal_bytes_scanned,
            0,
            "clean close leaves a snapshot"
        );
        assert_eq!(store.get(&p, b"k000").unwrap(), None);
        assert_eq!(store.get(&p, b"k199").unwrap(), Some(b"v199".to_vec()));
        let page = store.scan(&p, &KeyRange::all(), None, 1000).unwrap();
        assert_eq!(page.entries.len(), 199);
        put(&store, &p, "after", "close");
        // Simulate a crash: leak the handle so no clean close happens.
        std::mem::forget(store);
    }
    // The lock of the leaked handle is still held in this process: the OS releases it only when
    // the file is closed. Reopen through a copy of the directory instead.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    let store = FileStore::open(copy.path()).unwrap();
    assert!(
        store.open_report().journal_bytes_scanned > 0,
        "the tail after the snapshot is scanned"
    );
    assert_eq!(store.get(&p, b"after").unwrap(), Some(b"close".to_vec()));
    assert_eq!(store.get(&p, b"k150").unwrap(), Some(b"v150".to_vec()));
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn open_reads_no_partition_until_touched() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = FileStore::open(dir.path()).unwrap();
        for i in 0..50 {
            put(&store, &part(&format!("p{i}")), "k", "v");
        }
    }
    let store = FileStore::open(dir.path()).unwrap();
    assert_eq!(store.stats().partitions, 50);
    assert_eq!(
        store.stats().partitions_loaded,
        0,
        "open loads no partition (S5)"
    );
    assert_eq!(store.get(&part("p7"), b"k").unwrap(), Some(b"v".to_vec()));
    assert_eq!(
        store.stats().partitions_loaded,
        1,
        "first access loads exactly one"
    );
}

#[test]
fn concurrent_committers_share_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let threads = 16;
    let per_thread = 50;
    let barrier = Arc::new(Barrier::new(threads));
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = store.clone();
            let barrier = barrier.clone();
            s.spawn(move || {
                let p = part(&format!("t{t}"));
                barrier.wait();
                for i in 0..per_thread {
                    put(&store, &p, &format!("{i}"), "x");
                }
            });
        }
    });
    let stats = store.stats();
    assert_eq!(stats.batches, (threads * per_thread) as u64);
    assert!(
        stats.syncs < stats.batches,
        "group commit: {} syncs for {} batches",
        stats.syncs,
        stats.batches
    );
}

#[test]
fn second_open_is_refused_with_locked() {
    let dir = tempfile::tempdir().unwrap();
    let _first = FileStore::open(dir.path()).unwrap();
    match FileStore::open(dir.path()) {
        Err(e @ Error::Locked { .. }) => assert_eq!(e.code(), 3),
        other => panic!("expected Locked, got {other:?}"),
    }
}

#[test]
fn lock_is_released_by_close() {
    let dir = tempfile::tempdir().unwrap();
    let first = FileStore::open(dir.path()).unwrap();
    first.close().unwrap();
    let _second = FileStore::open(dir.path()).unwrap();
    assert!(matches!(first.get(&part("p"), b"k"), Err(Error::Closed)));
}

#[test]
fn compaction_reclaims_overwritten_data_and_keeps_live_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path())
        .segment_bytes(64 << 10)
        .auto_compact(false)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .open()
        .unwrap();
    let value = vec![7u8; 1000];
    for round in 0..20 {
        for p in 0..5 {
            let p = part(&format!("p{p}"));
            for k in 0..10 {
                let mut v = value.clone();
                v[0] = round as u8;
                assert!(
                    store
                        .apply(&p, &Batch::new().put(format!("k{k}").into_bytes(), v))
                        .unwrap()
                        .is_committed()
                );
            }
        }
    }
    assert!(
        store
            .apply(&part("p4"), &Batch::new().delete_range(KeyRange::all()))
            .unwrap()
            .is_committed()
    );
    let before = store.stats().segments;
    let report = store.compact().unwrap();
    assert!(report.segments_removed > 0, "{report:?}");
    assert!(store.stats().segments < before);
    for p in 0..4 {
        for k in 0..10 {
            let got = store
                .get(&part(&format!("p{p}")), format!("k{k}").as_bytes())
                .unwrap()
                .unwrap();
            assert_eq!(got[0], 19);
        }
    }
    assert_eq!(
        store
            .scan(&part("p4"), &KeyRange::all(), None, 10)
            .unwrap()
            .entries
            .len(),
        0
    );
    store.close().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let got = store.get(&part("p2"), b"k3").unwrap().unwrap();
    assert_eq!(got[0], 19);
    assert_eq!(
        store
            .scan(&part("p4"), &KeyRange::all(), None, 10)
            .unwrap()
            .entries
            .len(),
        0
    );
}

#[test]
fn a_file_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    assert!(matches!(
        FileStore::open(&file),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn long_chains_are_bounded_by_base_records() {
    let dir = tempfile::tempdir().unwrap();
    let p = part("hot");
    {
        let store = FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()
            .unwrap();
        for i in 0..1000 {
            put(&store, &p, &format!("k{}", i % 10), &format!("{i}"));
        }
    }
    let store = FileStore::open(dir.path()).unwrap();
    assert_eq!(store.get(&p, b"k9").unwrap(), Some(b"999".to_vec()));
    assert_eq!(
        store
            .scan(&p, &KeyRange::all(), None, 100)
            .unwrap()
            .entries
            .len(),
        10
    );
}

fn segment_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Compaction keeps the segments of a damaged partition and deletes the others; a later full
/// rebuild (snapshot removed) must accept the LSN gap the deleted segments leave, and still
/// report the damage instead of mistaking the gap for more damage.
#[test]
fn rebuild_after_compaction_accepts_lsn_gaps_and_reports_damage() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        FileStore::builder(dir.path())
            .segment_bytes(16 << 10)
            .auto_compact(false)
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()
            .unwrap()
    };
    let store = open();
    let write = |name: &str, round: u8| {
        let mut v = vec![1u8; 500];
        v[0] = round;
        let b = Batch::new().put(format!("k{}", round % 5).into_bytes(), v);
        assert!(store.apply(&part(name), &b).unwrap().is_committed());
    };
    // "a" fills the first segments alone; b, c and d fill the later ones.
    for round in 0..40u8 {
        write("a", round);
    }
    let a_segments = store.stats().segments;
    for round in 0..40u8 {
        for name in ["b", "c", "d"] {
            write(name, round);
        }
    }
    store.close().unwrap();
    let files = segment_files(dir.path());
    assert!(files.len() as u64 >= a_segments + 3, "{files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&files[0], &bytes).unwrap();

    let store = open();
    let report = store.compact().unwrap();
    assert_eq!(report.segments_kept as u64, a_segments, "{report:?}");
    assert!(report.segments_removed >= 2, "{report:?}");
    store.close().unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "snap") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let store = open();
    let report = store.open_report().clone();
    assert!(report.rebuilt_by_full_scan);
    assert_eq!(report.damaged.len(), 1, "{report:?}");
    assert_eq!(
        report.damaged[0].partition.as_deref(),
        Some("a"),
        "{report:?}"
    );
    assert!(matches!(
        store.get(&part("a"), b"k4"),
        Err(Error::Corrupt { .. })
    ));
    for name in ["b", "c", "d"] {
        assert_eq!(
            store.get(&part(name), b"k4").unwrap().unwrap()[0],
            39,
            "partition {name}"
        );
    }
}

/// Commits racing a close either commit durably or answer `Closed`; nothing is written after the
/// close returns, so a reopen sees exactly the acknowledged batches.
#[test]
fn commits_racing_close_are_durable_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let barrier = Barrier::new(5);
    let acknowledged: Vec<Vec<u32>> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let (store, barrier) = (&store, &barrier);
                s.spawn(move || {
                    let p = part(&format!("w{t}"));
                    let mut acked = Vec::new();
                    barrier.wait();
                    for i in 0..10_000u32 {
                        let b = Batch::new().put(i.to_be_bytes().to_vec(), b"x".to_vec());
                        match store.apply(&p, &b) {
                            Ok(outcome) => {
                                assert!(outcome.is_committed());
                                acked.push(i);
                            }
                            Err(Error::Closed) => break,
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                    acked
                })
            })
            .collect();
        barrier.wait();
        // Let the writers get going, then close under them.
        while store.stats().batches < 50 {
            std::thread::yield_now();
        }
        store.close().unwrap();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let reopened = FileStore::open(dir.path()).unwrap();
    for (t, acked) in acknowledged.iter().enumerate() {
        let p = part(&format!("w{t}"));
        let rows = reopened
            .scan(&p, &KeyRange::all(), None, 20_000)
            .unwrap()
            .entries;
        let acked_keys: Vec<Vec<u8>> = acked.iter().map(|i| i.to_be_bytes().to_vec()).collect();
        let stored: Vec<Vec<u8>> = rows.into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            stored, acked_keys,
            "writer {t}: exactly the acknowledged batches survive"
        );
    }
}

/// A session that only reads leaves the directory untouched: close finds the snapshot on disk
/// still exact and writes no new one (no needless syncs at close).
#[test]
fn a_read_only_session_rewrites_nothing_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let p = part("p");
    {
        let store = FileStore::open(dir.path()).unwrap();
        put(&store, &p, "k", "v");
        store.close().unwrap();
    }
    let files_with_times = || {
        let mut found: Vec<(std::path::PathBuf, std::time::SystemTime)> =
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap())
                .filter(|e| e.file_type().unwrap().is_file())
                .map(|e| (e.path(), e.metadata().unwrap().modified().unwrap()))
                .collect();
        found.sort();
        found
    };
    // Age every file so that a rewrite would show.
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    for (path, _) in files_with_times() {
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let before = files_with_times();
    {
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(store.get(&p, b"k").unwrap(), Some(b"v".to_vec()));
        store.close().unwrap();
    }
    let after: Vec<_> = files_with_times()
        .into_iter()
        .filter(|(path, _)| !path.ends_with("LOCK"))
        .collect();
    let before: Vec<_> = before
        .into_iter()
        .filter(|(path, _)| !path.ends_with("LOCK"))
        .collect();
    assert_eq!(after, before, "the manifest and snapshot were rewritten");
}

/// A file layer whose syncs wait while a gate is closed, telling the test when one is waiting.
#[derive(Debug)]
struct GatedFs {
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    waiting: std::sync::mpsc::SyncSender<()>,
}

#[derive(Debug)]
struct GatedFile {
    inner: Arc<dyn portcullis::store::VfsFile>,
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    waiting: std::sync::mpsc::SyncSender<()>,
}

impl portcullis::store::VfsFile for GatedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let (open, opened) = &*self.gate;
        let mut is_open = open.lock().unwrap();
        if !*is_open {
            let _ = self.waiting.try_send(());
        }
        while !*is_open {
            is_open = opened.wait(is_open).unwrap();
        }
        self.inner.sync_data()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
}

impl portcullis::store::Vfs for GatedFs {
    fn open(
        &self,
        path: &std::path::Path,
        mode: portcullis::store::OpenMode,
    ) -> std::io::Result<Arc<dyn portcullis::store::VfsFile>> {
        let inner = portcullis::store::OsFs.open(path, mode)?;
        Ok(Arc::new(GatedFile {
            inner,
            gate: self.gate.clone(),
            waiting: self.waiting.clone(),
        }))
    }
    fn create_dir_all(&self, path: &std::path::Path) -> std::io::Result<()> {
        portcullis::store::OsFs.create_dir_all(path)
    }
    fn list(&self, dir: &std::path::Path) -> std::io::Result<Vec<String>> {
        portcullis::store::OsFs.list(dir)
    }
    fn kind(&self, path: &std::path::Path) -> std::io::Result<Option<portcullis::store::PathKind>> {
        portcullis::store::OsFs.kind(path)
    }
    fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
        portcullis::store::OsFs.remove(path)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        portcullis::store::OsFs.rename(from, to)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        portcullis::store::OsFs.sync_dir(dir)
    }
    fn try_lock(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Box<dyn portcullis::store::VfsLock>> {
        portcullis::store::OsFs.try_lock(path)
    }
}

/// `get_for_update` answers from the committed-but-not-yet-durable batch, without waiting for
/// its sync (a plain `get` waits for it, so that it never shows what a crash could take away).
#[test]
fn get_for_update_sees_a_batch_whose_sync_is_still_running() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new((std::sync::Mutex::new(true), std::sync::Condvar::new()));
    let (waiting, sync_waits) = std::sync::mpsc::sync_channel(16);
    let fs = GatedFs {
        gate: gate.clone(),
        waiting,
    };
    let store = FileStore::builder(dir.path())
        .vfs(Arc::new(fs))
        .open()
        .unwrap();
    let p = part("p");
    put(&store, &p, "n", "1");
    *gate.0.lock().unwrap() = false;
    std::thread::scope(|s| {
        let writer = s.spawn(|| put(&store, &p, "n", "2"));
        // The writer's batch is appended and its sync is held at the gate.
        sync_waits.recv().unwrap();
        let (answer, answered) = std::sync::mpsc::channel();
        let (store, p) = (&store, &p);
        s.spawn(move || answer.send(store.get_for_update(p, b"n").unwrap()).unwrap());
        let seen = answered.recv_timeout(std::time::Duration::from_secs(30));
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        assert_eq!(
            seen,
            Ok(Some(b"2".to_vec())),
            "get_for_update must not wait for the sync"
        );
        writer.join().unwrap();
    });
    assert_eq!(store.get(&p, b"n").unwrap(), Some(b"2".to_vec()));
}
