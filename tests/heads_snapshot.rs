//! The paged heads snapshot (SPEC S4, S5, S8): open reads only the snapshot's page index, a
//! partition's head is found on its first touch, heads found after the snapshot or kept when
//! an index is dropped win over the pages, a damaged page refuses exactly the partitions it
//! could hold (a damaged index page those of every data page it names) until a reopen rebuilds
//! the heads from the journal, and a snapshot of the older whole-file format is read and
//! converted.

mod common;

use std::collections::BTreeMap;

use common::disk::{builder, snapshot_files};
use common::layout::{SNAPSHOT_PAGE_LEN, SNAPSHOT_PAGES_AT};
use portcullis::Error;
use portcullis::store::{Batch, FaultFs, FileStore, Partition, Store};

/// Enough partitions for several pages (22 bytes an entry, about 740 a page).
const PARTITIONS: u64 = 4_000;

fn name(i: u64) -> String {
    format!("entity/{i:06}")
}

fn put(store: &FileStore, name: &str, value: &str) {
    let p = Partition::new(name).unwrap();
    let batch = Batch::new().put("v", value);
    assert!(store.apply(&p, &batch).unwrap().is_committed());
}

fn get(store: &FileStore, name: &str) -> Result<Option<Vec<u8>>, Error> {
    store.get(&Partition::new(name).unwrap(), b"v")
}

/// A store of `PARTITIONS` one-row partitions, closed cleanly, and what each holds.
fn written() -> (FaultFs, BTreeMap<String, String>) {
    let fs = FaultFs::new();
    let store = builder(&fs).max_loaded_partitions(64).open().unwrap();
    let mut model = BTreeMap::new();
    for i in 0..PARTITIONS {
        let value = format!("first {i}");
        put(&store, &name(i), &value);
        model.insert(name(i), value);
    }
    store.close().unwrap();
    (fs, model)
}

/// Every partition answers what the model holds, listing and membership agree with it.
fn check(store: &FileStore, model: &BTreeMap<String, String>) {
    for (n, value) in model {
        assert_eq!(
            get(store, n).unwrap().as_deref(),
            Some(value.as_bytes()),
            "{n}"
        );
        assert!(
            store
                .contains_partition(&Partition::new(n).unwrap())
                .unwrap()
        );
    }
    let listed: Vec<String> = store
        .list_partitions(b"")
        .unwrap()
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(listed, model.keys().cloned().collect::<Vec<_>>());
    for prefix in [
        "entity/0012",
        "entity/0039",
        "entity/00000",
        "entity/9",
        "new/",
    ] {
        let listed: Vec<String> = store
            .list_partitions(prefix.as_bytes())
            .unwrap()
            .iter()
            .map(|p| p.to_string())
            .collect();
        let expected: Vec<String> = model
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect();
        assert_eq!(listed, expected, "prefix {prefix}");
    }
    for absent in ["entity/", "entity/0000005", "entity/999999", "a", "zzz"] {
        let p = Partition::new(absent).unwrap();
        assert!(!store.contains_partition(&p).unwrap(), "{absent}");
        assert_eq!(get(store, absent).unwrap(), None);
    }
    assert_eq!(store.stats().partitions, model.len() as u64);
}

/// Open reads the snapshot's page index, not every head: far less than the heads' bytes, and
/// no partition is loaded (failed before the paged snapshot: open read the whole file).
#[test]
fn open_reads_the_page_index_not_every_head() {
    let (fs, model) = written();
    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert!(!report.rebuilt_by_full_scan, "{report:?}");
    assert_eq!(report.partitions, PARTITIONS);
    assert!(
        report.snapshot_bytes < 1_000,
        "open read {} snapshot bytes for {PARTITIONS} partitions",
        report.snapshot_bytes
    );
    // With one index page, open reads it with the meta: a page at most, never every head.
    assert!(
        report.snapshot_index_bytes <= SNAPSHOT_PAGE_LEN as u64,
        "{report:?}"
    );
    assert_eq!(store.stats().partitions_loaded, 0);
    check(&store, &model);
}

/// Heads newer than the pages (found by open's scan after a crash, kept when an index is
/// dropped, new partitions between the pages' names) win over the pages, in lookups, lists,
/// counts and every later snapshot.
#[test]
fn newer_heads_win_over_the_pages() {
    let (fs, mut model) = written();
    let mut fs = fs;
    for round in 0..3 {
        let store = builder(&fs).max_loaded_partitions(32).open().unwrap();
        check(&store, &model);
        for i in (round..PARTITIONS).step_by(7) {
            let value = format!("round {round} {i}");
            put(&store, &name(i), &value);
            model.insert(name(i), value);
            let new = format!("{}x{round}", name(i));
            put(&store, &new, "new");
            model.insert(new, "new".into());
        }
        put(&store, "new/first", "n");
        model.insert("new/first".into(), "n".into());
        if round == 1 {
            // A snapshot mid-way, then more after it, then a crash: open scans the rest.
            store.write_heads_snapshot().unwrap();
            put(&store, &name(5), "after the snapshot");
            model.insert(name(5), "after the snapshot".into());
            put(&store, "new/second", "n");
            model.insert("new/second".into(), "n".into());
            let image = fs.crash_process();
            drop(store);
            fs = image;
        } else {
            check(&store, &model);
            store.close().unwrap();
        }
    }
    let store = builder(&fs).open().unwrap();
    check(&store, &model);
}

/// Byte `at` of page `page` of the newest snapshot.
fn page_byte(page: usize, at: usize) -> usize {
    SNAPSHOT_PAGES_AT + page * SNAPSHOT_PAGE_LEN + at
}

fn damage_page(fs: &FaultFs, page: usize) {
    let snap = snapshot_files(fs).pop().unwrap();
    common::disk::damage(fs, &snap, |b| {
        // The first entry's name (after the checksum, the count and the name's length).
        b[page_byte(page, 8)] ^= 0x01;
    });
}

/// A damaged page refuses exactly the partitions it could hold, and says so; every other
/// partition keeps working; compaction keeps the segments of the refused ones; a reopen
/// rebuilds the heads from the journal and serves every partition again.
#[test]
fn a_damaged_page_refuses_exactly_the_partitions_it_could_hold() {
    let (fs, model) = written();
    damage_page(&fs, 2);
    let store = builder(&fs).open().unwrap();
    assert!(!store.open_report().rebuilt_by_full_scan);
    assert!(store.damage().is_empty(), "nothing is read before a touch");
    // The pages' first names say which page holds which names.
    let mut refused = Vec::new();
    for n in model.keys() {
        match get(&store, n) {
            Ok(v) => assert_eq!(v.as_deref(), Some(model[n].as_bytes()), "{n}"),
            Err(Error::Corrupt { what, detail }) => {
                assert!(what.contains("page 2"), "{what}");
                assert!(detail.contains("reopened"), "{detail}");
                refused.push(n.clone());
            }
            Err(e) => panic!("{n}: {e:?}"),
        }
    }
    assert!(
        !refused.is_empty() && refused.len() < 1_000,
        "{}",
        refused.len()
    );
    // The refused names are one contiguous run: the page's span.
    let first = model.keys().position(|n| *n == refused[0]).unwrap();
    let span: Vec<String> = model
        .keys()
        .skip(first)
        .take(refused.len())
        .cloned()
        .collect();
    assert_eq!(span, refused);
    // A new partition the page could hold is refused too (it may exist); others are not.
    let inside = format!("{}x", refused[3]);
    let err = store
        .apply(
            &Partition::new(&inside).unwrap(),
            &Batch::new().put("v", "x"),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    put(&store, "zzz/outside", "x");
    assert!(store.list_partitions(b"").is_err());
    assert_eq!(store.list_partitions(b"zzz/").unwrap().len(), 1);
    let damage = store.damage();
    assert!(
        damage.unattributed.iter().any(|d| d.contains("page 2")),
        "{damage:?}"
    );
    store.compact().unwrap();
    store.close().unwrap();

    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert!(report.rebuilt_by_full_scan, "{report:?}");
    let mut model = model;
    model.insert("zzz/outside".into(), "x".into());
    check(&store, &model);
    store.close().unwrap();
    // The rebuilt snapshot is paged and intact again.
    let store = builder(&fs).open().unwrap();
    assert!(!store.open_report().rebuilt_by_full_scan);
    check(&store, &model);
}

/// Negative control: with the page checksum not checked, the damaged page serves a partition
/// that exists as absent, which the test above would catch.
#[test]
fn negative_control_unchecked_pages_lose_partitions() {
    let (fs, model) = written();
    damage_page(&fs, 2);
    let store = builder(&fs).open().unwrap();
    store.set_snapshot_page_checks_off_for_test(true);
    let lost = model
        .keys()
        .filter(|n| matches!(get(&store, n), Ok(None)))
        .count();
    assert!(lost > 0, "unchecked pages lost nothing");
}

/// A snapshot of the whole-file format (version 2) is read at open and converted to the paged
/// one, never ignored.
#[test]
fn a_whole_file_snapshot_is_read_and_converted() {
    let (fs, model) = written();
    let store = builder(&fs).open().unwrap();
    store.write_version_2_heads_snapshot_for_test().unwrap();
    store.close().unwrap();
    let magic = |fs: &FaultFs| {
        let snap = snapshot_files(fs).pop().unwrap();
        fs.read_file(&snap).unwrap()[0..8].to_vec()
    };
    assert_eq!(magic(&fs), b"PCLSHEAD");

    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert!(!report.rebuilt_by_full_scan, "{report:?}");
    assert_eq!(report.journal_bytes_scanned, 0);
    assert_eq!(report.partitions, PARTITIONS);
    check(&store, &model);
    assert_eq!(magic(&fs), b"PCLSHPAG", "open converts the snapshot");
    store.close().unwrap();

    let store = builder(&fs).open().unwrap();
    assert!(store.open_report().snapshot_bytes < 1_000);
    check(&store, &model);
}

/// Byte `at` of the newest snapshot's index page (after the data pages; one index page holds
/// the first names of hundreds of data pages, and the meta after it is shorter than a page).
fn index_page_byte(fs: &FaultFs, at: usize) -> usize {
    let snap = snapshot_files(fs).pop().unwrap();
    let len = fs.read_file(&snap).unwrap().len();
    let pages = (len - SNAPSHOT_PAGES_AT) / SNAPSHOT_PAGE_LEN;
    page_byte(pages - 1, at)
}

/// Flips the last byte of the index page's second entry: data page 1's first name.
fn damage_index_page(fs: &FaultFs) {
    let snap = snapshot_files(fs).pop().unwrap();
    let at = index_page_byte(fs, 0);
    common::disk::damage(fs, &snap, |b| {
        // The checksum and the count, then each entry: name length and name.
        let second = at + 6 + 1 + b[at + 6] as usize;
        let last = second + b[second] as usize;
        b[last] ^= 0x01;
    });
}

/// A damaged index page refuses every partition whose data page it names (here all of them:
/// a few thousand partitions have one index page), never answers one absent, and a reopen
/// rebuilds the heads from the journal.
#[test]
fn a_damaged_index_page_refuses_the_partitions_it_names() {
    let (fs, model) = written();
    damage_index_page(&fs);
    let store = builder(&fs).open().unwrap();
    assert!(!store.open_report().rebuilt_by_full_scan);
    for n in model.keys() {
        match get(&store, n) {
            Err(Error::Corrupt { what, detail }) => {
                assert!(what.contains("index page 0"), "{what}");
                assert!(detail.contains("reopened"), "{detail}");
            }
            other => panic!("{n}: {other:?}"),
        }
    }
    // A name before the index's first is outside its span.
    put(&store, "aaa/before", "x");
    let damage = store.damage();
    assert!(
        damage
            .unattributed
            .iter()
            .any(|d| d.contains("index page 0")),
        "{damage:?}"
    );
    store.close().unwrap();

    let store = builder(&fs).open().unwrap();
    assert!(store.open_report().rebuilt_by_full_scan);
    let mut model = model;
    model.insert("aaa/before".into(), "x".into());
    check(&store, &model);
}

/// Negative control: with the checksums not checked, the damaged index page sends a lookup
/// to the wrong data page, which answers a partition that exists as absent.
#[test]
fn negative_control_an_unchecked_index_page_loses_partitions() {
    let (fs, model) = written();
    damage_index_page(&fs);
    let store = builder(&fs).open().unwrap();
    store.set_snapshot_page_checks_off_for_test(true);
    let lost = model
        .keys()
        .filter(|n| matches!(get(&store, n), Ok(None)))
        .count();
    assert!(lost > 0, "an unchecked index page lost nothing");
}

/// SPEC E8: a damaged page stops the heads snapshots (the next open rebuilds the heads), and
/// the store says so: the listener hears `SnapshotsStopped` once, and the store reports itself
/// degraded for that reason until it is reopened.
#[test]
fn e8_a_damaged_page_stops_the_snapshots_degrades_the_store_and_is_told() {
    use portcullis::observe::{DegradedCause, Event, Listener};
    let (fs, model) = written();
    damage_page(&fs, 2);
    let (tx, rx) = crossbeam::channel::unbounded();
    let listener: std::sync::Arc<dyn Listener> =
        std::sync::Arc::new(move |e: &Event| drop(tx.send(e.clone())));
    let store = builder(&fs).listener(listener).open().unwrap();
    assert_eq!(
        store.stats().degraded,
        None,
        "nothing is read before a touch"
    );
    let refused = model
        .keys()
        .filter(|n| matches!(get(&store, n), Err(Error::Corrupt { .. })))
        .count();
    assert!(refused > 0);
    // A snapshot is due at the next compaction (and at close); it is abandoned instead.
    store.compact().unwrap();
    let stopped: Vec<Event> = rx
        .try_iter()
        .filter(|e| matches!(e, Event::SnapshotsStopped { .. }))
        .collect();
    assert!(
        matches!(stopped.as_slice(), [Event::SnapshotsStopped { reason, .. }] if reason.contains("reopen")),
        "{stopped:?}"
    );
    let degraded = store.stats().degraded.expect("the store is degraded");
    assert_eq!(degraded.cause, DegradedCause::SnapshotsStopped);
    store.close().unwrap();
    let store = builder(&fs).open().unwrap();
    assert!(store.open_report().rebuilt_by_full_scan);
    assert_eq!(store.stats().degraded, None, "a reopen rebuilt the heads");
}
