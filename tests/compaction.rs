//! Compaction of the file-backed store (SPEC S7): a partition of any size survives compaction
//! and reopen, and the garbage estimate that starts compaction by itself survives restarts.

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
/// before the run, with nothing lost and nothing reported as damage.
#[test]
fn a_base_run_cut_short_by_a_crash_is_passed_over() {
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
        .filter(|r| r.kind == 3)
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

/// Issue 8 item 12: the garbage estimate that starts compaction by itself survives restarts.
/// Each session overwrites every value once, so each makes less garbage than half the journal,
/// while together they make far more. A store that forgot its estimate at every open never
/// compacted; this one starts a compaction in the third session and it reclaims the garbage.
#[test]
fn the_garbage_estimate_survives_restarts_and_starts_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("p").unwrap();
    let open = || {
        FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .segment_bytes(64 << 10)
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
    let mut estimate = 0;
    for session in 0..2u8 {
        let store = open();
        assert_eq!(
            store.stats().garbage_bytes,
            estimate,
            "session {session} starts from the estimate the last one left"
        );
        write_every_key(&store, session);
        assert_eq!(store.background_compactions(), 0, "session {session}");
        estimate = store.stats().garbage_bytes;
        assert_eq!(estimate, u64::from(session) * 200 * 1000);
        store.close().unwrap();
    }
    let store = open();
    assert_eq!(store.stats().garbage_bytes, estimate, "the third session");
    let segments = store.stats().segments;
    write_every_key(&store, 2);
    assert!(
        store.background_compactions() >= 1,
        "the garbage of three sessions starts a compaction (estimate {})",
        store.stats().garbage_bytes
    );
    store.wait_for_background_compactions();
    assert!(store.stats().compactions >= 1);
    assert!(store.stats().segments < segments, "{:?}", store.stats());
    for k in [0u32, 199] {
        let value = store
            .get(&p, format!("k{k:03}").as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(value[999], 2);
    }
    store.close().unwrap();
}

/// A compaction started by garbage runs once per trigger, not again and again in the
/// background while the estimate stays high: here the garbage lies in segments kept as the
/// evidence of a damaged partition, so no compaction can lower it. A background run that
/// repeated compactions while garbage was due never finished (the waiter below gave up).
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
    let garbage = store.stats().garbage_bytes;
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
    assert_eq!(
        store.stats().garbage_bytes,
        garbage,
        "nothing was reclaimable"
    );
    store.close().unwrap();
}
