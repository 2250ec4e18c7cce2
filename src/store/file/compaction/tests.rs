//! Compaction's choice of what to move, and what it leaves due when it fails.

use super::*;
use crate::store::file::format::loc;

fn index(values: &[(&str, u32, u64, u32)]) -> partition::Index {
    values
        .iter()
        .map(|&(k, segment, offset, len)| {
            let v = ValueLoc {
                at: loc(segment, offset),
                len,
                crc: 0,
            };
            (Box::from(k.as_bytes()), v)
        })
        .collect()
}

fn keys(movers: &[Mover]) -> Vec<&str> {
    movers
        .iter()
        .map(|(k, _)| std::str::from_utf8(k).unwrap())
        .collect()
}

/// Runs are gathered smallest first while each is no larger than what is gathered so far;
/// a larger run stays where it is.
#[test]
fn runs_are_gathered_smallest_first_while_no_larger_than_the_total() {
    let victims: HashSet<u32> = [5].into_iter().collect();
    let index = index(&[
        // An old run of 400 bytes in segment 2, a lone value far from it, one of 100 in
        // segment 3.
        ("a", 2, 1000, 200),
        ("b", 2, 1200, 200),
        ("g", 2, 900_000, 60),
        ("c", 3, 500, 100),
        // 150 bytes in the victim.
        ("d", 5, 100, 150),
        // Two lone values in segment 7, far apart: two runs of 50.
        ("e", 7, 100, 50),
        ("f", 7, 900_000, 50),
    ]);
    let (movers, gathered) = movers(&index, &victims);
    // 150, then 50, 50, 60 and 100 join (each no more than the total so far: 410); the
    // run of 400 does too; nothing is left.
    assert_eq!(keys(&movers), vec!["a", "b", "c", "d", "e", "f", "g"]);
    assert_eq!(gathered, 660);
    // With less in the victims the large run stays: 60, then 50, 50, 60, 100 (total 320).
    let mut small = index.clone();
    small.get_mut(&b"d"[..]).unwrap().len = 60;
    let (moved, gathered) = super::movers(&small, &victims);
    assert_eq!(keys(&moved), vec!["c", "d", "e", "f", "g"]);
    assert_eq!(gathered, 260);
    // Nothing in the victims: nothing moves.
    let (movers, gathered) = movers_of_none(&index);
    assert!(movers.is_empty() && gathered == 0);
}

fn movers_of_none(index: &partition::Index) -> (Vec<Mover>, u64) {
    movers(index, &[9].into_iter().collect())
}

/// A store on the fault-injecting disk whose sealed segments are all due (histories written in
/// turns), with nothing compacted yet; and the segments due.
#[cfg(feature = "fault-injection")]
fn scattered_store(fs: &crate::store::FaultFs) -> (crate::store::FileStore, Vec<u32>) {
    use crate::store::{Batch, FileStore, Partition, Store};
    let store = FileStore::builder("/db")
        .vfs(std::sync::Arc::new(fs.clone()))
        .clock(std::sync::Arc::new(crate::ManualClock::new(1_000)))
        .segment_bytes(4096)
        .snapshot_every_bytes(1 << 40)
        .auto_compact(false)
        .open()
        .unwrap();
    for i in 0..60u32 {
        let p = Partition::new(format!("p{}", i % 6)).unwrap();
        let b = Batch::new().put(format!("k{i}").into_bytes(), vec![i as u8; 300]);
        assert!(store.apply(&p, &b).unwrap().is_committed());
    }
    let inner = &store.inner;
    let due = inner.scatter.due(inner.journal.sealed_through() + 1);
    assert!(
        due.len() >= 3,
        "the workload left too few segments due: {due:?}"
    );
    (store, due)
}

/// A compaction of the due segments that fails at any one operation (a transient I/O error:
/// reading a victim, rewriting a partition, syncing, writing the snapshot, removing a segment)
/// leaves every segment it did not remove due, so the next compaction takes it; and that one,
/// with the disk healthy again, removes them all. Before, a victim whose read failed was
/// counted as evidence and forgotten, and so was every victim of a compaction that failed
/// later: scattered for good.
#[cfg(feature = "fault-injection")]
#[test]
fn a_compaction_that_fails_anywhere_leaves_its_victims_due() {
    use crate::store::{FailMode, FaultFs, Store};
    // How many operations a clean compaction of the due segments makes.
    let fs = FaultFs::new();
    let (store, due) = scattered_store(&fs);
    let before = fs.ops();
    let report = compact(&store.inner, Pick::Due).unwrap();
    assert_eq!(report.segments_removed as usize, due.len());
    let ops = fs.ops() - before;
    drop(store);

    let mut failed = 0;
    for k in 1..=ops {
        let fs = FaultFs::new();
        let (store, due) = scattered_store(&fs);
        fs.fail_at(fs.ops() + k, FailMode::Once);
        let outcome = compact(&store.inner, Pick::Due);
        let inner = &store.inner;
        let live = inner.journal.live_segments();
        let still_due = inner.scatter.due(inner.journal.sealed_through() + 1);
        for n in due.iter().filter(|n| live.contains(n)) {
            assert!(
                still_due.contains(n),
                "operation {k} of the compaction failed ({:?}; {outcome:?}): segment {n} is \
                 still there but no longer due",
                fs.injected()
            );
        }
        if let Ok(report) = &outcome {
            assert_eq!(
                report.segments_kept, 0,
                "{k}: {report:?}: nothing is damaged"
            );
        }
        failed += outcome.is_err() as u32;
        // A failed journal write or sync is latched until a reopen (SPEC S3); anything else
        // leaves the store able to finish the job at once.
        if inner.journal.failed().is_none() {
            compact(inner, Pick::Due).unwrap();
            let live = inner.journal.live_segments();
            let left: Vec<_> = due.iter().filter(|n| live.contains(n)).collect();
            assert!(left.is_empty(), "{k}: segments {left:?} were never taken");
            for i in 0..6 {
                let p = crate::store::Partition::new(format!("p{i}")).unwrap();
                assert!(store.get(&p, b"k0").is_ok());
            }
        }
    }
    assert!(failed > 0, "toothless: no failure made a compaction fail");
}
