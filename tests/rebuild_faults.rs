//! A full-scan rebuild on a store whose compaction deleted segments (SPEC S4, S7): the rebuild
//! must know which gaps compaction left on purpose, from the newest heads snapshot that reads
//! back intact when no manifest says it, whether the manifest is missing, damaged, or was set
//! aside by a rebuild that was killed, failed or lost power. Otherwise it takes the gap for a
//! loss and refuses, for good, every partition not written since and every partition the store
//! does not know.
//!
//! The store ([`compacted_with_a_gap`]) keeps its first segment (it holds a damaged record of
//! [`DAMAGED`]) and deletes the next ones; [`QUIET`] lives only in the first segment. A rebuild
//! finds the damaged record and refuses [`DAMAGED`], and so does its first load in any case:
//! that, and nothing else, may be refused.

mod common;

use std::path::Path;

use common::disk::{DAMAGED, DIR, QUIET, Tally, builder, compacted_with_a_gap, damage, files};
use portcullis::Error;
use portcullis::store::{FailMode, FaultFs, FileStore, Partition, Store, Vfs};

fn manifest() -> std::path::PathBuf {
    Path::new(DIR).join("MANIFEST")
}

/// Flips a bit of the manifest's body: it reads back wrong (a checksum mismatch).
fn damage_manifest(fs: &FaultFs) {
    damage(fs, &manifest(), |b| {
        let last = b.len() - 1;
        b[last] ^= 0x01
    });
}

/// Checks that `store` refuses [`DAMAGED`] and nothing else (no damage without a name either),
/// serves every other partition its newest value and a partition it does not know as absent.
fn refuses_only_what_is_damaged(store: &FileStore, tally: &Tally, what: &str) {
    let refused = tally.refused(store);
    assert_eq!(refused, [DAMAGED], "{what}: {:?}", store.damage());
    assert!(
        store.damage().unattributed.is_empty(),
        "{what}: {:?}",
        store.damage()
    );
    let unknown = Partition::new("never-written").unwrap();
    assert_eq!(store.get(&unknown, b"v").unwrap(), None, "{what}");
    let quiet = Partition::new(QUIET).unwrap();
    assert_eq!(
        store.get(&quiet, b"v").unwrap().as_deref(),
        Some(tally.newest(QUIET))
    );
}

/// Opens `fs` twice (the second open reads what the first persisted) and checks both.
fn reopens_refusing_only_what_is_damaged(fs: &FaultFs, tally: &Tally, what: &str) {
    for round in ["open", "second open"] {
        let store = builder(fs)
            .open()
            .unwrap_or_else(|e| panic!("{what}, {round}: {e}"));
        refuses_only_what_is_damaged(&store, tally, &format!("{what}, {round}"));
        store.close().unwrap();
    }
}

/// Issue 24, defect 2: with the manifest missing, the rebuild reads what the newest heads
/// snapshot records: the segments compaction deleted (a gap, not a loss) and the refusals.
#[test]
fn a_rebuild_without_the_manifest_uses_what_the_newest_snapshot_knows() {
    let (fs, tally) = compacted_with_a_gap();
    fs.remove(&manifest()).unwrap();
    let store = builder(&fs).open().unwrap();
    assert!(store.open_report().rebuilt_by_full_scan);
    refuses_only_what_is_damaged(&store, &tally, "rebuilt");
    store.close().unwrap();
    reopens_refusing_only_what_is_damaged(&fs, &tally, "after the rebuild");
}

/// A damaged manifest is set aside and the store rebuilt with what the newest snapshot knows;
/// the damaged file is kept as evidence.
#[test]
fn a_rebuild_after_a_damaged_manifest_uses_what_the_newest_snapshot_knows() {
    let (fs, tally) = compacted_with_a_gap();
    damage_manifest(&fs);
    let store = builder(&fs).open().unwrap();
    assert!(store.open_report().rebuilt_by_full_scan);
    refuses_only_what_is_damaged(&store, &tally, "rebuilt");
    store.close().unwrap();
    assert!(
        fs.read_file(&Path::new(DIR).join("MANIFEST.damaged"))
            .is_some()
    );
    reopens_refusing_only_what_is_damaged(&fs, &tally, "after the rebuild");
}

/// Issue 24, defect 2: a rebuild (of a damaged manifest) killed, or cut by a power cut, at
/// every operation leaves a store that opens refusing nothing that was not damaged.
#[test]
fn a_rebuild_killed_at_any_operation_refuses_nothing_healthy() {
    let (image, tally) = compacted_with_a_gap();
    damage_manifest(&image);
    let fs = image.crash_process();
    fs.record_crash_points();
    let store = builder(&fs).open().unwrap();
    assert!(store.open_report().rebuilt_by_full_scan);
    store.close().unwrap();
    let points = fs.take_crash_points();
    assert!(points.len() > 10, "{points:?}");
    for point in &points {
        reopens_refusing_only_what_is_damaged(&point.kill(), &tally, &format!("killed {point:?}"));
        for seed in 0..3 {
            reopens_refusing_only_what_is_damaged(
                &point.power_cut(seed),
                &tally,
                &format!("power cut {point:?}, seed {seed}"),
            );
        }
    }
}

/// Issue 24, defect 2: a rebuild (of a damaged manifest) with each of its operations failing
/// once answers `Io` or rebuilds with what the newest snapshot knows; either way the next open
/// refuses nothing that was not damaged, and a rebuild that failed before it set the damaged
/// manifest aside changed nothing on disk. Before, an error reading the snapshot the rebuild
/// takes its knowledge from was taken for "nothing known".
#[test]
fn a_rebuild_with_each_operation_failing_once_refuses_nothing_healthy() {
    let (image, tally) = compacted_with_a_gap();
    damage_manifest(&image);
    let before = files(&image);
    let (ops, set_aside_at) = {
        let fs = image.crash_process();
        fs.record_crash_points();
        let store = builder(&fs).open().unwrap();
        assert!(store.open_report().rebuilt_by_full_scan);
        let ops = fs.ops();
        let rename = fs
            .take_crash_points()
            .into_iter()
            .find(|p| p.what.starts_with("rename /db/MANIFEST "))
            .expect("the damaged manifest is set aside");
        (ops, rename.op)
    };
    let mut failed_opens = 0;
    for k in 1..=ops {
        let fs = image.crash_process();
        fs.fail_at(k, FailMode::Once);
        let what = || {
            format!(
                "operation {k} ({}) failing once",
                fs.injected().unwrap_or_default()
            )
        };
        match builder(&fs).open() {
            Ok(store) => {
                refuses_only_what_is_damaged(&store, &tally, &what());
                store.close().unwrap();
            }
            Err(e) => {
                assert!(matches!(e, Error::Io { .. }), "{}: {e:?}", what());
                // Whatever the order of its steps, a failed read leaves the disk as it was.
                let read = ["open Read ", "list ", "kind ", "read_at ", "len "]
                    .iter()
                    .any(|op| fs.injected().unwrap_or_default().starts_with(op));
                assert!(
                    (k >= set_aside_at && !read) || files(&fs) == before,
                    "{}: a failed rebuild changed the disk",
                    what()
                );
                failed_opens += 1;
            }
        }
        reopens_refusing_only_what_is_damaged(&fs, &tally, &format!("{}, reopened", what()));
    }
    assert!(failed_opens > 0, "no failure reached the caller");
}
