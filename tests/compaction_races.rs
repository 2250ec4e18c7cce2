//! Compaction against the group-commit queue (SPEC S7, S14): a segment becomes a victim only
//! once every record in it is written, trimmed and synced, whatever the journal's appenders
//! and its group-commit leader are doing.
//!
//! The interleaving that lost acknowledged batches is forced here, not waited for: the
//! group-commit leader is held inside its sync (a file layer blocks that sync until the test
//! lets it go); meanwhile one commit queues a record for the segment being filled, the only
//! record of its partition, and a second commit's record does not fit, so the journal moves its
//! tail to the next segment before any leader has written either of them. Compaction then
//! chooses its victims. With the rule, the segment those records are queued for is not one of
//! them; with the rule switched off (`SkipSync::SealedVictims`, the negative control) it is,
//! compaction reads it without the queued record, and deletes it once the record is
//! acknowledged, so the partition's read answers `Corrupt` (segment missing).
//!
//! Every wait for another thread is bounded (`os_files::STEP`): a step that never happens fails the test
//! with its name instead of hanging it.

mod common;

use std::sync::Arc;
use std::thread;

use common::os_files::{SyncGate, observed_os, wait};
use crossbeam::channel::unbounded;
use portcullis::store::{Batch, FileStore, Partition, SkipSync, Store};

fn put(store: &FileStore, name: &str, len: usize) -> portcullis::Result<()> {
    let p = Partition::new(name).unwrap();
    let outcome = store.apply(&p, &Batch::new().put(b"k".to_vec(), value(name, len)))?;
    assert!(outcome.is_committed(), "{name}: {outcome:?}");
    Ok(())
}

fn value(name: &str, len: usize) -> Vec<u8> {
    let mut v = name.as_bytes().to_vec();
    v.resize(len, b'.');
    v
}

/// What one forced run saw.
struct Run {
    /// The segments compaction took as victims while the records were queued.
    victims: Vec<u32>,
    /// Each partition's read after everything settled (`None`: it answered its value), and
    /// again after a reopen.
    reads: Vec<(&'static str, Option<String>)>,
}

/// The records each partition writes, in order: `warm` before the leader is held (so the
/// segment's first step is prepared and the held sync is the commit's own), `held` whose leader
/// is held in its sync, `queued` (its partition's only record, queued for segment 1), and
/// `rollover`, too large for what is left of segment 1.
const WRITES: [(&str, usize); 4] = [
    ("warm", 100),
    ("held", 100),
    ("queued", 100),
    ("rollover", 3_900),
];

fn forced_run(control: bool) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (gate, held_rx, go_tx) = SyncGate::new();
    let (appended_tx, appended_rx) = unbounded();
    let (victims_tx, victims_rx) = unbounded();
    let mut builder = FileStore::builder(dir.path())
        .vfs(Arc::new(observed_os(gate.clone())))
        .segment_bytes(4096)
        .snapshot_every_bytes(1 << 40)
        .auto_compact(false)
        .observe_appends(move |p, _lsn| {
            let _ = appended_tx.send(p.to_string());
        })
        .observe_compaction_victims(move |victims| {
            let _ = victims_tx.send(victims.to_vec());
        });
    if control {
        builder = builder.skip_sync(SkipSync::SealedVictims);
    }
    let store = Arc::new(builder.open().unwrap());
    put(&store, WRITES[0].0, WRITES[0].1).unwrap();
    assert_eq!(wait(&appended_rx, "the warm-up commit's append"), "warm");

    gate.arm();
    let spawn_put = |(name, len): (&'static str, usize)| {
        let store = store.clone();
        thread::spawn(move || put(&store, name, len))
    };
    let held = spawn_put(WRITES[1]);
    assert_eq!(wait(&appended_rx, "the held commit's append"), "held");
    wait(&held_rx, "the leader's sync");
    // The leader is inside its sync: these two are queued behind it, not written.
    let queued = spawn_put(WRITES[2]);
    assert_eq!(wait(&appended_rx, "the queued commit's append"), "queued");
    let rollover = spawn_put(WRITES[3]);
    assert_eq!(wait(&appended_rx, "the rollover's append"), "rollover");

    let compactor = {
        let store = store.clone();
        thread::spawn(move || store.compact())
    };
    let victims = wait(&victims_rx, "compaction's choice of victims");
    go_tx.send(()).unwrap();
    for writer in [held, queued, rollover] {
        writer.join().unwrap().unwrap();
    }
    compactor.join().unwrap().unwrap();

    let read = |store: &FileStore| -> Vec<(&'static str, Option<String>)> {
        WRITES
            .iter()
            .map(|&(name, len)| {
                let p = Partition::new(name).unwrap();
                let wrong = match store.get(&p, b"k") {
                    Ok(Some(v)) if v == value(name, len) => None,
                    other => Some(format!("{other:?}")),
                };
                (name, wrong)
            })
            .collect()
    };
    let mut reads = read(&store);
    drop(compactor_free(store));
    let reopened = FileStore::open(dir.path()).unwrap();
    reads.extend(read(&reopened));
    reopened.close().unwrap();
    Run { victims, reads }
}

/// The store once every thread holding it has finished.
fn compactor_free(store: Arc<FileStore>) -> FileStore {
    Arc::try_unwrap(store).unwrap_or_else(|_| panic!("a thread still holds the store"))
}

fn wrong_reads(run: &Run) -> Vec<String> {
    run.reads
        .iter()
        .filter_map(|(name, wrong)| wrong.as_ref().map(|w| format!("{name}: {w}")))
        .collect()
}

/// The segment the queued records are meant for is not sealed while they wait, so compaction
/// does not take it, and every acknowledged batch reads back, before and after a reopen.
#[test]
fn a_segment_with_queued_records_is_never_a_victim() {
    let run = forced_run(false);
    assert_eq!(wrong_reads(&run), Vec::<String>::new());
    assert!(
        run.victims.is_empty(),
        "compaction took {:?} while records for segment 1 were queued",
        run.victims
    );
}

/// Negative control: with victims taken below the tail the journal's appenders have moved
/// (not below what the leader has sealed), compaction takes segment 1 while a record is still
/// queued for it, and the acknowledged batch of that record is lost.
#[test]
fn control_victims_below_the_appenders_tail_lose_an_acknowledged_batch() {
    let run = forced_run(true);
    assert_eq!(run.victims, vec![1]);
    let wrong = wrong_reads(&run);
    assert!(
        wrong.iter().any(|w| w.starts_with("queued:")),
        "the control lost nothing: {:?}",
        run.reads
    );
}
