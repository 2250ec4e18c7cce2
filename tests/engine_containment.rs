//! Containment (R4) and fail-closed (R5): each cause contains only its entity, every later
//! touch gets the same named refusal without rerunning the unit, and a release makes the next
//! touch run the unit again.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::engine::{TestEngine, TestMachine, TestStore, builder, closed_with, entity, payloads};
use portcullis::log::{self, keys};
use portcullis::restore::{Metrics, ReasonKind, UnitReport};
use portcullis::store::{Batch, Store};
use portcullis::{EntityId, Error};

/// Three entities with records "a", "b", closed so they reopen pending.
fn seeded() -> Arc<TestStore> {
    closed_with(3, &["a", "b"])
}

/// Touches the damaged entity 1: it must be contained with `kind`, the others served, and
/// three more touches must give the identical refusal without rerunning the unit.
fn assert_contained(engine: &TestEngine, machine: &TestMachine, kind: ReasonKind) -> String {
    let bad = entity(1);
    let first = engine.read(&bad, |_| ()).unwrap_err();
    assert!(matches!(first, Error::Contained { .. }), "{first}");
    assert_eq!(first.code(), 11);
    let message = first.to_string();
    assert!(
        message.contains(kind.name()),
        "{message} should name {}",
        kind.name()
    );
    assert_eq!(engine.containment(&bad).unwrap().unwrap().kind, kind);
    for i in [0, 2] {
        assert_eq!(payloads(engine, &entity(i)).unwrap().len(), 2);
    }
    let runs = engine.stats().units_run;
    for _ in 0..3 {
        assert_eq!(engine.read(&bad, |_| ()).unwrap_err().to_string(), message);
        let write = engine.append(&bad, vec![b"c".to_vec()]).unwrap_err();
        assert_eq!(write.to_string(), message);
        assert_eq!(
            engine.defer(&bad, b"d".to_vec()).unwrap_err().to_string(),
            message
        );
    }
    engine.warm().unwrap().wait().unwrap();
    assert_eq!(
        engine.stats().units_run,
        runs,
        "a unit reran without a release"
    );
    assert!(machine.units_of(&bad) <= 1);
    assert_eq!(engine.stats().phases.contained, 1);
    message
}

fn open(store: &Arc<TestStore>) -> (Arc<TestMachine>, TestEngine) {
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, store).open().unwrap();
    (machine, engine)
}

#[test]
fn r4_corrupt_record() {
    let store = seeded();
    let p = entity(1).partition();
    let mut row = store.get(&p, &keys::record_key(2)).unwrap().unwrap();
    *row.last_mut().unwrap() ^= 0x20;
    let _ = store
        .apply(&p, &Batch::new().put(keys::record_key(2), row.clone()))
        .unwrap();
    let (machine, engine) = open(&store);
    assert_contained(&engine, &machine, ReasonKind::CorruptRecord);
    // Repaired by an operator, then released: the next touch runs the whole unit again.
    *row.last_mut().unwrap() ^= 0x20;
    let _ = store
        .apply(&p, &Batch::new().put(keys::record_key(2), row))
        .unwrap();
    assert!(engine.release(&entity(1)).unwrap());
    assert!(
        !engine.release(&entity(1)).unwrap(),
        "nothing left to release"
    );
    assert_eq!(payloads(&engine, &entity(1)).unwrap().len(), 2);
    assert_eq!(machine.units_of(&entity(1)), 2);
}

#[test]
fn r4_apply_refusal() {
    let store = seeded();
    let p = entity(1).partition();
    log::append(&*store, &p, &[b"!refuse".to_vec()], Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    let (machine, engine) = open(&store);
    let message = assert_contained(&engine, &machine, ReasonKind::ApplyRefusal);
    assert!(message.contains("record 3"), "{message}");
    // Released without a fix: the unit reruns and refuses the same way.
    assert!(engine.release(&entity(1)).unwrap());
    assert_eq!(
        engine.read(&entity(1), |_| ()).unwrap_err().to_string(),
        message
    );
    assert_eq!(machine.units_of(&entity(1)), 2);
}

#[test]
fn r4_io_error() {
    let store = seeded();
    *store.fail_reads_of.lock() = Some(entity(1).partition());
    let (machine, engine) = open(&store);
    assert_contained(&engine, &machine, ReasonKind::Io);
    *store.fail_reads_of.lock() = None;
    assert!(engine.release(&entity(1)).unwrap());
    assert_eq!(payloads(&engine, &entity(1)).unwrap().len(), 2);
    // The failed unit stopped before the application saw it; the rerun reached it once.
    assert_eq!(machine.units_of(&entity(1)), 1);
    assert_eq!(engine.stats().units_run, 4);
}

#[test]
fn r4_panic_in_apply() {
    let store = seeded();
    let p = entity(1).partition();
    log::append(&*store, &p, &[b"!panic".to_vec()], Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    let (machine, engine) = open(&store);
    let message = assert_contained(&engine, &machine, ReasonKind::Panic);
    assert!(message.contains("poisonous"), "{message}");
}

/// A checkpoint that does not decode, over history truncated up to it: nothing is left to
/// replay instead (with the history stored, restore falls back to it, SPEC E7:
/// `engine_restore::e7_a_checkpoint_that_does_not_decode_falls_back_to_the_whole_history`).
#[test]
fn r4_checkpoint_that_does_not_decode() {
    let store = seeded();
    let p = entity(1).partition();
    let head = log::read_head(&*store, &p).unwrap();
    let head = log::write_checkpoint(&*store, &p, &head, 2, b"junk".to_vec(), Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    log::truncate_before(&*store, &p, &head, 3)
        .unwrap()
        .committed()
        .unwrap();
    let (machine, engine) = open(&store);
    let message = assert_contained(&engine, &machine, ReasonKind::Decode);
    assert!(
        message.contains("checkpoint at 2 does not decode")
            && message.contains("truncated (records from 3 on are kept)"),
        "{message}"
    );
}

#[test]
fn r4_a_written_record_that_apply_refuses_contains_the_entity() {
    let store = seeded();
    let (machine, engine) = open(&store);
    engine.read(&entity(1), |_| ()).unwrap();
    let err = engine
        .append(&entity(1), vec![b"!refuse".to_vec()])
        .unwrap_err();
    assert!(err.to_string().contains("apply-refusal"), "{err}");
    let again = engine.read(&entity(1), |_| ()).unwrap_err();
    assert_eq!(again.to_string(), err.to_string());
    assert_eq!(payloads(&engine, &entity(0)).unwrap().len(), 2);
    assert_eq!(machine.units_of(&entity(1)), 1);
}

/// A metrics hook that panics while a restore is being reported.
struct PanickyMetrics {
    armed: AtomicBool,
    target: EntityId,
}

impl Metrics for PanickyMetrics {
    fn entity_restored(&self, entity: &EntityId, _: &UnitReport) {
        if *entity == self.target && self.armed.load(Ordering::SeqCst) {
            panic!("metrics hook crashed");
        }
    }
}

#[test]
fn r5_a_thread_that_unwinds_while_owning_a_gate_leaves_the_entity_refused() {
    let store = seeded();
    let machine = Arc::new(TestMachine::default());
    let metrics = Arc::new(PanickyMetrics {
        armed: AtomicBool::new(true),
        target: entity(1),
    });
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&metrics) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    let unwound = catch_unwind(AssertUnwindSafe(|| engine.read(&entity(1), |_| ())));
    assert!(unwound.is_err(), "the hook's panic reaches the toucher");
    // Nobody can tell whether the unit's outcome was recorded: refuse, never replay.
    let err = engine.read(&entity(1), |_| ()).unwrap_err();
    assert!(err.to_string().contains("fail-closed"), "{err}");
    assert_eq!(
        engine.containment(&entity(1)).unwrap().unwrap().kind,
        ReasonKind::FailClosed
    );
    assert_eq!(machine.units_of(&entity(1)), 1);
    assert_eq!(payloads(&engine, &entity(2)).unwrap().len(), 2);
    metrics.armed.store(false, Ordering::SeqCst);
    assert!(engine.release(&entity(1)).unwrap());
    assert_eq!(payloads(&engine, &entity(1)).unwrap().len(), 2);
    assert_eq!(machine.units_of(&entity(1)), 2);
}

#[test]
fn r5_r6_a_warm_survives_panics_and_counts_refusals() {
    let store = seeded();
    let machine = Arc::new(TestMachine::default());
    let metrics = Arc::new(PanickyMetrics {
        armed: AtomicBool::new(true),
        target: entity(1),
    });
    let p = entity(2).partition();
    log::append(&*store, &p, &[b"!panic".to_vec()], Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&metrics) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    let progress = engine.warm().unwrap().wait().unwrap();
    assert_eq!((progress.done, progress.total, progress.refused), (3, 3, 2));
    assert_eq!(payloads(&engine, &entity(0)).unwrap().len(), 2);
    assert!(engine.read(&entity(1), |_| ()).is_err());
    assert!(engine.read(&entity(2), |_| ()).is_err());
}
