//! Open reads no sealed segment older than the heads snapshot (SPEC S5): such a segment is
//! opened, and its header checked, by the first read that needs it. Damage found that way is
//! still never skipped silently (SPEC S4): the partitions that need the segment are refused
//! with `Corrupt` naming it, the refusal is recorded and survives close and reopen, and every
//! other partition keeps working. Runs on [`FaultFs`] so the tests damage exact bytes.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::check::{Model, check_store};
use common::disk::{
    BATCHES, KEEPER, KEPT, builder, damage, put_filled, segment_number, segments,
    value_in_a_sealed_segment, written_after_keeper,
};
use common::layout;
use common::traced::Traced;
use portcullis::Error;
use portcullis::store::{Batch, FaultFs, FileStore, Partition, SkipSync, Store, Vfs};

fn keeper() -> Partition {
    Partition::new(KEEPER).unwrap()
}

/// Asserts that `p` is refused with `Corrupt` naming `segment`, by a read and by a write, and
/// listed by `FileStore::damage`.
fn assert_refused_for(store: &FileStore, p: &Partition, key: &[u8], segment: u32) {
    let read = store.get(p, key);
    match &read {
        Err(e @ Error::Corrupt { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("segment {segment}")), "{msg}");
        }
        other => panic!("{p}: a read answered {other:?}"),
    }
    let write = store.apply(p, &Batch::new().put(key.to_vec(), b"new".to_vec()));
    assert!(
        matches!(write, Err(Error::Corrupt { .. })),
        "{p}: a write answered {write:?}"
    );
    let listed = store.damage();
    assert!(
        listed
            .partitions
            .iter()
            .any(|r| r.partition.as_ref() == Some(p)),
        "{p} is not listed as refused: {listed:?}"
    );
}

/// Every workload partition still answers exactly what was committed.
fn assert_others_work(store: &FileStore) {
    let mut model = Model::default();
    assert_eq!(
        check_store(&mut model, store, BATCHES, BATCHES),
        Ok(BATCHES)
    );
}

/// The keeper's store, closed cleanly, or reopened, written to and left by a killed process
/// (open then scans the journal after the snapshot the clean close wrote).
fn closed_or_killed_after_a_snapshot(clean_close: bool) -> FaultFs {
    let fs = written_after_keeper(true);
    if clean_close {
        return fs;
    }
    let store = builder(&fs).open().unwrap();
    let late = Partition::new("late").unwrap();
    let put = Batch::new().put(b"v".to_vec(), b"after the snapshot".to_vec());
    assert!(store.apply(&late, &put).unwrap().is_committed());
    let image = fs.crash_process();
    drop(store);
    image
}

#[test]
fn a_damaged_header_of_a_sealed_segment_refuses_the_partitions_that_need_it_and_survives_reopen() {
    for clean_close in [true, false] {
        let fs = closed_or_killed_after_a_snapshot(clean_close);
        let first = segments(&fs)[0].clone();
        let n = segment_number(&first);
        damage(&fs, &first, |b| b[17] ^= 0x40);
        let store = builder(&fs)
            .open()
            .unwrap_or_else(|e| panic!("clean close {clean_close}: open failed: {e}"));
        assert_refused_for(&store, &keeper(), KEPT.0, n);
        assert_others_work(&store);
        store.close().unwrap();

        // Recorded: the next open refuses it before anything reads the segment again.
        let store = builder(&fs).open().unwrap();
        let listed = store.damage();
        assert!(
            listed
                .partitions
                .iter()
                .any(|r| r.partition.as_ref() == Some(&keeper())),
            "clean close {clean_close}: the refusal did not survive reopen: {listed:?}"
        );
        assert_refused_for(&store, &keeper(), KEPT.0, n);
        assert_others_work(&store);
        // The damaged segment is kept as evidence.
        assert!(fs.read_file(&first).is_some());
    }
}

#[test]
fn a_segment_missing_from_the_directory_refuses_the_partitions_that_need_it() {
    for clean_close in [true, false] {
        let fs = closed_or_killed_after_a_snapshot(clean_close);
        let first = segments(&fs)[0].clone();
        let n = segment_number(&first);
        fs.remove(&first).unwrap();
        let store = builder(&fs).open().unwrap();
        assert_refused_for(&store, &keeper(), KEPT.0, n);
        let err = store.get(&keeper(), KEPT.0).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        assert_others_work(&store);
        store.close().unwrap();
        let store = builder(&fs).open().unwrap();
        assert_refused_for(&store, &keeper(), KEPT.0, n);
        assert_others_work(&store);
    }
}

/// A partition whose chain (since its newest base record) avoids the damaged segment but one
/// of whose values lives there: its load checks the segments of its values, so it is refused
/// as a whole and the refusal recorded, not served with one value failing.
fn value_only_in_damaged_segment(check: bool) {
    let fs = FaultFs::new();
    let (store, big, holder) = value_in_a_sealed_segment(&fs);
    let late = Partition::new("late").unwrap();
    put_filled(&store, &late, "v", 10);
    store.close().unwrap();
    let n = segment_number(&holder);
    damage(&fs, &holder, |b| b[17] ^= 0x40);

    let mut b = builder(&fs);
    if !check {
        b = b.skip_sync(SkipSync::ValueSegmentCheck);
    }
    let store = b.open().unwrap();
    assert_refused_for(&store, &big, b"k7", n);
    assert_eq!(store.get(&late, b"v").unwrap(), Some(vec![b'x'; 10]));
}

#[test]
fn a_partition_with_a_value_in_a_damaged_segment_is_refused_at_its_load() {
    value_only_in_damaged_segment(true);
}

/// Negative control: without the load's check of its values' segments, the partition loads
/// and is never refused.
#[test]
#[should_panic(expected = "a read answered Ok")]
fn negative_control_without_the_value_segment_check_the_partition_is_served() {
    value_only_in_damaged_segment(false);
}

/// The journal files an open of the store touched, by file name.
fn segments_touched(calls: &[String]) -> Vec<String> {
    let mut touched: Vec<String> = calls
        .iter()
        .filter_map(|c| c.split_once(' ').map(|(_, path)| path))
        .filter(|path| path.ends_with(".seg"))
        .map(|path| {
            Path::new(path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    touched.sort();
    touched.dedup();
    touched
}

#[test]
fn open_opens_no_sealed_segment_and_a_read_opens_only_what_it_needs() {
    let fs = written_after_keeper(true);
    let all = segments(&fs);
    assert!(all.len() >= 4, "the workload spans several segments");
    let newest = all.last().unwrap().file_name().unwrap().to_string_lossy();
    let traced = Traced::new(Arc::new(fs.clone()));
    let store = builder(&fs).vfs(Arc::new(traced.clone())).open().unwrap();
    assert_eq!(
        segments_touched(&traced.take()),
        vec![newest.into_owned()],
        "open touched only the segment the heads snapshot points into"
    );
    // Reading the keeper opens its segment, the first one, and nothing else of the journal
    // but the segments its own records and values live in.
    assert_eq!(
        store.get(&keeper(), KEPT.0).unwrap().as_deref(),
        Some(KEPT.1)
    );
    let first = all[0].file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(segments_touched(&traced.take()), vec![first]);
    store.close().unwrap();
}

#[test]
fn a_refused_sealed_header_does_not_stop_compaction_or_later_opens() {
    let fs = written_after_keeper(true);
    let first = segments(&fs)[0].clone();
    damage(&fs, &first, |b| b[layout::VERSION_AT] ^= 0x04);
    let store = builder(&fs).open().unwrap();
    store.compact().unwrap();
    assert!(fs.read_file(&first).is_some(), "kept as evidence");
    assert!(matches!(
        store.get(&keeper(), KEPT.0),
        Err(Error::Corrupt { .. })
    ));
    assert_others_work(&store);
    store.close().unwrap();
    let store = builder(&fs).open().unwrap();
    assert!(matches!(
        store.get(&keeper(), KEPT.0),
        Err(Error::Corrupt { .. })
    ));
    assert_others_work(&store);
}

/// When the segment the heads snapshot points into is lost with everything after it, the
/// newest file left is a sealed segment open did not scan: appends go to a new segment numbered
/// past the lost one, and no sealed segment is written to.
#[test]
fn after_the_snapshots_segment_is_lost_appends_touch_no_sealed_segment() {
    let fs = written_after_keeper(true);
    let mut all = segments(&fs);
    let lost = all.pop().unwrap();
    fs.remove(&lost).unwrap();
    let sealed: Vec<_> = all.iter().map(|s| fs.read_file(s)).collect();

    let store = builder(&fs).open().unwrap();
    assert!(
        !store.open_report().damaged.is_empty(),
        "the loss is reported"
    );
    let fresh = Partition::new("fresh").unwrap();
    let put = Batch::new().put(b"v".to_vec(), b"after the loss".to_vec());
    // The loss is unattributed: an operator accepts it, and a new partition is written.
    store.accept_unattributed_damage().unwrap();
    assert!(store.apply(&fresh, &put).unwrap().is_committed());
    store.close().unwrap();

    let after: Vec<_> = all.iter().map(|s| fs.read_file(s)).collect();
    assert!(sealed == after, "a sealed segment was written to");
    assert!(
        fs.read_file(&lost).is_none(),
        "the lost segment's number was reused"
    );
    let store = builder(&fs).open().unwrap();
    assert_eq!(
        store.get(&fresh, b"v").unwrap().as_deref(),
        Some(&b"after the loss"[..])
    );
}
