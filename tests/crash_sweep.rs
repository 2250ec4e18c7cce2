//! Power cuts at every I/O operation of the file-backed store (SPEC S3, S4).
//!
//! Each workload runs once on a [`FaultFs`] that keeps a copy of the disk before every
//! operation that changes it (a crash point). For every crash point, several seeded crash
//! images are built the way a power cut could leave the disk (unsynced writes kept in any
//! subset of 4 KiB pieces, out of order, possibly torn; unsynced directory changes kept in any
//! subset; see [`FaultFs::crash`]) and checked by [`check_power_cut`]: open succeeds with no
//! damage, exactly a prefix of the committed batches containing every acknowledged one, no
//! partial batch, and a store that works afterwards.
//!
//! Workloads: one writer through store creation, segment rotation, base records, a heads
//! snapshot, compaction, close, reopen-then-write; the same with the process killed inside a
//! journal `fdatasync`, reopened, written to, and then a power cut at every operation after
//! that; and several writer threads sharing syncs (group commit) while a snapshot and a
//! compaction run beside them. Negative controls turn one sync off each and must be caught.

mod common;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Barrier};

use common::check::{Model, check_state, read_state};
use common::crash::{DIR, Timeline, builder, check_power_cut, image_seed, write_batches};
use common::workload::{decode_gen, writer_batch, writer_partition, writer_rows};
use parking_lot::Mutex;
use portcullis::store::{CrashPoint, FaultFs, KeyRange, Outcome, SkipSync, Store, SyncPolicy};

/// How much a lane sweeps.
#[derive(Clone, Copy)]
struct Lane {
    /// Batches of the single-writer workload before it closes and reopens.
    batches: u64,
    /// Crash images per crash point.
    seeds: u64,
    /// Seeds every crash image of the run (printed with any failure).
    base_seed: u64,
    /// Rounds of the group-commit workload (each writer commits one batch per round).
    rounds: u64,
}

const DEFAULT_LANE: Lane = Lane {
    batches: 24,
    seeds: 3,
    base_seed: 0x00C0_FFEE,
    rounds: 12,
};

/// The long lane: more batches and more images per point (run in release by .ci/run).
fn long_lane() -> Lane {
    let base_seed = std::env::var("PORTCULLIS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_C0DE);
    Lane {
        batches: 90,
        seeds: 32,
        base_seed,
        rounds: 40,
    }
}

/// What a sweep found wrong. A sweep stops at its first finding, except for a negative control,
/// which sweeps on to show every way the missing sync shows.
struct Findings {
    keep_going: bool,
    found: Vec<String>,
    /// Images checked.
    images: u64,
    /// Images whose open truncated a torn tail.
    torn_tails: u64,
    /// Images that lost batches which were attempted but not acknowledged.
    lost_unacknowledged: u64,
}

impl Findings {
    fn new(skip: Option<SkipSync>) -> Self {
        Findings {
            keep_going: skip.is_some(),
            found: Vec::new(),
            images: 0,
            torn_tails: 0,
            lost_unacknowledged: 0,
        }
    }

    /// Records a check's result; `Err` means stop now.
    fn note(&mut self, result: Result<(), String>) -> Result<(), String> {
        match result {
            Err(e) if self.keep_going => {
                self.found.push(e);
                Ok(())
            }
            other => other,
        }
    }

    fn finish(self, swept: usize) -> Result<usize, String> {
        if self.found.is_empty() {
            eprintln!(
                "{} images: {} with a torn tail truncated, {} lost unacknowledged batches",
                self.images, self.torn_tails, self.lost_unacknowledged
            );
            // A sweep that never tears a tail or drops an unsynced batch tests nothing.
            if self.images > 0 && (self.torn_tails == 0 || self.lost_unacknowledged == 0) {
                return Err(format!(
                    "the sweep is toothless: {} images, {} torn tails, {} with unacknowledged \
                     batches lost",
                    self.images, self.torn_tails, self.lost_unacknowledged
                ));
            }
            Ok(swept)
        } else {
            Err(self.found.join("\n"))
        }
    }
}

/// Runs `f`, turning a panic into an error that names `what`.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(panic) => {
            eprintln!("panicked at {what}");
            resume_unwind(panic)
        }
    }
}

/// One writer: creates the store, writes `lane.batches` batches with a heads snapshot after a
/// third of them and a compaction after two thirds, closes, reopens and writes four more.
/// Returns every crash point and the timeline of the batches. Under a weak `policy` only the
/// snapshot, the compaction and each close acknowledge (they sync everything before them).
fn single_writer(
    lane: Lane,
    skip: Option<SkipSync>,
    policy: SyncPolicy,
) -> (Vec<CrashPoint>, Timeline) {
    let fs = FaultFs::new();
    fs.record_crash_points();
    let mut timeline = if policy == SyncPolicy::SyncEveryCommit {
        Timeline::default()
    } else {
        Timeline::weak()
    };
    let open = || builder(&fs, skip).sync_policy(policy).open();
    let store = open().expect("creating the store");
    let n = lane.batches;
    write_batches(&store, &fs, &mut timeline, 1..=n, |i, timeline| {
        if i == n / 3 {
            store.write_heads_snapshot().expect("snapshot");
            timeline.flushed(i, &fs);
        }
        if i == 2 * n / 3 {
            let report = store.compact().expect("compaction");
            assert!(report.segments_removed > 0, "compaction removed nothing");
            timeline.flushed(i, &fs);
        }
    });
    store.close().expect("close");
    timeline.flushed(n, &fs);
    let store = open().expect("reopening");
    write_batches(&store, &fs, &mut timeline, n + 1..=n + 4, |_, _| {});
    store.close().expect("second close");
    timeline.flushed(n + 4, &fs);
    (fs.take_crash_points(), timeline)
}

/// Checks `lane.seeds` power-cut images at every crash point of a single-writer run. `bounds`
/// gives, for a crash point's operation, the newest batch that must survive and the newest
/// that may.
fn sweep_points(
    lane: Lane,
    points: &[CrashPoint],
    bounds: impl Fn(u64) -> (u64, u64),
    model: &mut Model,
    findings: &mut Findings,
    context: &str,
) -> Result<(), String> {
    for point in points {
        let (acked, attempted) = bounds(point.op);
        for s in 0..lane.seeds {
            let seed = image_seed(lane.base_seed, point.op, s);
            let what = format!("{context}power cut {point:?}, image seed {seed:#x}");
            let image = point.power_cut(seed);
            let checked = guarded(&what, || {
                check_power_cut(&image, model, acked, attempted, seed)
            });
            if let Ok(recovered) = &checked {
                findings.images += 1;
                findings.torn_tails += u64::from(recovered.torn_tail);
                findings.lost_unacknowledged += u64::from(recovered.newest < attempted);
            }
            findings.note(checked.map(|_| ()))?;
        }
    }
    Ok(())
}

fn single_writer_sweep(
    lane: Lane,
    skip: Option<SkipSync>,
    policy: SyncPolicy,
) -> Result<usize, String> {
    let (points, timeline) = single_writer(lane, skip, policy);
    let mut model = Model::default();
    let bounds = |op| (timeline.acked_before(op), timeline.attempted_before(op));
    let mut findings = Findings::new(skip);
    sweep_points(lane, &points, bounds, &mut model, &mut findings, "")?;
    findings.finish(points.len())
}

/// How the first life of a two-life sweep ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FirstCrash {
    /// The process is killed inside a sync (a journal `fdatasync`, a snapshot's, a
    /// directory's): the page cache holds writes the disk may not.
    Kill,
    /// The process is killed before any operation that changes the disk (a write, a
    /// truncation, a creation, a rename, a removal, a sync), not only inside syncs.
    KillAnywhere,
    /// The power is cut (one seeded image per point): recovery then repairs the image (a torn
    /// tail truncated, a half-created segment removed) while a second power cut may strike.
    PowerCut,
}

/// Ends the single writer's first life at every `stride`-th crash point (only syncs for
/// [`FirstCrash::Kill`]), then reopens, reads, writes two batches and closes while recording,
/// and power-cuts at every operation of that second life. Once open has returned, what it showed counts as
/// acknowledged: readers may have seen it.
fn second_life_sweep(
    lane: Lane,
    first: FirstCrash,
    stride: usize,
    skip: Option<SkipSync>,
) -> Result<usize, String> {
    let (points, timeline) = single_writer(lane, skip, SyncPolicy::SyncEveryCommit);
    let mut model = Model::default();
    let ends: Vec<&CrashPoint> = points
        .iter()
        .filter(|p| first != FirstCrash::Kill || p.what.starts_with("sync_"))
        .step_by(stride)
        .collect();
    let journal_syncs = ends
        .iter()
        .filter(|p| p.what.starts_with(&format!("sync_data {DIR}/journal")))
        .count();
    assert!(journal_syncs >= 5, "too few journal syncs: {journal_syncs}");
    let mut findings = Findings::new(skip);
    let mut swept = 0;
    for end in ends {
        let acked = timeline.acked_before(end.op);
        let attempted = timeline.attempted_before(end.op);
        let (fs, context) = match first {
            FirstCrash::Kill | FirstCrash::KillAnywhere => {
                (end.kill(), format!("killed {end:?}, then "))
            }
            FirstCrash::PowerCut => {
                let seed = image_seed(lane.base_seed ^ 0x2B, end.op, 0);
                let context = format!("power cut {end:?} (image seed {seed:#x}), then ");
                (end.power_cut(seed), context)
            }
        };
        fs.record_crash_points();
        let reopened = builder(&fs, skip)
            .open()
            .map_err(|e| format!("{context}reopening failed: {e}"))
            .and_then(|store| {
                let state =
                    read_state(&store).map_err(|e| format!("{context}reading failed: {e}"))?;
                let seen = check_state(&mut model, &state, acked, attempted)
                    .map_err(|e| format!("{context}after reopening: {e}"))?;
                Ok((store, seen))
            });
        let (store, seen) = match reopened {
            Ok(found) => found,
            Err(e) => {
                findings.note(Err(e))?;
                continue;
            }
        };
        let opened = fs.ops();
        let mut second = Timeline::default();
        write_batches(&store, &fs, &mut second, seen + 1..=seen + 2, |_, _| {});
        store
            .close()
            .map_err(|e| format!("{context}close failed: {e}"))?;
        let after = fs.take_crash_points();
        // The first life's batches (as far as it got before the kill) count at every point of
        // the second, whose disk counts operations afresh; once open has returned, what it
        // showed must survive too.
        let bounds = |op: u64| {
            let floor = if op > opened { seen } else { acked };
            let must = floor.max(second.acked_before(op));
            (must, attempted.max(second.attempted_before(op)).max(must))
        };
        sweep_points(lane, &after, bounds, &mut model, &mut findings, &context)?;
        swept += after.len();
    }
    findings.finish(swept)
}

/// Several writer threads, each committing one batch per round to its own partition, so their
/// commits share syncs; a heads snapshot and a compaction run beside one round each. The store
/// reports the journal position (LSN) of every batch, so the check can demand a prefix of the
/// journal, not of each partition alone.
struct GroupRun {
    points: Vec<CrashPoint>,
    /// Per writer: the timeline of its batches.
    timelines: Vec<Timeline>,
    /// (writer, batch) -> LSN.
    lsns: HashMap<(usize, u64), u64>,
}

const WRITERS: usize = 3;

fn group_commit(lane: Lane, skip: Option<SkipSync>) -> GroupRun {
    let fs = FaultFs::new();
    fs.record_crash_points();
    let lsns: Arc<Mutex<HashMap<(usize, u64), u64>>> = Arc::default();
    let counts: Arc<Mutex<HashMap<usize, u64>>> = Arc::default();
    let observe = {
        let (lsns, counts) = (lsns.clone(), counts.clone());
        move |p: &portcullis::store::Partition, lsn: u64| {
            let name = String::from_utf8_lossy(p.as_bytes()).into_owned();
            let t: usize = name.trim_start_matches("writer-").parse().unwrap();
            let mut counts = counts.lock();
            let i = counts.entry(t).or_insert(0);
            *i += 1;
            lsns.lock().insert((t, *i), lsn);
        }
    };
    let store = builder(&fs, skip)
        .observe_appends(observe)
        .open()
        .expect("creating the store");
    let barrier = Barrier::new(WRITERS + 1);
    let timelines: Vec<Mutex<Timeline>> = (0..WRITERS).map(|_| Mutex::default()).collect();
    std::thread::scope(|s| {
        for (t, timeline) in timelines.iter().enumerate() {
            let (store, fs, barrier) = (&store, &fs, &barrier);
            s.spawn(move || {
                for i in 1..=lane.rounds {
                    barrier.wait();
                    timeline.lock().start(i, fs);
                    // A failure is recorded, not panicked on, so no thread is left at the
                    // barrier; the check below reports it.
                    if let Ok(Outcome::Committed) =
                        store.apply(&writer_partition(t), &writer_batch(i))
                    {
                        timeline.lock().ack(i, fs);
                    }
                }
            });
        }
        for r in 1..=lane.rounds {
            barrier.wait();
            if r == lane.rounds / 3 {
                store.write_heads_snapshot().expect("snapshot");
            }
            if r == 2 * lane.rounds / 3 {
                store.compact().expect("compaction");
            }
        }
    });
    store.close().expect("close");
    let timelines: Vec<Timeline> = timelines.into_iter().map(Mutex::into_inner).collect();
    for (t, timeline) in timelines.iter().enumerate() {
        assert_eq!(
            timeline.acked_before(u64::MAX),
            lane.rounds,
            "writer {t} stopped"
        );
    }
    let lsns = lsns.lock().clone();
    GroupRun {
        points: fs.take_crash_points(),
        timelines,
        lsns,
    }
}

/// Checks one image of the group-commit workload: each writer's partition at a whole batch,
/// at least its acknowledged one; and the batches visible are a prefix of the journal.
fn check_group_image(run: &GroupRun, op: u64, image: &FaultFs) -> Result<(), String> {
    let store = builder(image, None)
        .open()
        .map_err(|e| format!("open failed: {e}"))?;
    if !store.open_report().damaged.is_empty() {
        return Err(format!(
            "a power cut left damage: {:?}",
            store.open_report().damaged
        ));
    }
    let mut newest_visible: Option<(u64, usize, u64)> = None;
    let mut oldest_missing: Option<(u64, usize, u64)> = None;
    for (t, timeline) in run.timelines.iter().enumerate() {
        let p = writer_partition(t);
        let page = store
            .scan(&p, &KeyRange::all(), None, 100)
            .map_err(|e| format!("writer {t}: reading failed: {e}"))?;
        let rows: std::collections::BTreeMap<_, _> = page.entries.into_iter().collect();
        let g = match rows.get(&b"g"[..]) {
            Some(v) => decode_gen(v).ok_or("a malformed generation")?,
            None => 0,
        };
        let acked = timeline.acked_before(op);
        if g < acked {
            return Err(format!(
                "writer {t}: batch {acked} was acknowledged, the newest visible is {g}"
            ));
        }
        if g > timeline.attempted_before(op) {
            return Err(format!(
                "writer {t}: batch {g} is visible but was never attempted"
            ));
        }
        if rows != writer_rows(g) {
            return Err(format!("writer {t}: batch {g} is visible in part"));
        }
        if g > 0 {
            let lsn = run.lsns[&(t, g)];
            if newest_visible.is_none_or(|(l, _, _)| lsn > l) {
                newest_visible = Some((lsn, t, g));
            }
        }
        if let Some(&lsn) = run.lsns.get(&(t, g + 1))
            && oldest_missing.is_none_or(|(l, _, _)| lsn < l)
        {
            oldest_missing = Some((lsn, t, g + 1));
        }
        // The recovered store takes the writer's next batch.
        match store.apply(&p, &writer_batch(g + 1)) {
            Ok(Outcome::Committed) => {}
            other => {
                return Err(format!(
                    "writer {t}: batch {} after recovery answered {other:?}",
                    g + 1
                ));
            }
        }
    }
    if let (Some(visible), Some(missing)) = (newest_visible, oldest_missing)
        && visible.0 > missing.0
    {
        return Err(format!(
            "not a prefix of the journal: writer {} batch {} (LSN {}) is visible, but writer {} \
             batch {} (LSN {}) is not",
            visible.1, visible.2, visible.0, missing.1, missing.2, missing.0
        ));
    }
    store
        .close()
        .map_err(|e| format!("close after recovery: {e}"))
}

fn group_commit_sweep(lane: Lane, skip: Option<SkipSync>) -> Result<usize, String> {
    let run = group_commit(lane, skip);
    let mut findings = Findings::new(skip);
    for point in &run.points {
        for s in 0..lane.seeds {
            let seed = image_seed(lane.base_seed, point.op, s);
            let what = format!("group commit: power cut {point:?}, image seed {seed:#x}");
            let image = point.power_cut(seed);
            findings.note(guarded(&what, || check_group_image(&run, point.op, &image)))?;
        }
    }
    findings.finish(run.points.len())
}

fn must_pass(result: Result<usize, String>, what: &str) {
    match result {
        Ok(points) => eprintln!("{what}: {points} crash points swept"),
        Err(e) => panic!("{e}"),
    }
}

/// A power cut at every operation of one writer's life: creation, rotation, snapshot,
/// compaction, close, reopen-then-write (SPEC S3, S4).
#[test]
fn a_power_cut_at_every_operation_keeps_every_acknowledged_batch() {
    must_pass(
        single_writer_sweep(DEFAULT_LANE, None, SyncPolicy::SyncEveryCommit),
        "single writer",
    );
}

/// Under `NeverSyncMayLoseRecent` a power cut may lose any batch since the last snapshot,
/// compaction or close, but never shows a partial batch and never damages anything: every
/// segment but the newest was synced before the next began, whatever the policy (SPEC S4).
#[test]
fn a_power_cut_under_never_sync_loses_only_what_was_not_flushed() {
    must_pass(
        single_writer_sweep(DEFAULT_LANE, None, SyncPolicy::NeverSyncMayLoseRecent),
        "single writer, never sync",
    );
}

/// A process killed inside a journal sync leaves writes in the page cache that the disk may
/// not hold; the reopened store shows them, so it must make them durable before it serves
/// them (SPEC S4; PostgreSQL syncs its data directory after a crash for the same reason).
#[test]
fn a_power_cut_after_a_kill_and_reopen_loses_nothing_readers_saw() {
    must_pass(
        second_life_sweep(DEFAULT_LANE, FirstCrash::Kill, 2, None),
        "kill then power cut",
    );
}

/// A power cut, recovery, and a second power cut at every operation of recovery and of the
/// writes after it: what recovery repairs, and what it then shows, stays (SPEC S4).
#[test]
fn a_power_cut_during_recovery_loses_nothing_the_first_recovery_would_keep() {
    must_pass(
        second_life_sweep(DEFAULT_LANE, FirstCrash::PowerCut, 4, None),
        "power cut, recovery, power cut",
    );
}

/// A power cut at every operation while several writers share syncs and a snapshot and a
/// compaction run beside them: a prefix of the journal, every acknowledged batch (SPEC S3, S4).
#[test]
fn a_power_cut_during_group_commit_keeps_a_prefix_of_the_journal() {
    must_pass(group_commit_sweep(DEFAULT_LANE, None), "group commit");
}

/// The long lane: more batches and more images per crash point. Run in release by .ci/run;
/// `PORTCULLIS_CRASH_SEED` picks another seed.
#[test]
#[ignore = "long: thousands of crash images"]
fn power_cuts_long_lane() {
    let lane = long_lane();
    eprintln!("long lane, base seed {:#x}", lane.base_seed);
    must_pass(
        single_writer_sweep(lane, None, SyncPolicy::SyncEveryCommit),
        "single writer",
    );
    must_pass(
        single_writer_sweep(lane, None, SyncPolicy::NeverSyncMayLoseRecent),
        "single writer, never sync",
    );
    must_pass(
        second_life_sweep(lane, FirstCrash::Kill, 1, None),
        "kill then power cut",
    );
    must_pass(
        second_life_sweep(lane, FirstCrash::PowerCut, 1, None),
        "power cut, recovery, power cut",
    );
    must_pass(group_commit_sweep(lane, None), "group commit");
}

/// The long lane's kills at every operation of one writer's life, not only inside syncs
/// (creation, rotation, snapshot, compaction, close, reopen-then-write), each followed by a
/// reopen, reads, writes and a close with a power cut at every operation of that second life
/// (four images per point, to stay within the lane's time). Run in release by .ci/run.
#[test]
#[ignore = "long: a kill at every operation, then a power cut at every operation after it"]
fn kills_at_every_operation_long_lane() {
    let lane = Lane {
        seeds: 4,
        ..long_lane()
    };
    eprintln!("long lane, base seed {:#x}", lane.base_seed);
    must_pass(
        second_life_sweep(lane, FirstCrash::KillAnywhere, 1, None),
        "kill at every operation then power cut",
    );
}

/// A negative control must make the sweep fail, and at least once for the reason given.
fn must_catch(result: Result<usize, String>, reason: &[&str], control: &str) {
    match result {
        Ok(points) => panic!("{control}: {points} crash points swept and nothing was caught"),
        Err(e) => {
            let found: Vec<&str> = e.lines().collect();
            let hit = found
                .iter()
                .find(|f| reason.iter().any(|r| f.contains(r)))
                .unwrap_or_else(|| {
                    panic!(
                        "{control}: {} findings, none as expected ({reason:?}); first: {}",
                        found.len(),
                        found[0]
                    )
                });
            eprintln!("{control}: {} findings, for example: {hit}", found.len());
        }
    }
}

const LOST: &[&str] = &["was acknowledged"];

/// Negative control: commits acknowledged without `fdatasync` lose acknowledged batches.
#[test]
fn control_skipping_the_journal_sync_is_caught() {
    let skip = Some(SkipSync::JournalData);
    must_catch(
        single_writer_sweep(DEFAULT_LANE, skip, SyncPolicy::SyncEveryCommit),
        LOST,
        "no journal sync (one writer)",
    );
    must_catch(
        group_commit_sweep(DEFAULT_LANE, skip),
        LOST,
        "no journal sync (group commit)",
    );
}

/// Negative control: without directory syncs, a new segment (or the store itself) can vanish
/// with acknowledged batches in it.
#[test]
fn control_skipping_directory_syncs_is_caught() {
    let skip = Some(SkipSync::Directories);
    must_catch(
        single_writer_sweep(DEFAULT_LANE, skip, SyncPolicy::SyncEveryCommit),
        LOST,
        "no directory sync",
    );
}

/// Negative control: without syncing the parent when the store directory is created, the
/// whole store can vanish.
#[test]
fn control_skipping_the_parent_directory_sync_is_caught() {
    let skip = Some(SkipSync::ParentDirectory);
    must_catch(
        single_writer_sweep(DEFAULT_LANE, skip, SyncPolicy::SyncEveryCommit),
        LOST,
        "no parent directory sync",
    );
}

/// Negative control: a reopen after a clean close syncs nothing, but only then; an open that
/// skipped its syncs whatever it found would let a power cut after the reopen lose batches
/// readers saw.
#[test]
fn control_skipping_open_syncs_whatever_open_found_is_caught() {
    let skip = Some(SkipSync::FoundNothingCheck);
    must_catch(
        second_life_sweep(DEFAULT_LANE, FirstCrash::Kill, 1, skip),
        LOST,
        "no syncs at open after a killed writer",
    );
}

/// Negative control: open rewrites the tail segment's header and syncs the journal directory
/// only when the tail held no record; skipping them after every crash lets a segment whose
/// creation a kill cut short lose its directory entry in a power cut after the reopen, with
/// the batches the reopened store acknowledged in it.
#[test]
fn control_skipping_the_empty_tail_check_is_caught() {
    let skip = Some(SkipSync::EmptyTailCheck);
    must_catch(
        second_life_sweep(DEFAULT_LANE, FirstCrash::Kill, 1, skip),
        LOST,
        "no journal directory sync at open after a cut-short segment",
    );
}

/// Negative control: without syncing at open what a killed process left, a power cut after
/// the reopen loses batches readers saw.
#[test]
fn control_skipping_the_sync_of_the_scanned_tail_is_caught() {
    let skip = Some(SkipSync::ScannedTail);
    must_catch(
        second_life_sweep(DEFAULT_LANE, FirstCrash::Kill, 1, skip),
        LOST,
        "no tail sync at open",
    );
}
