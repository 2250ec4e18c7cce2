//! Preallocated journal segments (docs/DESIGN.md, "Segments and records" and "Recovery"): a
//! segment is sized up front, so a commit's sync never has a new file size to commit; a sealed
//! segment, and the tail at a clean close, is trimmed to its records; open reads the zeros of a
//! preallocated end as the end of the records, never as a torn tail or damage, while a torn
//! record before the zeros is still a torn tail and a valid record after them is still damage.
//!
//! The store runs on [`FaultFs`] with 4 KiB segments (see `common::disk`).

mod common;

use std::path::Path;

use common::check::{Model, check_store};
use common::disk::{BATCHES, Tally, builder, damage, journal, segment_number, segments, written};
use common::layout;
use portcullis::store::{FaultFs, OpenMode, SkipSync, Store, Vfs};

/// The segment size `common::disk::builder` configures.
const SEGMENT_BYTES: usize = 4096;

fn file_len(fs: &FaultFs, path: &Path) -> usize {
    fs.read_file(path).unwrap().len()
}

/// Checks that the store holds every batch of the shared workload (see `common::disk`).
fn holds_the_whole_workload(store: &dyn Store) {
    let mut model = Model::default();
    let m = check_store(&mut model, store, BATCHES, BATCHES).unwrap();
    assert_eq!(m, BATCHES, "a batch was lost");
}

/// A commit's sync must not have to commit a new file size: every write lands inside a segment
/// already sized to `segment_bytes`, the first segment of a new store and every segment a
/// rollover creates alike.
#[test]
fn appends_inside_a_segment_never_change_its_length() {
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    let mut tally = Tally::default();
    let mut seen = 0;
    for i in 0..60 {
        tally.put(&store, &format!("p{}", i % 3), 100);
        let segs = segments(&fs);
        let tail = segs.last().unwrap();
        let bytes = fs.read_file(tail).unwrap();
        assert_eq!(
            bytes.len(),
            SEGMENT_BYTES,
            "commit {i}: the tail segment {} is not at its preallocated size",
            tail.display()
        );
        assert!(layout::written_len(&bytes) < SEGMENT_BYTES);
        seen = seen.max(segs.len());
    }
    assert!(seen >= 3, "the workload spans several segments");
}

/// A sealed segment is trimmed to its records when the next one starts, so compaction,
/// inspection and disk usage see exactly its records; a clean close trims the tail too, so the
/// next open has no zeros to read, and the first write after it sizes the tail again.
#[test]
fn sealed_segments_and_a_cleanly_closed_tail_end_at_their_records() {
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    let mut tally = Tally::default();
    while segments(&fs).len() < 4 {
        tally.put(&store, "p", 300);
    }
    let segs = segments(&fs);
    for sealed in &segs[..segs.len() - 1] {
        let bytes = fs.read_file(sealed).unwrap();
        assert_eq!(
            layout::written_len(&bytes),
            bytes.len(),
            "{}",
            sealed.display()
        );
        assert!(!layout::records(&bytes).is_empty());
    }
    store.close().unwrap();
    let tail = segments(&fs).pop().unwrap();
    let bytes = fs.read_file(&tail).unwrap();
    assert_eq!(
        layout::written_len(&bytes),
        bytes.len(),
        "the close trims the tail"
    );

    let store = builder(&fs).open().unwrap();
    assert_eq!(store.open_report().journal_bytes_scanned, 0);
    assert!(store.open_report().torn_tail.is_none());
    tally.put(&store, "p", 10);
    assert_eq!(
        file_len(&fs, &tail),
        SEGMENT_BYTES,
        "the first write sizes it"
    );
    assert!(tally.refused(&store).is_empty());
}

/// A killed process leaves its tail segment preallocated: open reads the zeros after the last
/// record as the end of the journal, truncates nothing and reports nothing, and the store
/// writes on after the last record.
#[test]
fn a_killed_writer_leaves_zeros_that_open_reads_as_the_end() {
    let fs = written(false);
    let tail = segments(&fs).pop().unwrap();
    let bytes = fs.read_file(&tail).unwrap();
    let written_len = layout::written_len(&bytes);
    assert!(
        written_len < bytes.len(),
        "the tail is preallocated: {written_len} of {} bytes written",
        bytes.len()
    );
    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert_eq!(report.torn_tail, None, "{report:?}");
    assert!(report.damaged.is_empty(), "{report:?}");
    assert!(report.refused.is_empty(), "{report:?}");
    holds_the_whole_workload(&store);
    let mut tally = Tally::default();
    tally.put(&store, "after", 10);
    let now = fs.read_file(&tail).unwrap();
    assert_eq!(
        &now[..written_len],
        &bytes[..written_len],
        "nothing was cut"
    );
    assert!(
        layout::written_len(&now) > written_len,
        "the new record follows"
    );
    drop(store);
    let store = builder(&fs).open().unwrap();
    holds_the_whole_workload(&store);
    assert!(tally.refused(&store).is_empty());
}

/// A record cut short and followed by zeros (a write torn inside the preallocated space) is a
/// torn tail: cut at the record, the bytes it dropped counted up to the zeros, every batch
/// before it intact.
#[test]
fn a_torn_record_followed_by_zeros_is_a_torn_tail() {
    let fs = written(false);
    let tail = segments(&fs).pop().unwrap();
    let bytes = fs.read_file(&tail).unwrap();
    let last = *layout::records(&bytes).last().unwrap();
    let end = last.offset + layout::FRAME_LEN + last.body_len;
    let keep = last.offset + layout::FRAME_LEN + last.body_len / 2;
    damage(&fs, &tail, |b| b[keep..end].fill(0));
    let bytes = fs.read_file(&tail).unwrap();
    assert_eq!(bytes.len(), SEGMENT_BYTES, "still preallocated");
    let nonzero_end = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;

    let store = builder(&fs).open().unwrap();
    let torn = store
        .open_report()
        .torn_tail
        .clone()
        .expect("a torn tail is reported");
    assert_eq!(torn.offset, last.offset as u64);
    assert_eq!(torn.bytes_dropped, (nonzero_end - last.offset) as u64);
    assert!(store.open_report().damaged.is_empty());
    let mut model = Model::default();
    let m = check_store(&mut model, &store, BATCHES - 1, BATCHES).unwrap();
    assert_eq!(m, BATCHES - 1, "only the torn batch is lost");
}

/// Zeros where a durable record was, with valid records after them that were framed once it
/// was durable, are damage, not the end of the journal: the scan skips the zeros and finds the
/// records after them.
#[test]
fn a_valid_record_after_zeros_is_still_damage() {
    let fs = written(false);
    let tail = segments(&fs).pop().unwrap();
    let bytes = fs.read_file(&tail).unwrap();
    let records = layout::records(&bytes);
    assert!(records.len() >= 3, "the tail holds several records");
    let victim = records[records.len() - 2];
    damage(&fs, &tail, |b| {
        b[victim.offset..victim.offset + layout::FRAME_LEN + victim.body_len].fill(0)
    });
    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert_eq!(report.torn_tail, None, "{report:?}");
    assert!(
        report
            .damaged
            .iter()
            .any(|d| d.offset == victim.offset as u64),
        "{report:?}"
    );
    assert!(!report.refused.is_empty(), "{report:?}");
}

/// Records lost at the end of a sealed segment (zeros where they were) show as a gap in LSNs
/// at the next segment: damage, never a silently shorter journal.
#[test]
fn zeroed_records_at_the_end_of_a_sealed_segment_are_damage() {
    let fs = written(false);
    let segs = segments(&fs);
    assert!(segs.len() >= 3, "the workload spans several segments");
    let sealed = &segs[segs.len() - 2];
    let bytes = fs.read_file(sealed).unwrap();
    let last = *layout::records(&bytes).last().unwrap();
    damage(&fs, sealed, |b| b[last.offset..].fill(0));
    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert_eq!(report.torn_tail, None, "{report:?}");
    assert!(!report.damaged.is_empty(), "{report:?}");
    assert!(!report.refused.is_empty(), "{report:?}");
}

/// A tail shorter than `segment_bytes` (cut inside its zeros, or at its last record, as a
/// crash before its size was durable or an earlier version leaves it) is read to its end and
/// sized again by the first write.
#[test]
fn a_tail_preallocated_shorter_than_expected_is_read_and_sized_again() {
    for cut_at_records in [false, true] {
        let fs = written(false);
        let tail = segments(&fs).pop().unwrap();
        let bytes = fs.read_file(&tail).unwrap();
        let written_len = layout::written_len(&bytes);
        let keep = if cut_at_records {
            written_len
        } else {
            (written_len + SEGMENT_BYTES) / 2
        };
        damage(&fs, &tail, |b| b.truncate(keep));
        let store = builder(&fs).open().unwrap();
        let report = store.open_report().clone();
        assert_eq!(report.torn_tail, None, "{report:?}");
        assert!(report.damaged.is_empty(), "{report:?}");
        holds_the_whole_workload(&store);
        let mut tally = Tally::default();
        tally.put(&store, "after", 10);
        assert_eq!(file_len(&fs, &tail), SEGMENT_BYTES);
        assert!(tally.refused(&store).is_empty());
    }
}

/// A crash between creating the newest segment and writing its header leaves a file that is
/// empty, or sized and all zeros: open removes it (its creation was cut short) and writes on.
#[test]
fn a_crash_between_creating_and_sizing_a_segment_loses_nothing() {
    for size in [0, SEGMENT_BYTES] {
        let fs = written(false);
        let newest = segment_number(segments(&fs).last().unwrap()) + 1;
        let path = journal().join(format!("{newest:010}.seg"));
        let file = fs.open(&path, OpenMode::CreateNew).unwrap();
        file.set_len(size as u64).unwrap();
        drop(file);
        let store = builder(&fs).open().unwrap();
        let report = store.open_report().clone();
        assert!(report.damaged.is_empty(), "{report:?}");
        assert!(report.refused.is_empty(), "{report:?}");
        assert!(
            !fs.list(&journal())
                .unwrap()
                .contains(&format!("{newest:010}.seg"))
        );
        holds_the_whole_workload(&store);
        let mut tally = Tally::default();
        tally.put(&store, "after", 10);
        drop(store);
        let store = builder(&fs).open().unwrap();
        holds_the_whole_workload(&store);
        assert!(tally.refused(&store).is_empty());
    }
}

/// Negative control of the zero check: when open takes an all-zero frame as the end of the
/// records without checking that only zeros follow, the records after zeros where a durable
/// record was are dropped silently, which `a_valid_record_after_zeros_is_still_damage` reports.
#[test]
fn without_the_zero_check_records_after_zeros_vanish_silently() {
    let fs = written(false);
    let tail = segments(&fs).pop().unwrap();
    let bytes = fs.read_file(&tail).unwrap();
    let records = layout::records(&bytes);
    let victim = records[records.len() - 2];
    damage(&fs, &tail, |b| {
        b[victim.offset..victim.offset + layout::FRAME_LEN + victim.body_len].fill(0)
    });
    let store = builder(&fs)
        .skip_sync(SkipSync::ZeroEndCheck)
        .open()
        .unwrap();
    let report = store.open_report().clone();
    assert_eq!(report.torn_tail, None, "{report:?}");
    assert!(
        report.damaged.is_empty(),
        "the loss went unnoticed: {report:?}"
    );
    let mut model = Model::default();
    let m = check_store(&mut model, &store, 0, BATCHES).unwrap();
    assert!(
        m < BATCHES,
        "the acknowledged batches after the zeros are gone"
    );
}

/// A sealed segment that still carries preallocated zeros after its records (a rollover trims
/// it, but the walk does not rely on that) is compacted like any other: its zeros are the end
/// of its records, not damage that would keep it.
#[test]
fn compaction_reads_a_sealed_segment_to_the_end_of_its_records() {
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    let mut tally = Tally::default();
    while segments(&fs).len() < 4 {
        tally.put(&store, "p", 300);
    }
    store.close().unwrap();
    let sealed = segments(&fs)[0].clone();
    let len = file_len(&fs, &sealed);
    damage(&fs, &sealed, |b| b.resize(SEGMENT_BYTES.max(len + 100), 0));
    let store = builder(&fs).open().unwrap();
    let report = store.compact().unwrap();
    assert_eq!(report.segments_kept, 0, "{report:?}");
    assert!(report.segments_removed >= 3, "{report:?}");
    assert!(
        !fs.list(&journal())
            .unwrap()
            .iter()
            .any(|n| journal().join(n) == sealed)
    );
    assert!(tally.refused(&store).is_empty());
}

/// A segment larger than the preallocation step is sized a step at a time, never a whole
/// segment ahead of its records: a lone commit still rarely commits a new file size (once per
/// step), and open after a crash has at most about a step of unwritten space to read.
#[test]
fn a_large_segment_is_sized_one_step_ahead_of_its_records() {
    const STEP: usize = 256 << 10;
    let fs = FaultFs::new();
    let store = builder(&fs).segment_bytes(8 << 20).open().unwrap();
    let mut tally = Tally::default();
    let mut sizes = Vec::new();
    for i in 0..60 {
        tally.put(&store, &format!("p{}", i % 3), 64 << 10);
        let segs = segments(&fs);
        assert_eq!(segs.len(), 1, "the workload fits one segment");
        let bytes = fs.read_file(&segs[0]).unwrap();
        let records_end = layout::written_len(&bytes);
        assert!(
            records_end < bytes.len(),
            "commit {i}: no space sized ahead"
        );
        assert!(
            bytes.len() - records_end <= STEP && bytes.len().is_multiple_of(STEP),
            "commit {i}: sized to {} with records ending at {records_end}",
            bytes.len()
        );
        if sizes.last() != Some(&bytes.len()) {
            sizes.push(bytes.len());
        }
    }
    // About 3.8 MiB of records: sized 16 times, one step each time.
    let steps: Vec<usize> = (1..=16).map(|m| m * STEP).collect();
    assert_eq!(sizes, steps, "{sizes:?}");
    store.close().unwrap();
}
