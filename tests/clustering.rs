//! Histories appended in turns end up laid out together without anyone asking (SPEC S7): a
//! journal written round-robin over many partitions is scattered, so compaction starts by
//! itself on each sealed segment that is, copies the partitions' values together, and a
//! history is then read with a few reads instead of one per value. A store written in runs is
//! left alone, the bytes compaction copies stay within a bound, and a power cut at any
//! operation of a compaction started this way loses nothing acknowledged.
//!
//! Reads are counted as the operations of the fault-injecting disk during a read-only pass.

mod common;

use common::check::Model;
use common::crash::{Timeline, check_power_cut, image_seed, write_batches};
use common::disk::builder;
use portcullis::store::{Batch, FaultFs, FileStoreBuilder, KeyRange, Partition, Store, SyncPolicy};

const ENTITIES: u64 = 200;
const RECORDS: u64 = 100;
const SEGMENT_BYTES: u64 = 256 << 10;
/// Reads of one history after the load, at most on average: its base and runs, and one per
/// record of the load's last part, which stays scattered (about a segment and a half of
/// journal: 9 records of each history here).
const READS_PER_HISTORY: u64 = 16;

fn entity(e: u64) -> Partition {
    Partition::new(format!("entity/{e:05}")).unwrap()
}

fn key(s: u64) -> Vec<u8> {
    format!("{s:010}").into_bytes()
}

fn value(e: u64, s: u64) -> Vec<u8> {
    let mut v = format!("entity {e} record {s};").into_bytes();
    v.resize(200, b'a' + (e % 26) as u8);
    v
}

fn store_on(fs: &FaultFs) -> FileStoreBuilder {
    builder(fs)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .segment_bytes(SEGMENT_BYTES)
        .base_every_records(64)
        .auto_compact(true)
}

/// Loads every entity's log, record by record: in turns (round-robin over the entities) or
/// each entity's whole log at once. Waits for the compactions that start by themselves, then
/// closes. Returns the journal bytes written and the compactions started.
fn load(
    fs: &FaultFs,
    in_turns: bool,
    configure: impl Fn(FileStoreBuilder) -> FileStoreBuilder,
) -> (u64, u64) {
    let store = configure(store_on(fs)).open().unwrap();
    let rows: Vec<(u64, u64)> = if in_turns {
        (0..RECORDS)
            .flat_map(|s| (0..ENTITIES).map(move |e| (e, s)))
            .collect()
    } else {
        (0..ENTITIES)
            .flat_map(|e| (0..RECORDS).map(move |s| (e, s)))
            .collect()
    };
    for (e, s) in rows {
        let batch = Batch::new().put(key(s), value(e, s));
        assert!(store.apply(&entity(e), &batch).unwrap().is_committed());
    }
    store.wait_for_background_compactions();
    let written = store.stats().bytes_written;
    let started = store.background_compactions();
    store.close().unwrap();
    (written, started)
}

/// Reads every entity's history in a fresh store and checks it; returns the disk operations
/// the reads made.
fn reads_of_every_history(fs: &FaultFs) -> u64 {
    let store = store_on(fs).auto_compact(false).open().unwrap();
    let before = fs.ops();
    for e in 0..ENTITIES {
        let page = store
            .scan(&entity(e), &KeyRange::all(), None, 1000)
            .unwrap();
        let expected: Vec<(Vec<u8>, Vec<u8>)> =
            (0..RECORDS).map(|s| (key(s), value(e, s))).collect();
        assert!(page.entries == expected, "entity {e}'s history");
    }
    let reads = fs.ops() - before;
    store.close().unwrap();
    reads
}

/// A load in turns over 200 entities (about 23 segments) ends with every history readable in
/// a few reads, without any call to `compact`; with the scatter trigger switched off (the
/// negative control) the same load takes about one read per record.
#[test]
fn a_load_in_turns_ends_with_every_history_in_a_few_reads() {
    let fs = FaultFs::new();
    let (_, started) = load(&fs, true, |b| b);
    assert!(started >= 1, "no compaction started by itself");
    let reads = reads_of_every_history(&fs);
    eprintln!("clustered: {reads} reads for {ENTITIES} histories");
    assert!(
        reads <= ENTITIES * READS_PER_HISTORY,
        "{reads} reads for {ENTITIES} histories of {RECORDS} records"
    );
}

#[test]
fn control_without_the_scatter_trigger_histories_stay_scattered() {
    let fs = FaultFs::new();
    let (_, started) = load(&fs, true, |b| b.skip_scatter_trigger());
    assert_eq!(started, 0, "nothing else makes this load worth compacting");
    let reads = reads_of_every_history(&fs);
    eprintln!("scattered: {reads} reads for {ENTITIES} histories");
    assert!(
        reads > ENTITIES * READS_PER_HISTORY,
        "the control must see the scattered layout ({reads} reads)"
    );
}

/// Each entity's whole log at once is already laid out together: nothing is compacted and
/// nothing copied. In turns, compaction copies each value a bounded number of times: the
/// journal written is at most `BOUND` times that of the same load without the trigger.
#[test]
fn a_store_written_in_runs_is_left_alone_and_copies_stay_bounded() {
    const BOUND: u64 = 5;
    let (in_runs, started) = load(&FaultFs::new(), false, |b| b);
    assert_eq!(started, 0, "a store written in runs was compacted");
    let (plain, _) = load(&FaultFs::new(), true, |b| b.skip_scatter_trigger());
    let (clustered, _) = load(&FaultFs::new(), true, |b| b);
    eprintln!("written: in runs {in_runs}, in turns {plain}, in turns clustered {clustered}");
    assert!(
        clustered <= BOUND * plain,
        "compaction wrote {clustered} bytes for a load of {plain}"
    );
}

/// A power cut at every operation of a workload whose compactions start because its journal
/// is scattered (the shared crash workload writes its partitions in turns) keeps every
/// acknowledged batch, shows a prefix, and leaves a working store (`check_power_cut`).
#[test]
fn a_power_cut_at_every_operation_of_a_compaction_started_by_scatter_loses_nothing() {
    const BATCHES: u64 = 60;
    let fs = FaultFs::new();
    fs.record_crash_points();
    let store = common::crash::builder(&fs, None)
        .auto_compact(true)
        .open()
        .unwrap();
    let mut timeline = Timeline::default();
    // Waiting after each batch keeps the run deterministic: each compaction runs whole
    // between two batches.
    write_batches(&store, &fs, &mut timeline, 1..=BATCHES, |_, _| {
        store.wait_for_background_compactions();
    });
    let started = store.background_compactions();
    let compactions = store.stats().compactions;
    store.close().unwrap();
    timeline.flushed(BATCHES, &fs);
    assert!(
        started >= 1 && compactions >= 1,
        "no compaction by scatter ran"
    );
    let points = fs.take_crash_points();
    let mut model = Model::default();
    for point in &points {
        let (acked, attempted) = (
            timeline.acked_before(point.op),
            timeline.attempted_before(point.op),
        );
        let seed = image_seed(0x5CA7, point.op, 0);
        let image = point.power_cut(seed);
        if let Err(e) = check_power_cut(&image, &mut model, acked, attempted, seed) {
            panic!("power cut {point:?}, image seed {seed:#x}: {e}");
        }
    }
    eprintln!("{} crash points, {compactions} compactions", points.len());
}
