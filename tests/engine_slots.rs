//! Slots leaving the registry (SPEC R2, R3, R4, R8, R10): a passivated entity that nobody uses
//! costs what an untouched one costs; a touch racing the removal of its slot shares the one
//! restore and loses no deferred work; what cannot be rebuilt from the store (a use in
//! progress, a deferral in flight, a containment, an unsettled write, a repair done while
//! repairs are owed) keeps the slot. Negative controls switch the guard off and find the
//! violation. Bounded in threads and time; no test sleeps to synchronise. Slots under a
//! memory budget are in tests/engine_slot_budget.rs.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, contained, crashed_with, entity,
    leave_an_unsettled_write, one_entity, payloads, recs, slots, until, within, writes_deferral,
};
use crossbeam::channel;
use parking_lot::Mutex;
use portcullis::engine::Deferred;
use portcullis::restore::{Metrics, ReasonKind, UnitReport};
use portcullis::{EntityId, Error};

#[test]
fn r10_a_passivated_idle_entity_leaves_the_registry() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    for i in 0..5 {
        engine.register(&entity(i)).unwrap();
    }
    // Registering makes no slot; nor do questions that restore nothing.
    assert_eq!(slots(&engine), 0);
    assert!(engine.containment(&entity(0)).unwrap().is_none());
    assert!(!engine.release(&entity(0)).unwrap());
    drop(engine.history(&entity(0), 1).unwrap());
    assert!(!engine.verify_checkpoint(&entity(0)).unwrap());
    assert_eq!(slots(&engine), 0);
    for i in 0..5 {
        engine.append(&entity(i), recs(&["a"])).unwrap();
    }
    assert_eq!(slots(&engine), 5);
    for i in 0..5 {
        assert!(engine.passivate(&entity(i)).unwrap());
        assert_eq!(slots(&engine), 4 - i as u64, "after passivating {i}");
    }
    let stats = engine.stats();
    assert_eq!(stats.passivation.retired, 5);
    assert_eq!(stats.phases.pending, 5);
    // Restored again on the next touch, from a fresh slot, with the same state.
    for i in 0..5 {
        assert_eq!(payloads(&engine, &entity(i)).unwrap(), recs(&["a"]));
        assert_eq!(machine.units_of(&entity(i)), 2);
    }
    assert_eq!(slots(&engine), 5);
}

/// Counts restore units of one entity running at the same time (their start is the machine's
/// hook, their end the `entity_restored` hook): more than one is two restores of one
/// activation (SPEC R2).
#[derive(Default)]
struct Overlaps {
    running: Mutex<HashMap<EntityId, u32>>,
    found: AtomicU64,
}

impl Overlaps {
    fn started(&self, e: &EntityId) {
        let mut running = self.running.lock();
        let n = running.entry(e.clone()).or_default();
        if *n > 0 {
            self.found.fetch_add(1, Ordering::SeqCst);
        }
        *n += 1;
    }
}

impl Metrics for Overlaps {
    fn entity_restored(&self, e: &EntityId, _: &UnitReport) {
        if let Some(n) = self.running.lock().get_mut(e) {
            *n -= 1;
        }
    }
}

/// Readers, a deferrer and a passivator race on two entities, round after round (a barrier
/// starts each round). No two units of one entity ever run at once, every deferred record is
/// applied exactly once and in order, and slots did leave the registry during the race.
#[test]
fn r2_r8_touches_racing_slot_removal_share_one_restore_and_lose_no_deferred_work() {
    const ENTITIES: usize = 2;
    const ROUNDS: usize = 200;
    const THREADS: usize = 4;
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let overlaps = Arc::new(Overlaps::default());
    {
        let overlaps = Arc::clone(&overlaps);
        machine.set_hook(move |e| overlaps.started(e));
    }
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&overlaps) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    for i in 0..ENTITIES {
        engine.register(&entity(i)).unwrap();
        engine.append(&entity(i), recs(&["a"])).unwrap();
    }
    let barrier = Arc::new(Barrier::new(THREADS));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut threads = Vec::new();
    for reader in 0..2 {
        let (engine, barrier) = (engine.clone(), Arc::clone(&barrier));
        threads.push(std::thread::spawn(move || {
            for round in 0..ROUNDS {
                barrier.wait();
                let e = entity((round + reader) % ENTITIES);
                let got = payloads(&engine, &e).unwrap();
                assert_eq!(got[0], b"a", "round {round}");
                let mut names = got.clone();
                names.sort();
                names.dedup();
                assert_eq!(names.len(), got.len(), "a record folded twice: {got:?}");
                assert!(Instant::now() < deadline, "bounded in time");
            }
        }));
    }
    {
        let (engine, barrier) = (engine.clone(), Arc::clone(&barrier));
        threads.push(std::thread::spawn(move || {
            for round in 0..ROUNDS {
                barrier.wait();
                let record = format!("d{round}").into_bytes();
                match engine.defer(&entity(round % ENTITIES), record).unwrap() {
                    Deferred::Queued | Deferred::Applied { .. } => {}
                    other => panic!("round {round}: {other:?}"),
                }
            }
        }));
    }
    {
        let (engine, barrier) = (engine.clone(), Arc::clone(&barrier));
        threads.push(std::thread::spawn(move || {
            for round in 0..ROUNDS {
                barrier.wait();
                for i in [round % ENTITIES, (round + 1) % ENTITIES] {
                    match engine.passivate(&entity(i)) {
                        Ok(_) | Err(Error::Unavailable { .. }) => {}
                        Err(e) => panic!("passivate: {e}"),
                    }
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        overlaps.found.load(Ordering::SeqCst),
        0,
        "two units at once"
    );
    for i in 0..ENTITIES {
        let mut want = vec![b"a".to_vec()];
        want.extend(
            (i..ROUNDS)
                .step_by(ENTITIES)
                .map(|r| format!("d{r}").into_bytes()),
        );
        assert_eq!(payloads(&engine, &entity(i)).unwrap(), want, "entity {i}");
    }
    let stats = engine.stats().passivation;
    assert!(stats.retired > 0, "no slot left during the race: {stats:?}");
}

/// What a touch racing the removal of its entity's slot saw.
struct Race {
    units: u64,
    deferred: Deferred,
    readers: Vec<Vec<Vec<u8>>>,
    last: Vec<Vec<u8>>,
    passivated: Vec<bool>,
    slots_while_in_use: Vec<u64>,
}

/// A passivated entity gets a deferral whose row is held at the store; a reader waits on the
/// gate for it; the entity is passivated again (its slot is asked to leave); a second reader
/// arrives; then the row commits.
fn removal_racing_a_deferral(unguarded: bool) -> Race {
    let (store, machine, engine, e) = one_entity(1, &["a"]);
    assert!(engine.passivate(&e).unwrap());
    assert_eq!(slots(&engine), 0);
    engine.set_retire_unguarded_for_test(unguarded);
    let (entered_tx, entered_rx) = channel::bounded(1);
    let (go_tx, go_rx) = channel::bounded::<()>(1);
    store.set_before_apply(move |_, batch| {
        if writes_deferral(batch) {
            let _ = entered_tx.send(());
            let _ = go_rx.recv_timeout(Duration::from_secs(10));
        }
    });
    let spawn = |f: fn(&TestEngine, &EntityId) -> Vec<Vec<u8>>| {
        let (engine, e) = (engine.clone(), e.clone());
        std::thread::spawn(move || f(&engine, &e))
    };
    let deferrer = {
        let (engine, e) = (engine.clone(), e.clone());
        std::thread::spawn(move || engine.defer(&e, b"d1".to_vec()).unwrap())
    };
    entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut slots_while_in_use = vec![slots(&engine)];
    // The deferral in flight keeps the slot (the entity is pending: nothing to passivate).
    let mut passivated = vec![engine.passivate(&e).unwrap()];
    slots_while_in_use.push(slots(&engine));
    let first = spawn(|engine, e| payloads(engine, e).unwrap());
    until(|| engine.stats().phases.waiting >= 1 || first.is_finished());
    // A waiter (and the deferral) keep it.
    passivated.push(engine.passivate(&e).unwrap());
    slots_while_in_use.push(slots(&engine));
    let second = spawn(|engine, e| payloads(engine, e).unwrap());
    until(|| engine.stats().phases.waiting >= 2 || second.is_finished());
    go_tx.send(()).unwrap();
    let deferred = deferrer.join().unwrap();
    let readers = vec![first.join().unwrap(), second.join().unwrap()];
    store.clear_hooks();
    engine.set_retire_unguarded_for_test(false);
    Race {
        units: machine.units_of(&e),
        deferred,
        readers,
        last: payloads(&engine, &e).unwrap(),
        passivated,
        slots_while_in_use,
    }
}

#[test]
fn r2_r8_a_touch_racing_the_removal_of_its_slot_shares_the_one_restore() {
    let race = removal_racing_a_deferral(false);
    assert_eq!(race.slots_while_in_use, [1, 1, 1]);
    assert_eq!(race.passivated, [false, false]);
    assert_eq!(race.deferred, Deferred::Queued);
    let want = recs(&["a", "d1"]);
    assert_eq!(race.readers, [want.clone(), want.clone()]);
    assert_eq!(race.last, want);
    // One unit for the first activation, one for the reactivation, shared by both readers.
    assert_eq!(race.units, 2);
}

/// Negative control: with the guard off the slot leaves while a deferral and a waiter use it;
/// the second reader makes a fresh slot and restores the entity a second time, and the state
/// served afterwards lacks the deferred record.
#[test]
fn r2_r8_negative_control_removing_a_slot_in_use_restores_twice_and_loses_deferred_work() {
    let race = removal_racing_a_deferral(true);
    assert!(
        race.units > 2 && race.last != recs(&["a", "d1"]),
        "the control did not break the activation: {} units, last read {:?}",
        race.units,
        race.last
    );
}

/// The write path's containment is recorded only in memory (a restore would meet the record
/// again, but a containment from an I/O error or an audit would not come back): its slot and
/// named reason stay until it is released.
#[test]
fn r4_a_contained_entity_keeps_its_slot_and_its_named_reason() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (engine, e) = contained(&machine, &store);
    assert!(!engine.passivate(&e).unwrap());
    assert_eq!(slots(&engine), 1);
    let reason = engine.containment(&e).unwrap().expect("still contained");
    assert_eq!(reason.kind, ReasonKind::ApplyRefusal);
    let err = engine.read(&e, |_| ()).unwrap_err();
    assert!(err.to_string().contains("apply-refusal"), "{err}");
    assert_eq!(machine.units_of(&e), 1, "the unit ran again");
    // Released, it is pending and idle: its slot leaves.
    assert!(engine.release(&e).unwrap());
    assert_eq!(slots(&engine), 0);
}

/// An I/O error contains an entity; once the store answers again, only the kept slot remembers
/// the containment. Negative control: with the guard off, passivating it removes the slot and
/// the next touch restores it as if nothing happened.
#[test]
fn r4_negative_control_removing_a_contained_slot_erases_its_containment() {
    for unguarded in [false, true] {
        let (store, _machine, engine, e) = one_entity(1, &["a"]);
        assert!(engine.passivate(&e).unwrap());
        *store.fail_reads_of.lock() = Some(e.partition());
        let err = engine.read(&e, |_| ()).unwrap_err();
        assert!(err.to_string().contains("io-error"), "{err}");
        *store.fail_reads_of.lock() = None;
        engine.set_retire_unguarded_for_test(unguarded);
        assert!(!engine.passivate(&e).unwrap());
        let still = engine.containment(&e).unwrap().map(|r| r.kind);
        if unguarded {
            assert_eq!(still, None, "the control did not erase the containment");
        } else {
            assert_eq!(still, Some(ReasonKind::Io));
            assert_eq!(slots(&engine), 1);
        }
    }
}

#[test]
fn r10_an_entity_in_use_keeps_its_slot() {
    let (_store, machine, engine, e) = one_entity(1, &["a"]);
    // A closure holds it.
    let (inner, e2) = (engine.clone(), e.clone());
    let (refused, during) = within("a passivation from inside a closure", move || {
        inner
            .read(&e2, |_| (inner.passivate(&e2), slots(&inner)))
            .unwrap()
    });
    assert!(
        matches!(refused, Err(Error::Unavailable { .. })),
        "{refused:?}"
    );
    assert_eq!(during, 1);
    // A unit is restoring it.
    assert!(engine.passivate(&e).unwrap());
    let (started_tx, started_rx) = channel::bounded(1);
    let (go_tx, go_rx) = channel::bounded::<()>(1);
    machine.set_hook(move |_| {
        let _ = started_tx.send(());
        let _ = go_rx.recv_timeout(Duration::from_secs(10));
    });
    let reader = {
        let (engine, e) = (engine.clone(), e.clone());
        std::thread::spawn(move || payloads(&engine, &e).unwrap())
    };
    started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let refused = engine.passivate(&e);
    assert!(
        matches!(refused, Err(Error::Unavailable { .. })),
        "{refused:?}"
    );
    assert_eq!(slots(&engine), 1);
    go_tx.send(()).unwrap();
    assert_eq!(reader.join().unwrap(), recs(&["a"]));
    assert_eq!(slots(&engine), 1);
}

/// A write whose answer was lost, and which cannot be settled yet, keeps the entity restored
/// (and so its slot) until it is settled.
#[test]
fn r10_an_entity_with_an_unsettled_write_keeps_its_slot() {
    let (store, _machine, engine, e) = one_entity(0, &["a"]);
    leave_an_unsettled_write(&engine, &store, &e, b"b");
    let refused = engine.passivate(&e);
    assert!(
        matches!(refused, Err(Error::Unavailable { .. })),
        "{refused:?}"
    );
    assert_eq!(slots(&engine), 1);
    engine.append(&e, recs(&["c"])).unwrap();
    assert!(engine.passivate(&e).unwrap());
    assert_eq!(slots(&engine), 0);
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b", "c"]));
}

/// After an unclean restart the namespace owes a repair: each entity is repaired once, and its
/// slot leaves the registry once passivated (its `\0repair` row records the repair), yet
/// closing drops the owed repair since every entity had it, and the next holder owes none.
#[test]
fn r3_a_passivated_entity_leaves_the_registry_and_its_repair_still_counts() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["fix"]);
    let ns = entity(0).namespace().clone();
    crashed_with_two_entities(&machine, &store);
    let engine = builder(&machine, &store).open().unwrap();
    for i in 0..2 {
        assert_eq!(payloads(&engine, &entity(i)).unwrap(), recs(&["x", "fix"]));
        assert!(engine.passivate(&entity(i)).unwrap());
    }
    assert_eq!(slots(&engine), 0);
    engine.close().unwrap();
    let next = builder(&machine, &store).open().unwrap();
    assert!(next.owed_repairs(&ns).unwrap().is_empty());
    for i in 0..2 {
        assert_eq!(payloads(&next, &entity(i)).unwrap(), recs(&["x", "fix"]));
    }
    assert_eq!(machine.repairs.lock().len(), 2, "repaired once per entity");
}

/// Entity 0 is repaired and passivated (no slot); entity 1 is never touched. Closing must keep
/// the repair owed, so the next holder repairs entity 1. Negative control: counting entities
/// without a slot as repaired unread drops the repair, and entity 1 is never repaired.
#[test]
fn r3_an_untouched_entity_keeps_the_repair_owed_to_the_next_holder() {
    for assumed in [false, true] {
        let store = TestStore::new();
        let machine = Arc::new(TestMachine::default());
        *machine.repair_records.lock() = recs(&["fix"]);
        let ns = entity(0).namespace().clone();
        crashed_with_two_entities(&machine, &store);
        let engine = builder(&machine, &store).open().unwrap();
        engine.set_repairs_assumed_for_test(assumed);
        assert_eq!(payloads(&engine, &entity(0)).unwrap(), recs(&["x", "fix"]));
        assert!(engine.passivate(&entity(0)).unwrap());
        assert_eq!(slots(&engine), 0);
        engine.close().unwrap();
        let next = builder(&machine, &store).open().unwrap();
        let owed = next.owed_repairs(&ns).unwrap();
        let second = payloads(&next, &entity(1)).unwrap();
        if assumed {
            assert!(
                owed.is_empty() && second == recs(&["x"]),
                "the control did not drop the repair: owed {owed:?}, entity 1 {second:?}"
            );
        } else {
            assert!(!owed.is_empty());
            assert_eq!(second, recs(&["x", "fix"]));
            // Entity 0 is not repaired again: its row names the owed term.
            assert_eq!(payloads(&next, &entity(0)).unwrap(), recs(&["x", "fix"]));
            assert_eq!(machine.repairs.lock().len(), 2, "repaired once per entity");
        }
    }
}

/// Two registered entities with one record each, written by an engine that then crashes (so
/// the next holder of their namespace owes a repair).
fn crashed_with_two_entities(machine: &Arc<TestMachine>, store: &Arc<TestStore>) {
    crashed_with(machine, store, &[entity(0), entity(1)], &["x"]);
}
