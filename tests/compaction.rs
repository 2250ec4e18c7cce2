//! Compaction of the file-backed store (SPEC S7): a partition of any size survives compaction
//! and reopen, and the dead-byte counts that start compaction by itself survive restarts.

mod common;

use common::layout;
use portcullis::store::{Batch, FileStore, KeyRange, Partition, Store, SyncPolicy};

/// A 1 KiB key, distinct for each `i`.
fn big_key(i: u32) -> Vec<u8> {
    let mut key = format!("{i:08}-").into_bytes();
    key.resize(1024, b'k');
    key
}

fn value_of(i: u32) -> Vec<u8> {
    format!("value {i}").into_bytes()
}

/// Writes `keys` keys of 1 KiB to one partition, compacts, reopens and reads every key back.
/// The partition's base record (its whole key index) is over `keys` KiB, so a large `keys`
/// takes it past what one journal record can hold.
fn huge_partition_survives_compaction_and_reopen(keys: u32) {
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("huge").unwrap();
    let open = || {
        FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .segment_bytes(8 << 20)
            .auto_compact(false)
            .open()
            .unwrap()
    };
    let store = open();
    const PER_BATCH: u32 = 200;
    for first in (0..keys).step_by(PER_BATCH as usize) {
        let batch = (first..(first + PER_BATCH).min(keys))
            .fold(Batch::new(), |b, i| b.put(big_key(i), value_of(i)));
        assert!(store.apply(&p, &batch).unwrap().is_committed());
    }
    let report = store.compact().unwrap();
    assert!(report.segments_removed > 0, "{report:?}");
    assert_eq!(report.partitions_rewritten, 1, "{report:?}");
    store.close().unwrap();

    let store = open();
    assert!(store.open_report().damaged.is_empty());
    let mut seen = 0u32;
    let mut cursor = None;
    loop {
        let page = store
            .scan(&p, &KeyRange::all(), cursor.as_ref(), 1000)
            .unwrap_or_else(|e| panic!("scan after {seen} keys: {e}"));
        for (key, value) in &page.entries {
            assert_eq!(key, &big_key(seen));
            assert_eq!(value, &value_of(seen));
            seen += 1;
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, keys);
    assert_eq!(
        store.get(&p, &big_key(keys - 1)).unwrap(),
        Some(value_of(keys - 1))
    );
    // A second compaction and reopen start from the split base.
    let extra = Batch::new().put(b"after".to_vec(), b"reopen".to_vec());
    assert!(store.apply(&p, &extra).unwrap().is_committed());
    store.compact().unwrap();
    store.close().unwrap();
    let store = open();
    assert_eq!(store.get(&p, b"after").unwrap(), Some(b"reopen".to_vec()));
    assert_eq!(store.get(&p, &big_key(0)).unwrap(), Some(value_of(0)));
    assert_eq!(
        store.get(&p, &big_key(keys / 2)).unwrap(),
        Some(value_of(keys / 2))
    );
}

/// Issue 8 item 1, at the size that broke: 100,000 keys of 1 KiB make a base of about 100 MiB,
/// over the 80 MiB a record may hold. Slow in debug builds: `.ci/run` runs it in release.
#[test]
#[ignore = "long lane: about 100 MiB of keys; run by .ci/run in release"]
fn a_partition_of_100_000_one_kib_keys_survives_compaction_and_reopen() {
    huge_partition_survives_compaction_and_reopen(100_000);
}

/// The same path in the default lane: 20,000 keys of 1 KiB make a base of about 20 MiB, which
/// is written as several records.
#[test]
fn a_partition_whose_base_needs_several_records_survives_compaction_and_reopen() {
    huge_partition_survives_compaction_and_reopen(20_000);
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

/// A base split over several records counts only when the whole run reached the disk: a crash
/// that keeps its first part and loses the last leaves a partition that loads from the batches
/// before the run, with nothing lost and nothing reported as damage. Runs of packed parts
/// (format version 3) and of version 2's parts alike.
#[test]
fn a_base_run_cut_short_by_a_crash_is_passed_over() {
    base_run_cut_short(false);
}

#[test]
fn a_base_run_of_format_version_2_cut_short_by_a_crash_is_passed_over() {
    base_run_cut_short(true);
}

fn base_run_cut_short(version_2: bool) {
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("huge").unwrap();
    const KEYS: u32 = 10_000;
    const OVERWRITES: u32 = 1_300;
    {
        let store = FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .auto_compact(false)
            .open()
            .unwrap();
        store.set_version_2_records_for_test(version_2);
        for first in (0..KEYS).step_by(500) {
            let batch =
                (first..first + 500).fold(Batch::new(), |b, i| b.put(big_key(i), value_of(i)));
            assert!(store.apply(&p, &batch).unwrap().is_committed());
        }
        // Enough batches after the keys for a base to fall due (one eighth of the key count).
        for n in 0..OVERWRITES {
            let batch = Batch::new().put(b"counter".to_vec(), n.to_le_bytes().to_vec());
            assert!(store.apply(&p, &batch).unwrap().is_committed());
        }
        store.flush().unwrap();
        // A crash: no clean close, so no snapshot names the run.
        std::mem::forget(store);
    }
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    std::fs::remove_file(copy.path().join("LOCK")).unwrap();
    let mut segments: Vec<_> = std::fs::read_dir(copy.path().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segments.sort();
    let newest = segments.last().unwrap();
    let bytes = std::fs::read(newest).unwrap();
    let parts: Vec<_> = layout::records(&bytes)
        .into_iter()
        .filter(|r| r.kind == if version_2 { 3 } else { 5 })
        .collect();
    assert!(parts.len() >= 2, "the base was split: {parts:?}");
    // Lose the last part of the run, and whatever followed it.
    let cut = parts.last().unwrap().offset;
    std::fs::OpenOptions::new()
        .write(true)
        .open(newest)
        .unwrap()
        .set_len(cut as u64)
        .unwrap();

    let store = FileStore::open(copy.path()).unwrap();
    assert!(store.open_report().damaged.is_empty());
    for i in [0, KEYS / 3, KEYS - 1] {
        assert_eq!(
            store.get(&p, &big_key(i)).unwrap(),
            Some(value_of(i)),
            "key {i}"
        );
    }
    // The batches after the run were cut with it: the counter holds the value of the batch
    // that made the base fall due.
    let counter = store.get(&p, b"counter").unwrap().unwrap();
    let counter = u32::from_le_bytes(counter.try_into().unwrap());
    assert!(
        counter > KEYS / 8 - 100 && counter < OVERWRITES - 1,
        "{counter}"
    );
    let all = store.scan(&p, &KeyRange::all(), None, 100_000).unwrap();
    assert_eq!(all.entries.len() as u32, KEYS + 1);
    // The partition takes new writes, and a later base run is whole again.
    for n in 0..OVERWRITES {
        let batch = Batch::new().put(b"again".to_vec(), n.to_le_bytes().to_vec());
        assert!(store.apply(&p, &batch).unwrap().is_committed());
    }
    store.close().unwrap();
    let store = FileStore::open(copy.path()).unwrap();
    assert_eq!(store.get(&p, &big_key(7)).unwrap(), Some(value_of(7)));
    let all = store.scan(&p, &KeyRange::all(), None, 100_000).unwrap();
    assert_eq!(all.entries.len() as u32, KEYS + 2);
}

/// Issue 8 item 12, per segment: the dead-byte counts that start compaction by itself survive
/// restarts. Each session overwrites every value once with compaction off, so the segments of
/// the session before it die; a store that forgot its counts at every open would never take
/// them. Reopened with compaction on, the store compacts them at once, before any commit. The
/// same store with its snapshot's counts unreadable (the file of format version 2, which had
/// none: the negative control) compacts nothing at open.
#[test]
fn the_dead_byte_counts_survive_restarts_and_start_compaction_at_open() {
    let with_counts = sessions_then_reopen(false);
    assert!(with_counts >= 1, "the counts start a compaction at open");
    let without = sessions_then_reopen(true);
    assert_eq!(
        without, 0,
        "a snapshot without counts starts nothing at open"
    );
}

/// Three sessions of overwrites with compaction off, then an open with compaction on; returns
/// the compactions that open started (and checks what they left).
fn sessions_then_reopen(forget_counts: bool) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("p").unwrap();
    let open = |auto: bool| {
        FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .segment_bytes(64 << 10)
            .auto_compact(auto)
            .open()
            .unwrap()
    };
    let write_every_key = |store: &FileStore, session: u8| {
        for k in 0..200u32 {
            let mut value = vec![session; 1000];
            value[..4].copy_from_slice(&k.to_le_bytes());
            let batch = Batch::new().put(format!("k{k:03}").into_bytes(), value);
            assert!(store.apply(&p, &batch).unwrap().is_committed());
        }
    };
    let (mut estimate, mut counts) = (0, Vec::new());
    for session in 0..3u8 {
        let store = open(false);
        assert_eq!(
            (store.stats().garbage_bytes, store.dead_bytes_by_segment()),
            (estimate, counts.clone()),
            "session {session} starts from the counts the last one left"
        );
        write_every_key(&store, session);
        // Every value of the session before died (200 KB), with records bases superseded.
        let now = store.stats().garbage_bytes;
        let overwritten = if session == 0 { 0 } else { 200 * 1000 };
        assert!(
            now >= estimate + overwritten,
            "session {session}: {now} after {estimate}"
        );
        (estimate, counts) = (store.stats().garbage_bytes, store.dead_bytes_by_segment());
        store.close().unwrap();
    }
    if forget_counts {
        let snapshot = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "snap"))
            .unwrap();
        let mut bytes = std::fs::read(&snapshot).unwrap();
        layout::set_envelope_version(&mut bytes, 2);
        std::fs::write(&snapshot, bytes).unwrap();
    }
    let store = open(true);
    let started = store.background_compactions();
    let segments = store.stats().segments;
    store.wait_for_background_compactions();
    if started > 0 {
        assert!(store.stats().compactions >= 1);
        assert!(store.stats().segments < segments, "{:?}", store.stats());
        assert!(
            store.stats().garbage_bytes < estimate / 2,
            "{:?}",
            store.stats()
        );
    }
    for k in [0u32, 199] {
        let value = store
            .get(&p, format!("k{k:03}").as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(value[999], 2);
    }
    store.close().unwrap();
    started
}

/// A compaction started by garbage runs once per trigger, not again and again in the
/// background: here the garbage lies in segments kept as the evidence of a damaged partition,
/// so no compaction can reclaim it (they are due no more once kept). A background run that
/// repeated compactions while garbage was due never finished (the waiter below gave up). The
/// reopen itself starts the one compaction (the snapshot counted those segments due); the
/// commit after it starts none.
#[test]
fn garbage_no_compaction_can_reclaim_starts_one_compaction_per_trigger() {
    let dir = tempfile::tempdir().unwrap();
    let open = |auto: bool| {
        FileStore::builder(dir.path())
            .segment_bytes(16 << 10)
            .auto_compact(auto)
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()
            .unwrap()
    };
    let p = Partition::new("a").unwrap();
    let store = open(false);
    for round in 0..200u32 {
        let mut v = vec![1u8; 500];
        v[..4].copy_from_slice(&round.to_le_bytes());
        let b = Batch::new().put(format!("k{}", round % 5).into_bytes(), v);
        assert!(store.apply(&p, &b).unwrap().is_committed());
    }
    store.close().unwrap();
    let mut files: Vec<_> = std::fs::read_dir(dir.path().join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // Damage in the partition's newest record: its load fails, so every segment holding its
    // records is kept.
    let newest = files.last().unwrap();
    let mut bytes = std::fs::read(newest).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0xff;
    std::fs::write(newest, &bytes).unwrap();

    let store = open(true);
    let (garbage, segments) = (store.stats().garbage_bytes, store.stats().segments);
    let other = Partition::new("b").unwrap();
    assert!(
        store
            .apply(&other, &Batch::new().put("k", "v"))
            .unwrap()
            .is_committed()
    );
    assert_eq!(store.background_compactions(), 1, "garbage {garbage}");
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = store.clone();
    std::thread::spawn(move || {
        waiter.wait_for_background_compactions();
        let _ = done.send(());
    });
    // A bound on a hang, not a synchronisation: the run ends at once when it is right.
    assert!(
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_ok(),
        "the background run kept compacting ({} compactions)",
        store.stats().compactions
    );
    assert_eq!(store.stats().compactions, 1);
    assert_eq!(store.stats().segments, segments, "nothing was reclaimable");
    store.close().unwrap();
}

/// Compaction leaves alone a partition none of whose values lies in its victims only when its
/// chain since its newest base does not pass through one either: here a partition's newest
/// record (a delete, which holds no value) lies in a segment that falls due because another
/// partition's overwrites died there. Compaction rewrites it (a base in the tail), so it loads
/// after a reopen. With the chain check off (the negative control) compaction leaves it alone,
/// deletes the segment its chain needs, and the reopened store refuses it as damaged.
#[test]
fn a_partition_whose_chain_passes_through_a_victim_is_rewritten() {
    assert_eq!(chain_through_victim(false).unwrap(), Some(b"kept".to_vec()));
}

#[test]
fn control_without_the_chain_check_a_partition_loses_its_chain() {
    let read = chain_through_victim(true);
    assert!(
        matches!(read, Err(portcullis::Error::Corrupt { .. })),
        "{read:?}"
    );
}

fn chain_through_victim(chain_check_off: bool) -> Result<Option<Vec<u8>>, portcullis::Error> {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .segment_bytes(4096)
            .base_every_records(1000)
            .open()
            .unwrap()
    };
    let store = open();
    store.set_compaction_chain_check_off_for_test(chain_check_off);
    let (p, q, r) = (
        Partition::new("p").unwrap(),
        Partition::new("q").unwrap(),
        Partition::new("r").unwrap(),
    );
    let put = |part: &Partition, key: &str, value: &[u8]| {
        let b = Batch::new().put(key.as_bytes().to_vec(), value.to_vec());
        assert!(store.apply(part, &b).unwrap().is_committed());
    };
    // The first segment: p's value, and r's live values after it.
    put(&p, "k", b"kept");
    let first = store.stats().segments;
    let mut n = 0;
    while store.stats().segments == first {
        put(&r, &format!("r{n}"), &[1; 300]);
        n += 1;
    }
    // The second: p's newest record, a delete, then q's overwrites, most of them dead.
    let gone = Batch::new().delete(b"absent".to_vec());
    assert!(store.apply(&p, &gone).unwrap().is_committed());
    let second = store.stats().segments;
    while store.stats().segments == second {
        put(&q, "x", &[2; 300]);
    }
    // The commit that sealed the second segment started its compaction.
    store.wait_for_background_compactions();
    assert!(store.stats().compactions >= 1, "{:?}", store.stats());
    store.close().unwrap();
    let store = open();
    let read = store.get(&p, b"k");
    store.close().unwrap();
    read
}

/// A background compaction that fails is not started again at once: its victims stay due, and
/// the next commit asks again. A run that started a new one whenever segments were still due
/// after a failure kept failing and starting again for as long as the store lived (a store
/// dropped without a close while its directory was removed spun on the rayon pool; here, every
/// sync failing, the waiter below gave up).
#[test]
fn a_background_compaction_that_fails_is_not_started_again_at_once() {
    let fs = portcullis::store::FaultFs::new();
    let open = |auto: bool| {
        FileStore::builder("/db")
            .vfs(std::sync::Arc::new(fs.clone()))
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .segment_bytes(4096)
            .auto_compact(auto)
            .open()
            .unwrap()
    };
    let store = open(false);
    let p = Partition::new("p").unwrap();
    for n in 0..100u32 {
        let b = Batch::new().put(b"k".to_vec(), vec![n as u8; 300]);
        assert!(store.apply(&p, &b).unwrap().is_committed());
    }
    store.close().unwrap();
    // Reopened with its dead segments due, it compacts at once; every sync fails.
    fs.fail_syncs();
    let store = open(true);
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = store.clone();
    std::thread::spawn(move || {
        waiter.wait_for_background_compactions();
        let _ = done.send(());
    });
    // A bound on a hang, not a synchronisation: the run ends at once when it is right.
    assert!(
        finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_ok(),
        "the failing compaction kept starting again ({} runs)",
        store.background_compactions()
    );
    assert_eq!(store.background_compactions(), 1);
    assert_eq!(store.stats().compactions, 0);
    assert!(!store.dead_bytes_by_segment().is_empty(), "still due");
}
