//! Fault sweep of the file-backed store on [`FaultFs`] (SPEC S3, S4, S10).
//!
//! A fixed workload (open, guarded batches over a few partitions, a heads snapshot, a
//! compaction, close) first runs cleanly to count its I/O operations. Then, for every operation
//! index `k`, it runs again with operation `k` failing: once as a transient error, once as a
//! disk that dies there (which is a power cut at instant `k`). Each time, seeded crash images of
//! the disk are reopened with a fresh store and checked: exactly a prefix of the workload's
//! batches, including every batch whose `apply` returned `Committed`, no partial batch.
//! (Power cuts at every operation, group commit and kills are swept in `crash_sweep.rs`.)

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;

use common::check::{Model, check_state, check_store, read_state};
use common::logs;
use common::workload::{batch, partition_of};
use portcullis::store::{
    Batch, FailMode, FaultFs, FileStore, FileStoreBuilder, MemoryStore, Outcome, Partition, Store,
    SyncPolicy,
};
use portcullis::{Error, ManualClock};

const DIR: &str = "/db";
/// Batches in the workload: enough to fill several 4 KiB segments and to need base records.
const BATCHES: u64 = 24;
/// Crash images checked after each fault.
const SEEDS: u64 = 3;

/// A store on `fs` with small segments and every background job off, so the operation count
/// of the workload is deterministic; the snapshot and compaction run at fixed points instead.
fn builder(fs: &FaultFs) -> FileStoreBuilder {
    FileStore::builder(DIR)
        .vfs(Arc::new(fs.clone()))
        .clock(Arc::new(ManualClock::new(1_000)))
        .segment_bytes(4096)
        .snapshot_every_bytes(1 << 40)
        .base_every_records(4)
        .auto_compact(false)
}

/// What one run of the workload achieved.
#[derive(Debug, Default)]
struct Run {
    /// The newest batch acknowledged as committed (0 if none).
    acked: u64,
    /// The newest batch handed to `apply` (0 if none).
    attempted: u64,
    /// The first error, if any (the workload stops there, as a crashed program would).
    error: Option<String>,
}

/// Applies batches `from..=to` to `store`, stopping at the first error. Returns the error.
fn apply_batches(store: &FileStore, from: u64, to: u64, run: &mut Run) -> Result<(), Error> {
    for n in from..=to {
        run.attempted = n;
        match store.apply(&partition_of(n), &batch(n))? {
            Outcome::Committed => run.acked = n,
            other => {
                panic!("batch {n} was refused ({other:?}): an earlier batch was lost or doubled")
            }
        }
        if n == BATCHES / 3 {
            store.write_heads_snapshot()?;
        }
        if n == 2 * BATCHES / 3 {
            store.compact()?;
        }
    }
    Ok(())
}

/// Runs the whole workload on `fs`: open, every batch, close.
fn run_workload(fs: &FaultFs) -> Run {
    let mut run = Run::default();
    let store = match builder(fs).open() {
        Ok(store) => store,
        Err(e) => {
            run.error = Some(format!("open: {e}"));
            return run;
        }
    };
    if let Err(e) = apply_batches(&store, 1, BATCHES, &mut run) {
        check_sync_failure_latches(fs, &store, &e, run.attempted);
        run.error = Some(e.to_string());
    }
    if let Err(e) = store.close() {
        run.error.get_or_insert(format!("close: {e}"));
    }
    run
}

/// After a failed data sync, the store must refuse every later write with `SyncFailed`: the
/// failed writes may be gone from the disk, so retrying would acknowledge what is not there.
fn check_sync_failure_latches(fs: &FaultFs, store: &FileStore, error: &Error, n: u64) {
    let injected = fs.injected().unwrap_or_default();
    if !(injected.starts_with("sync_data") && injected.contains("journal")) {
        return;
    }
    assert!(
        matches!(error, Error::SyncFailed(_) | Error::Io { .. }),
        "a failed journal sync surfaced as {error:?}"
    );
    let again = store.apply(&partition_of(n), &batch(n));
    assert!(
        matches!(again, Err(Error::SyncFailed(_))),
        "after a failed journal sync ({injected}), a write answered {again:?} instead of SyncFailed"
    );
}

/// Reopens `image` with a fresh store and checks it holds a prefix of the workload with every
/// acknowledged batch; then writes a few more batches on top and checks again, so recovery
/// leaves a store that works. Returns the newest batch found.
fn check_image(image: &FaultFs, model: &mut Model, run: &Run, what: &str) -> u64 {
    let store = builder(image)
        .open()
        .unwrap_or_else(|e| panic!("{what}: reopening failed: {e}"));
    // A failed operation and a power cut damage nothing that was synced.
    assert!(
        store.open_report().damaged.is_empty(),
        "{what}: damage reported: {:?}",
        store.open_report().damaged
    );
    let m = check_store(model, &store, run.acked, run.attempted)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut more = Run {
        acked: m,
        attempted: m,
        error: None,
    };
    apply_batches(&store, m + 1, m + 3, &mut more)
        .unwrap_or_else(|e| panic!("{what}: writing after recovery failed: {e}"));
    check_store(model, &store, m + 3, m + 3)
        .unwrap_or_else(|e| panic!("{what}: after writing on the recovered store: {e}"));
    store
        .close()
        .unwrap_or_else(|e| panic!("{what}: close failed: {e}"));
    // What the recovered store acknowledged survives a power cut after its clean close.
    for seed in 0..2 {
        let again = builder(&image.crash(seed))
            .open()
            .unwrap_or_else(|e| panic!("{what}: open after a later power cut failed: {e}"));
        check_store(model, &again, m + 3, m + 3)
            .unwrap_or_else(|e| panic!("{what}: after a later power cut (seed {seed}): {e}"));
    }
    m
}

/// Runs `f`, adding `what` to any panic so a failure names its fault point and seed.
fn with_context<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(panic) => {
            eprintln!("failed at {what}");
            resume_unwind(panic)
        }
    }
}

/// The operation count of a clean run, and a check that the clean run is itself correct.
fn clean_run_ops(model: &mut Model) -> u64 {
    let fs = FaultFs::new();
    let run = run_workload(&fs);
    assert_eq!(run.error, None);
    assert_eq!(run.acked, BATCHES);
    // Directory entries may stay unsynced (the lock file, an old snapshot's removal): the crash
    // images below check that either way is harmless. Written data may not.
    let unsynced: Vec<String> = fs
        .unsynced()
        .into_iter()
        .filter(|what| what.starts_with("writes"))
        .collect();
    assert_eq!(
        unsynced,
        Vec::<String>::new(),
        "a clean close left unsynced writes"
    );
    for seed in 0..SEEDS {
        check_image(
            &fs.crash(seed),
            model,
            &run,
            &format!("clean run, seed {seed}"),
        );
    }
    fs.ops()
}

fn sweep(mode: FailMode) {
    let mut model = Model::default();
    let total = clean_run_ops(&mut model);
    assert!(total > 50, "the workload ran only {total} operations");
    let mut survived = Vec::new();
    for k in 1..=total {
        let fs = FaultFs::new();
        fs.fail_at(k, mode);
        let run = with_context(&format!("{mode:?} fault at operation {k}"), || {
            run_workload(&fs)
        });
        let injected = fs.injected().unwrap_or_default();
        assert!(
            !injected.is_empty(),
            "{mode:?}: operation {k} was never reached"
        );
        // A failed write, sync, rename or creation must reach the caller. (Cleanup such as
        // removing an old snapshot, and reads made only for reporting, may fail quietly: the
        // crash images below check that this is harmless.)
        let must_surface = [
            "write_all_at",
            "sync_data",
            "set_len",
            "rename",
            "open Create",
        ]
        .iter()
        .any(|op| injected.starts_with(op));
        assert!(
            run.error.is_some() || !must_surface,
            "{mode:?} fault at operation {k} ({injected}) was swallowed: {run:?}"
        );
        survived.push(run.acked);
        for seed in 0..SEEDS {
            let what = format!("{mode:?} fault at operation {k} ({injected}), crash seed {seed}");
            let image = fs.crash(k.wrapping_mul(7919) ^ seed);
            with_context(&what, || check_image(&image, &mut model, &run, &what));
        }
        if mode == FailMode::Once {
            // The program carries on without a crash: the disk holds everything written.
            let what = format!("Once fault at operation {k} ({injected}), no crash");
            with_context(&what, || {
                check_image(&fs.crash_process(), &mut model, &run, &what)
            });
        }
    }
    // The sweep must reach every stage of the workload, not only its start.
    assert_eq!(survived.iter().max(), Some(&BATCHES));
    eprintln!("{mode:?}: swept {total} fault points");
}

/// Every operation of the workload failing once, transiently (SPEC S3, S4).
#[test]
fn every_operation_failing_once_leaves_a_committed_prefix() {
    sweep(FailMode::Once);
}

/// The disk dying at every operation of the workload: a power cut at every instant (SPEC S4).
#[test]
fn a_disk_dying_at_every_operation_leaves_a_committed_prefix() {
    sweep(FailMode::DeadDisk);
}

/// Once a sync fails, nothing is acknowledged again until the store is reopened, and what was
/// acknowledged before survives (SPEC S3; the fsyncgate lesson).
#[test]
fn a_failed_sync_is_latched_never_retried_and_forgotten() {
    let mut model = Model::default();
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    let mut run = Run::default();
    apply_batches(&store, 1, 5, &mut run).unwrap();
    fs.fail_syncs();
    run.attempted = 6;
    let first = store.apply(&partition_of(6), &batch(6));
    assert!(
        first.is_err(),
        "a batch was acknowledged though its sync failed: {first:?}"
    );
    // Syncs work again, but the store must not trust the journal any more.
    fs.clear_faults();
    for n in 6..9 {
        let again = store.apply(&partition_of(n), &batch(n));
        assert!(
            matches!(again, Err(Error::SyncFailed(_))),
            "a write after a failed sync answered {again:?}"
        );
    }
    // Reads keep working.
    read_state(&store).unwrap();
    drop(store);
    for seed in 0..20 {
        let what = format!("after a failed sync, seed {seed}");
        check_image(&fs.crash(seed), &mut model, &run, &what);
    }
}

/// A record cut short at the end of the journal is a torn write: it is truncated, the open
/// report and the log say so, and every batch before it is intact (SPEC S4).
#[test]
fn a_torn_tail_is_truncated_and_logged() {
    logs::start();
    let mut model = Model::default();
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    let mut run = Run::default();
    apply_batches(&store, 1, 7, &mut run).unwrap();
    // The process dies with the store open: everything written is on disk.
    let image = fs.crash_process();
    drop(store);
    let journal = std::path::Path::new(DIR).join("journal");
    let newest = newest_segment(&image, &journal);
    let bytes = image.read_file(&newest).unwrap();
    // The segment is preallocated: its records end before its zeros.
    let written = common::layout::written_len(&bytes);
    let mut cut = bytes.clone();
    cut.truncate(written - 5);
    image.write_file(&newest, cut).unwrap();

    let store = builder(&image).open().unwrap();
    let torn = store
        .open_report()
        .torn_tail
        .clone()
        .expect("the open report names the torn tail");
    assert_eq!(torn.offset + torn.bytes_dropped, written as u64 - 5);
    assert!(
        logs::warned(&["torn tail", &format!("offset {}", torn.offset)]),
        "the truncation was not logged"
    );
    assert!(store.open_report().damaged.is_empty());
    let m = check_store(&mut model, &store, 6, 7).unwrap();
    assert_eq!(m, 6, "only the torn batch is lost");
    // The truncation was made durable, and the store writes on after it.
    let mut more = Run::default();
    apply_batches(&store, 7, 9, &mut more).unwrap();
    drop(store);
    for seed in 0..10 {
        let run = Run {
            acked: 9,
            attempted: 9,
            error: None,
        };
        check_image(
            &image.crash(seed),
            &mut model,
            &run,
            "after writing past a torn tail",
        );
    }
}

fn newest_segment(fs: &FaultFs, journal: &std::path::Path) -> std::path::PathBuf {
    use portcullis::store::Vfs;
    let names = fs.list(journal).unwrap();
    let newest = names
        .iter()
        .filter(|n| n.ends_with(".seg"))
        .max()
        .expect("the journal has a segment");
    journal.join(newest)
}

/// Crash images taken at every point of the workload and damaged at random never make the
/// store panic; whatever it answers is either an error or correct data (SPEC E1, S4).
#[test]
fn no_crash_image_makes_the_store_panic() {
    let mut model = Model::default();
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    let mut run = Run::default();
    apply_batches(&store, 1, 12, &mut run).unwrap();
    let image = fs.crash_process();
    drop(store);
    let mut rng = common::rng::Rng::new(0xC0FFEE);
    let journal = std::path::Path::new(DIR).join("journal");
    for round in 0..300 {
        let damaged = image.crash(round);
        let seg = newest_segment(&damaged, &journal);
        let mut bytes = damaged.read_file(&seg).unwrap();
        // Flip, zero or cut at a random place.
        let at = rng.below(bytes.len() as u64) as usize;
        match rng.below(3) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes[at..].iter_mut().take(16).for_each(|b| *b = 0),
            _ => bytes.truncate(at),
        }
        damaged.write_file(&seg, bytes).unwrap();
        let what = format!("damage round {round}");
        with_context(&what, || {
            // Open may refuse damage it cannot attribute, but only with a named damage error.
            let store = match builder(&damaged).open() {
                Ok(store) => store,
                Err(Error::Corrupt { .. }) => return,
                Err(e) => panic!("{what}: open failed with an unnamed error: {e:?}"),
            };
            // A partition may refuse with a named error; what it does answer must be a state
            // of the workload (checked per partition, since damage is per partition).
            for n in 1..=12u64 {
                let p = partition_of(n);
                match store.scan(&p, &portcullis::store::KeyRange::all(), None, 100) {
                    Ok(page) => {
                        check_partition_is_some_prefix(&mut model, &p, &page.entries, 12, &what)
                    }
                    Err(Error::Corrupt { .. }) => {}
                    Err(e) => panic!("{what}: a read failed with an unnamed error: {e:?}"),
                }
            }
        });
    }
}

/// `rows` must be the rows of partition `p` after some prefix of batches `1..=up_to`.
fn check_partition_is_some_prefix(
    model: &mut Model,
    p: &Partition,
    rows: &[(Vec<u8>, Vec<u8>)],
    up_to: u64,
    what: &str,
) {
    let name = String::from_utf8(p.as_bytes().to_vec()).unwrap();
    let found: std::collections::BTreeMap<_, _> = rows.iter().cloned().collect();
    let ok = (0..=up_to).any(|m| match model.state(m).get(&name) {
        Some(expected) => *expected == found,
        None => found.is_empty(),
    });
    assert!(
        ok,
        "{what}: partition {name} shows rows no prefix of the workload left"
    );
}

/// The checker must accept every honest prefix and catch what crash bugs look like: a partial
/// batch, a lost acknowledged batch, a batch from nowhere, a stale partition (a negative control
/// for the checker itself).
#[test]
fn the_checker_catches_what_it_must() {
    let mut model = Model::default();
    let store = MemoryStore::new();
    for n in 1..=40 {
        assert_eq!(
            store.apply(&partition_of(n), &batch(n)).unwrap(),
            Outcome::Committed
        );
        let state = read_state(&store).unwrap();
        assert_eq!(check_state(&mut model, &state, n, n), Ok(n));
        assert_eq!(check_state(&mut model, &state, 0, 100), Ok(n));
    }
    let good = read_state(&store).unwrap();
    assert!(
        check_state(&mut model, &good, 41, 50).is_err(),
        "a lost acknowledged batch"
    );
    assert!(
        check_state(&mut model, &good, 0, 39).is_err(),
        "a batch never attempted"
    );

    // Half of batch 41: its generation without its other rows.
    let p41 = partition_of(41);
    let half = MemoryStore::new();
    for n in 1..=40 {
        assert!(
            half.apply(&partition_of(n), &batch(n))
                .unwrap()
                .is_committed()
        );
    }
    let partial = Batch::new().put(b"g".to_vec(), b"41".to_vec());
    assert_eq!(half.apply(&p41, &partial).unwrap(), Outcome::Committed);
    let state = read_state(&half).unwrap();
    assert!(
        check_state(&mut model, &state, 0, 50).is_err(),
        "a partial batch"
    );

    // The other rows of batch 41 without its generation.
    let mut rest = good.clone();
    let after = model.state(41).clone();
    let name = String::from_utf8(p41.as_bytes().to_vec()).unwrap();
    let mut rows = after[&name].clone();
    rows.insert(b"g".to_vec(), b"40".to_vec());
    rest.insert(name, rows);
    assert!(
        check_state(&mut model, &rest, 0, 50).is_err(),
        "rows without their generation"
    );

    // A partition that lost its newest batch while a later batch elsewhere survived.
    let n40 = (1..41).rev().find(|&m| partition_of(m) != p41).unwrap();
    let p40: Partition = partition_of(n40);
    let mut stale = model.state(41).clone();
    let older = model.state(n40 - 1).clone();
    let n40 = String::from_utf8(p40.as_bytes().to_vec()).unwrap();
    stale.insert(n40.clone(), older[&n40].clone());
    assert!(
        check_state(&mut model, &stale, 0, 50).is_err(),
        "a stale partition"
    );
}

/// A negative control for the sweep: a store that acknowledges before syncing
/// (`NeverSyncMayLoseRecent`) must be caught losing acknowledged batches by some crash image.
#[test]
fn the_crash_images_catch_a_store_that_acknowledges_before_syncing() {
    let mut model = Model::default();
    let (fs, run) = unsynced_run(SyncPolicy::NeverSyncMayLoseRecent);
    let mut caught = 0;
    for seed in 0..50 {
        let reopened = builder(&fs.crash(seed)).open().unwrap();
        let lost = read_state(&reopened)
            .map_err(|e| e.to_string())
            .and_then(|state| check_state(&mut model, &state, run.acked, run.attempted));
        if lost.is_err() {
            caught += 1;
        }
    }
    assert!(
        caught > 0,
        "no crash image lost an unsynced acknowledged batch"
    );
}

/// Runs the workload's batches under a policy that does not sync each commit, and returns the
/// disk as the power cut finds it, before the store is closed.
fn unsynced_run(policy: SyncPolicy) -> (FaultFs, Run) {
    let fs = FaultFs::new();
    let store = builder(&fs).sync_policy(policy).open().unwrap();
    let mut run = Run::default();
    for n in 1..=BATCHES {
        assert!(
            store
                .apply(&partition_of(n), &batch(n))
                .unwrap()
                .is_committed()
        );
        run.acked = n;
        run.attempted = n;
    }
    // The power fails before the store is closed (closing syncs everything).
    let at_power_cut = fs.fork();
    drop(store);
    (at_power_cut, run)
}

/// Under the weaker sync policies a power cut may lose recent acknowledged batches, but never
/// shows a partial batch and never damages a partition (their documented promise; SPEC S4).
#[test]
fn a_power_cut_under_a_weak_sync_policy_loses_only_recent_batches() {
    let mut model = Model::default();
    for policy in [
        SyncPolicy::NeverSyncMayLoseRecent,
        SyncPolicy::PeriodicMayLoseRecent {
            interval_ms: 3_600_000,
        },
    ] {
        let (fs, run) = unsynced_run(policy);
        for seed in 0..50 {
            let reopened = builder(&fs.crash(seed)).open().unwrap();
            let report = reopened.open_report().clone();
            let state = read_state(&reopened).unwrap_or_else(|e| {
                panic!("{policy:?}, seed {seed}: {e}; open report: {report:?}")
            });
            check_state(&mut model, &state, 0, run.attempted)
                .unwrap_or_else(|e| panic!("{policy:?}, seed {seed}: {e}"));
            assert!(
                report.damaged.is_empty(),
                "{policy:?}, seed {seed}: {report:?}"
            );
        }
    }
}
