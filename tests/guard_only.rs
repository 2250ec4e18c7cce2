//! A batch with guards and no operations (how an application checks a lease or a version before
//! an external side effect) is answered only on durable state (SPEC S3): when its guards were
//! checked against a batch of its partition still waiting for its sync, it waits for that sync,
//! and a power cut after its answer keeps what decided it. The negative control
//! (`SkipSync::GuardOnlyWait`) answers at once and is caught.
//!
//! The writer's batch is held between its append and its wait for durability by the append
//! observer (`FileStoreBuilder::observe_appends`), so nobody syncs it until someone waits for it.

mod common;

use std::thread;

use crossbeam::channel::{Receiver, Sender, bounded};
use parking_lot::Mutex;
use portcullis::Error;
use portcullis::store::{Batch, FaultFs, FileStore, Outcome, Partition, SkipSync, Store};

use common::crash::builder;

fn lease() -> Partition {
    Partition::new("leases/printer").unwrap()
}

/// A store on `fs` whose commits to [`lease`] stop after their append, before their wait for
/// durability: each sends its LSN on the first channel and goes on when the second one says so.
fn held_store(fs: &FaultFs, skip: Option<SkipSync>) -> (FileStore, Receiver<u64>, Sender<()>) {
    let (appended_tx, appended) = bounded::<u64>(1);
    let (release, release_rx) = bounded::<()>(1);
    let release_rx = Mutex::new(release_rx);
    let store = builder(fs, skip)
        .observe_appends(move |p, lsn| {
            if *p == lease() {
                appended_tx.send(lsn).unwrap();
                release_rx.lock().recv().unwrap();
            }
        })
        .open()
        .unwrap();
    (store, appended, release)
}

/// What the store on `image` holds under the lease's `holder` key.
fn holder_after(image: &FaultFs) -> Option<Vec<u8>> {
    let store = builder(image, None).open().unwrap();
    let holder = store.get(&lease(), b"holder").unwrap();
    store.close().unwrap();
    holder
}

/// Commits `holder = a` and holds it pending; then checks `holder == a` with a guard-only batch
/// (and `holder` absent, which the pending batch refuses) and answers the check's outcomes and
/// whether every power cut after the check kept the holder.
fn check_against_a_pending_batch(skip: Option<SkipSync>) -> (Outcome, Outcome, bool) {
    let fs = FaultFs::new();
    let (store, appended, release) = held_store(&fs, skip);
    let writer = {
        let store = store.clone();
        thread::spawn(move || store.apply(&lease(), &Batch::new().put("holder", "a")))
    };
    appended.recv().unwrap();
    // Pending: appended, not durable; a power cut now loses it.
    assert_eq!(holder_after(&fs.crash(0)), None);
    let held = store
        .apply(&lease(), &Batch::new().equals("holder", "a"))
        .unwrap();
    let refused = store
        .apply(&lease(), &Batch::new().absent("holder"))
        .unwrap();
    // A power cut right after the answers, the writer still held before its own wait.
    let kept = (0..8).all(|seed| holder_after(&fs.crash(seed)) == Some(b"a".to_vec()));
    release.send(()).unwrap();
    assert!(writer.join().unwrap().unwrap().is_committed());
    store.close().unwrap();
    (held, refused, kept)
}

#[test]
fn a_guard_only_batch_is_answered_only_once_what_decided_it_is_durable() {
    let (held, refused, kept) = check_against_a_pending_batch(None);
    assert_eq!(held, Outcome::Committed);
    assert_eq!(refused, Outcome::PreconditionFailed { index: 0 });
    assert!(
        kept,
        "a power cut after the answers lost the batch that decided them"
    );
}

/// The negative control: answered at once, the check's state is lost by a power cut.
#[test]
fn control_skipping_the_guard_only_wait_is_caught() {
    let (held, _, kept) = check_against_a_pending_batch(Some(SkipSync::GuardOnlyWait));
    assert_eq!(held, Outcome::Committed);
    assert!(
        !kept,
        "the check answered at once, yet its state survived every power cut"
    );
}

/// When the sync of the batch that decided the guards fails, the check is not answered
/// `Committed` (nor refused on that batch's value): it answers the sync's error, as the writer
/// does.
#[test]
fn a_guard_only_batch_decided_by_a_batch_whose_sync_fails_answers_the_error() {
    let fs = FaultFs::new();
    let (store, appended, release) = held_store(&fs, None);
    let writer = {
        let store = store.clone();
        thread::spawn(move || store.apply(&lease(), &Batch::new().put("holder", "a")))
    };
    appended.recv().unwrap();
    fs.fail_syncs();
    let check = store.apply(&lease(), &Batch::new().equals("holder", "a"));
    assert!(
        matches!(check, Err(Error::Io { .. } | Error::SyncFailed(_))),
        "{check:?}"
    );
    let refused = store.apply(&lease(), &Batch::new().absent("holder"));
    assert!(matches!(refused, Err(Error::SyncFailed(_))), "{refused:?}");
    release.send(()).unwrap();
    assert!(writer.join().unwrap().is_err());
}

/// With nothing pending the check answers at once from the durable state, and a check of a
/// partition the store does not know is answered as before.
#[test]
fn a_guard_only_batch_with_nothing_pending_answers_at_once() {
    let fs = FaultFs::new();
    let store = builder(&fs, None).open().unwrap();
    assert!(
        store
            .apply(&lease(), &Batch::new().put("holder", "a"))
            .unwrap()
            .is_committed()
    );
    let syncs = store.stats().syncs;
    assert!(
        store
            .apply(&lease(), &Batch::new().equals("holder", "a"))
            .unwrap()
            .is_committed()
    );
    let other = Partition::new("leases/none").unwrap();
    assert_eq!(
        store
            .apply(&other, &Batch::new().present("holder"))
            .unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    assert_eq!(
        store.stats().syncs,
        syncs,
        "a check of durable state syncs nothing"
    );
    store.close().unwrap();
}
