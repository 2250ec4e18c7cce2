//! The engine as a fenced owner (SPEC F11, E4): every engine write commits under the grant of
//! the namespace's holding, engines share a store, and one clock serves engine, fence and
//! store. Taking a namespace over (a deposed owner, repairs on hand-over) is in
//! tests/engine_takeover.rs.

mod common;

use std::sync::Arc;

use common::engine::{TestMachine, TestStore, builder, entity, payloads, recs, taken_over};
use portcullis::engine::Deferred;
use portcullis::store::{Batch, MemoryStore, Partition, Precondition, Store};
use portcullis::{Error, ManualClock};

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
