//! How the file-backed store reads values (SPEC S1, S5, S8): a page's values lie close together
//! in the journal when they were appended together, so a scan reads them with a few merged
//! reads; the first read after a load takes the values of the records the load has just read;
//! and a damaged value cut out of a merged read still answers `Corrupt` naming its partition and
//! segment (SPEC S4).
//!
//! Reads are counted as the operations of the fault-injecting disk after open (a read-only
//! session makes no other kind).

mod common;

use common::disk::{builder, damage, segment_number, segments};
use portcullis::Error;
use portcullis::store::{Batch, FaultFs, FileStore, KeyRange, Partition, Store};

const ROWS: u64 = 100;

fn key(i: u64) -> Vec<u8> {
    format!("row-{i:04}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    format!("value-{i:04}-").repeat(12).into_bytes()
}

/// A closed store with one partition of [`ROWS`] rows, one batch each (an entity's log), in
/// one segment, with a base record every 16 batches.
fn one_partition() -> (FaultFs, Partition) {
    let fs = FaultFs::new();
    let p = Partition::new("entity/1").unwrap();
    let store = open(&fs);
    for i in 0..ROWS {
        let batch = Batch::new().put(key(i), value(i));
        assert!(store.apply(&p, &batch).unwrap().is_committed());
    }
    store.close().unwrap();
    assert_eq!(segments(&fs).len(), 1, "the rows must share one segment");
    (fs, p)
}

fn open(fs: &FaultFs) -> FileStore {
    builder(fs)
        .segment_bytes(1 << 20)
        .base_every_records(16)
        .open()
        .unwrap()
}

/// Disk operations `f` makes on a freshly opened store.
fn reads_of(fs: &FaultFs, f: impl FnOnce(&FileStore)) -> u64 {
    let store = open(fs);
    let before = fs.ops();
    f(&store);
    let reads = fs.ops() - before;
    store.close().unwrap();
    reads
}

fn scan_all(store: &FileStore, p: &Partition) -> Vec<(Vec<u8>, Vec<u8>)> {
    let page = store
        .scan(p, &KeyRange::all(), None, ROWS as usize)
        .unwrap();
    assert!(page.next.is_none());
    page.entries
}

fn expected() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..ROWS).map(|i| (key(i), value(i))).collect()
}

#[test]
fn a_page_of_values_appended_together_is_read_with_a_few_reads() {
    let (fs, p) = one_partition();
    // Loaded first, so only the page's value reads are counted.
    let page_reads = {
        let store = open(&fs);
        assert_eq!(store.get(&p, b"absent").unwrap(), None);
        let before = fs.ops();
        assert_eq!(scan_all(&store, &p), expected());
        let reads = fs.ops() - before;
        store.close().unwrap();
        reads
    };
    assert!(
        page_reads <= 3,
        "a page of {ROWS} values appended together took {page_reads} reads"
    );
    // get_many merges the same way, and answers in the order asked, absent keys included.
    let keys: Vec<Vec<u8>> = [7, 3, 99, 50].into_iter().map(key).collect();
    let mut asked: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
    asked.insert(2, b"absent");
    let store = open(&fs);
    let got = store.get_many(&p, &asked).unwrap();
    assert_eq!(
        got,
        vec![
            Some(value(7)),
            Some(value(3)),
            None,
            Some(value(99)),
            Some(value(50))
        ]
    );
    store.close().unwrap();
}

#[test]
fn the_first_read_after_a_load_takes_values_from_the_records_the_load_read() {
    let (fs, p) = one_partition();
    // The load alone: a get of an absent key reads the chain and no value.
    let load = reads_of(&fs, |store| {
        assert_eq!(store.get(&p, b"absent").unwrap(), None);
    });
    // The load and the first page: the values of the records the walk read come from them,
    // and the others (older than the base) in one merged read.
    let first_page = reads_of(&fs, |store| assert_eq!(scan_all(store, &p), expected()));
    assert!(
        first_page <= load + 2,
        "the first page took {first_page} reads where the load alone took {load}"
    );
    // A point read of a value the walk has just read takes no read of its own.
    let first_get = reads_of(&fs, |store| {
        assert_eq!(
            store.get(&p, &key(ROWS - 1)).unwrap(),
            Some(value(ROWS - 1))
        );
    });
    assert_eq!(
        first_get, load,
        "a value in a record just read was read again"
    );
}

/// A history appended in one batch of 16 values of 4 KiB (a record of about 64 KiB, more than
/// the chain walk's first small read of it): the first page after open takes every value from
/// the record its load has just read, with no read of its own.
#[test]
fn a_history_written_in_one_large_batch_is_read_from_the_record_its_load_read() {
    let fs = FaultFs::new();
    let p = Partition::new("entity/big").unwrap();
    let big = |i: u64| vec![i as u8; 4096];
    {
        let store = open(&fs);
        let mut batch = Batch::new();
        for i in 0..16 {
            batch = batch.put(key(i), big(i));
        }
        assert!(store.apply(&p, &batch).unwrap().is_committed());
        store.close().unwrap();
    }
    let load = reads_of(&fs, |store| {
        assert_eq!(store.get(&p, b"absent").unwrap(), None);
    });
    let first_page = reads_of(&fs, |store| {
        let page = store.scan(&p, &KeyRange::all(), None, 100).unwrap();
        let want: Vec<_> = (0..16).map(|i| (key(i), big(i))).collect();
        assert_eq!(page.entries, want);
    });
    assert_eq!(
        first_page, load,
        "the values of the record the load read were read again"
    );
}

/// Flips a byte of the value of row `i` (a row older than the base, so loads do not read its
/// record and only the value read sees the damage).
fn damage_value(fs: &FaultFs, i: u64) -> u32 {
    let segment = segments(fs).pop().unwrap();
    let needle = value(i);
    damage(fs, &segment, |bytes| {
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
            .expect("the value is in the segment");
        bytes[at + 20] ^= 0x40;
    });
    segment_number(&segment)
}

#[test]
fn a_damaged_value_in_a_merged_read_answers_corrupt_naming_partition_and_segment() {
    let (fs, p) = one_partition();
    let segment = damage_value(&fs, 5);
    let store = open(&fs);
    let err = store
        .scan(&p, &KeyRange::all(), None, ROWS as usize)
        .unwrap_err();
    let Error::Corrupt { what, detail } = &err else {
        panic!("a damaged value answered {err:?}");
    };
    assert!(what.contains("entity/1"), "{err}");
    assert!(
        detail.contains(&format!("journal segment {segment} ")) && detail.contains("checksum"),
        "{err}"
    );
    // The values around it are still read correctly, alone or merged.
    assert_eq!(store.get(&p, &key(4)).unwrap(), Some(value(4)));
    let page = store
        .scan(&p, &KeyRange::all(), None, 5)
        .expect("rows before the damaged one");
    assert_eq!(page.entries, expected()[..5].to_vec());
    store.close().unwrap();
}

/// Negative control: with the checksum of values cut out of a merged read turned off, the same
/// damage goes unnoticed and the scan hands back wrong bytes.
#[test]
fn without_value_checks_a_damaged_value_in_a_merged_read_is_returned() {
    let (fs, p) = one_partition();
    damage_value(&fs, 5);
    let store = builder(&fs)
        .segment_bytes(1 << 20)
        .base_every_records(16)
        .skip_value_checks()
        .open()
        .unwrap();
    let entries = scan_all(&store, &p);
    assert_ne!(entries[5].1, value(5), "the damage was not read");
    assert_eq!(entries[4], (key(4), value(4)));
    store.close().unwrap();
}

/// Compaction lays a partition's live values out together and in key order, so after it a
/// history that was scattered through the journal (two entities appended in turns) is read
/// with one read: the values in the segments compaction retires are copied, and so are the
/// partition's values in the newest segment, which are no more bytes than those.
#[test]
fn after_compaction_a_scattered_history_is_one_read() {
    let fs = FaultFs::new();
    let (a, b) = (
        Partition::new("entity/a").unwrap(),
        Partition::new("entity/b").unwrap(),
    );
    let open = |fs: &FaultFs| builder(fs).open().unwrap();
    let store = open(&fs);
    for i in 0..60 {
        // Keys out of order, so only a layout in key order makes a page one run.
        let k = (i * 37) % 60;
        for p in [&a, &b] {
            let batch = Batch::new().put(key(k), value(k));
            assert!(store.apply(p, &batch).unwrap().is_committed());
        }
    }
    let report = store.compact().unwrap();
    assert!(report.segments_removed >= 2, "{report:?}");
    store.close().unwrap();

    let expected: Vec<(Vec<u8>, Vec<u8>)> = (0..60).map(|i| (key(i), value(i))).collect();
    let store = open(&fs);
    assert_eq!(store.get(&a, b"absent").unwrap(), None);
    let before = fs.ops();
    let page = store.scan(&a, &KeyRange::all(), None, 100).unwrap();
    let reads = fs.ops() - before;
    assert_eq!(page.entries, expected);
    assert_eq!(reads, 1, "a compacted history took {reads} reads");
    assert_eq!(
        store.scan(&b, &KeyRange::all(), None, 100).unwrap().entries,
        expected
    );
    store.close().unwrap();
}

/// A closed store where `p` has a base and then `n` small batches, each followed by one of
/// another partition's: `p`'s chain is small records lying close together in one segment.
fn a_tail_of_small_records(n: u64) -> (FaultFs, Partition) {
    let fs = FaultFs::new();
    let p = Partition::new("entity/1").unwrap();
    let other = Partition::new("entity/2").unwrap();
    let store = builder(&fs)
        .segment_bytes(1 << 20)
        .base_every_records(1_000)
        .open()
        .unwrap();
    for i in 0..n {
        let batch = Batch::new().put(key(i), b"a row of about a hundred bytes".repeat(3));
        assert!(store.apply(&p, &batch).unwrap().is_committed());
        assert!(store.apply(&other, &batch).unwrap().is_committed());
    }
    store.close().unwrap();
    assert_eq!(segments(&fs).len(), 1, "the records must share one segment");
    (fs, p)
}

#[test]
fn a_load_reads_a_chain_of_small_records_lying_close_together_with_a_few_reads() {
    const N: u64 = 100;
    let (fs, p) = a_tail_of_small_records(N);
    // The load alone (a missing key reads no value), then a point read of the newest row.
    let reads = reads_of(&fs, |store| {
        assert_eq!(store.get(&p, b"absent").unwrap(), None);
    });
    // One read of the head, then windows of 64 KiB that hold the chain's 100 records of
    // about 150 bytes (with another partition's between): not one read per record.
    assert!(
        reads <= 6,
        "{reads} reads to load a chain of {N} small records"
    );
    let store = builder(&fs).open().unwrap();
    for i in [N - 1, 0, N / 2] {
        assert_eq!(
            store.get(&p, &key(i)).unwrap(),
            Some(b"a row of about a hundred bytes".repeat(3))
        );
    }
    store.close().unwrap();
}

#[test]
fn a_damaged_record_in_a_chain_read_together_answers_corrupt_naming_its_segment() {
    let (fs, p) = a_tail_of_small_records(100);
    // `p`'s record of row 50 (written before the other partition's): within a window.
    let segment = segments(&fs).pop().unwrap();
    let needle = key(50);
    damage(&fs, &segment, |bytes| {
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
            .expect("the key is in the segment");
        bytes[at + 2] ^= 0x40;
    });
    let store = open(&fs);
    match store.get(&p, &key(99)) {
        Err(Error::Corrupt { what, detail }) => {
            let text = format!("{what}: {detail}");
            assert!(text.contains("entity/1"), "{text}");
            let named = format!("segment {}", segment_number(&segment));
            assert!(text.contains(&named), "{text}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    store.close().unwrap();
}
