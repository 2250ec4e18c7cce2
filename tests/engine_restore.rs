//! The restore unit through the engine: lazy open (R1), exactly once (R2), the unit's steps
//! (R3), deferred work (R8), unclean-restart repair, and checkpoint verification (L4).

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::engine::{TestMachine, TestStore, builder, crash, entity, payloads, recs};
use parking_lot::Mutex;
use portcullis::engine::Deferred;
use portcullis::log::{self, Checkpoint, keys};
use portcullis::restore::{Metrics, Origin, ReasonKind, UnitReport};
use portcullis::store::{Batch, Store};
use portcullis::{EntityId, Error, StateMachine};

#[derive(Default)]
struct Reports(Mutex<Vec<(EntityId, UnitReport)>>);

impl Metrics for Reports {
    fn entity_restored(&self, entity: &EntityId, report: &UnitReport) {
        self.0.lock().push((entity.clone(), report.clone()));
    }
}

#[test]
fn r1_open_reads_no_entity_and_serves_at_once() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    {
        let engine = builder(&machine, &store).open().unwrap();
        for i in 0..50 {
            engine.register(&entity(i)).unwrap();
            engine.append(&entity(i), recs(&["a", "b"])).unwrap();
        }
        engine.close().unwrap();
    }
    let machine = Arc::new(TestMachine::default());
    store.entity_reads.store(0, Ordering::SeqCst);
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(
        store.entity_reads.load(Ordering::SeqCst),
        0,
        "open read entity rows"
    );
    let stats = engine.stats();
    assert_eq!((stats.phases.entities, stats.phases.pending), (50, 50));
    assert_eq!(stats.units_run, 0);
    // Serving one entity restores that entity only.
    assert_eq!(payloads(&engine, &entity(7)).unwrap(), recs(&["a", "b"]));
    let stats = engine.stats();
    assert_eq!((stats.phases.restored, stats.phases.pending), (1, 49));
    assert_eq!(machine.units_of(&entity(7)), 1);
    assert_eq!(machine.units_of(&entity(8)), 0);
}

#[test]
fn r2_every_path_shares_one_unit() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    engine.read(&e, |_| ()).unwrap();
    engine.append(&e, recs(&["x"])).unwrap();
    engine.checkpoint(&e).unwrap();
    assert_eq!(
        engine.defer(&e, b"y".to_vec()).unwrap(),
        Deferred::Applied { seq: 2 }
    );
    engine.warm().unwrap().wait().unwrap();
    assert_eq!(machine.units_of(&e), 1);
    assert_eq!(engine.stats().units_run, 1);
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["x", "y"]));
}

#[test]
fn r3_restore_loads_the_checkpoint_and_replays_only_the_tail() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["1", "2", "3", "4", "5"])).unwrap();
        assert_eq!(engine.checkpoint(&e).unwrap(), 5);
        engine.append(&e, recs(&["6", "7", "8"])).unwrap();
        engine.close().unwrap();
    }
    let reports = Arc::new(Reports::default());
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&reports) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    let seqs = engine.read(&e, |s| {
        s.records.iter().map(|(q, _)| *q).collect::<Vec<_>>()
    });
    assert_eq!(seqs.unwrap(), (1..=8).collect::<Vec<u64>>());
    let reports = reports.0.lock();
    let report = &reports[0].1;
    assert_eq!(report.checkpoint_seq, Some(5));
    assert_eq!(report.replayed, 3);
    assert!(!report.checkpoint_published);
}

#[test]
fn r3_a_long_tail_publishes_an_owed_checkpoint() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        for i in 0..10 {
            engine.append(&e, vec![vec![i]]).unwrap();
        }
        engine.close().unwrap();
    }
    for expected_replay in [10, 0] {
        let reports = Arc::new(Reports::default());
        let engine = builder(&machine, &store)
            .checkpoint_tail_bound(4)
            .metrics(Arc::clone(&reports) as Arc<dyn Metrics>)
            .open()
            .unwrap();
        assert_eq!(payloads(&engine, &e).unwrap().len(), 10);
        let report = reports.0.lock()[0].1.clone();
        assert_eq!(report.replayed, expected_replay);
        assert_eq!(report.checkpoint_published, expected_replay > 4);
        engine.close().unwrap();
    }
}

#[test]
fn r3_code_inside_a_unit_can_touch_its_own_entity_without_deadlock() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let (a, b) = (entity(1), entity(2));
    engine.register(&a).unwrap();
    engine.register(&b).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let engine = engine.clone();
        let seen = Arc::clone(&seen);
        let (a, b) = (a.clone(), b.clone());
        machine.set_hook(move |e| {
            if *e == a {
                // Its own entity: answered at once. Another entity: restored inline.
                let own = engine.read(&a, |_| ()).map_err(|e| e.code());
                let other = engine.read(&b, |s| s.records.len()).map_err(|e| e.code());
                seen.lock().push((own, other));
            }
        });
    }
    engine.read(&a, |_| ()).unwrap();
    let seen = seen.lock();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].0,
        Err(13),
        "own entity answers WouldDeadlock at once"
    );
    assert_eq!(seen[0].1, Ok(0));
    assert_eq!(machine.units_of(&b), 1);
}

#[test]
fn r8_deferred_work_is_durable_when_accepted_and_applied_in_arrival_order() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["a"])).unwrap();
        engine.close().unwrap();
    }
    {
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(engine.defer(&e, b"d1".to_vec()).unwrap(), Deferred::Queued);
        assert_eq!(engine.defer(&e, b"d2".to_vec()).unwrap(), Deferred::Queued);
        // Bad input is refused and stores nothing.
        assert!(matches!(
            engine.defer(&e, b"!bad".to_vec()),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(
            engine.stats().phases.pending,
            1,
            "defer restored the entity"
        );
        assert_eq!(engine.stats().units_run, 0);
        // Crash: no clean close. The deferred rows are already durable.
        crash(engine);
    }
    {
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(engine.defer(&e, b"d3".to_vec()).unwrap(), Deferred::Queued);
        assert_eq!(
            payloads(&engine, &e).unwrap(),
            recs(&["a", "d1", "d2", "d3"])
        );
        let seqs = engine.read(&e, |s| {
            s.records.iter().map(|(q, _)| *q).collect::<Vec<_>>()
        });
        assert_eq!(seqs.unwrap(), vec![1, 2, 3, 4]);
        engine.close().unwrap();
    }
    // Applied exactly once: the rows moved into the log and are gone.
    let page = store.scan(
        &e.partition(),
        &portcullis::restore::keys::deferred_range(),
        None,
        10,
    );
    assert!(page.unwrap().entries.is_empty());
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        recs(&["a", "d1", "d2", "d3"])
    );
}

#[test]
fn r3_repair_runs_exactly_once_per_entity_and_unclean_incarnation() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let (a, b) = (entity(1), entity(2));
    {
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!((engine.incarnation(), engine.unclean_previous()), (1, None));
        engine.register(&a).unwrap();
        engine.register(&b).unwrap();
        engine.append(&a, recs(&["x"])).unwrap();
        crash(engine); // crash
    }
    assert!(
        machine.repairs.lock().is_empty(),
        "no repair after a clean start"
    );
    {
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(
            (engine.incarnation(), engine.unclean_previous()),
            (2, Some(1))
        );
        assert_eq!(payloads(&engine, &a).unwrap(), recs(&["x", "repaired"]));
        // The repair fails on b and contains it; nothing of it was appended.
        machine.panic_in_repair.store(true, Ordering::SeqCst);
        let err = engine.read(&b, |_| ()).unwrap_err();
        assert!(err.to_string().contains("panic"), "{err}");
        machine.panic_in_repair.store(false, Ordering::SeqCst);
        // Released, b's unit runs again and the repair with it; a's never reruns.
        assert!(engine.release(&b).unwrap());
        assert_eq!(payloads(&engine, &b).unwrap(), recs(&["repaired"]));
        crash(engine); // crash again, after both repairs committed
    }
    let repairs: Vec<(EntityId, u64)> = machine.repairs.lock().drain(..).collect();
    assert_eq!(
        repairs,
        vec![(a.clone(), 1), (b.clone(), 1), (b.clone(), 1)]
    );
    {
        // Incarnation 2 ended uncleanly too: one more repair each, for incarnation 2.
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(engine.unclean_previous(), Some(2));
        assert_eq!(
            payloads(&engine, &a).unwrap(),
            recs(&["x", "repaired", "repaired"])
        );
        assert_eq!(
            payloads(&engine, &b).unwrap(),
            recs(&["repaired", "repaired"])
        );
        engine.close().unwrap();
    }
    assert_eq!(
        machine.repairs.lock().drain(..).collect::<Vec<_>>(),
        vec![(a.clone(), 2), (b.clone(), 2)]
    );
    // After a clean close, no repair at all.
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(engine.unclean_previous(), None);
    engine.read(&a, |_| ()).unwrap();
    engine.read(&b, |_| ()).unwrap();
    assert!(machine.repairs.lock().is_empty());
}

#[test]
fn r3_repair_already_committed_is_not_rerun_when_the_unit_reruns() {
    // The repair batch commits, then the unit fails at its owed checkpoint (the application's
    // encoder panics): the entity is contained. Released, the unit reruns in the same
    // incarnation, replays the repair's record from the log, and must not repair again.
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["fix"]);
    let e = entity(1);
    crash({
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine
    });
    let engine = builder(&machine, &store).open().unwrap();
    machine.panic_in_encode.store(true, Ordering::SeqCst);
    let err = engine.read(&e, |_| ()).unwrap_err();
    assert!(
        err.to_string().contains("panic: during checkpoint encode"),
        "{err}"
    );
    machine.panic_in_encode.store(false, Ordering::SeqCst);
    assert!(engine.release(&e).unwrap());
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["fix"]));
    assert_eq!(machine.repairs.lock().len(), 1);
    assert_eq!(machine.units_of(&e), 2);
}

/// Two entities with records "a", "b", "c", and a checkpoint at 2 that the machine does not
/// decode; the store is closed so they reopen pending.
fn with_an_undecodable_checkpoint() -> (Arc<TestStore>, EntityId, EntityId) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (e, other) = (entity(1), entity(2));
    let engine = builder(&machine, &store).open().unwrap();
    for x in [&e, &other] {
        engine.register(x).unwrap();
        engine.append(x, recs(&["a", "b", "c"])).unwrap();
    }
    engine.close().unwrap();
    let p = e.partition();
    let head = log::read_head(&*store, &p).unwrap();
    // 12 bytes announcing a 100-byte record: TestMachine refuses to decode it.
    let junk = [&2u64.to_le_bytes()[..], &100u32.to_le_bytes()[..]].concat();
    log::write_checkpoint(&*store, &p, &head, 2, junk, Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    (store, e, other)
}

#[test]
fn e7_a_checkpoint_that_does_not_decode_falls_back_to_the_whole_history() {
    let (store, e, other) = with_an_undecodable_checkpoint();
    let machine = Arc::new(TestMachine::default());
    let reports = Arc::new(Reports::default());
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&reports) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    // Served, from every record of its history, not contained.
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        recs(&["a", "b", "c"]),
        "the entity is served from its whole history"
    );
    let report = reports.0.lock()[0].1.clone();
    assert_eq!(report.checkpoint_unreadable, Some(2));
    assert_eq!(report.checkpoint_seq, None);
    assert_eq!(report.replayed, 3);
    // It re-checkpointed in the encoding the machine reads, at its last record.
    assert!(report.checkpoint_published);
    let (head, checkpoint) = log::load_restore_point(&*store, &e.partition()).unwrap();
    assert_eq!(head.head.checkpoint.unwrap().seq, 3);
    assert_eq!(
        machine
            .decode_checkpoint(&e, &checkpoint.unwrap().state)
            .unwrap()
            .records
            .len(),
        3
    );
    assert_eq!(payloads(&engine, &other).unwrap().len(), 3);
    engine.close().unwrap();
    // The next restore starts from the new checkpoint and replays nothing.
    let reports = Arc::new(Reports::default());
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&reports) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    assert_eq!(payloads(&engine, &e).unwrap().len(), 3);
    let report = reports.0.lock()[0].1.clone();
    assert_eq!((report.checkpoint_seq, report.replayed), (Some(3), 0));
    assert_eq!(report.checkpoint_unreadable, None);
}

/// Negative control: with the fallback turned off, the same store contains the entity (the
/// behaviour before SPEC E7), so the test above depends on the fallback.
#[test]
fn e7_negative_control_without_the_fallback_an_undecodable_checkpoint_contains() {
    let (store, e, other) = with_an_undecodable_checkpoint();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    engine.set_checkpoint_fallback_off_for_test(true);
    let err = engine.read(&e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    assert!(
        err.to_string().contains("checkpoint at 2 does not decode"),
        "{err}"
    );
    assert_eq!(
        engine.containment(&e).unwrap().unwrap().kind,
        ReasonKind::Decode
    );
    assert_eq!(payloads(&engine, &other).unwrap().len(), 3);
}

#[test]
fn l4_a_checkpoint_that_does_not_match_its_history_is_contained() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (e, other) = (entity(1), entity(2));
    {
        let engine = builder(&machine, &store).open().unwrap();
        for x in [&e, &other] {
            engine.register(x).unwrap();
            engine.append(x, recs(&["a", "b", "c"])).unwrap();
            engine.checkpoint(x).unwrap();
        }
        engine.close().unwrap();
    }
    // Forge e's checkpoint: the right sequence number, a digest from another history.
    let p = e.partition();
    let mut head = log::read_head(&*store, &p).unwrap().head;
    let forged = Checkpoint {
        seq: 3,
        digest: 42,
        state: Vec::new(),
    };
    head.checkpoint = Some(forged.mark());
    let _ = store
        .apply(
            &p,
            &Batch::new()
                .put(keys::checkpoint_key(), forged.encode())
                .put(keys::head_key(), head.encode()),
        )
        .unwrap();
    let engine = builder(&machine, &store).open().unwrap();
    let err = engine.read(&e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    assert!(err.to_string().contains("corrupt-checkpoint"), "{err}");
    let reason = engine.containment(&e).unwrap().unwrap();
    assert_eq!(reason.kind, ReasonKind::CorruptCheckpoint);
    assert_eq!(payloads(&engine, &other).unwrap().len(), 3);
    // The off-lock audit agrees on the healthy entity...
    assert!(engine.verify_checkpoint(&other).unwrap());
    // ...and catches history rewritten under a restored entity's checkpoint.
    let q = other.partition();
    let mut row = store.get(&q, &keys::record_key(1)).unwrap().unwrap();
    *row.last_mut().unwrap() ^= 1;
    let _ = store
        .apply(&q, &Batch::new().put(keys::record_key(1), row))
        .unwrap();
    let err = engine.verify_checkpoint(&other).unwrap_err();
    assert!(err.to_string().contains("corrupt-checkpoint"), "{err}");
    assert_eq!(
        engine.read(&other, |_| ()).unwrap_err().to_string(),
        err.to_string()
    );
}

/// Where the units of a revocation's touches ran: runs revocation slices to `Complete` in an
/// engine serving the namespace of a pending entity with a lease, and answers the name of the
/// thread that restored it (the slice's own thread, or the engine's pool).
fn thread_of_a_revocation_touch(switches: portcullis::engine::OwnerSwitches) -> String {
    use portcullis::fence::{RevokeBudget, RevokeProgress};
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        // A fenced write takes a lease, so revocation will have to push to this entity.
        engine.append(&e, recs(&["a"])).unwrap();
        engine.close().unwrap();
    }
    assert_eq!(machine.units_of(&e), 1);
    // The background warm runs the restore a revocation push owes: on, for this test alone.
    let engine = builder(&machine, &store)
        .owner_switches_for_test(switches)
        .background_warm(true)
        .open()
        .unwrap();
    assert_eq!(machine.units_of(&e), 1, "open restores nothing");
    // Adopting the namespace owes it a warm, which restores the entity; passivated, it is
    // pending again when revocation pushes to it.
    engine.own(e.namespace()).unwrap();
    common::engine::until(|| machine.units_of(&e) == 2);
    common::engine::until(|| engine.passivate(&e).unwrap_or(false));
    let ran_on: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
    {
        let ran_on = Arc::clone(&ran_on);
        machine.set_hook(move |_| {
            let name = std::thread::current().name().unwrap_or("?").to_owned();
            ran_on.lock().push(name);
        });
    }
    engine.bump_epoch(e.namespace(), 1).unwrap();
    let mut steps = 0;
    while engine
        .revoke_step(e.namespace(), RevokeBudget::default())
        .unwrap()
        != RevokeProgress::Complete
    {
        steps += 1;
        assert!(steps < 100, "revocation did not complete");
    }
    common::engine::until(|| machine.units_of(&e) == 3);
    // Later touches share that unit.
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a"]));
    assert_eq!(machine.units_of(&e), 3);
    let ran_on = ran_on.lock().clone();
    assert_eq!(ran_on.len(), 1, "{ran_on:?}");
    ran_on[0].clone()
}

/// R2, F4: a revocation push is a touch: the pending entity of a namespace the engine serves is
/// restored (once), like on every other path, and on the engine's pool rather than inside the
/// slice, so a slice stays bounded (it neither runs a restore unit nor waits for one).
#[test]
fn r2_a_revocation_push_restores_the_entity_on_the_pool() {
    let ran_on = thread_of_a_revocation_touch(Default::default());
    assert!(ran_on.starts_with("portcullis-"), "{ran_on}");
}

/// The negative control: with the unit run inside the slice
/// (`OwnerSwitches::revocation_restores_inline`, as before), the slice's own thread restores
/// the entity.
#[test]
fn f4_negative_control_a_revocation_that_restores_inline_runs_the_unit_in_the_slice() {
    let switches = portcullis::engine::OwnerSwitches {
        revocation_restores_inline: true,
        ..Default::default()
    };
    let ran_on = thread_of_a_revocation_touch(switches);
    let me = std::thread::current().name().unwrap_or("?").to_owned();
    assert_eq!(ran_on, me);
}

/// R3: a repair owed after a crash is not lost when the next incarnation closes cleanly before
/// restoring every entity: the obligation is carried to the following holder of the namespace.
#[test]
fn r3_an_owed_repair_survives_a_clean_close_that_restored_nothing() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let (a, b) = (entity(1), entity(2));
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&a).unwrap();
        engine.register(&b).unwrap();
        engine.append(&a, recs(&["one"])).unwrap();
        crash(engine); // crash
    }
    {
        // Incarnation 2 repairs only b, then closes cleanly.
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(engine.unclean_previous(), Some(1));
        assert_eq!(payloads(&engine, &b).unwrap(), recs(&["repaired"]));
        engine.close().unwrap();
    }
    {
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(engine.unclean_previous(), None, "2 closed cleanly");
        assert_eq!(
            engine.owed_repairs(a.namespace()).unwrap(),
            vec![1],
            "the repair for term 1 is still owed"
        );
        assert_eq!(payloads(&engine, &a).unwrap(), recs(&["one", "repaired"]));
        assert_eq!(
            payloads(&engine, &b).unwrap(),
            recs(&["repaired"]),
            "b is not repaired twice"
        );
        engine.close().unwrap();
    }
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(
        engine.owed_repairs(a.namespace()).unwrap(),
        Vec::<u64>::new(),
        "every entity got its repair"
    );
    let repairs: Vec<(EntityId, u64)> = machine.repairs.lock().clone();
    assert_eq!(repairs, vec![(b.clone(), 1), (a.clone(), 1)]);
}

/// R3, R8: `apply` learns where a record comes from, so an application can suppress side
/// effects while history is only replayed.
#[test]
fn r3_apply_learns_whether_a_record_is_replayed_deferred_repaired_or_live() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["fix"]);
    let e = entity(1);
    let origins = |machine: &TestMachine| -> Vec<(u64, Origin)> {
        let mut applied = machine.applied.lock();
        let seen = applied
            .iter()
            .filter(|(x, _, _)| *x == e)
            .map(|(_, seq, origin)| (*seq, *origin))
            .collect();
        applied.clear();
        seen
    };
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["one"])).unwrap();
        crash(engine);
    }
    assert_eq!(origins(&machine), vec![(1, Origin::Live)]);
    {
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(
            engine.defer(&e, b"later".to_vec()).unwrap(),
            Deferred::Queued
        );
        assert_eq!(
            payloads(&engine, &e).unwrap(),
            recs(&["one", "later", "fix"])
        );
        assert_eq!(
            origins(&machine),
            vec![
                (1, Origin::Replay),
                (2, Origin::Deferred),
                (3, Origin::Repair)
            ]
        );
        assert_eq!(
            engine.defer(&e, b"now".to_vec()).unwrap(),
            Deferred::Applied { seq: 4 }
        );
        assert_eq!(origins(&machine), vec![(4, Origin::Live)]);
        engine.close().unwrap();
    }
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(payloads(&engine, &e).unwrap().len(), 4);
    assert!(
        origins(&machine).iter().all(|(_, o)| o.is_replay()),
        "a reopened entity only replays"
    );
}

/// Writes a lease, through the fence, for entity 5 of the test namespace, which is never
/// registered; answers what the engine then says of it: listed, read, its history,
/// registered.
fn lease_for_an_unregistered_entity(
    switches: portcullis::engine::OwnerSwitches,
) -> (bool, String, String, bool) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    let e = entity(5);
    let grant = engine.own(e.namespace()).unwrap();
    let written = engine
        .fence()
        .write(&e, grant, portcullis::store::Batch::new())
        .unwrap();
    assert!(matches!(
        written,
        portcullis::fence::WriteOutcome::Committed { .. }
    ));
    assert!(store.inner.contains_partition(&e.partition()).unwrap());
    let listed = engine.entities().unwrap().contains(&e);
    let read = format!("{:?}", payloads(&engine, &e));
    let history = format!("{:?}", engine.history(&e, 1).map(|h| h.count()));
    let registered = engine.register(&e).unwrap();
    if registered {
        assert_eq!(payloads(&engine, &e).unwrap(), Vec::<Vec<u8>>::new());
    }
    (listed, read, history, registered)
}

/// R1: a lease the fence writes into the partition of an entity never registered (a push or a
/// sweep on a row whose first batch never committed, or the application's own fenced write)
/// makes no entity: the registration marker, not the partition, says what is registered. It is
/// not listed, a read and `history` answer `UnknownEntity`, and `register` registers it.
/// Before, the partition was taken for a registered entity: listed, served fresh, its history
/// read, and `register` answered that it already was (writing no marker).
#[test]
fn r1_a_lease_for_an_unregistered_entity_makes_no_entity() {
    let (listed, read, history, registered) = lease_for_an_unregistered_entity(Default::default());
    assert!(!listed);
    assert!(read.contains("UnknownEntity"), "{read}");
    assert!(history.contains("UnknownEntity"), "{history}");
    assert!(registered);
}

/// The negative control: with any partition taken for an entity
/// (`OwnerSwitches::phantom_partitions_are_entities`), the lease makes a phantom one.
#[test]
fn r1_negative_control_a_partition_is_taken_for_an_entity() {
    let switches = portcullis::engine::OwnerSwitches {
        phantom_partitions_are_entities: true,
        ..Default::default()
    };
    let (listed, read, history, registered) = lease_for_an_unregistered_entity(switches);
    assert!(listed);
    assert!(read.starts_with("Ok"), "{read}");
    assert!(history.starts_with("Ok"), "{history}");
    assert!(!registered);
}
