//! The store workload: the file store on the fault-injecting disk (`FaultFs`), small segments
//! so rotation, heads snapshots and compaction run beside the writers, under one seed.
//!
//! Writers commit batches (fresh keys, some in partitions of their own and some large, and
//! overwrites of a counter per writer that make the garbage compaction reclaims); a reader
//! reads what was acknowledged; a checker commits guard-only batches on another writer's
//! counter as `get_for_update` shows it and cuts the power right after each answer; a cutter
//! cuts the power at a point of the schedule; a compactor asks for compactions of every sealed
//! segment. Most seeds run on a slow disk whose syncs take many steps ([`SimDisk`]); some make
//! one disk operation fail (once, or the disk dies there), others fill the disk up. Checked:
//!
//! - every acknowledged batch reads back while the store runs (linearizable reads, S3, S14),
//!   unless the disk failed; on a full disk too (it refuses writes, not reads);
//! - a commit fails only on a failing or full disk, and never as `Corrupt`;
//! - after close, and in every crash image, every batch acknowledged before the image was
//!   taken is there (S3, S4), a counter never goes back, and the reopened store takes writes;
//! - a guard-only batch answered `Committed` was decided on durable state: the image cut
//!   right after its answer holds the value it was guarded on (S14);
//! - bit rot on the disk the run left is noticed (half the seeds, [`bit_rot`]);
//! - nothing waits for ever (shuttle reports a deadlock with the waiting tasks named).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};

use portcullis::Error;
use portcullis::Spawner;
use portcullis::clock::SimClock;
use portcullis::store::{Batch, FailMode, FaultFs, FileStore, Outcome, Partition, SkipSync, Store};

use super::bit_rot;
use super::disk::SimDisk;
use super::{Control, Plan, Rng, Trace, pause, task};

/// What was acknowledged: per partition and key, the value (a counter: the highest).
#[derive(Clone, Debug, Default)]
pub struct Acked(pub BTreeMap<(String, String), Vec<u8>>);

impl Acked {
    fn record(&mut self, p: &str, key: &str, value: &[u8]) {
        let slot = self.0.entry((p.into(), key.into())).or_default();
        if counter(value) >= counter(slot) || !key.ends_with('c') {
            *slot = value.to_vec();
        }
    }
}

/// A counter key's value is its number; other values compare as 0.
pub fn counter(value: &[u8]) -> u64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Checks that `store` holds every acknowledged value in `acked` (a counter: at least it).
fn holds_all(store: &FileStore, acked: &Acked, what: &str) {
    for ((p, key), value) in &acked.0 {
        let got = store
            .get(&Partition::new(p).unwrap(), key.as_bytes())
            .unwrap_or_else(|e| panic!("{what}: reading acknowledged {p}/{key} failed: {e}"));
        let ok = match &got {
            Some(v) if key.ends_with('c') => counter(v) >= counter(value),
            Some(v) => v == value,
            None => false,
        };
        assert!(
            ok,
            "{what}: acknowledged {p}/{key} = {:?} lost or rolled back (read {:?})",
            String::from_utf8_lossy(value),
            got.map(|v| String::from_utf8_lossy(&v).into_owned())
        );
    }
}

fn open(disk: SimDisk, clock: &SimClock, control: Option<Control>, segment: u64) -> FileStore {
    let mut builder = FileStore::builder("/sim")
        .vfs(Arc::new(disk))
        .clock(Arc::new(clock.clone()))
        .spawner(Spawner::simulated())
        .segment_bytes(segment)
        .snapshot_every_bytes(8 << 10);
    match control {
        Some(Control::SealedVictims) => builder = builder.skip_sync(SkipSync::SealedVictims),
        Some(Control::GuardOnlyWait) => builder = builder.skip_sync(SkipSync::GuardOnlyWait),
        Some(Control::ValueChecks) => builder = builder.skip_value_checks(),
        _ => {}
    }
    builder.open().expect("the store opens")
}

pub fn run(plan: Plan, rng: &mut Rng, clock: &SimClock, trace: &Trace) {
    let fs = FaultFs::new();
    let segment = 4096 * (1 + rng.below(3));
    // A slow disk in two seeds of three: background work runs while a leader syncs.
    let sync_steps = if rng.chance(67) { rng.below(100) } else { 0 };
    let disk = SimDisk {
        sync_steps,
        ..SimDisk::plain(fs.clone())
    };
    let store = Arc::new(open(disk.clone(), clock, plan.control, segment));
    let writers = 2 + rng.below(3);
    let parts = 1 + rng.below(3);
    let faulty = plan.control.is_none() && rng.chance(25);
    // A disk that fills up in some seeds without other faults: writes then fail, and every
    // acknowledged batch must still read back.
    let full = plan.control.is_none() && !faulty && rng.chance(20);
    if full {
        let room = 2_000 + rng.below(30_000);
        disk.full_after.store(
            fs.bytes_written() + room,
            std::sync::atomic::Ordering::SeqCst,
        );
        trace.push(format!("the disk fills up after {room} more bytes"));
    }
    trace.push(format!(
        "store: segment {segment}, {writers} writers, {parts} partitions, faulty {faulty}, \
         {sync_steps} steps per sync"
    ));
    let acked: Arc<StdMutex<Acked>> = Arc::default();
    let images: Arc<StdMutex<Vec<(String, FaultFs, Acked)>>> = Arc::default();
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if faulty {
        let at = fs.ops() + 20 + rng.below(300);
        let mode = if rng.chance(50) {
            FailMode::Once
        } else {
            FailMode::DeadDisk
        };
        trace.push(format!("fault: operation {at} fails ({mode:?})"));
        fs.fail_at(at, mode);
    }
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (store, acked, trace, failed) =
            (store.clone(), acked.clone(), trace.clone(), failed.clone());
        let mut rng = Rng::new(rng.next());
        let batches = 6 + rng.below(10);
        tasks.push(task(format!("writer {w}"), move || {
            for i in 0..batches {
                // Now and then a partition of its own: its only record may be one still
                // queued when a compaction reads the segment it is meant for.
                let p = if rng.chance(50) {
                    format!("q{w}-{i}")
                } else {
                    format!("p{}", rng.below(parts))
                };
                let (key, value) = if rng.chance(40) {
                    (format!("w{w}c"), i.to_string().into_bytes())
                } else {
                    // Now and then a large value, so segments fill and rotate.
                    let len = if rng.chance(35) {
                        1000 + rng.below(1500)
                    } else {
                        40 + rng.below(300)
                    };
                    let pad = "x".repeat(len as usize);
                    (format!("w{w}k{i}"), format!("{w}:{i}:{pad}").into_bytes())
                };
                let batch = Batch::new().put(key.clone(), value.clone());
                let outcome = store.apply(&Partition::new(&p).unwrap(), &batch);
                trace.push(format!("writer {w} put {p}/{key}: {outcome:?}"));
                match outcome {
                    Ok(Outcome::Committed) => acked
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .record(&p, &key, &value),
                    Ok(other) => panic!("an unguarded batch answered {other:?}"),
                    Err(e) => {
                        assert!(faulty || full, "a commit failed on a healthy disk: {e}");
                        assert!(
                            !matches!(e, Error::Corrupt { .. }),
                            "a failing disk made a commit answer Corrupt: {e}"
                        );
                        failed.store(true, std::sync::atomic::Ordering::SeqCst)
                    }
                }
            }
        }));
    }
    // The reader: what was acknowledged reads back (linearizable reads).
    {
        let (store, acked, trace, failed, fs) = (
            store.clone(),
            acked.clone(),
            trace.clone(),
            failed.clone(),
            fs.clone(),
        );
        let mut rng = Rng::new(rng.next());
        tasks.push(task("reader".into(), move || {
            for _ in 0..8 {
                pause(1 + rng.below(20));
                let seen = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if seen.0.is_empty() {
                    continue;
                }
                let pick = rng.below(seen.0.len() as u64) as usize;
                let ((p, key), value) = seen.0.iter().nth(pick).unwrap();
                let got = store.get(&Partition::new(p).unwrap(), key.as_bytes());
                trace.push(format!("reader get {p}/{key}: {}", got.is_ok()));
                if faulty
                    && (failed.load(std::sync::atomic::Ordering::SeqCst) || fs.injected().is_some())
                {
                    continue; // a failed disk may refuse reads (a full one may not)
                }
                let got = got
                    .unwrap_or_else(|e| panic!("S14: reading acknowledged {p}/{key} failed: {e}"));
                let ok = match &got {
                    Some(v) if key.ends_with('c') => counter(v) >= counter(value),
                    Some(v) => v == value,
                    None => false,
                };
                assert!(ok, "S3: acknowledged {p}/{key} reads as {got:?}");
            }
        }));
    }
    // The checker: guard-only batches on another writer's counter, then a power cut.
    if !faulty {
        let (store, fs, trace, images) = (store.clone(), fs.clone(), trace.clone(), images.clone());
        let mut rng = Rng::new(rng.next());
        tasks.push(task("checker".into(), move || {
            for n in 0..4 {
                pause(rng.below(30));
                let name = format!("p{}", rng.below(parts));
                let p = Partition::new(&name).unwrap();
                let key = format!("w{}c", rng.below(writers));
                let Ok(Some(seen)) = store.get_for_update(&p, key.as_bytes()) else {
                    continue;
                };
                let outcome = store.apply(&p, &Batch::new().equals(key.clone(), seen.clone()));
                trace.push(format!("checker guard {p:?}/{key}: {outcome:?}"));
                if let Ok(Outcome::Committed) = outcome {
                    let image = fs.crash(rng.next());
                    let mut guarded = Acked::default();
                    guarded.record(&name, &key, &seen);
                    images.lock().unwrap().push((
                        format!("the power cut after guard-only check {n}"),
                        image,
                        guarded,
                    ));
                }
            }
        }));
    }
    // The cutter: a power cut at one point of the schedule.
    if rng.chance(60) {
        let (fs, acked, images) = (fs.clone(), acked.clone(), images.clone());
        let mut rng = Rng::new(rng.next());
        tasks.push(task("cutter".into(), move || {
            pause(rng.below(200));
            let before = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let image = fs.crash(rng.next());
            images
                .lock()
                .unwrap()
                .push(("a power cut mid-run".into(), image, before));
        }));
    }
    // The compactor: compactions on demand (every sealed segment a victim) at points of the
    // schedule, beside the background compactions of the due ones.
    if rng.chance(50) {
        let (store, trace) = (store.clone(), trace.clone());
        let mut rng = Rng::new(rng.next());
        let rounds = 4 + rng.below(24);
        tasks.push(task("compactor".into(), move || {
            for n in 0..rounds {
                pause(rng.below(30));
                let report = store.compact();
                trace.push(format!("compactor {n}: {report:?}"));
            }
        }));
    }
    for t in tasks {
        t.join().unwrap();
    }
    let acked = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let failed = failed.load(std::sync::atomic::Ordering::SeqCst) || fs.injected().is_some();
    // A fault the run did not reach is disarmed: the check reads a disk that did not fail.
    if !failed {
        fs.clear_faults();
    }
    // A full disk refuses writes, never reads: what was acknowledged still reads back.
    if !(faulty && failed) {
        let what = if full && failed {
            "S3 on a full disk"
        } else {
            "S3 while running"
        };
        holds_all(&store, &acked, what);
    }
    let closed = store.close();
    trace.push(format!("close: {}", closed.is_ok()));
    drop(store);
    // After the run: a power cut, then every acknowledged batch must be there.
    fs.clear_faults();
    let mut checks = images.lock().unwrap_or_else(|p| p.into_inner()).clone();
    checks.push((
        "a power cut after the run".into(),
        fs.crash(rng.next()),
        acked,
    ));
    let rot = checks
        .last()
        .map(|(_, image, acked)| (image.fork(), acked.clone()));
    for (what, image, acked) in checks {
        let reopened = open(SimDisk::plain(image), clock, None, segment);
        holds_all(&reopened, &acked, &format!("S4 after {what}"));
        // The reopened store takes writes again (after a full disk too).
        let p = Partition::new("after").unwrap();
        let outcome = reopened.apply(&p, &Batch::new().put(b"k".to_vec(), b"v".to_vec()));
        assert!(
            matches!(outcome, Ok(Outcome::Committed)),
            "the store reopened after {what} refused a write: {outcome:?}"
        );
        trace.push(format!("checked {what}: {} acknowledged", acked.0.len()));
        reopened.close().expect("a clean close");
    }
    // Bit rot on the disk the run left, in half the seeds.
    if let Some((image, acked)) = rot
        && rng.chance(50)
    {
        let reopen = |image| open(SimDisk::plain(image), clock, plan.control, segment);
        bit_rot::check(image, &acked, rng, reopen, trace);
    }
}
