//! Taking a namespace over from its owner (SPEC F11, R3): a deposed owner stops serving at
//! once and answers `Fenced` from memory, `own` answers the current epoch or refuses a stale
//! holder, deferrals after a take-over are refused, a fenced restore is retryable, adoption on
//! first use never takes a namespace from another owner, and a take-over from a dead owner
//! repairs each entity once while a clean hand-over repairs none. `take_over` (SPEC F12) is
//! refused while the holder is live unless forced, needs no force once the holder's lease
//! expired, resumes without bumping again, and `owner_of` says who serves a namespace; `own`
//! adopts on the proof of completion a take-over held off by a declared recovery left.

mod common;

use std::sync::Arc;

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, entity, ns, owner_builder, payloads, recs,
    revoke_to_complete, taken_over,
};
use portcullis::engine::{OwnerSwitches, TakeOver};
use portcullis::fence::RevokeBudget;
use portcullis::store::{MemoryStore, Store};
use portcullis::{Error, ManualClock, Namespace};

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
// One safe call (SPEC F12): take_over, and the lookup routers use.

/// Two owners over a store on a manual clock, owner lease renewals off (the clock decides).
fn owners_on_a_clock() -> (
    ManualClock,
    Arc<TestStore>,
    Arc<TestMachine>,
    [TestEngine; 2],
) {
    let clock = ManualClock::new(1_000_000);
    let store = TestStore::with_clock(Arc::new(clock.clone()));
    let machine = Arc::new(TestMachine::default());
    let open = |owner: &str| {
        owner_builder(&machine, &store, owner)
            .renew_owner_lease(false)
            .open()
            .unwrap()
    };
    let (a, b) = (open("a"), open("b"));
    (clock, store, machine, [a, b])
}

fn take_over_from_a_live_holder(switches: OwnerSwitches) -> Result<u64, Error> {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let b = owner_builder(&machine, &store, "b")
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    let ns = ns();
    a.own(&ns).unwrap();
    a.register(&entity(1)).unwrap();
    b.take_over(&ns, TakeOver::new())
}

#[test]
fn f12_take_over_is_refused_while_the_holder_is_live_unless_forced() {
    let err = take_over_from_a_live_holder(OwnerSwitches::default()).unwrap_err();
    assert!(
        matches!(&err, Error::OwnerLive { owner, incarnation: 1, .. } if owner == "a"),
        "{err}"
    );
    assert!(err.to_string().contains("TakeOver::force"), "{err}");
    // Forced, it bumps, revokes and adopts; a's next write is fenced.
    let (store, machine) = (TestStore::new(), Arc::new(TestMachine::default()));
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    a.own(&ns()).unwrap();
    a.register(&entity(1)).unwrap();
    a.append(&entity(1), recs(&["a1"])).unwrap();
    assert!(
        b.take_over(&ns(), TakeOver::new()).is_err(),
        "nothing forced"
    );
    assert_eq!(
        b.current_epoch(&ns()).unwrap(),
        0,
        "a refused take-over bumps nothing"
    );
    assert_eq!(b.take_over(&ns(), TakeOver::new().force(true)).unwrap(), 1);
    assert_eq!(b.owed_repairs(&ns()).unwrap(), vec![1]);
    assert!(matches!(
        a.append(&entity(1), recs(&["late"])),
        Err(Error::Fenced { .. })
    ));
    assert_eq!(payloads(&b, &entity(1)).unwrap(), recs(&["a1"]));
}

#[test]
fn negative_control_a_take_over_that_ignores_a_live_holder_is_caught() {
    let switches = OwnerSwitches {
        take_over_ignores_liveness: true,
        ..OwnerSwitches::default()
    };
    assert_eq!(take_over_from_a_live_holder(switches).unwrap(), 1);
}

/// A holder whose process died (every call of its store view fails) stops renewing; once its
/// lease has expired, `take_over` needs no force and no operator, and each entity is repaired
/// once for the dead holder's term.
#[test]
fn f12_take_over_from_a_holder_whose_lease_expired_needs_no_force() {
    let clock = ManualClock::new(1_000_000);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let view = common::killable::Killable::over(&store);
    let open = |owner: &str, store: Arc<dyn Store>| {
        portcullis::Engine::builder(Arc::clone(&machine))
            .store(store)
            .owner(owner)
            .pool_threads(1)
            .open()
            .unwrap()
    };
    let a = open("a", Arc::clone(&view) as Arc<dyn Store>);
    for i in 0..3 {
        a.register(&entity(i)).unwrap();
        a.append(&entity(i), recs(&["a"])).unwrap();
    }
    view.kill();
    std::mem::forget(a);
    let b = open("b", Arc::clone(&store));
    let holder = b.owner_of(&ns()).unwrap().unwrap();
    assert!(holder.live && holder.serves(), "{holder:?}");
    assert!(matches!(
        b.take_over(&ns(), TakeOver::new()),
        Err(Error::OwnerLive { .. })
    ));
    clock.advance(10_000); // a's owner lease expires
    let holder = b.owner_of(&ns()).unwrap().unwrap();
    assert!(!holder.live && !holder.serves(), "{holder:?}");
    // a's entity leases (30 s) are still live: revocation pushes them.
    assert_eq!(b.take_over(&ns(), TakeOver::new()).unwrap(), 1);
    for i in 0..3 {
        assert_eq!(payloads(&b, &entity(i)).unwrap(), recs(&["a", "repaired"]));
    }
    assert_eq!(machine.repairs.lock().len(), 3);
    let holder = b.owner_of(&ns()).unwrap().unwrap();
    assert_eq!(
        (holder.owner.as_str(), holder.epoch, holder.current_epoch),
        ("b", 1, 1)
    );
    assert!(holder.serves());
}

/// A take-over whose revocation does not complete within its slices answers Unavailable;
/// called again it resumes where it stopped, without bumping again.
#[test]
fn f12_take_over_resumes_without_bumping_again() {
    let (_clock, _store, _machine, [a, b]) = owners_on_a_clock();
    a.own(&ns()).unwrap();
    for i in 0..12 {
        a.register(&entity(i)).unwrap();
    }
    let short = TakeOver::new()
        .force(true)
        .budget(RevokeBudget::default().with_max_pushes(1))
        .max_slices(2);
    let err = b.take_over(&ns(), short).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("call take_over again"), "{err}");
    assert_eq!(b.grant(&ns()), None);
    let mut calls = 1;
    let grant = loop {
        calls += 1;
        match b.take_over(&ns(), short) {
            Ok(grant) => break grant,
            Err(Error::Unavailable { .. }) if calls < 20 => {}
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        (grant, b.current_epoch(&ns()).unwrap()),
        (1, 1),
        "bumped once"
    );
}

/// A forced take-over held off by a declared recovery (SPEC F6) pushes to every lease and
/// leaves the checkpoint `Done`, but answers Unavailable while the hold-off lasts. `own` is
/// refused until the hold-off is over, and then adopts on that checkpoint, the proof of
/// completion (docs/fencing.md), with no slice run since; the old holder is fenced.
#[test]
fn f12_own_adopts_on_the_completion_proof_once_a_recovery_hold_off_ends() {
    let (clock, _store, _machine, [a, b]) = owners_on_a_clock();
    a.own(&ns()).unwrap();
    a.register(&entity(1)).unwrap();
    a.append(&entity(1), recs(&["a1"])).unwrap();
    a.mark_lease_table_recovered(&ns()).unwrap();
    let forced = TakeOver::new().force(true).max_slices(4);
    let err = b.take_over(&ns(), forced).unwrap_err();
    assert!(err.to_string().contains("still pending"), "{err}");
    let err = b.own(&ns()).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(err.to_string().contains("declared recovery"), "{err}");
    clock.advance(35_000); // the hold-off: epoch lease and margin after the marker
    let slices = b.fence().stats().slices;
    assert_eq!(b.own(&ns()).unwrap(), 1);
    assert_eq!(
        b.fence().stats().slices,
        slices,
        "adopted on the proof, no slice run"
    );
    assert!(matches!(
        a.append(&entity(1), recs(&["late"])),
        Err(Error::Fenced { .. })
    ));
    assert_eq!(payloads(&b, &entity(1)).unwrap(), recs(&["a1"]));
}

/// Nothing to take: an unowned or released namespace is adopted as `own` would, with no bump
/// and no repair; a namespace served unfenced cannot be taken over.
#[test]
fn f12_take_over_of_a_free_namespace_adopts_it_and_an_unfenced_one_is_refused() {
    let (_clock, _store, machine, [a, b]) = owners_on_a_clock();
    assert_eq!(b.owner_of(&ns()).unwrap(), None);
    assert_eq!(a.take_over(&ns(), TakeOver::new()).unwrap(), 0);
    a.register(&entity(1)).unwrap();
    a.release_namespace(&ns()).unwrap();
    let released = b.owner_of(&ns()).unwrap().unwrap();
    assert!(released.released && !released.serves(), "{released:?}");
    assert_eq!(b.take_over(&ns(), TakeOver::new()).unwrap(), 0, "no bump");
    assert!(b.owed_repairs(&ns()).unwrap().is_empty());
    payloads(&b, &entity(1)).unwrap();
    assert!(machine.repairs.lock().is_empty());
    let plain = Namespace::new("plain").unwrap();
    a.own_unfenced(&plain).unwrap();
    let err = b
        .take_over(&plain, TakeOver::new().force(true))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}
