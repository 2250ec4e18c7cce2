//! Writes whose answer was lost (SPEC S2, R5): the store committed a batch but answered an
//! error (a timed-out etcd request does). The engine settles the outcome by reading the log
//! head instead of guessing, so a healthy entity is never contained for it, a committed record
//! is folded exactly once, and one that did not commit is never folded.

mod common;

use std::sync::Arc;

use common::engine::{
    TestMachine, TestStore, builder, entity, leave_an_unsettled_write, payloads, recs,
};
use portcullis::Error;
use portcullis::restore::Origin;

/// How many times `apply` folded the record with sequence number `seq` of entity 0 live.
fn live_folds(machine: &TestMachine, seq: u64) -> usize {
    let e = entity(0);
    machine
        .applied
        .lock()
        .iter()
        .filter(|(who, s, origin)| *who == e && *s == seq && *origin == Origin::Live)
        .count()
}

#[test]
fn a_write_whose_answer_was_lost_after_it_committed_succeeds_and_is_folded_once() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(0);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a"])).unwrap();
    *store.lose_answers_of.lock() = Some(e.partition());
    let seqs = engine
        .append(&e, recs(&["b"]))
        .expect("the lost answer is settled by a read");
    assert_eq!(seqs, 2..=2);
    *store.lose_answers_of.lock() = None;
    engine
        .append(&e, recs(&["c"]))
        .expect("the entity is not contained");
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b", "c"]));
    assert_eq!(
        live_folds(&machine, 2),
        1,
        "the settled record is folded exactly once"
    );
    assert!(engine.containment(&e).unwrap().is_none());
}

#[test]
fn a_lost_answer_that_cannot_be_read_yet_is_settled_before_the_next_write() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(0);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a"])).unwrap();
    // The answer is lost and, from the commit on, the store cannot be read either (it is
    // unreachable for a while).
    leave_an_unsettled_write(&engine, &store, &e, b"b");
    assert_eq!(
        live_folds(&machine, 2),
        0,
        "not folded while its outcome is unknown"
    );
    engine
        .append(&e, recs(&["c"]))
        .expect("the entity is not contained");
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b", "c"]));
    assert_eq!(live_folds(&machine, 2), 1);
    assert_eq!(live_folds(&machine, 3), 1);
    assert!(engine.containment(&e).unwrap().is_none());
}

#[test]
fn a_write_that_failed_before_it_committed_is_never_folded() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(0);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a"])).unwrap();
    *store.fail_writes_of.lock() = Some(e.partition());
    let err = engine.append(&e, recs(&["b"])).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    *store.fail_writes_of.lock() = None;
    let seqs = engine.append(&e, recs(&["c"])).unwrap();
    assert_eq!(seqs, 2..=2, "the failed write took no sequence number");
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "c"]));
}

#[test]
fn a_checkpoint_whose_answer_was_lost_does_not_contain_the_entity() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(0);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a", "b"])).unwrap();
    *store.lose_answers_of.lock() = Some(e.partition());
    assert!(engine.checkpoint(&e).is_err());
    *store.lose_answers_of.lock() = None;
    engine
        .append(&e, recs(&["c"]))
        .expect("the entity is not contained");
    engine.checkpoint(&e).unwrap();
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b", "c"]));
    assert!(engine.containment(&e).unwrap().is_none());
    // A restart restores from the checkpoint and the history agrees (SPEC L4).
    engine.close().unwrap();
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b", "c"]));
    assert!(engine.verify_checkpoint(&e).unwrap());
}
