//! Damaged files and bad input on the file-backed store: the outcomes docs/DESIGN.md documents
//! (SPEC S4, S10, S1, E1). Never a panic, never wrong data.
//!
//! The store runs on [`FaultFs`], so the tests can damage exact bytes of the documented layout
//! (see `common::layout`) and simulate a killed process (`crash_process`) or a clean close.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::check::{Model, State, check_store, read_state};
use common::disk::{
    BATCHES, DIR, KEEPER, KEPT, builder, damage, journal, segments, snapshot_files, written,
    written_after_keeper,
};
use common::layout::{self, RecordAt};
use common::logs;
use common::workload::{PARTITIONS, batch, partition_of};
use portcullis::Error;
use portcullis::store::{
    Batch, FaultFs, FileStore, KeyRange, MAX_BATCH_BYTES, MAX_KEY_BYTES, MAX_VALUE_BYTES,
    Partition, Store, Vfs,
};

/// The partition (of the workload's) whose name hashes to `hash`.
fn partition_named_by(hash: u64) -> &'static str {
    PARTITIONS
        .into_iter()
        .find(|n| layout::partition_hash(n.as_bytes()) == hash)
        .expect("a workload partition")
}

/// Checks that `damaged` refuses every read with `Corrupt` and every other partition shows
/// exactly the rows of the model's final state.
fn check_only_damaged_refuses(store: &FileStore, damaged: &str, what: &str) {
    let mut model = Model::default();
    let expected = model.state(BATCHES).clone();
    for name in PARTITIONS {
        let p = Partition::new(name).unwrap();
        let scanned = store.scan(&p, &KeyRange::all(), None, 1000);
        let got = store.get(&p, b"g");
        if name == damaged {
            assert!(
                matches!(scanned, Err(Error::Corrupt { .. })),
                "{what}: the damaged partition {name} answered a scan with {scanned:?}"
            );
            assert!(
                matches!(got, Err(Error::Corrupt { .. })),
                "{what}: the damaged partition {name} answered a get with {got:?}"
            );
        } else {
            let rows: std::collections::BTreeMap<_, _> = scanned
                .unwrap_or_else(|e| panic!("{what}: healthy partition {name}: {e}"))
                .entries
                .into_iter()
                .collect();
            assert_eq!(
                Some(&rows),
                expected.get(name),
                "{what}: partition {name} is wrong"
            );
        }
    }
}

/// A record in a sealed segment is damaged, and open scans it (the writer was killed, so the
/// journal after the last snapshot is scanned): open lists the damage, its partition refuses to
/// load with `Corrupt`, the others return correct data (SPEC S4).
#[test]
fn a_flipped_byte_in_a_sealed_segment_fails_only_its_partition() {
    let fs = written(false);
    let segs = segments(&fs);
    assert!(segs.len() >= 3, "the workload spans several segments");
    let first = fs.read_file(&segs[0]).unwrap();
    let victim: RecordAt = layout::records(&first)[0];
    let name = partition_named_by(victim.partition_hash);
    damage(&fs, &segs[0], |b| {
        b[victim.offset + layout::FRAME_LEN + victim.body_len / 2] ^= 0x10;
    });

    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert_eq!(report.damaged.len(), 1, "{report:?}");
    assert_eq!(report.damaged[0].segment, 1);
    assert_eq!(report.damaged[0].offset, victim.offset as u64);
    assert_eq!(report.damaged[0].partition.as_deref(), Some(name));
    assert_eq!(
        report.torn_tail, None,
        "damage in a sealed segment is not a torn tail"
    );
    check_only_damaged_refuses(&store, name, "scanned damage");
    // The healthy partitions still take writes.
    let other = PARTITIONS.into_iter().find(|n| *n != name).unwrap();
    let p = Partition::new(other).unwrap();
    assert!(
        store
            .apply(&p, &Batch::new().put(b"x".to_vec(), b"y".to_vec()))
            .unwrap()
            .is_committed()
    );
}

/// Damage in history the heads snapshot already covers is found by the load that walks through
/// it: that partition is refused with `Corrupt`, the others work (SPEC S4).
#[test]
fn a_flipped_byte_in_snapshotted_history_fails_its_partition_at_load() {
    let fs = written(true);
    // The newest record of a partition is the first one its load reads.
    let segs = segments(&fs);
    let last_seg = segs.last().unwrap();
    let bytes = fs.read_file(last_seg).unwrap();
    let victim = *layout::records(&bytes).last().unwrap();
    let name = partition_named_by(victim.partition_hash);
    damage(&fs, last_seg, |b| {
        b[victim.offset + layout::FRAME_LEN + victim.body_len / 2] ^= 0x01;
    });
    let store = builder(&fs).open().unwrap();
    assert_eq!(
        store.open_report().journal_bytes_scanned,
        0,
        "a clean close left a snapshot"
    );
    check_only_damaged_refuses(&store, name, "damage found at load");
}

/// A record cut short at the end of the newest segment (its frame incomplete, or its body) is a
/// torn write: truncated, reported and logged, and every batch before it intact (SPEC S4).
#[test]
fn a_truncated_tail_is_cut_and_logged_and_the_prefix_survives() {
    logs::start();
    for cut_into_frame in [false, true] {
        let fs = written(false);
        let last_seg = segments(&fs).pop().unwrap();
        let bytes = fs.read_file(&last_seg).unwrap();
        let last = *layout::records(&bytes).last().unwrap();
        let keep = if cut_into_frame {
            last.offset + layout::FRAME_LEN / 2
        } else {
            last.offset + layout::FRAME_LEN + last.body_len - 1
        };
        damage(&fs, &last_seg, |b| b.truncate(keep));

        let store = builder(&fs).open().unwrap();
        let torn = store
            .open_report()
            .torn_tail
            .clone()
            .expect("a torn tail is reported");
        assert_eq!(torn.offset, last.offset as u64);
        assert_eq!(torn.bytes_dropped, (keep - last.offset) as u64);
        assert!(logs::warned(&[
            "torn tail",
            &format!("offset {}", last.offset)
        ]));
        assert!(store.open_report().damaged.is_empty());
        let mut model = Model::default();
        // The last record may be a batch or a base record; either way no acknowledged batch
        // before it may be missing, and nothing partial may show.
        let m = check_store(&mut model, &store, BATCHES - 1, BATCHES).unwrap();
        if last.kind == 1 {
            assert_eq!(m, BATCHES - 1, "only the torn batch is lost");
        }
    }
}

/// A removed heads snapshot, or a removed manifest, is not fatal: open warns, rebuilds by
/// scanning the whole journal, says so in its report, data is intact, and the next open is fast
/// again (the documented outcome).
#[test]
fn a_removed_snapshot_or_manifest_is_rebuilt_by_a_full_scan() {
    logs::start();
    for remove_manifest in [false, true] {
        let fs = written(true);
        let victims = if remove_manifest {
            vec![Path::new(DIR).join("MANIFEST")]
        } else {
            snapshot_files(&fs)
        };
        assert_eq!(victims.len(), 1, "one snapshot after a clean close");
        fs.remove(&victims[0]).unwrap();

        let store = builder(&fs).open().unwrap();
        let report = store.open_report().clone();
        assert!(report.rebuilt_by_full_scan, "{report:?}");
        assert!(report.journal_bytes_scanned > 0);
        assert!(logs::warned(&["rebuilding by a full scan"]));
        let mut model = Model::default();
        assert_eq!(
            check_store(&mut model, &store, BATCHES, BATCHES),
            Ok(BATCHES)
        );
        store.close().unwrap();

        let again = builder(&fs).open().unwrap();
        assert!(!again.open_report().rebuilt_by_full_scan);
        assert_eq!(again.open_report().journal_bytes_scanned, 0);
        assert_eq!(
            check_store(&mut model, &again, BATCHES, BATCHES),
            Ok(BATCHES)
        );
    }
}

/// A newer format version in any segment header, the manifest or a heads snapshot is refused
/// with `UnsupportedVersion`, and nothing is changed (SPEC S10). The rest of the file is left
/// as it is: a later layout this build must not try to interpret. Open reads only the segments
/// from the heads snapshot's on, so a sealed segment older than that (the first one here) is
/// refused by the first read that needs it, and by every later one, not by open.
#[test]
fn a_future_format_version_is_refused() {
    enum Target {
        FirstSegment,
        NewestSegment,
        Manifest,
        Snapshot,
    }
    for target in [
        Target::FirstSegment,
        Target::NewestSegment,
        Target::Manifest,
        Target::Snapshot,
    ] {
        let fs = written_after_keeper(true);
        let keeper = Partition::new(KEEPER).unwrap();
        let segs = segments(&fs);
        let path = match target {
            Target::FirstSegment => segs[0].clone(),
            Target::NewestSegment => segs.last().unwrap().clone(),
            Target::Manifest => Path::new(DIR).join("MANIFEST"),
            Target::Snapshot => snapshot_files(&fs).pop().unwrap(),
        };
        let is_segment = matches!(target, Target::FirstSegment | Target::NewestSegment);
        damage(&fs, &path, |b| {
            if is_segment {
                layout::set_segment_version(b, 4);
            } else {
                layout::set_envelope_version(b, 4);
            }
        });
        let before: Vec<_> = segs.iter().map(|s| fs.read_file(s)).collect();
        let mut opened = builder(&fs).open();
        if let (Target::FirstSegment, Ok(store)) = (&target, &opened) {
            let first = store
                .scan(&keeper, &KeyRange::all(), None, 1000)
                .map(|_| ());
            let again = store.get(&keeper, KEPT.0).map(|_| ());
            assert_eq!(
                format!("{first:?}"),
                format!("{again:?}"),
                "every read answers the same"
            );
            opened = first.map(|()| unreachable!("a read of {keeper} answered"));
        }
        match opened {
            Err(Error::UnsupportedVersion {
                file,
                found: 4,
                supported: 3,
            }) => {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                assert!(file.contains(&name), "the error names {file}, not {name}");
            }
            other => panic!("{}: a future version answered {other:?}", path.display()),
        }
        let after: Vec<_> = segs.iter().map(|s| fs.read_file(s)).collect();
        assert!(
            before == after,
            "{}: refusing changed the journal",
            path.display()
        );
    }
}

/// A directory path that names a file is refused with a clear error, and the file is untouched
/// (SPEC E1).
#[test]
fn a_path_that_is_a_file_is_refused_clearly() {
    let fs = FaultFs::new();
    fs.write_file(Path::new("/not-a-dir"), b"precious".to_vec())
        .unwrap();
    let err = FileStore::builder("/not-a-dir")
        .vfs(Arc::new(fs.clone()))
        .open()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert!(err.to_string().contains("/not-a-dir") && err.to_string().contains("is a file"));
    assert_eq!(fs.read_file(Path::new("/not-a-dir")).unwrap(), b"precious");

    // The same on the real file system.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"precious").unwrap();
    let err = FileStore::open(&file).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
}

/// A read-only directory: creating a store there fails with an I/O error that names the path
/// and the cause; an existing store either refuses to open the same way or opens and serves
/// correct reads while refusing writes clearly. Modelled with `FaultFs`'s read-only mode,
/// because these tests may run as root, whom permission bits do not stop (SPEC E1).
#[test]
fn a_read_only_directory_gives_a_clear_error() {
    let fs = FaultFs::new();
    fs.create_dir_all(Path::new(DIR)).unwrap();
    fs.set_read_only(true);
    let err = builder(&fs).open().unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(DIR) && msg.contains("read-only"),
        "unclear: {msg}"
    );

    let fs = written(true);
    fs.set_read_only(true);
    match builder(&fs).open() {
        Err(e) => {
            assert!(matches!(e, Error::Io { .. }), "{e:?}");
            assert!(e.to_string().contains("read-only"), "unclear: {e}");
        }
        Ok(store) => {
            let mut model = Model::default();
            assert_eq!(
                check_store(&mut model, &store, BATCHES, BATCHES),
                Ok(BATCHES)
            );
            let n = BATCHES + 1;
            let refused = store.apply(&partition_of(n), &batch(n)).unwrap_err();
            assert!(
                refused.to_string().contains("read-only"),
                "unclear: {refused}"
            );
        }
    }
}

/// Oversize keys, values and batches, and empty keys, are refused before anything is written:
/// not one byte of the disk changes, and the store keeps working (SPEC S1, E1).
#[test]
fn oversize_and_empty_input_changes_nothing_on_disk() {
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    for n in 1..=6 {
        assert!(
            store
                .apply(&partition_of(n), &batch(n))
                .unwrap()
                .is_committed()
        );
    }
    let p = partition_of(7);
    let disk_before = disk_bytes(&fs);
    let state_before: State = read_state(&store).unwrap();
    let big_value = vec![7u8; MAX_VALUE_BYTES];
    let cases: Vec<(&str, Batch)> = vec![
        ("empty key", Batch::new().put(Vec::new(), b"v".to_vec())),
        (
            "empty key in a guard",
            Batch::new()
                .absent(Vec::new())
                .put(b"k".to_vec(), b"v".to_vec()),
        ),
        (
            "oversize key",
            Batch::new().put(vec![1u8; MAX_KEY_BYTES + 1], b"v".to_vec()),
        ),
        (
            "oversize key after a good put",
            Batch::new()
                .put(b"k".to_vec(), b"v".to_vec())
                .delete(vec![1u8; MAX_KEY_BYTES + 1]),
        ),
        (
            "oversize value",
            Batch::new().put(b"k".to_vec(), vec![0u8; MAX_VALUE_BYTES + 1]),
        ),
        (
            "oversize batch",
            (0..=MAX_BATCH_BYTES / MAX_VALUE_BYTES).fold(Batch::new(), |b, i| {
                b.put(format!("k{i}").into_bytes(), big_value.clone())
            }),
        ),
    ];
    for (what, bad) in cases {
        let err = store.apply(&p, &bad).unwrap_err();
        assert!(
            matches!(err, Error::TooLarge { .. } | Error::InvalidArgument(_)),
            "{what}: {err:?}"
        );
        assert!(disk_bytes(&fs) == disk_before, "{what}: the disk changed");
        assert_eq!(
            read_state(&store).unwrap(),
            state_before,
            "{what}: the store changed"
        );
    }
    // The store still works, and the refusals left nothing behind after a reopen either.
    assert!(store.apply(&p, &batch(7)).unwrap().is_committed());
    store.close().unwrap();
    let store = builder(&fs).open().unwrap();
    let mut model = Model::default();
    assert_eq!(check_store(&mut model, &store, 7, 7), Ok(7));
}

/// Every file of the store and its bytes.
fn disk_bytes(fs: &FaultFs) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for dir in [Path::new(DIR).to_path_buf(), journal()] {
        for name in fs.list(&dir).unwrap() {
            let path = dir.join(&name);
            if let Some(bytes) = fs.read_file(&path) {
                files.push((path, bytes));
            }
        }
    }
    files
}

/// Bit rot in an acknowledged record of the newest segment, where the record after it was
/// written in the same group commit (its frame proves nothing about the damaged one) and a
/// later one was framed after that group's sync: the damage is durable, not a torn tail, and
/// the later acknowledged batches survive (SPEC S3, S4). Open used to ask only the next record
/// for proof, took the damage for a torn write and cut both acknowledged batches after it; the
/// simulator's bit-rot check found it.
#[test]
fn damage_whose_proof_is_not_the_next_record_is_not_a_torn_tail() {
    use common::os_files::{ObservedOs, SyncGate, wait};
    use crossbeam::channel::unbounded;

    let fs = FaultFs::new();
    let (gate, held, go) = SyncGate::new();
    let (appended_tx, appended) = unbounded();
    let store = Arc::new(
        builder(&fs)
            .vfs(Arc::new(ObservedOs::over(gate.clone(), fs.clone())))
            .observe_appends(move |p, _lsn| {
                let _ = appended_tx.send(p.to_string());
            })
            .open()
            .unwrap(),
    );
    fn value(name: &str) -> Vec<u8> {
        format!("{name}:{}", ".".repeat(200)).into_bytes()
    }
    fn put(store: &FileStore, name: &str) {
        let p = Partition::new(name).unwrap();
        let outcome = store.apply(&p, &Batch::new().put(b"k".to_vec(), value(name)));
        assert!(outcome.unwrap().is_committed(), "{name}");
    }
    let spawn_put = |name: &'static str| {
        let store = store.clone();
        std::thread::spawn(move || put(&store, name))
    };
    // The segment's first step is prepared, so the held sync is a commit's own.
    put(&store, "warm");
    assert_eq!(wait(&appended, "the warm-up's append"), "warm");
    gate.arm();
    let held_commit = spawn_put("held");
    assert_eq!(wait(&appended, "the held commit's append"), "held");
    wait(&held, "the leader's sync");
    // Queued behind the held sync: written together by the next leader, each framed before
    // either was durable.
    let damaged = spawn_put("damaged");
    assert_eq!(wait(&appended, "the damaged record's append"), "damaged");
    let same_group = spawn_put("samegroup");
    assert_eq!(wait(&appended, "its group's append"), "samegroup");
    go.send(()).unwrap();
    for writer in [held_commit, damaged, same_group] {
        writer.join().unwrap();
    }
    // Framed after the group's sync: its frame proves the damaged record durable.
    put(&store, "proof");
    let image = fs.crash_process();
    drop(store);

    let seg = segments(&image).last().unwrap().clone();
    let bytes = image.read_file(&seg).unwrap();
    let at = bytes
        .windows(8)
        .position(|w| w == b"damaged:")
        .expect("the damaged record's value");
    damage(&image, &seg, |b| b[at + 100] ^= 0x10);

    let reopened = builder(&image).open().unwrap();
    let report = reopened.open_report().clone();
    assert_eq!(report.torn_tail, None, "{report:?}");
    for name in ["warm", "held", "samegroup", "proof"] {
        let got = reopened.get(&Partition::new(name).unwrap(), b"k");
        assert_eq!(got.unwrap(), Some(value(name)), "{name}: {report:?}");
    }
    let got = reopened.get(&Partition::new("damaged").unwrap(), b"k");
    assert!(matches!(got, Err(Error::Corrupt { .. })), "{got:?}");
}
