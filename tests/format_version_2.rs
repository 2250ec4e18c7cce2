//! SPEC S10: a store written by format version 2 (its files say version 2, its bases hold whole
//! keys and locations, compaction's copies are batches) is read by this build, takes new
//! writes in version 3's records next to the old ones, and is rewritten by compaction; every
//! value reads back at every step.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::layout;
use portcullis::store::{
    Batch, FaultFs, FileStore, FileStoreBuilder, KeyRange, Partition, Store, SyncPolicy, Vfs,
};

const DIR: &str = "/db";

fn builder(fs: &FaultFs) -> FileStoreBuilder {
    FileStore::builder(DIR)
        .vfs(Arc::new(fs.clone()))
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .segment_bytes(16 << 10)
        .base_every_records(4)
        .auto_compact(false)
}

type Model = BTreeMap<(u64, Vec<u8>), Vec<u8>>;

fn partition(p: u64) -> Partition {
    Partition::new(format!("p/{p}")).unwrap()
}

/// Round `round` of the workload: puts, overwrites and deletes over five partitions.
fn write_round(store: &FileStore, model: &mut Model, round: u64) {
    for p in 0..5u64 {
        let key = format!("k{:03}", (round * 7 + p) % 40).into_bytes();
        let mut batch = Batch::new().put(key.clone(), vec![(round + p) as u8; 100 + p as usize]);
        model.insert((p, key), vec![(round + p) as u8; 100 + p as usize]);
        if round % 5 == 4 {
            let gone = format!("k{:03}", (round * 3 + p) % 40).into_bytes();
            batch = batch.delete(gone.clone());
            model.remove(&(p, gone));
        }
        assert!(store.apply(&partition(p), &batch).unwrap().is_committed());
    }
}

fn check(store: &FileStore, model: &Model, when: &str) {
    for p in 0..5u64 {
        let page = store
            .scan(&partition(p), &KeyRange::all(), None, 1000)
            .unwrap();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = model
            .range((p, Vec::new())..(p + 1, Vec::new()))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect();
        assert!(page.entries == expected, "{when}: partition {p}");
    }
}

fn files(fs: &FaultFs, dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for name in fs.list(dir).unwrap() {
        let path = dir.join(name);
        match fs.kind(&path).unwrap() {
            Some(portcullis::store::PathKind::Dir) => out.extend(files(fs, &path)),
            Some(_) => out.push(path),
            None => {}
        }
    }
    out
}

/// Rewrites every file's format version as version 2 wrote it: the preamble of every file, and
/// a segment header's own checksum (which covers the preamble).
fn say_version_2(fs: &FaultFs) {
    for path in files(fs, Path::new(DIR)) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "LOCK" {
            continue;
        }
        let mut bytes = fs.read_file(&path).unwrap();
        layout::set_preamble_version(&mut bytes, 2);
        if name.ends_with(".seg") {
            let crc = crc32c::crc32c(&bytes[0..28]);
            bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        }
        fs.write_file(&path, bytes).unwrap();
    }
}

/// The kinds of every record of every segment.
fn kinds(fs: &FaultFs) -> Vec<u8> {
    let mut kinds = Vec::new();
    for path in files(fs, &Path::new(DIR).join("journal")) {
        let bytes = fs.read_file(&path).unwrap();
        kinds.extend(layout::records(&bytes).iter().map(|r| r.kind));
    }
    kinds
}

#[test]
fn s10_a_store_of_format_version_2_is_read_written_and_compacted() {
    let fs = FaultFs::new();
    let mut model = Model::new();
    // Written the way version 2 wrote it: bases of whole entries, compaction's copies as
    // batches, and a compaction in the middle so both kinds lie in the journal.
    let store = builder(&fs).open().unwrap();
    store.set_version_2_records_for_test(true);
    for round in 0..120 {
        write_round(&store, &mut model, round);
        if round == 60 {
            store.compact().unwrap();
        }
    }
    store.close().unwrap();
    let old = kinds(&fs);
    assert!(
        old.contains(&2) && old.iter().all(|k| (1..=3).contains(k)),
        "{old:?}"
    );
    say_version_2(&fs);

    // This build reads it all, from the snapshot version 2 wrote (no per-segment counts).
    let store = builder(&fs).open().unwrap();
    assert!(store.open_report().damaged.is_empty());
    assert!(store.open_report().refused.is_empty());
    assert_eq!(store.stats().garbage_bytes, 0, "version 2 kept no counts");
    check(&store, &model, "reopened");
    // New writes go in version 3's records, next to the old ones; the loads that follow walk
    // chains through both.
    for round in 120..200 {
        write_round(&store, &mut model, round);
    }
    check(&store, &model, "written");
    store.close().unwrap();
    let store = builder(&fs).open().unwrap();
    check(&store, &model, "reopened after writing");
    let mixed = kinds(&fs);
    assert!(mixed.contains(&2) && mixed.contains(&4), "{mixed:?}");
    // Compaction rewrites every partition in version 3's records.
    let report = store.compact().unwrap();
    assert!(report.segments_removed > 0, "{report:?}");
    check(&store, &model, "compacted");
    store.close().unwrap();
    let store = builder(&fs).open().unwrap();
    check(&store, &model, "reopened after compaction");
    store.close().unwrap();
    let new = kinds(&fs);
    assert!(
        new.contains(&6) && !new.contains(&2) && !new.contains(&3),
        "{new:?}"
    );
}
