//! Passivation (SPEC R10): idle restored entities dropped under a budget or on request, and
//! restored again on their next touch exactly once per activation, behind the same gate. Also
//! what is never passivated (a contained entity, one a closure holds), deferred work to a
//! passivated entity (R8), and a race of passivation with writes and reads. Bounded in threads
//! and time; no test sleeps to synchronise.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, contained, crashed_with, entity, one_entity,
    payloads, recs, until, within,
};
use common::rng::Rng;
use portcullis::Error;
use portcullis::Origin;

#[test]
fn r10_the_budget_is_respected_after_many_touches() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .max_resident_entities(3)
        .open()
        .unwrap();
    for i in 0..20 {
        engine.register(&entity(i)).unwrap();
        engine
            .append(&entity(i), vec![format!("r{i}").into_bytes()])
            .unwrap();
        let stats = engine.stats().passivation;
        assert!(stats.resident <= 3, "after entity {i}: {stats:?}");
    }
    // Every entity answers its own state, restored again where it was passivated.
    for round in 0..2 {
        for i in 0..20 {
            let got = payloads(&engine, &entity(i)).unwrap();
            assert_eq!(got, vec![format!("r{i}").into_bytes()], "round {round}");
            let stats = engine.stats().passivation;
            assert!(stats.resident <= 3, "round {round}, entity {i}: {stats:?}");
            assert_eq!(stats.resident, engine.stats().phases.restored);
        }
    }
    let stats = engine.stats().passivation;
    assert_eq!(stats.budget, Some(3));
    assert!(stats.passivations >= 17 + 40 - 3, "{stats:?}");
    // One unit per first activation, and one per reactivation.
    assert!(engine.stats().units_run >= 20 + 40 - 3, "{stats:?}");
    // The passivated entities left the registry: only the resident ones have slots.
    assert!(stats.retired >= 17 + 40 - 3, "{stats:?}");
    assert_eq!(stats.slots, stats.resident, "{stats:?}");
}

#[test]
fn r10_the_least_recently_touched_entity_is_passivated_first() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .max_resident_entities(3)
        .open()
        .unwrap();
    for i in 0..3 {
        engine.register(&entity(i)).unwrap();
        engine.append(&entity(i), recs(&["x"])).unwrap();
    }
    engine.register(&entity(3)).unwrap();
    // Entity 0 is touched again: entity 1 is now the least recently touched.
    engine.read(&entity(0), |_| ()).unwrap();
    engine.read(&entity(3), |_| ()).unwrap();
    assert!(!engine.passivate(&entity(1)).unwrap(), "1 was passivated");
    for i in [0, 2, 3] {
        assert!(engine.passivate(&entity(i)).unwrap(), "{i} was resident");
    }
}

#[test]
fn r10_a_passivated_entity_restores_from_its_checkpoint_with_the_same_state() {
    let (_store, machine, engine, e) = one_entity(1, &["a", "b", "c"]);
    assert_eq!(engine.checkpoint(&e).unwrap(), 3);
    engine.append(&e, recs(&["d"])).unwrap();
    let before = engine.read(&e, |s| s.clone()).unwrap();
    machine.applied.lock().clear();
    assert!(engine.passivate(&e).unwrap());
    assert_eq!(engine.stats().passivation.resident, 0);
    assert_eq!(engine.stats().phases.pending, 1);
    assert_eq!(engine.read(&e, |s| s.clone()).unwrap(), before);
    // Restored from the checkpoint at 3: only record 4 was replayed.
    let applied = machine.applied.lock().clone();
    assert_eq!(applied, vec![(e.clone(), 4, Origin::Replay)]);
    assert_eq!(machine.units_of(&e), 2);
    let stats = engine.stats().passivation;
    // Passivated, its slot left the registry; the read made a fresh one.
    assert_eq!((stats.passivations, stats.retired, stats.slots), (1, 1, 1));
    // Writes continue after the head the restore read.
    engine.append(&e, recs(&["e"])).unwrap();
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        recs(&["a", "b", "c", "d", "e"])
    );
}

#[test]
fn r10_concurrent_touches_of_a_passivated_entity_share_one_unit() {
    const THREADS: usize = 16;
    let (_store, machine, engine, e) = one_entity(0, &["a", "b"]);
    assert!(engine.passivate(&e).unwrap());
    let handle: Arc<OnceLock<TestEngine>> = Arc::new(OnceLock::new());
    handle.set(engine.clone()).ok().unwrap();
    {
        let handle = Arc::clone(&handle);
        // Hold the reactivation until every other toucher is parked on the gate.
        machine.set_hook(move |_| {
            let engine = handle.get().unwrap();
            until(|| engine.stats().phases.waiting >= (THREADS - 1) as u64);
        });
    }
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let engine = engine.clone();
            let barrier = Arc::clone(&barrier);
            let e = e.clone();
            std::thread::spawn(move || {
                barrier.wait();
                payloads(&engine, &e).map_err(|e| e.to_string())
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().unwrap(), recs(&["a", "b"]));
    }
    // One unit for the first activation, one for the reactivation.
    assert_eq!(machine.units_of(&e), 2);
    assert_eq!(engine.stats().passivation.retired, 1);
}

#[test]
fn r10_an_unclean_restart_repair_does_not_run_again_on_reactivation() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["fix"]);
    let e = entity(1);
    crashed_with(&machine, &store, std::slice::from_ref(&e), &["x"]);
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["x", "fix"]));
    assert_eq!(machine.repairs.lock().len(), 1);
    for _ in 0..3 {
        assert!(engine.passivate(&e).unwrap());
        assert_eq!(payloads(&engine, &e).unwrap(), recs(&["x", "fix"]));
    }
    assert_eq!(machine.repairs.lock().len(), 1, "the repair ran again");
    // One unit in the first engine, one on first touch here, one per reactivation.
    assert_eq!(machine.units_of(&e), 5);
}

#[test]
fn r10_work_deferred_to_a_passivated_entity_is_applied_exactly_once() {
    let (_store, machine, engine, e) = one_entity(1, &["a"]);
    assert!(engine.passivate(&e).unwrap());
    for r in ["d1", "d2"] {
        let answer = engine.defer(&e, r.as_bytes().to_vec()).unwrap();
        assert_eq!(answer, portcullis::engine::Deferred::Queued);
    }
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "d1", "d2"]));
    let deferred = |m: &TestMachine| {
        m.applied
            .lock()
            .iter()
            .filter(|(_, _, o)| *o == Origin::Deferred)
            .count()
    };
    assert_eq!(deferred(&machine), 2);
    // Passivated again, the records come back from the log, not from the deferred rows.
    assert!(engine.passivate(&e).unwrap());
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "d1", "d2"]));
    assert_eq!(deferred(&machine), 2, "deferred work was applied twice");
}

#[test]
fn r10_a_contained_entity_is_not_passivated() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    // An entity whose written record `apply` refuses is contained; passivation must leave it so.
    let (engine, e) = contained(&machine, &store);
    assert!(!engine.passivate(&e).unwrap());
    assert!(engine.containment(&e).unwrap().is_some());
    let err = engine.read(&e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    assert_eq!(machine.units_of(&e), 1, "the unit ran again");
}

/// Negative control: with the phase check switched off, the same test finds the containment
/// erased.
#[test]
fn r10_negative_control_unguarded_passivation_erases_a_containment() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (engine, e) = contained(&machine, &store);
    engine.set_passivate_unguarded_for_test(true);
    let _ = engine.passivate(&e);
    assert!(
        engine.containment(&e).unwrap().is_none(),
        "the control did not erase the containment"
    );
}

#[test]
fn r10_an_entity_a_closure_holds_is_not_passivated() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .max_resident_entities(1)
        .open()
        .unwrap();
    let (a, b) = (entity(1), entity(2));
    for e in [&a, &b] {
        engine.register(e).unwrap();
        engine.append(e, recs(&["x"])).unwrap();
    }
    let inner = engine.clone();
    let a2 = a.clone();
    let answer = within("a passivation from inside a closure", move || {
        inner
            .read(&a2, |s| {
                let err = inner.passivate(&a2).unwrap_err();
                (s.records.len(), err)
            })
            .unwrap()
    });
    assert_eq!(answer.0, 1);
    assert!(
        matches!(answer.1, Error::Unavailable { .. }),
        "{}",
        answer.1
    );
    assert_eq!(
        machine.units_of(&a),
        2,
        "a was reactivated once by the read"
    );
}

/// Several threads append to and read a few entities while another passivates them at random
/// (and the budget passivates too). Every acknowledged write is in the state exactly once, in
/// order, and a read never sees less than what was acknowledged before it began.
#[test]
fn r10_passivation_racing_writes_and_reads_never_loses_a_write_or_serves_stale_state() {
    const ENTITIES: usize = 3;
    const WRITERS: usize = 2;
    const OPS: usize = 300;
    let seed: u64 = 0x5eed_0010;
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .max_resident_entities(2)
        .open()
        .unwrap();
    for i in 0..ENTITIES {
        engine.register(&entity(i)).unwrap();
    }
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..ENTITIES).map(|_| AtomicU64::new(0)).collect());
    let barrier = Arc::new(Barrier::new(WRITERS + 2));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (engine, acked, barrier) = (engine.clone(), Arc::clone(&acked), Arc::clone(&barrier));
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ w as u64);
            barrier.wait();
            for op in 0..OPS {
                let i = rng.below(ENTITIES as u64) as usize;
                let record = format!("w{w}-{op}").into_bytes();
                let seqs = engine.append(&entity(i), vec![record]).unwrap();
                acked[i].fetch_max(*seqs.end(), Ordering::SeqCst);
                assert!(Instant::now() < deadline, "bounded in time");
            }
        }));
    }
    {
        let (engine, acked, barrier) = (engine.clone(), Arc::clone(&acked), Arc::clone(&barrier));
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0xaaaa);
            barrier.wait();
            for _ in 0..OPS * 2 {
                let i = rng.below(ENTITIES as u64) as usize;
                let floor = acked[i].load(Ordering::SeqCst);
                let seqs: Vec<u64> = engine
                    .read(&entity(i), |s| s.records.iter().map(|(q, _)| *q).collect())
                    .unwrap();
                assert!(
                    seqs.len() as u64 >= floor,
                    "stale: {} records, {floor} acknowledged",
                    seqs.len()
                );
                assert!(seqs.iter().enumerate().all(|(n, q)| *q == n as u64 + 1));
            }
        }));
    }
    {
        let (engine, barrier) = (engine.clone(), Arc::clone(&barrier));
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0x5555);
            barrier.wait();
            for _ in 0..OPS * 2 {
                let i = rng.below(ENTITIES as u64) as usize;
                match engine.passivate(&entity(i)) {
                    Ok(_) | Err(Error::Unavailable { .. }) => {}
                    Err(e) => panic!("passivate: {e}"),
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let mut total = 0;
    for i in 0..ENTITIES {
        let records = engine.read(&entity(i), |s| s.records.clone()).unwrap();
        let n = acked[i].load(Ordering::SeqCst);
        assert_eq!(records.len() as u64, n, "entity {i}");
        // Exactly once: each write's record appears once.
        let mut names: Vec<_> = records.iter().map(|(_, r)| r.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len() as u64, n, "entity {i} folded a record twice");
        total += n;
    }
    assert_eq!(total, (WRITERS * OPS) as u64);
    let stats = engine.stats();
    let passivation = &stats.passivation;
    // Entities were passivated and restored again.
    assert!(
        passivation.passivations > 0 && stats.units_run > ENTITIES as u64,
        "{stats:?}"
    );
    // The resident count did not drift from the gates.
    assert_eq!(passivation.resident, stats.phases.restored, "{stats:?}");
}

/// Both budgets on an engine over the file store: states and partition indexes are dropped and
/// come back with the same answers.
#[test]
fn r10_an_engine_over_the_file_store_drops_idle_indexes_and_states() {
    let dir = tempfile::tempdir().unwrap();
    let machine = Arc::new(TestMachine::default());
    let engine = portcullis::Engine::builder(Arc::clone(&machine))
        .directory(dir.path())
        .pool_threads(2)
        .max_resident_entities(2)
        .max_loaded_partitions(2)
        .open()
        .unwrap();
    for i in 0..12 {
        engine.register(&entity(i)).unwrap();
        engine
            .append(&entity(i), vec![format!("r{i}").into_bytes()])
            .unwrap();
    }
    for i in 0..12 {
        let got = engine.read(&entity(i), |s| s.records.clone()).unwrap();
        assert_eq!(got, vec![(1, format!("r{i}").into_bytes())]);
    }
    let stats = engine.stats();
    assert!(stats.passivation.resident <= 2, "{stats:?}");
    assert!(stats.store.partitions_loaded <= 2, "{stats:?}");
    assert!(stats.store.indexes_dropped > 0, "{stats:?}");
    engine.close().unwrap();
}
