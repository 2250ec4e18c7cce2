//! Owner liveness and prompt deposition (SPEC F12): an engine's incarnation is live while it
//! renews the lease on its owner row; an engine with the owner id of a live one is refused at
//! open (never taking it for a crash), whatever the owner id (the default one too); a crashed
//! owner's lease expires and it is then taken over as a crash, repair owed, with no operator;
//! an engine that let its lease expire and was replaced serves nothing; a deposed owner stops
//! serving reads within `owner_lease - lease_margin` of the bump. Time is a manual clock, except
//! where the background renewer (real time) is the subject: there the tests wait for states the
//! engine reports. Nothing sleeps.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{
    TestMachine, TestStore, entity, ns, payloads, recs, revoke_to_complete, until,
};
use common::killable::Killable;
use portcullis::engine::{Engine, EngineBuilder, OwnerSwitches};
use portcullis::fence::FenceConfig;
use portcullis::store::{FileStore, MemoryStore, Store, SyncPolicy};
use portcullis::{Clock, Error, ManualClock};

type Eng = Engine<Arc<TestMachine>>;

/// The default owner lease and fence margin, in ms.
const LEASE_MS: u64 = 10_000;
const MARGIN_MS: u64 = 5_000;

fn engine_over(
    machine: &Arc<TestMachine>,
    store: Arc<dyn Store>,
) -> EngineBuilder<Arc<TestMachine>> {
    Engine::builder(Arc::clone(machine))
        .store(store)
        .pool_threads(1)
        .warm_parallelism(1)
}

/// A file store on a manual clock, and the clock.
fn file_store() -> (tempfile::TempDir, Arc<dyn Store>, ManualClock) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let store = FileStore::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .open()
        .unwrap();
    (dir, Arc::new(store), clock)
}

fn assert_owner_live(err: &Error, incarnation: u64) {
    assert!(
        matches!(err, Error::OwnerLive { incarnation: i, .. } if *i == incarnation),
        "{err}"
    );
    assert_eq!(err.code(), 18);
}

// ---------------------------------------------------------------------------------------------
// One live incarnation per owner id.

/// Two engines with the default owner id over one file store, on two threads: before F12 the
/// second took the first one's open incarnation for a crash and took its namespaces at the same
/// epoch, so the first one's next write found its log moved.
fn second_engine_with_the_same_owner_id(switches: OwnerSwitches) -> Result<(), String> {
    let (_dir, store, _clock) = file_store();
    let machine = Arc::new(TestMachine::default());
    let a = engine_over(&machine, Arc::clone(&store)).open().unwrap();
    a.register(&entity(1)).unwrap();
    a.append(&entity(1), recs(&["a1"])).unwrap();
    let (machine2, store2) = (Arc::clone(&machine), Arc::clone(&store));
    let second = std::thread::spawn(move || {
        engine_over(&machine2, store2)
            .owner_switches_for_test(switches)
            .open()
    })
    .join()
    .unwrap();
    let err = match second {
        Ok(b) => {
            let _ = b.read(&entity(1), |_| ());
            b.crash_for_test();
            std::mem::forget(b);
            return Err("the second engine with a live owner id opened".into());
        }
        Err(err) => err,
    };
    assert_owner_live(&err, 1);
    let message = err.to_string();
    assert!(
        message.contains("\"default\"") && message.contains("close it"),
        "{message}"
    );
    // The first engine was not disturbed; once it closes, the owner id is free at once.
    a.append(&entity(1), recs(&["a2"])).unwrap();
    a.close().unwrap();
    let b = engine_over(&machine, store).open().unwrap();
    assert_eq!((b.incarnation(), b.unclean_previous()), (2, None));
    assert_eq!(payloads(&b, &entity(1)).unwrap(), recs(&["a1", "a2"]));
    assert!(machine.repairs.lock().is_empty(), "no crash was assumed");
    Ok(())
}

#[test]
fn f12_a_second_engine_with_a_live_owner_id_is_refused_at_open() {
    second_engine_with_the_same_owner_id(OwnerSwitches::default()).unwrap();
}

#[test]
fn negative_control_an_open_that_ignores_the_live_incarnation_is_caught() {
    let switches = OwnerSwitches {
        ignore_live_incarnation: true,
        ..OwnerSwitches::default()
    };
    assert!(second_engine_with_the_same_owner_id(switches).is_err());
}

/// A crashed owner (its process gone: every call of its store view fails, so nothing renews
/// its lease) is refused as live until its lease expires, and is then taken for crashed with
/// no operator: the next engine with its owner id opens and repairs each entity once.
#[test]
fn f12_a_crashed_owners_lease_expires_and_its_restart_repairs_once() {
    let (_dir, store, clock) = file_store();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let view = Killable::over(&store);
    let a = engine_over(&machine, Arc::clone(&view) as Arc<dyn Store>)
        .open()
        .unwrap();
    for i in 0..3 {
        a.register(&entity(i)).unwrap();
        a.append(&entity(i), recs(&["a"])).unwrap();
    }
    view.kill(); // the process dies mid-flight
    std::mem::forget(a);
    let reopen = || engine_over(&machine, Arc::clone(&store)).open();
    clock.advance(LEASE_MS - 1);
    assert_owner_live(&reopen().unwrap_err(), 1);
    clock.advance(1);
    let b = reopen().unwrap();
    assert_eq!((b.incarnation(), b.unclean_previous()), (2, Some(1)));
    assert_eq!(b.owed_repairs(&ns()).unwrap(), vec![1]);
    for i in 0..3 {
        assert_eq!(payloads(&b, &entity(i)).unwrap(), recs(&["a", "repaired"]));
    }
    assert_eq!(machine.repairs.lock().len(), 3, "once per entity");
}

/// An engine that let its lease expire (idle, renewals off) and was replaced by a newer engine
/// with its owner id (which took it for crashed) serves nothing any more, even a namespace the
/// newer one has not touched yet: its renewal finds the incarnation row replaced.
fn superseded(switches: OwnerSwitches) -> Result<(), String> {
    let clock = ManualClock::new(1_000_000);
    let store = TestStore::with_clock(Arc::new(clock.clone()));
    let machine = Arc::new(TestMachine::default());
    let open = |switches| {
        engine_over(&machine, Arc::clone(&store) as Arc<dyn Store>)
            .renew_owner_lease(false)
            .owner_switches_for_test(switches)
            .open()
    };
    let old = open(switches).unwrap();
    old.register(&entity(1)).unwrap();
    old.append(&entity(1), recs(&["old"])).unwrap();
    clock.advance(LEASE_MS);
    let new = open(OwnerSwitches::default()).unwrap();
    assert_eq!(new.unclean_previous(), Some(1));
    match old.read(&entity(1), |_| ()) {
        Err(err) => {
            assert_owner_live(&err, 2);
            assert!(err.to_string().contains("close it"), "{err}");
        }
        Ok(()) => return Err("the superseded engine served a read".into()),
    }
    assert!(old.grant(&ns()).is_none());
    assert!(matches!(
        old.renew_owner_lease(),
        Err(Error::OwnerLive { .. })
    ));
    // The newer engine serves the namespace (a restart after a crash: one repair).
    assert_eq!(payloads(&new, &entity(1)).unwrap(), recs(&["old"]));
    assert_eq!(machine.repairs.lock().len(), 1);
    Ok(())
}

#[test]
fn f12_an_engine_replaced_after_its_lease_expired_serves_nothing() {
    superseded(OwnerSwitches::default()).unwrap();
}

#[test]
fn negative_control_a_renewal_not_guarded_on_the_incarnation_is_caught() {
    let switches = OwnerSwitches {
        unguarded_renewal: true,
        ..OwnerSwitches::default()
    };
    assert!(superseded(switches).is_err());
}

/// A write of an engine whose lease lapsed while the write was in flight (a stall between its
/// plan and its commit) does not commit once a newer engine with its owner id opened: the newer
/// one took the namespace at the same epoch, so the fence does not tell the two apart; the owner
/// lease does. Here the stalled write reaches the store while the newer engine's restore unit
/// is between its read of the log and its repair record. Before the write was bounded by the
/// owner lease it committed there, the repair found the log moved, and the newer engine
/// contained the healthy entity (found by the simulator, long-lane seed 1009003).
fn stalled_write(switches: OwnerSwitches) -> Result<(), String> {
    use std::sync::Mutex;
    use std::sync::mpsc;

    let clock = ManualClock::new(1_000_000);
    let store = TestStore::with_clock(Arc::new(clock.clone()));
    let machine = Arc::new(TestMachine::default());
    let open = |switches| {
        engine_over(&machine, Arc::clone(&store) as Arc<dyn Store>)
            .renew_owner_lease(false)
            .background_warm(false)
            .owner_switches_for_test(switches)
            .open()
            .unwrap()
    };
    let old = open(switches);
    old.register(&entity(1)).unwrap();
    old.append(&entity(1), recs(&["old"])).unwrap();

    // The first batch each thread sends to the entity after this waits for its turn.
    let (reached_tx, reached) = mpsc::channel::<&'static str>();
    let (zombie_go, zombie_turn) = mpsc::channel::<()>();
    let (successor_go, successor_turn) = mpsc::channel::<()>();
    let turns = Mutex::new((Some(zombie_turn), Some(successor_turn)));
    let reached_tx = Mutex::new(reached_tx);
    let partition = entity(1).partition();
    store.set_before_apply(move |p, _| {
        if *p != partition {
            return;
        }
        let stalled = std::thread::current().name() == Some("stalled writer");
        let turn = {
            let mut turns = turns.lock().unwrap();
            if stalled {
                turns.0.take()
            } else {
                turns.1.take()
            }
        };
        if let Some(turn) = turn {
            let who = if stalled {
                "stalled writer"
            } else {
                "successor"
            };
            reached_tx.lock().unwrap().send(who).unwrap();
            turn.recv().unwrap();
        }
    });

    let stalled = {
        let old = old.clone();
        std::thread::Builder::new()
            .name("stalled writer".into())
            .spawn(move || old.append(&entity(1), recs(&["stalled"])))
            .unwrap()
    };
    assert_eq!(reached.recv().unwrap(), "stalled writer");
    // The old engine stalls past its lease; a newer one with its owner id opens.
    clock.advance(LEASE_MS);
    let new = open(OwnerSwitches::default());
    assert_eq!(new.unclean_previous(), Some(1));
    let reader = {
        let new = new.clone();
        std::thread::spawn(move || payloads(&new, &entity(1)))
    };
    assert_eq!(reached.recv().unwrap(), "successor");
    // The stalled write reaches the store while the successor's unit is mid-way.
    zombie_go.send(()).unwrap();
    let stalled = stalled.join().unwrap();
    successor_go.send(()).unwrap();
    let restored = reader.join().unwrap();
    store.clear_hooks();

    if !matches!(
        stalled,
        Err(Error::Unavailable { .. } | Error::OwnerLive { .. })
    ) {
        return Err(format!("the stalled write answered {stalled:?}"));
    }
    assert_eq!(restored.unwrap(), recs(&["old"]), "the successor serves");
    new.append(&entity(1), recs(&["new"])).unwrap();
    assert_eq!(payloads(&new, &entity(1)).unwrap(), recs(&["old", "new"]));
    // The old engine learns it was replaced at its next call.
    assert_owner_live(&old.read(&entity(1), |_| ()).unwrap_err(), 2);
    Ok(())
}

#[test]
fn f12_a_write_stalled_past_the_owner_lease_does_not_commit_under_its_successor() {
    stalled_write(OwnerSwitches::default()).unwrap();
}

/// Many writer threads of one engine stall at once, each with a write planned and not yet at
/// the store, while the lease lapses and a newer engine with the owner id opens; none of their
/// writes commits, and the newer engine serves every entity as the old one left it.
#[test]
fn f12_many_stalled_writers_commit_nothing_under_the_successor() {
    use std::sync::Barrier;

    const WRITERS: usize = 8;
    let clock = ManualClock::new(1_000_000);
    let store = TestStore::with_clock(Arc::new(clock.clone()));
    let machine = Arc::new(TestMachine::default());
    let open = || {
        engine_over(&machine, Arc::clone(&store) as Arc<dyn Store>)
            .renew_owner_lease(false)
            .background_warm(false)
            .open()
            .unwrap()
    };
    let old = open();
    for i in 0..WRITERS {
        old.register(&entity(i)).unwrap();
        old.append(&entity(i), recs(&["old"])).unwrap();
    }
    // Each writer's first batch to its entity waits until every writer got there, then until
    // the successor opened.
    let (all_stalled, go) = (
        Arc::new(Barrier::new(WRITERS + 1)),
        Arc::new(Barrier::new(WRITERS + 1)),
    );
    let (stalled_hook, go_hook) = (Arc::clone(&all_stalled), Arc::clone(&go));
    store.set_before_apply(move |p, _| {
        thread_local!(static STALLED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        let writer = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("writer"));
        if writer && p.as_bytes().starts_with(b"e/") && !STALLED.replace(true) {
            stalled_hook.wait();
            go_hook.wait();
        }
    });
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            let old = old.clone();
            std::thread::Builder::new()
                .name(format!("writer {i}"))
                .spawn(move || old.append(&entity(i), recs(&["stalled"])))
                .unwrap()
        })
        .collect();
    all_stalled.wait();
    clock.advance(LEASE_MS);
    let new = open();
    go.wait();
    for (i, w) in writers.into_iter().enumerate() {
        let answer = w.join().unwrap();
        assert!(
            matches!(
                answer,
                Err(Error::Unavailable { .. } | Error::OwnerLive { .. })
            ),
            "writer {i}'s stalled write answered {answer:?}"
        );
    }
    store.clear_hooks();
    for i in 0..WRITERS {
        assert_eq!(payloads(&new, &entity(i)).unwrap(), recs(&["old"]));
    }
    assert_eq!(new.stats().phases.contained, 0);
}

/// With the owner lease ignored (`ignore_lease_expiry` turns the bound on writes off with the
/// check at each call) the stalled write commits under its successor.
#[test]
fn negative_control_a_write_not_bounded_by_the_owner_lease_is_caught() {
    let switches = OwnerSwitches {
        ignore_lease_expiry: true,
        ..OwnerSwitches::default()
    };
    assert!(stalled_write(switches).is_err());
}

// ---------------------------------------------------------------------------------------------
// Prompt deposition: a deposed owner stops serving reads within the bound.

/// `a` serves the namespace; `c` takes it over (bump, revoke to Complete, own). `a` may serve a
/// stale read until `owner_lease - lease_margin` after its last renewal; its first call after
/// that renews, which re-reads the namespace's epoch, and is refused. Before F12 reads were
/// never fenced: `a` served its stale state for as long as it wrote nothing.
fn deposed_read(switches: OwnerSwitches) -> Result<(), String> {
    let clock = ManualClock::new(1_000_000);
    let store = TestStore::with_clock(Arc::new(clock.clone()));
    let machine = Arc::new(TestMachine::default());
    let open = |owner: &str, switches| {
        engine_over(&machine, Arc::clone(&store) as Arc<dyn Store>)
            .owner(owner)
            .renew_owner_lease(false)
            .owner_switches_for_test(switches)
            .open()
            .unwrap()
    };
    let a = open("a", switches);
    let c = open("c", OwnerSwitches::default());
    a.register(&entity(1)).unwrap();
    a.append(&entity(1), recs(&["a1"])).unwrap();
    let valid_until = a.stats().owner_lease.valid_until_ms;
    assert_eq!(valid_until, clock.now_ms() + LEASE_MS - MARGIN_MS);
    c.bump_epoch(&ns(), 1).unwrap();
    revoke_to_complete(&c, &ns());
    c.own(&ns()).unwrap();
    c.append(&entity(1), recs(&["c1"])).unwrap();
    // Within the bound a stale read may still be served (docs/fencing.md states the bound).
    clock.advance(valid_until - 1 - clock.now_ms());
    assert_eq!(payloads(&a, &entity(1)).unwrap(), recs(&["a1"]), "stale");
    clock.advance(1);
    match a.read(&entity(1), |_| ()) {
        Err(Error::Fenced {
            grant: 0,
            current: 1,
        }) => {}
        other => return Err(format!("a deposed owner's read past the bound: {other:?}")),
    }
    assert_eq!(a.grant(&ns()), None);
    assert_eq!(a.stats().owner_lease.renewals, 1);
    Ok(())
}

#[test]
fn f12_a_deposed_owner_stops_serving_reads_within_the_bound() {
    deposed_read(OwnerSwitches::default()).unwrap();
}

#[test]
fn negative_control_a_renewal_that_does_not_reread_the_namespaces_is_caught() {
    let switches = OwnerSwitches {
        skip_held_recheck: true,
        ..OwnerSwitches::default()
    };
    assert!(deposed_read(switches).is_err());
}

#[test]
fn negative_control_serving_past_the_lease_without_renewing_is_caught() {
    let switches = OwnerSwitches {
        ignore_lease_expiry: true,
        ..OwnerSwitches::default()
    };
    assert!(deposed_read(switches).is_err());
}

/// An explicit renewal deposes at once.
#[test]
fn f12_renew_owner_lease_deposes_a_namespace_taken_over() {
    let clock = ManualClock::new(1_000_000);
    let store = TestStore::with_clock(Arc::new(clock.clone()));
    let machine = Arc::new(TestMachine::default());
    let open = |owner: &str| {
        engine_over(&machine, Arc::clone(&store) as Arc<dyn Store>)
            .owner(owner)
            .renew_owner_lease(false)
            .open()
            .unwrap()
    };
    let (a, c) = (open("a"), open("c"));
    a.register(&entity(1)).unwrap();
    c.take_over(&ns(), portcullis::engine::TakeOver::new().force(true))
        .unwrap();
    assert_eq!(a.grant(&ns()), Some(0), "not yet learned");
    a.renew_owner_lease().unwrap();
    assert_eq!(a.grant(&ns()), None);
    assert!(matches!(
        a.read(&entity(1), |_| ()),
        Err(Error::Fenced { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// The background renewer (real time): it keeps the incarnation live, and deposes.

/// A fence margin (the skew bound) of 500 ms, so an owner lease of 1.5 s is renewed every
/// 500 ms, and stays live through a renewal late by up to a second on a loaded machine.
fn short_leases(machine: &Arc<TestMachine>, store: &Arc<dyn Store>, owner: &str) -> Eng {
    let config = FenceConfig::builder().lease_margin_ms(500).build().unwrap();
    engine_over(machine, Arc::clone(store))
        .owner(owner)
        .fence_config(config)
        .owner_lease(Duration::from_millis(1_500))
        .open()
        .unwrap()
}

#[test]
fn f12_the_background_renewer_keeps_the_owner_live_and_deposes_it_after_a_take_over() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let machine = Arc::new(TestMachine::default());
    let a = short_leases(&machine, &store, "a");
    a.register(&entity(1)).unwrap();
    // Renewed for longer than a whole lease, with no call: still live.
    until(|| a.stats().owner_lease.renewals >= 4);
    let again = engine_over(&machine, Arc::clone(&store)).owner("a").open();
    assert!(matches!(again, Err(Error::OwnerLive { .. })), "{again:?}");
    let c = short_leases(&machine, &store, "c");
    c.bump_epoch(&ns(), 1).unwrap();
    revoke_to_complete(&c, &ns());
    c.own(&ns()).unwrap();
    // No call of a's: its background renewal learns it was deposed.
    until(|| a.grant(&ns()).is_none());
    assert!(matches!(
        a.read(&entity(1), |_| ()),
        Err(Error::Fenced { .. })
    ));
    a.close().unwrap();
    c.close().unwrap();
}
