//! Races that must not cost a guarantee: no false containment from an audit racing a
//! checkpoint with truncation (L4, R4), no checkpoint adopted as verified after the history it
//! claims changed (L4), no restored entity with stale state after a containment raced a
//! release (R4), and fail-closed after a panic between a write's commit and its fold (R5).
//! Threads are ordered with channels; `within` only bounds a hang.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::engine::{TestMachine, TestStore, builder, entity, payloads, recs, writes_records};
use crossbeam::channel;
use portcullis::Error;
use portcullis::log::{self, Checkpoint, keys};
use portcullis::restore::ReasonKind;
use portcullis::store::{Batch, Store};

/// L4, R4: `verify_checkpoint` walks history page by page without the entity's lock. A
/// checkpoint with truncation that lands during the walk deletes records it has not read yet;
/// that is not damage, and the healthy entity must not be contained.
#[test]
fn l4_an_audit_racing_a_checkpoint_with_truncation_contains_nothing() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        let many: Vec<Vec<u8>> = (0..600u32).map(|i| i.to_le_bytes().to_vec()).collect();
        engine.append(&e, many).unwrap();
        engine.close().unwrap();
    }
    // The unit owes a checkpoint (a long tail) and publishes it without truncating, so the
    // audit has 600 retained records (three pages) to walk.
    let engine = builder(&machine, &store)
        .checkpoint_tail_bound(10)
        .truncate_after_checkpoint(true)
        .open()
        .unwrap();
    assert_eq!(payloads(&engine, &e).unwrap().len(), 600);
    let fired = Arc::new(AtomicBool::new(false));
    {
        let engine = engine.clone();
        let fired = Arc::clone(&fired);
        let p = e.partition();
        let e = e.clone();
        store.set_before_scan(move |q, _| {
            if *q == p && !fired.swap(true, Ordering::SeqCst) {
                // Another caller checkpoints and truncates while the audit walks.
                assert_eq!(engine.checkpoint(&e).unwrap(), 600);
            }
        });
    }
    let verified = engine.verify_checkpoint(&e);
    store.clear_hooks();
    assert!(fired.load(Ordering::SeqCst), "the race was staged");
    assert!(verified.unwrap(), "the checkpoint is sound");
    assert_eq!(engine.containment(&e).unwrap(), None);
    assert_eq!(payloads(&engine, &e).unwrap().len(), 600);
}

/// L4: the audit adopts a checkpoint as verified only if, once its walk ends, the head still
/// names the checkpoint and history root it walked. A checkpoint replaced during the walk by
/// one that does not match its history must not be reported verified.
#[test]
fn l4_an_audit_does_not_adopt_a_checkpoint_replaced_during_its_walk() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    let engine = builder(&machine, &store).open().unwrap();
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a", "b", "c"])).unwrap();
    engine.checkpoint(&e).unwrap();
    let fired = Arc::new(AtomicBool::new(false));
    {
        let fired = Arc::clone(&fired);
        let p = e.partition();
        let inner: Arc<TestStore> = Arc::clone(&store);
        store.set_before_scan(move |q, _| {
            if *q == p && !fired.swap(true, Ordering::SeqCst) {
                // The checkpoint is replaced under the walk by one from another history.
                let mut head = log::read_head(&inner.inner, &p).unwrap().head;
                let forged = Checkpoint {
                    seq: 3,
                    digest: 42,
                    state: Vec::new(),
                };
                head.checkpoint = Some(forged.mark());
                let batch = Batch::new()
                    .put(keys::checkpoint_key(), forged.encode())
                    .put(keys::head_key(), head.encode());
                assert!(inner.inner.apply(&p, &batch).unwrap().is_committed());
            }
        });
    }
    let verified = engine.verify_checkpoint(&e);
    store.clear_hooks();
    assert!(fired.load(Ordering::SeqCst), "the race was staged");
    let err = verified.expect_err("a forged checkpoint was adopted as verified");
    assert!(err.to_string().contains("corrupt-checkpoint"), "{err}");
}

/// R4: a write that committed a record `apply` refuses contains the entity; an operator
/// release that lands while that write is still in flight must not let a new unit restore the
/// entity without the record and settle it restored over the containment.
#[test]
fn r4_a_release_racing_a_refused_write_never_serves_stale_state() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    let engine = builder(&machine, &store).open().unwrap();
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["r"])).unwrap();
    engine.checkpoint(&e).unwrap();
    // The writer decides (holding the entity) and waits for a go before committing.
    let (in_decide_tx, in_decide_rx) = channel::bounded::<()>(1);
    let (go_tx, go_rx) = channel::bounded::<()>(1);
    let writer = {
        let engine = engine.clone();
        let e = e.clone();
        std::thread::spawn(move || {
            engine.write(&e, |_| {
                in_decide_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                (recs(&["!refuse"]), ())
            })
        })
    };
    in_decide_rx.recv().unwrap();
    // An audit contains the entity meanwhile (its checkpoint looks forged for a moment).
    let p = e.partition();
    let (head_row, ckpt_row) = (
        store.get(&p, &keys::head_key()).unwrap().unwrap(),
        store.get(&p, &keys::checkpoint_key()).unwrap().unwrap(),
    );
    let mut head = log::read_head(&*store, &p).unwrap().head;
    let forged = Checkpoint {
        seq: 1,
        digest: 42,
        state: Vec::new(),
    };
    head.checkpoint = Some(forged.mark());
    let forge = Batch::new()
        .put(keys::checkpoint_key(), forged.encode())
        .put(keys::head_key(), head.encode());
    assert!(store.apply(&p, &forge).unwrap().is_committed());
    assert!(engine.verify_checkpoint(&e).is_err());
    let repair = Batch::new()
        .put(keys::checkpoint_key(), ckpt_row)
        .put(keys::head_key(), head_row);
    assert!(store.apply(&p, &repair).unwrap().is_committed());
    // The operator releases it while the write is still in flight.
    let mut stale_unit = None;
    match engine.release(&e) {
        Ok(true) => {
            // A new unit runs: it reads the log before the writer commits its record.
            let (started_tx, started_rx) = channel::bounded::<()>(1);
            let (finish_tx, finish_rx) = channel::bounded::<()>(1);
            machine.set_hook(move |_| {
                started_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
            });
            let reader = {
                let engine = engine.clone();
                let e = e.clone();
                std::thread::spawn(move || payloads(&engine, &e))
            };
            started_rx.recv().unwrap();
            go_tx.send(()).unwrap();
            let written = writer.join().unwrap();
            assert!(
                matches!(written, Err(Error::Contained { .. })),
                "{written:?}"
            );
            finish_tx.send(()).unwrap();
            stale_unit = Some(reader.join().unwrap());
        }
        Err(Error::Unavailable { .. }) => {
            go_tx.send(()).unwrap();
            let written = writer.join().unwrap();
            assert!(
                matches!(written, Err(Error::Contained { .. })),
                "{written:?}"
            );
            assert!(engine.release(&e).unwrap());
        }
        other => panic!("unexpected release outcome {other:?}"),
    }
    if let Some(served) = stale_unit {
        assert!(
            served.is_err(),
            "a unit served {served:?} without the committed record"
        );
    }
    // The committed record is refused by apply, so every restore contains the entity.
    let now = payloads(&engine, &e);
    let err = now.expect_err("the entity was served without its committed record");
    assert!(err.to_string().contains("apply-refusal"), "{err}");
}

/// R5: a panic after a write's batch committed but before the state folded it leaves the
/// engine unable to tell what the state holds: the entity fails closed instead of serving the
/// state without the record; a release restores it with the record.
#[test]
fn r5_a_panic_between_a_writes_commit_and_its_fold_fails_closed() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    let engine = builder(&machine, &store).open().unwrap();
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a"])).unwrap();
    let armed = Arc::new(AtomicBool::new(true));
    {
        let armed = Arc::clone(&armed);
        store.set_after_apply(move |_, batch| {
            if writes_records(batch) && armed.swap(false, Ordering::SeqCst) {
                panic!("the store panicked after committing");
            }
        });
    }
    let unwound = catch_unwind(AssertUnwindSafe(|| engine.append(&e, recs(&["b"]))));
    store.clear_hooks();
    assert!(unwound.is_err(), "the panic reaches the caller");
    let err = engine.read(&e, |s| s.records.len()).unwrap_err();
    assert!(err.to_string().contains("fail-closed"), "{err}");
    assert_eq!(
        engine.containment(&e).unwrap().unwrap().kind,
        ReasonKind::FailClosed
    );
    assert!(engine.release(&e).unwrap());
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b"]));
}
