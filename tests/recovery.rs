//! Recovery after damage and loss on the file-backed store (SPEC S3, S4, S10): what open keeps,
//! what it refuses, and that nothing is ever rolled back silently. Runs on [`FaultFs`] so the
//! tests damage exact bytes of the documented layout (see `common::layout`).

mod common;

use std::path::Path;

use common::check::{Model, check_store};
use common::disk::{
    BATCHES, DIR, KEEPER, KEPT, Tally, builder, damage, partitions_in, segment_number, segments,
    snapshot_files, value_in_a_sealed_segment, written, written_after_keeper,
};
use common::layout;
use common::workload::PARTITIONS;
use portcullis::Error;
use portcullis::store::{Batch, FaultFs, FileStore, Partition, Store, SyncPolicy, Vfs};

const NAMES: [&str; 6] = ["p0", "p1", "p2", "p3", "p4", "p5"];

/// A disk left by a killed process: rounds of writes to every partition, then a final round
/// whose records sit together in one sealed segment (`final_segment`), then filler writes to
/// another partition and one write to `late`, a partition that exists only after that segment.
struct Scene {
    fs: FaultFs,
    tally: Tally,
    final_segment: std::path::PathBuf,
    /// Offsets of the final round's records in `final_segment`, by partition.
    final_records: Vec<(String, layout::RecordAt)>,
}

fn scene(snapshot_after_first_round: bool, clean_close: bool) -> Scene {
    let fs = FaultFs::new();
    // No base records: each partition's chain is its batches, so the history an operator
    // accepts is exactly the batches before the damage.
    let store = builder(&fs).base_every_records(1000).open().unwrap();
    let mut tally = Tally::default();
    for round in 0..3 {
        for name in NAMES {
            tally.put(&store, name, 150);
        }
        if round == 0 && snapshot_after_first_round {
            store.write_heads_snapshot().unwrap();
        }
    }
    // Start the final round in a fresh segment, so it lies in one segment.
    let before = segments(&fs).len();
    while segments(&fs).len() == before {
        tally.put(&store, "filler", 900);
    }
    for name in NAMES {
        tally.put(&store, name, 100);
    }
    let final_segment = segments(&fs).pop().unwrap();
    // Seal it.
    while segments(&fs).last() == Some(&final_segment) {
        tally.put(&store, "filler", 900);
    }
    tally.put(&store, "filler", 900);
    tally.put(&store, "late", 10);
    let fs = if clean_close {
        store.close().unwrap();
        fs
    } else {
        let image = fs.crash_process();
        drop(store);
        image
    };
    let bytes = fs.read_file(&final_segment).unwrap();
    let final_records = layout::records(&bytes)
        .into_iter()
        .filter_map(|r| {
            NAMES
                .iter()
                .find(|n| layout::partition_hash(n.as_bytes()) == r.partition_hash)
                .map(|n| (n.to_string(), r))
        })
        .collect();
    Scene {
        fs,
        tally,
        final_segment,
        final_records,
    }
}

/// Asserts that partition `name` is refused with `Corrupt` by every read path.
fn assert_refused(store: &FileStore, name: &str) {
    let p = Partition::new(name).unwrap();
    let got = store.get(&p, b"v");
    assert!(
        matches!(got, Err(Error::Corrupt { .. })),
        "{name}: get answered {got:?}"
    );
    let write = store.apply(&p, &Batch::new().put(b"v".to_vec(), b"new".to_vec()));
    assert!(
        matches!(write, Err(Error::Corrupt { .. })),
        "{name}: a write answered {write:?}"
    );
}

/// Item 2 of issue 8 (SPEC S4): a damaged header of the newest segment, which holds
/// acknowledged batches, is damage, not "a creation cut short": open keeps the file unchanged,
/// reports it, refuses what it held, and rolls nothing back.
#[test]
fn a_damaged_header_of_the_newest_segment_keeps_the_file_and_refuses_what_it_held() {
    let fs = written(false);
    let newest = segments(&fs).pop().unwrap();
    let held = partitions_in(&fs.read_file(&newest).unwrap(), &PARTITIONS);
    assert!(!held.is_empty(), "the newest segment holds records");
    damage(&fs, &newest, |b| b[17] ^= 0x40); // inside the segment number: checksum fails
    let before = fs.read_file(&newest).unwrap();

    let store = builder(&fs).open().unwrap();
    assert_eq!(
        fs.read_file(&newest).as_ref(),
        Some(&before),
        "open changed or deleted a segment of acknowledged records"
    );
    let report = store.open_report().clone();
    assert!(
        report
            .damaged
            .iter()
            .any(|d| d.segment == segment_number(&newest)),
        "the damaged header is reported: {report:?}"
    );
    for name in &held {
        assert_refused(&store, name);
    }
    // Nothing else rolled back either: every partition answers its final state or refuses.
    let mut model = Model::default();
    let expected = model.state(BATCHES).clone();
    for name in PARTITIONS {
        let p = Partition::new(name).unwrap();
        match store.scan(&p, &portcullis::store::KeyRange::all(), None, 100) {
            Ok(page) => assert_eq!(
                Some(&page.entries.into_iter().collect()),
                expected.get(name),
                "{name} was rolled back"
            ),
            Err(Error::Corrupt { .. }) => {}
            Err(e) => panic!("{name}: {e}"),
        }
    }
    // The journal goes on in a new segment, and the damaged one is still there after a reopen.
    store.close().unwrap();
    let again = builder(&fs).open().unwrap();
    assert_eq!(fs.read_file(&newest).as_ref(), Some(&before));
    for name in &held {
        assert_refused(&again, name);
    }
}

/// The control for item 2: a newest segment whose header is cut short and holds nothing after
/// it is a creation cut short, and is removed.
#[test]
fn a_newest_segment_whose_creation_was_cut_short_is_removed() {
    for tail in [Vec::new(), vec![0u8; 300]] {
        let fs = written(true);
        let newest = segments(&fs).pop().unwrap();
        let next = newest.with_file_name(format!("{:010}.seg", segment_number(&newest) + 1));
        let mut bytes = b"PCLSSEG\x01\x02\x00".to_vec();
        bytes.extend_from_slice(&tail);
        fs.write_file(&next, bytes).unwrap();
        let store = builder(&fs).open().unwrap();
        assert!(
            fs.read_file(&next).is_none(),
            "the empty segment is removed"
        );
        assert!(store.open_report().damaged.is_empty());
        let mut model = Model::default();
        assert_eq!(
            check_store(&mut model, &store, BATCHES, BATCHES),
            Ok(BATCHES)
        );
    }
}

/// Item 3 of issue 8 (SPEC S3, S4): what a killed process wrote may be only in the page cache.
/// Open makes the journal tail it found durable before serving it, so a power cut after
/// readers saw it cannot take it away.
#[test]
fn open_syncs_the_journal_tail_it_found_before_serving_it() {
    let fs = FaultFs::new();
    let store = builder(&fs)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .open()
        .unwrap();
    let mut tally = Tally::default();
    for round in 0..4 {
        for name in NAMES {
            tally.put(&store, name, 40 + round);
        }
    }
    // The process dies: its unsynced writes are in the page cache only.
    let killed = fs.fork();
    drop(store);
    assert!(killed.has_unsynced(), "the workload left unsynced writes");

    let reopened = builder(&killed).open().unwrap();
    assert!(
        tally.refused(&reopened).is_empty(),
        "every batch is visible"
    );
    for seed in 0..16 {
        let after_power_cut = builder(&killed.crash(seed)).open().unwrap();
        assert!(
            tally.refused(&after_power_cut).is_empty(),
            "seed {seed}: a power cut took away what readers already saw"
        );
    }
}

/// Item 4 of issue 8 (SPEC S4): damage spanning several records (a zeroed run of bytes) refuses
/// every partition whose records could lie there, not only the first; nothing rolls back.
#[test]
fn damage_spanning_several_records_refuses_every_partition_it_could_hold() {
    let s = scene(false, false);
    // Zero from the start of p1's final record to the middle of p3's.
    let at = |name: &str| s.final_records.iter().find(|(n, _)| n == name).unwrap().1;
    let (from, to) = (at("p1"), at("p3"));
    damage(&s.fs, &s.final_segment, |b| {
        b[from.offset..to.offset + layout::FRAME_LEN + to.body_len / 2].fill(0)
    });

    let store = builder(&s.fs).open().unwrap();
    assert!(!store.open_report().damaged.is_empty());
    let refused = s.tally.refused(&store);
    for name in ["p1", "p2", "p3"] {
        assert!(
            refused.contains(&name.to_owned()),
            "{name} must be refused: {refused:?}"
        );
    }
    // Records after the range prove their partitions intact.
    for name in ["p4", "p5", "late"] {
        assert!(
            !refused.contains(&name.to_owned()),
            "{name} is intact: {refused:?}"
        );
    }
    // A partition the store does not know may have lived only in the range: refused too.
    assert_refused(&store, "never-seen");
    assert!(!store.damage().unattributed.is_empty());
}

/// Item 5 of issue 8 (SPEC S4): a refusal survives snapshots, close, reopen and a damaged
/// manifest, until an operator accepts it; then the partition serves its intact history.
#[test]
fn a_refusal_survives_snapshots_and_reopen_until_an_operator_accepts_it() {
    let s = scene(false, false);
    let victim = s.final_records.iter().find(|(n, _)| n == "p2").unwrap().1;
    damage(&s.fs, &s.final_segment, |b| {
        b[victim.offset + layout::FRAME_LEN + victim.body_len - 3] ^= 0x08
    });
    let store = builder(&s.fs).open().unwrap();
    assert_eq!(s.tally.refused(&store), vec!["p2".to_owned()]);
    store.write_heads_snapshot().unwrap();
    store.close().unwrap();

    let store = builder(&s.fs).open().unwrap();
    assert_eq!(
        store.open_report().journal_bytes_scanned,
        0,
        "the snapshot covers the damage"
    );
    assert_eq!(
        s.tally.refused(&store),
        vec!["p2".to_owned()],
        "after reopen"
    );
    let listed = store.damage();
    assert_eq!(listed.partitions.len(), 1, "{listed:?}");
    assert_eq!(
        listed.partitions[0].partition,
        Some(Partition::new("p2").unwrap())
    );
    store.close().unwrap();

    // The refusal is in the snapshot too: a damaged manifest does not forget it.
    damage(&s.fs, &Path::new(DIR).join("MANIFEST"), |b| {
        let last = b.len() - 1;
        b[last] ^= 0x01
    });
    let store = builder(&s.fs).open().unwrap();
    assert!(store.open_report().rebuilt_by_full_scan);
    assert_eq!(
        s.tally.refused(&store),
        vec!["p2".to_owned()],
        "after a rebuild"
    );

    // The operator accepts: p2 serves its intact history (its previous value), durably.
    assert!(store.accept_damage(&Partition::new("p2").unwrap()).unwrap());
    let p2 = Partition::new("p2").unwrap();
    let older = &s.tally.written["p2"][s.tally.written["p2"].len() - 2];
    assert_eq!(store.get(&p2, b"v").unwrap().as_ref(), Some(older));
    store.close().unwrap();
    let store = builder(&s.fs).open().unwrap();
    assert_eq!(store.get(&p2, b"v").unwrap().as_ref(), Some(older));
    assert!(store.damage().is_empty(), "{:?}", store.damage());
}

/// Item 6 of issue 8 (SPEC S4): a corrupt manifest is rebuilt by a full scan and reported, as
/// docs/DESIGN.md says; the damaged file is kept aside as evidence.
#[test]
fn a_corrupt_manifest_is_rebuilt_by_a_full_scan_and_reported() {
    for flip_at in [9, 18, 23] {
        let fs = written(true);
        let manifest = Path::new(DIR).join("MANIFEST");
        damage(&fs, &manifest, |b| {
            let at = flip_at.min(b.len() - 1);
            b[at] ^= 0x04
        });
        let store = builder(&fs).open().unwrap();
        let report = store.open_report().clone();
        assert!(report.rebuilt_by_full_scan, "{report:?}");
        assert!(
            report
                .rebuild_reason
                .as_deref()
                .unwrap_or("")
                .contains("manifest"),
            "{report:?}"
        );
        assert!(
            fs.read_file(&Path::new(DIR).join("MANIFEST.damaged"))
                .is_some()
        );
        let mut model = Model::default();
        assert_eq!(
            check_store(&mut model, &store, BATCHES, BATCHES),
            Ok(BATCHES)
        );
    }
}

/// Item 7 of issue 8 (SPEC S10): every file is read magic and version first. A newer version
/// is refused with `UnsupportedVersion` even when the rest of the file has a layout this build
/// cannot check, and nothing is changed; a damaged version field is damage, never "upgrade".
/// The first segment is sealed and older than the heads snapshot, so open does not read it:
/// the first read that needs it (the keeper's) answers instead, as open would have.
#[test]
fn every_file_reads_magic_and_version_first() {
    let keeper = Partition::new(KEEPER).unwrap();
    for target in ["first segment", "newest segment", "manifest", "snapshot"] {
        let path_of = |fs: &FaultFs| match target {
            "first segment" => segments(fs)[0].clone(),
            "newest segment" => segments(fs).pop().unwrap(),
            "manifest" => Path::new(DIR).join("MANIFEST"),
            _ => snapshot_files(fs).pop().unwrap(),
        };
        // A later release's file: its preamble checks out, the rest is not this layout.
        let fs = written_after_keeper(true);
        let path = path_of(&fs);
        damage(&fs, &path, |b| layout::set_preamble_version(b, 4));
        let before: Vec<_> = segments(&fs).iter().map(|s| fs.read_file(s)).collect();
        let opened = match builder(&fs).open() {
            Ok(store) if target == "first segment" => store
                .get(&keeper, KEPT.0)
                .map(|_| unreachable!("the keeper was read")),
            other => other.map(|_| ()),
        };
        match opened {
            Err(Error::UnsupportedVersion { found: 4, .. }) => {}
            other => panic!("{target}: a newer version answered {other:?}"),
        }
        let after: Vec<_> = segments(&fs).iter().map(|s| fs.read_file(s)).collect();
        assert!(before == after, "{target}: refusing changed the journal");

        // A flipped bit in the version field: damage, and open goes on.
        let fs = written_after_keeper(true);
        let path = path_of(&fs);
        damage(&fs, &path, |b| b[layout::VERSION_AT] ^= 0x04);
        let store = builder(&fs)
            .open()
            .unwrap_or_else(|e| panic!("{target}: a damaged version field answered {e}"));
        if target == "first segment" {
            let err = store.get(&keeper, KEPT.0).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
            let n = segment_number(&path);
            assert!(err.to_string().contains(&format!("segment {n}")), "{err}");
            assert!(
                store
                    .damage()
                    .partitions
                    .iter()
                    .any(|r| r.partition.as_ref() == Some(&keeper)),
                "the refusal is recorded"
            );
        } else {
            let report = store.open_report();
            assert!(
                report.rebuilt_by_full_scan || !report.damaged.is_empty(),
                "{target}: the damage is reported: {report:?}"
            );
        }
        assert!(fs.read_file(&path).is_some() || target == "manifest");
    }
}

/// Item 8 of issue 8 (SPEC S4): a segment after the snapshot that is lost, cut to its header, or
/// cut at a record boundary is a loss, not a compaction gap: the partitions whose records were
/// there are refused, never rolled back.
#[test]
fn a_lost_or_truncated_segment_after_the_snapshot_is_refused_not_rolled_back() {
    for how in ["removed", "cut to its header", "cut at a record boundary"] {
        let s = scene(true, false);
        let cut = s.final_records[1].1.offset;
        match how {
            "removed" => s.fs.remove(&s.final_segment).unwrap(),
            "cut to its header" => damage(&s.fs, &s.final_segment, |b| {
                b.truncate(layout::SEGMENT_HEADER_LEN)
            }),
            _ => damage(&s.fs, &s.final_segment, |b| b.truncate(cut)),
        }
        let lost: Vec<&str> = s
            .final_records
            .iter()
            .filter(|(_, r)| how != "cut at a record boundary" || r.offset >= cut)
            .map(|(n, _)| n.as_str())
            .collect();
        let store = builder(&s.fs).open().unwrap();
        assert!(!store.open_report().damaged.is_empty(), "{how}: reported");
        let refused = s.tally.refused(&store);
        for name in &lost {
            assert!(
                refused.contains(&name.to_string()),
                "{how}: {name} must be refused"
            );
        }
        assert!(
            !refused.contains(&"late".to_owned()),
            "{how}: late is intact"
        );
        assert_refused(&store, "never-seen");
        // An operator who accepts the loss gets the intact history back.
        store.accept_unattributed_damage().unwrap();
        for name in &lost {
            store
                .accept_damage(&Partition::new(*name).unwrap())
                .unwrap();
        }
        let p = Partition::new("never-seen").unwrap();
        assert_eq!(store.get(&p, b"v").unwrap(), None);
    }
}

/// Item 9 of issue 8 (SPEC S4): one damaged header of a sealed segment does not make the store
/// unopenable; open goes on and refuses only what that segment could hold, in snapshotted
/// history and in the journal open scans alike.
#[test]
fn a_damaged_sealed_segment_header_refuses_only_what_it_could_hold() {
    for clean_close in [true, false] {
        let s = scene(false, clean_close);
        damage(&s.fs, &s.final_segment, |b| b[17] ^= 0x40);
        let store = builder(&s.fs)
            .open()
            .unwrap_or_else(|e| panic!("clean close {clean_close}: open failed: {e}"));
        let refused = s.tally.refused(&store);
        for (name, _) in &s.final_records {
            assert!(refused.contains(name), "{name} had its newest record there");
        }
        assert!(
            !refused.contains(&"late".to_owned()),
            "late never touched the segment"
        );
        if clean_close {
            let err = store.get(&Partition::new("p0").unwrap(), b"v").unwrap_err();
            let n = segment_number(&s.final_segment);
            assert!(err.to_string().contains(&format!("segment {n}")), "{err}");
        }
    }
}

/// Item 10 of issue 8 (SPEC S4): a value in a truncated segment answers `Corrupt` naming the
/// segment and the partition, never a retryable `Io` error.
#[test]
fn a_truncated_segment_answers_corrupt_naming_segment_and_partition() {
    let fs = FaultFs::new();
    let (store, big, holder) = value_in_a_sealed_segment(&fs);
    store.close().unwrap();
    damage(&fs, &holder, |b| {
        b.truncate(layout::SEGMENT_HEADER_LEN + 20)
    });

    let store = builder(&fs).open().unwrap();
    assert_eq!(store.get(&big, b"k7").unwrap(), Some(vec![b'x'; 10]));
    let err = store.get(&big, b"old").unwrap_err();
    let n = segment_number(&holder);
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("big") && msg.contains(&format!("segment {n}")),
        "{msg}"
    );
}

/// Item 8 of issue 8, the newest segment: the segment the heads snapshot points into is lost
/// with everything after it; the journal must not simply end earlier and roll back.
#[test]
fn a_lost_newest_segment_past_the_snapshot_is_refused_not_rolled_back() {
    let s = scene(false, false);
    // A snapshot positioned in the newest segment, then more writes into it.
    let store = builder(&s.fs).open().unwrap();
    store.write_heads_snapshot().unwrap();
    let mut tally = s.tally;
    tally.put(&store, "late", 10);
    tally.put(&store, "p1", 10);
    let fs = s.fs.crash_process();
    drop(store);
    let newest = segments(&fs).pop().unwrap();
    fs.remove(&newest).unwrap();

    let store = builder(&fs).open().unwrap();
    assert!(!store.open_report().damaged.is_empty(), "reported");
    let refused = tally.refused(&store);
    for name in ["p1", "late"] {
        assert!(refused.contains(&name.to_owned()), "{name}: {refused:?}");
    }
    assert_refused(&store, "never-seen");
}

/// Item 8 of issue 8, a rebuild: with the snapshot lost, a gap compaction did not record is a
/// loss (refused), while the gaps it recorded are accepted (`file_store`'s
/// `rebuild_after_compaction_accepts_lsn_gaps_and_reports_damage`).
#[test]
fn a_rebuild_treats_a_gap_compaction_did_not_record_as_a_loss() {
    let s = scene(false, true);
    for snap in snapshot_files(&s.fs) {
        s.fs.remove(&snap).unwrap();
    }
    s.fs.remove(&s.final_segment).unwrap();
    let store = builder(&s.fs).open().unwrap();
    assert!(store.open_report().rebuilt_by_full_scan);
    let refused = s.tally.refused(&store);
    for (name, _) in &s.final_records {
        assert!(refused.contains(name), "{name}: {refused:?}");
    }
    assert!(!refused.contains(&"late".to_owned()));
}

/// Format version 1 (no preamble checksum) is still read (SPEC S10): segment headers and
/// whole-file envelopes of version 1 open, and the data is intact.
#[test]
fn a_version_1_store_is_still_read() {
    let fs = written(true);
    for seg in segments(&fs) {
        damage(&fs, &seg, |b| {
            // Version 1 header: magic | 1 | number | salt | crc of bytes 0..24 | padding.
            let number: [u8; 4] = b[16..20].try_into().unwrap();
            let salt: [u8; 8] = b[20..28].try_into().unwrap();
            b[8..12].copy_from_slice(&1u32.to_le_bytes());
            b[12..16].copy_from_slice(&number);
            b[16..24].copy_from_slice(&salt);
            let crc = crc32c::crc32c(&b[0..24]);
            b[24..28].copy_from_slice(&crc.to_le_bytes());
            b[28..32].fill(0);
        });
    }
    for snap in snapshot_files(&fs) {
        fs.remove(&snap).unwrap();
    }
    // A version 1 manifest naming no snapshot: magic | 1 | body length | crc | body (None).
    let body = [0u8];
    let mut manifest = b"PCLSMANI".to_vec();
    manifest.extend_from_slice(&1u32.to_le_bytes());
    manifest.extend_from_slice(&1u32.to_le_bytes());
    manifest.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    manifest.extend_from_slice(&body);
    fs.write_file(&Path::new(DIR).join("MANIFEST"), manifest)
        .unwrap();

    let store = builder(&fs).open().unwrap();
    let report = store.open_report().clone();
    assert!(report.damaged.is_empty(), "{report:?}");
    let mut model = Model::default();
    assert_eq!(
        check_store(&mut model, &store, BATCHES, BATCHES),
        Ok(BATCHES)
    );
}

/// Item 10 of issue 8, the other side: a transient I/O error while a load reads a record is
/// `Io`, not damage; it is neither remembered nor persisted, and the next read succeeds.
#[test]
fn a_transient_read_error_during_a_load_is_not_damage() {
    let fs = written(true);
    let store = builder(&fs).open().unwrap();
    let p = Partition::new(PARTITIONS[0]).unwrap();
    fs.fail_at(fs.ops() + 1, portcullis::store::FailMode::Once);
    let err = store.get(&p, b"g").unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(
        store.get(&p, b"g").unwrap().is_some(),
        "the next read works"
    );
    assert!(store.damage().is_empty(), "{:?}", store.damage());
}
