//! The engine as a fenced owner (SPEC F11, E4): every engine write commits under the grant of
//! the namespace's holding, a deposed owner stops serving at once, engines share a store, and
//! one clock serves engine, fence and store.

mod common;

use std::sync::Arc;

use common::engine::{
    TestMachine, TestStore, builder, entity, owner_builder, payloads, recs, revoke_to_complete,
    taken_over,
};
use portcullis::engine::Deferred;
use portcullis::store::{Batch, MemoryStore, Partition, Precondition, Store};
use portcullis::{Error, ManualClock, Namespace};

const LEASE_KEY: &[u8] = b"\0fence.epoch.lease";

/// Every recorded entity batch carries the fence's lease guard and deadline (SPEC F3): it was
/// committed through the fence. Returns how many there were.
fn assert_all_fenced(batches: &[(Partition, Batch)], what: &str) -> usize {
    assert!(!batches.is_empty(), "{what}: no entity batch was written");
    for (p, batch) in batches {
        let lease_guard = batch.guards().iter().any(|g| match g {
            Precondition::Equals(k, _) | Precondition::Absent(k) => k.as_slice() == LEASE_KEY,
            _ => false,
        });
        let deadline = batch
            .guards()
            .iter()
            .any(|g| matches!(g, Precondition::NotAfter(_)));
        assert!(
            lease_guard && deadline,
            "{what}: a batch on {p} was written without the fence's lease guard and deadline"
        );
    }
    batches.len()
}

/// Runs `op` while recording entity batches, and checks every one was fenced.
fn fenced_during(store: &TestStore, what: &str, op: impl FnOnce()) {
    store.record_entity_batches();
    op();
    assert_all_fenced(&store.take_entity_batches(), what);
    *store.entity_batches.lock() = None;
}

// ---------------------------------------------------------------------------------------------
// Every kind of engine write goes through the fence (SPEC F11). Before F11 only application
// writes did: registration markers, deferred rows and their drain, repair records, owed and
// explicit checkpoints and truncation were written with no lease guard.

#[test]
fn f11_registration_marker_is_fenced() {
    let store = TestStore::new();
    let engine = builder(&Arc::new(TestMachine::default()), &store)
        .open()
        .unwrap();
    fenced_during(&store, "register", || {
        assert!(engine.register(&entity(1)).unwrap());
    });
}

#[test]
fn f11_application_write_is_fenced() {
    let store = TestStore::new();
    let engine = builder(&Arc::new(TestMachine::default()), &store)
        .open()
        .unwrap();
    engine.register(&entity(1)).unwrap();
    fenced_during(&store, "append", || {
        engine.append(&entity(1), recs(&["a"])).unwrap();
    });
}

#[test]
fn f11_deferred_row_and_its_drain_are_fenced() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    fenced_during(&store, "defer to a pending entity", || {
        assert_eq!(engine.defer(&e, b"d".to_vec()).unwrap(), Deferred::Queued);
    });
    fenced_during(&store, "the restore unit's drain of deferred rows", || {
        assert_eq!(payloads(&engine, &e).unwrap(), recs(&["d"]));
    });
    fenced_during(&store, "defer to a restored entity", || {
        assert!(matches!(
            engine.defer(&e, b"d2".to_vec()).unwrap(),
            Deferred::Applied { seq: 2 }
        ));
    });
}

#[test]
fn f11_repair_records_are_fenced() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["a"])).unwrap();
        common::engine::crash(engine); // no clean close: the namespace is never released
    }
    let engine = builder(&machine, &store).open().unwrap();
    fenced_during(&store, "repair", || {
        assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "repaired"]));
    });
}

#[test]
fn f11_owed_checkpoint_is_fenced() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["a", "b", "c"])).unwrap();
        engine.close().unwrap();
    }
    let engine = builder(&machine, &store)
        .checkpoint_tail_bound(1)
        .open()
        .unwrap();
    fenced_during(&store, "owed checkpoint", || {
        payloads(&engine, &e).unwrap();
    });
    let head = portcullis::log::read_head(&*store, &e.partition()).unwrap();
    assert_eq!(head.head.checkpoint.map(|c| c.seq), Some(3));
}

#[test]
fn f11_checkpoint_and_truncation_are_fenced() {
    let store = TestStore::new();
    let engine = builder(&Arc::new(TestMachine::default()), &store)
        .truncate_after_checkpoint(true)
        .open()
        .unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a", "b"])).unwrap();
    store.record_entity_batches();
    assert_eq!(engine.checkpoint(&e).unwrap(), 2);
    let batches = store.take_entity_batches();
    assert_eq!(
        assert_all_fenced(&batches, "checkpoint and truncation"),
        2,
        "one checkpoint batch, one truncation batch"
    );
    let head = portcullis::log::read_head(&*store, &e.partition()).unwrap();
    assert_eq!(head.head.first_seq, 3, "truncated");
}

// ---------------------------------------------------------------------------------------------
// Hand-over: a deposed owner stops serving at once, and a fenced restore is retryable.

#[test]
fn f11_a_deposed_owner_is_refused_and_then_answers_fenced_without_store_calls() {
    let (store, _machine, a, b) = taken_over();
    let (e, ns) = (entity(1), entity(1).namespace().clone());
    // a still holds grant 0 in memory; its next write learns it is stale.
    let err = a.append(&e, recs(&["stale"])).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Fenced {
                grant: 0,
                current: 1
            }
        ),
        "{err}"
    );
    assert_eq!(a.grant(&ns), None, "a stopped serving the namespace");
    // Every later call for the namespace answers Fenced from memory.
    let calls = store.calls();
    for result in [
        a.read(&e, |_| ()).map(|_| ()),
        a.append(&e, recs(&["x"])).map(|_| ()),
        a.defer(&entity(2), b"x".to_vec()).map(|_| ()),
        a.register(&entity(3)).map(|_| ()),
        a.checkpoint(&e).map(|_| ()),
    ] {
        assert!(matches!(result, Err(Error::Fenced { .. })), "{result:?}");
    }
    assert_eq!(store.calls(), calls, "a deposed owner makes no store call");
    // The new owner serves the entity with nothing lost and nothing contained.
    b.append(&e, recs(&["b1"])).unwrap();
    assert_eq!(payloads(&b, &e).unwrap(), recs(&["a1", "b1"]));
    assert_eq!(b.stats().phases.contained, 0);
    assert_eq!(a.stats().phases.contained, 0);
}

/// `own` answers the namespace's current epoch (SPEC F11, docs/fencing.md "Holding"): called
/// by the holder after a bump of its own namespace (no write has met the new epoch yet), it
/// adopts the namespace again at that epoch, and the next write commits instead of meeting
/// `Fenced`. Before, it returned the stale grant 0.
#[test]
fn f11_own_after_a_bump_adopts_the_current_epoch_not_the_stale_grant() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let (e, ns) = (entity(1), entity(1).namespace().clone());
    assert_eq!(a.own(&ns).unwrap(), 0);
    a.register(&e).unwrap();
    a.append(&e, recs(&["a1"])).unwrap();
    // Asked again with nothing bumped: the same holding, no re-adoption.
    assert_eq!(a.own(&ns).unwrap(), 0);
    assert_eq!(machine.units_of(&e), 1);
    a.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&a, &ns);
    assert_eq!(a.own(&ns).unwrap(), 1);
    assert_eq!(a.grant(&ns), Some(1));
    a.append(&e, recs(&["a2"])).unwrap();
    assert_eq!(payloads(&a, &e).unwrap(), recs(&["a1", "a2"]));
    // Adopted again, the entity restored afresh under the new holding.
    assert_eq!(machine.units_of(&e), 2);
}

/// A holder whose namespace another owner took over (bump, revoke, own) and that has not
/// written since is stale: its `own` is refused with `NotServed`, as for any owner while
/// another holds the namespace at the current epoch, and it stops serving the namespace.
/// Before, `own` answered the stale grant 0 as if it still held it.
#[test]
fn f11_own_by_a_holder_another_owner_took_over_is_not_served() {
    let (_store, _machine, a, b) = taken_over();
    let (e, ns) = (entity(1), entity(1).namespace().clone());
    let err = a.own(&ns).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(err.to_string().contains("\"b\""), "{err}");
    assert_eq!(a.grant(&ns), None, "a stopped serving the namespace");
    let err = a.append(&e, recs(&["stale"])).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Fenced {
                grant: 0,
                current: 1
            }
        ),
        "{err}"
    );
    b.append(&e, recs(&["b1"])).unwrap();
    assert_eq!(payloads(&b, &e).unwrap(), recs(&["a1", "b1"]));
}

#[test]
fn f11_defer_after_bump_and_complete_is_refused() {
    // Before F11 a caller of the old owner could still inject records through `defer` after
    // the namespace was bumped and revoked to Complete, and the next touch applied them.
    let (store, machine, a, b) = taken_over();
    let pending = entity(2);
    let head = || portcullis::log::read_head(&*store, &pending.partition()).unwrap();
    let before = head();
    let err = a.defer(&pending, b"injected".to_vec()).unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert_eq!(head(), before);
    let deferred_rows = store
        .scan(
            &pending.partition(),
            &portcullis::restore::keys::deferred_range(),
            None,
            10,
        )
        .unwrap();
    assert!(
        deferred_rows.entries.is_empty(),
        "no deferred row was stored"
    );
    // The new owner's first touch finds nothing injected.
    assert_eq!(payloads(&b, &pending).unwrap(), Vec::<Vec<u8>>::new());
    drop(machine);
}

#[test]
fn f11_defer_to_a_restored_entity_after_a_take_over_is_refused() {
    let (_store, _machine, a, b) = taken_over();
    let e = entity(1);
    let err = a.defer(&e, b"late".to_vec()).unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert_eq!(payloads(&b, &e).unwrap(), recs(&["a1"]));
}

#[test]
fn f11_a_fenced_restore_is_retryable_not_contained() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    let e = entity(1);
    let ns = e.namespace().clone();
    a.own(&ns).unwrap();
    a.register(&e).unwrap();
    // Deferred work makes a's restore unit write (the drain).
    a.defer(&e, b"d".to_vec()).unwrap();
    b.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&b, &ns);
    // a's restore meets the new epoch at its first write: refused, not contained.
    let err = a.read(&e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert!(a.containment(&e).unwrap().is_none());
    assert_eq!(a.stats().phases.contained, 0);
    // Once b releases it and a adopts it again, the same restore runs to the end.
    b.own(&ns).unwrap();
    b.release_namespace(&ns).unwrap();
    assert_eq!(a.own(&ns).unwrap(), 1);
    assert_eq!(payloads(&a, &e).unwrap(), recs(&["d"]));
}

#[test]
fn f11_adoption_on_first_use_never_takes_a_namespace_from_another_owner() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = builder(&machine, &store).owner("a").open().unwrap();
    let b = builder(&machine, &store).owner("b").open().unwrap();
    let e = entity(1);
    a.register(&e).unwrap();
    a.append(&e, recs(&["a1"])).unwrap();
    assert_eq!(a.grant(e.namespace()), Some(0), "adopted on first use");
    let err = b.read(&e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(err.to_string().contains("\"a\""), "{err}");
    // a keeps serving it.
    a.append(&e, recs(&["a2"])).unwrap();
}

#[test]
fn f11_an_engine_that_does_not_adopt_on_first_use_serves_only_what_it_owns() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let ns = Namespace::new("test").unwrap();
    let engine = owner_builder(&machine, &store, "a").open().unwrap();
    let err = engine.register(&entity(1)).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert_eq!(err.code(), 15);
    let engine2 = owner_builder(&machine, &store, "b")
        .own(ns.clone())
        .open()
        .unwrap();
    assert_eq!(engine2.grant(&ns), Some(0));
    assert!(engine2.register(&entity(1)).unwrap());
}

// ---------------------------------------------------------------------------------------------
// Engines sharing one store (SPEC F11).

#[test]
fn f11_two_engines_over_one_store_see_no_false_crash_and_close_independently() {
    // Before F11 the second engine took the first one's open incarnation for a crash (and
    // repaired entities the first was still writing), and the first engine's close closed the
    // store under the second.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let open = |owner: &str| {
        portcullis::Engine::builder(Arc::clone(&machine))
            .store(Arc::clone(&store))
            .owner(owner)
            .pool_threads(1)
            .open()
            .unwrap()
    };
    let a = open("a");
    let b = open("b");
    assert_eq!((a.unclean_previous(), b.unclean_previous()), (None, None));
    let (ea, eb) = (
        portcullis::EntityId::new("left", "x").unwrap(),
        portcullis::EntityId::new("right", "y").unwrap(),
    );
    a.register(&ea).unwrap();
    b.register(&eb).unwrap();
    a.append(&ea, recs(&["a"])).unwrap();
    b.append(&eb, recs(&["b"])).unwrap();
    a.close().unwrap();
    // b keeps working over the same store.
    b.append(&eb, recs(&["b2"])).unwrap();
    assert_eq!(
        b.read(&eb, |s| s.records.len()).unwrap(),
        2,
        "b still serves"
    );
    assert!(machine.repairs.lock().is_empty(), "nobody was repaired");
    // a third engine, and a reopened a, find no crash either.
    let a2 = open("a");
    assert_eq!(a2.unclean_previous(), None);
    assert_eq!(
        a2.read(&ea, |s| s.records.len()).unwrap(),
        1,
        "a's entity is intact"
    );
    assert!(machine.repairs.lock().is_empty());
    b.close().unwrap();
    a2.close().unwrap();
    // The store belongs to its opener: still open.
    assert!(store.get(&ea.partition(), b"k").is_ok());
}

#[test]
fn f11_owner_ids_have_their_own_incarnations() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = builder(&machine, &store).owner("a").open().unwrap();
    let b = builder(&machine, &store).owner("b").open().unwrap();
    assert_eq!((a.incarnation(), b.incarnation()), (1, 1));
    a.close().unwrap();
    let again = builder(&machine, &store).owner("a").open().unwrap();
    assert_eq!((again.incarnation(), again.unclean_previous()), (2, None));
    assert_eq!(b.owner(), "b");
    let bad = builder(&machine, &store).owner("Not Valid").open();
    assert!(matches!(bad.err(), Some(Error::InvalidArgument(_))));
}

// ---------------------------------------------------------------------------------------------
// One clock (SPEC E4).

#[test]
fn e4_a_clock_other_than_the_stores_is_refused() {
    let machine = Arc::new(TestMachine::default());
    // The store runs on the system clock; a manual clock far from it is refused.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let err = portcullis::Engine::builder(Arc::clone(&machine))
        .store(Arc::clone(&store))
        .clock(Arc::new(ManualClock::new(1_000)))
        .open()
        .expect_err("a mismatched clock must be refused");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("one clock"), "{err}");
    // The same clock for both is accepted, and the engine (and fence) follow it.
    let clock = ManualClock::new(1_000);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let engine = portcullis::Engine::builder(Arc::clone(&machine))
        .store(Arc::clone(&store))
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    clock.advance(500);
    assert_eq!(engine.now_ms(), 1_500);
    // Without a clock, the engine takes the store's.
    let engine = portcullis::Engine::builder(Arc::clone(&machine))
        .store(store)
        .owner("other")
        .open()
        .unwrap();
    assert_eq!(engine.now_ms(), 1_500);
}

#[test]
fn e4_with_a_directory_the_store_runs_on_the_engines_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(5_000);
    let engine = portcullis::Engine::builder(Arc::new(TestMachine::default()))
        .directory(dir.path())
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    // Leases expire on the one clock: far past the lease, writes still renew and commit (with
    // a store on its own clock, deadlines would all have passed or never fire).
    engine.append(&e, recs(&["a"])).unwrap();
    clock.advance(10 * 60_000);
    engine.append(&e, recs(&["b"])).unwrap();
    assert_eq!(engine.now_ms(), 5_000 + 10 * 60_000);
    engine.close().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Repairs on hand-over (SPEC R3, F11, issue 10 item 4).

#[test]
fn f11_take_over_from_a_dead_owner_repairs_each_entity_once_and_a_clean_hand_over_none() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let ns = entity(1).namespace().clone();
    // A serves and dies (no close: the namespace is never released).
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    a.own(&ns).unwrap();
    for i in 0..3 {
        a.register(&entity(i)).unwrap();
        a.append(&entity(i), recs(&["a"])).unwrap();
    }
    common::engine::crash(a);
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    // Before F11 the second engine saw the first one's incarnation as its own crash; now B's
    // own incarnation is clean and the repair is owed to the namespace.
    assert_eq!(b.unclean_previous(), None);
    b.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&b, &ns);
    b.own(&ns).unwrap();
    assert_eq!(b.owed_repairs(&ns).unwrap(), vec![1]);
    for i in 0..3 {
        assert_eq!(payloads(&b, &entity(i)).unwrap(), recs(&["a", "repaired"]));
        // Touched again: not repaired again.
        assert_eq!(payloads(&b, &entity(i)).unwrap(), recs(&["a", "repaired"]));
    }
    assert_eq!(machine.repairs.lock().len(), 3, "exactly once per entity");
    // A clean hand-over: B releases, C adopts: nothing is repaired.
    b.release_namespace(&ns).unwrap();
    let c = owner_builder(&machine, &store, "c").open().unwrap();
    c.own(&ns).unwrap();
    assert!(c.owed_repairs(&ns).unwrap().is_empty());
    for i in 0..3 {
        assert_eq!(payloads(&c, &entity(i)).unwrap(), recs(&["a", "repaired"]));
    }
    assert_eq!(
        machine.repairs.lock().len(),
        3,
        "a clean hand-over repairs nothing"
    );
}

#[test]
fn r3_two_owed_repairs_run_once_each_with_their_own_labels() {
    // Incarnation 2 crashes while still owing incarnation 1's repair: before this change the
    // next incarnation ran only the repair for 2, so entities never repaired for 1 lost it.
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["r"]);
    let (a, b) = (entity(1), entity(2));
    let ns = a.namespace().clone();
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&a).unwrap();
        engine.register(&b).unwrap();
        common::engine::crash(engine);
    }
    {
        // Term 2 repairs only b for term 1, then crashes too.
        let engine = builder(&machine, &store).open().unwrap();
        assert_eq!(engine.owed_repairs(&ns).unwrap(), vec![1]);
        payloads(&engine, &b).unwrap();
        common::engine::crash(engine);
    }
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(engine.owed_repairs(&ns).unwrap(), vec![1, 2]);
    payloads(&engine, &a).unwrap();
    payloads(&engine, &b).unwrap();
    let mut repairs = machine.repairs.lock().clone();
    repairs.sort();
    assert_eq!(
        repairs,
        vec![
            (a.clone(), 1),
            (a.clone(), 2),
            (b.clone(), 1),
            (b.clone(), 2)
        ],
        "each owed repair ran once per entity, with its own label"
    );
}

#[test]
fn r3_a_listing_error_at_close_keeps_the_owed_repair() {
    // Before this change `phase_counts` turned a listing error into 0 entities, so close
    // decided every entity was restored and dropped the owed repair.
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (a, b) = (entity(1), entity(2));
    let ns = a.namespace().clone();
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&a).unwrap();
        engine.register(&b).unwrap();
        common::engine::crash(engine);
    }
    {
        let engine = builder(&machine, &store).open().unwrap();
        payloads(&engine, &a).unwrap(); // b is not restored
        store
            .fail_lists
            .store(true, std::sync::atomic::Ordering::SeqCst);
        engine.close().unwrap();
        store
            .fail_lists
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(engine.owed_repairs(&ns).unwrap(), vec![1]);
    payloads(&engine, &b).unwrap();
    assert!(machine.repairs.lock().contains(&(b.clone(), 1)));
}

// ---------------------------------------------------------------------------------------------
// Idempotent deferral (issue 10 item 3).

#[test]
fn r8_a_retried_deferral_after_an_ambiguous_failure_is_not_doubled() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    // The deferral commits, then the call fails (its answer is lost): the caller cannot tell.
    store.set_after_apply(|p, _| {
        if p.as_bytes().starts_with(b"e/") {
            panic!("the answer was lost after the commit");
        }
    });
    let lost = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine.defer_once(&e, b"req-1", b"pay".to_vec())
    }));
    assert!(lost.is_err());
    store.clear_hooks();
    // The retry learns the record is durable, and writes nothing.
    assert_eq!(
        engine.defer_once(&e, b"req-1", b"pay".to_vec()).unwrap(),
        Deferred::AlreadyAccepted
    );
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["pay"]));
    // Restored now: a retry still writes nothing; a new id appends.
    assert_eq!(
        engine.defer_once(&e, b"req-1", b"pay".to_vec()).unwrap(),
        Deferred::AlreadyAccepted
    );
    assert!(matches!(
        engine.defer_once(&e, b"req-2", b"pay".to_vec()).unwrap(),
        Deferred::Applied { seq: 2 }
    ));
    assert_eq!(
        engine.defer_once(&e, b"req-2", b"pay".to_vec()).unwrap(),
        Deferred::AlreadyAccepted
    );
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["pay", "pay"]));
    // Negative control: the plain `defer`, retried, doubles the work.
    engine.defer(&e, b"x".to_vec()).unwrap();
    engine.defer(&e, b"x".to_vec()).unwrap();
    assert_eq!(payloads(&engine, &e).unwrap().len(), 4);
    assert!(engine.defer_once(&e, b"", b"x".to_vec()).is_err());
}

// ---------------------------------------------------------------------------------------------
// Negative control (feature `test-hooks`): with the engine's entity writes sent around the
// fence, as before SPEC F11, the checks above catch it.

#[cfg(feature = "test-hooks")]
#[test]
fn negative_control_engine_writes_around_the_fence_are_caught() {
    let (store, _machine, a, b) = taken_over();
    a.set_bypass_fence_for_test(true);
    // The stale owner injects deferred work after Complete: the bug F11 fixes.
    assert_eq!(
        a.defer(&entity(2), b"injected".to_vec()).unwrap(),
        Deferred::Queued
    );
    assert_eq!(payloads(&b, &entity(2)).unwrap(), recs(&["injected"]));
    // And its batches carry no lease guard.
    store.record_entity_batches();
    a.register(&entity(9)).unwrap();
    let batches = store.take_entity_batches();
    let caught = std::panic::catch_unwind(|| assert_all_fenced(&batches, "bypassed"));
    assert!(
        caught.is_err(),
        "the fencing check must catch an unguarded batch"
    );
}
