//! Writes whose answer was lost (SPEC S2, R5): the store committed a batch but answered an
//! error (a timed-out etcd request does). The engine settles the outcome by reading the log
//! head instead of guessing, so a healthy entity is never contained for it, a committed record
//! is folded exactly once, and one that did not commit is never folded.

mod common;

use std::sync::Arc;

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, entity, leave_an_unsettled_write, payloads, recs,
};
use portcullis::Error;
use portcullis::engine::OwnerSwitches;
use portcullis::restore::Origin;
use portcullis::store::Outcome;

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

/// A write held in the network past its answer, then let through: answers what the write
/// answered, what the late copy got, and the log after one more append.
struct Delayed {
    answer: Result<(), Error>,
    late: Vec<Outcome>,
    next: Result<(), Error>,
    log: Vec<Vec<u8>>,
}

fn write_whose_copy_arrives_late(switches: OwnerSwitches) -> Delayed {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    let e = entity(0);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a"])).unwrap();
    *store.hold_record_writes_of.lock() = Some(e.partition());
    let answer = engine.append(&e, recs(&["b"])).map(|_| ());
    *store.hold_record_writes_of.lock() = None;
    let late = store.release_held();
    let next = engine.append(&e, recs(&["c"])).map(|_| ());
    let log = portcullis::log::read_log(&store.inner, &e.partition(), 1, 10)
        .unwrap()
        .records
        .into_iter()
        .map(|r| r.payload)
        .collect();
    Delayed {
        answer,
        late,
        next,
        log,
    }
}

/// F12, S2: a write whose answer was lost while its request is still in the network is settled
/// definitively before the engine answers: the head it finds unchanged proves nothing (a
/// delayed copy can still commit), so the engine seals the log (moves its head) and only then
/// answers that the write did not commit. The late copy then fails its head guard, and the
/// entity keeps serving. Before, the unchanged head was taken for proof: the late copy
/// committed a record the caller was told nothing about, and the next write found the log moved
/// and contained the entity.
#[test]
fn f12_a_lost_write_whose_copy_arrives_late_never_commits() {
    let delayed = write_whose_copy_arrives_late(OwnerSwitches::default());
    let err = delayed.answer.unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable { reason, .. } if reason.contains("never will")),
        "{err}"
    );
    assert_eq!(delayed.late.len(), 1);
    assert!(
        !delayed.late[0].is_committed(),
        "the late copy failed its head guard: {:?}",
        delayed.late
    );
    delayed.next.expect("the entity keeps serving");
    assert_eq!(delayed.log, recs(&["a", "c"]));
}

/// The negative control: settled on the unchanged head alone (`OwnerSwitches::
/// unsealed_settlement`), the late copy commits and the next write contains the entity.
#[test]
fn f12_negative_control_an_unsealed_settlement_lets_the_late_copy_commit() {
    let switches = OwnerSwitches {
        unsealed_settlement: true,
        ..OwnerSwitches::default()
    };
    let delayed = write_whose_copy_arrives_late(switches);
    assert_eq!(delayed.late, vec![Outcome::Committed]);
    assert!(
        matches!(delayed.next, Err(Error::Contained { .. })),
        "{:?}",
        delayed.next
    );
    assert_eq!(delayed.log, recs(&["a", "b"]));
}

/// When the held copy of a lost drain batch arrives, relative to the second restore.
#[derive(Clone, Copy, Debug)]
enum Late {
    /// Between the first restore (which lost its answer) and the second.
    Before,
    /// During the second restore, once it has read the log.
    During,
    /// After the second restore.
    After,
}

/// A pending entity with one deferred record whose first restore loses the drain batch's
/// answer (the request held in the network); the held copy arrives `late`. Answers the second
/// restore's read, what the late copy got, the log, and the engine.
/// What the second restore read, what the late copy got, the log, and the engine.
type Retried = (
    Result<Vec<Vec<u8>>, Error>,
    Vec<Outcome>,
    Vec<Vec<u8>>,
    TestEngine,
);

fn drain_whose_answer_is_lost(switches: OwnerSwitches, late: Late) -> Retried {
    let store = common::engine::closed_with(1, &["a"]);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    let e = entity(0);
    engine.defer(&e, b"d".to_vec()).unwrap();
    *store.hold_record_writes_of.lock() = Some(e.partition());
    let first = payloads(&engine, &e);
    assert!(
        matches!(first, Err(Error::OutcomeUnknown { .. })),
        "{first:?}"
    );
    *store.hold_record_writes_of.lock() = None;
    let outcomes: Arc<parking_lot::Mutex<Vec<Outcome>>> = Arc::default();
    match late {
        Late::Before => outcomes.lock().extend(store.release_held()),
        Late::During => {
            let (store, outcomes) = (Arc::clone(&store), Arc::clone(&outcomes));
            machine.set_hook(move |_| outcomes.lock().extend(store.release_held()));
        }
        Late::After => {}
    }
    let second = payloads(&engine, &e);
    outcomes.lock().extend(store.release_held());
    let log = portcullis::log::read_log(&store.inner, &e.partition(), 1, 10)
        .unwrap()
        .records
        .into_iter()
        .map(|r| r.payload)
        .collect();
    let late = outcomes.lock().clone();
    (second, late, log, engine)
}

/// R4, F12: a lost answer inside a restore unit is retried, not contained: the entity stays
/// pending, and its next unit seals the log before it reads it, so the lost batch (here the
/// drain of a deferred record) either committed before (and is read) or never commits, even if
/// its copy arrives while the next unit runs. The deferred record is in the log exactly once,
/// and the state served is its fold. Before, the unit contained the entity.
#[test]
fn r4_f12_a_lost_answer_inside_a_restore_unit_is_retried_not_contained() {
    for late in [Late::Before, Late::During, Late::After] {
        let (second, outcomes, log, engine) =
            drain_whose_answer_is_lost(OwnerSwitches::default(), late);
        assert_eq!(second.unwrap(), recs(&["a", "d"]), "late: {late:?}");
        assert_eq!(outcomes.len(), 1, "{late:?}");
        assert_eq!(
            outcomes[0].is_committed(),
            matches!(late, Late::Before),
            "{late:?}: {outcomes:?}"
        );
        assert_eq!(log, recs(&["a", "d"]), "{late:?}");
        engine
            .append(&entity(0), recs(&["c"]))
            .expect("the entity keeps serving");
        assert!(engine.containment(&entity(0)).unwrap().is_none());
    }
}

/// The negative control: without the seal before the next unit (`OwnerSwitches::
/// unsealed_settlement`), the late copy of the first unit's drain commits after the second unit
/// read the log: the second unit finds no deferred row left, serves state without the record,
/// and the next write finds the log moved and contains the entity.
#[test]
fn r4_f12_negative_control_an_unsealed_retry_serves_stale_state() {
    let switches = OwnerSwitches {
        unsealed_settlement: true,
        ..OwnerSwitches::default()
    };
    let (second, outcomes, log, engine) = drain_whose_answer_is_lost(switches, Late::During);
    assert!(outcomes[0].is_committed());
    assert_eq!(log, recs(&["a", "d"]));
    assert_eq!(
        second.unwrap(),
        recs(&["a"]),
        "stale: the record is missing"
    );
    let next = engine.append(&entity(0), recs(&["c"]));
    assert!(matches!(next, Err(Error::Contained { .. })), "{next:?}");
}

/// The origins entity 0's records were folded with, by sequence number.
fn origins(machine: &TestMachine) -> Vec<(u64, Origin)> {
    let e = entity(0);
    machine
        .applied
        .lock()
        .iter()
        .filter(|(who, _, _)| *who == e)
        .map(|(_, seq, origin)| (*seq, *origin))
        .collect()
}

/// Entity 0 holds `a` and owes a deferred record `d` (and, if `repair`, a repair: its
/// previous holder crashed); its first restore's batch commits but loses its answer, so the
/// record is in the log but was never folded. Then either a second restore in the same
/// engine, or (`crash`) one in the next engine after a crash. Answers the origins folded.
fn first_use_after_a_lost_batch(
    switches: OwnerSwitches,
    repair: bool,
    crash: bool,
) -> Vec<(u64, Origin)> {
    let machine = Arc::new(TestMachine::default());
    let store = if repair {
        *machine.repair_records.lock() = recs(&["fix"]);
        let store = TestStore::new();
        common::engine::crashed_with(&machine, &store, &[entity(0)], &["a"]);
        store
    } else {
        common::engine::closed_with(1, &["a"])
    };
    let open = || {
        builder(&machine, &store)
            .owner_switches_for_test(switches)
            .open()
            .unwrap()
    };
    let engine = open();
    let e = entity(0);
    if !repair {
        engine.defer(&e, b"d".to_vec()).unwrap();
    }
    *store.lose_answers_of.lock() = Some(e.partition());
    let first = payloads(&engine, &e);
    assert!(
        matches!(first, Err(Error::OutcomeUnknown { .. })),
        "{first:?}"
    );
    *store.lose_answers_of.lock() = None;
    machine.applied.lock().clear();
    let engine = if crash {
        common::engine::crash(engine);
        open()
    } else {
        engine
    };
    let folded = payloads(&engine, &e).unwrap();
    let expected: &[&str] = match (repair, crash) {
        (false, _) => &["a", "d"],
        (true, false) => &["a", "fix"],
        // The crashed engine's own term is owed a repair too.
        (true, true) => &["a", "fix", "fix"],
    };
    assert_eq!(folded, recs(expected));
    origins(&machine)
}

/// R3, R8: a deferred or repair record appended by a restore unit but not yet folded (its
/// batch's answer was lost, so the unit was retried; or the process crashed) is folded with
/// its first-use origin by the next unit, not as `Replay`, so work accepted as `Queued` (and a
/// repair) keeps its side effects. Before, it came back as `Replay` (and the lost answer
/// contained the entity).
#[test]
fn r3_r8_a_record_appended_but_not_yet_folded_keeps_its_first_use_origin() {
    for crash in [false, true] {
        let deferred = first_use_after_a_lost_batch(OwnerSwitches::default(), false, crash);
        assert_eq!(
            deferred,
            vec![(1, Origin::Replay), (2, Origin::Deferred)],
            "crash: {crash}"
        );
        let repaired = first_use_after_a_lost_batch(OwnerSwitches::default(), true, crash);
        let mut expected = vec![(1, Origin::Replay), (2, Origin::Repair)];
        if crash {
            expected.push((3, Origin::Repair));
        }
        assert_eq!(repaired, expected, "crash: {crash}");
    }
}

/// The negative control: with the first-use mark ignored
/// (`OwnerSwitches::first_use_origin_forgotten`), the record comes back as `Replay`.
#[test]
fn r3_r8_negative_control_a_forgotten_first_use_comes_back_as_replay() {
    let switches = OwnerSwitches {
        first_use_origin_forgotten: true,
        ..OwnerSwitches::default()
    };
    let deferred = first_use_after_a_lost_batch(switches, false, false);
    assert_eq!(deferred, vec![(1, Origin::Replay), (2, Origin::Replay)]);
}
