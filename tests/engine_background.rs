//! The engine's background thread (SPEC F9, F12, R3, R6, R8, R11): one per engine, so a slow
//! store delays only its own engine's sweeps; close stops and joins it, so nothing of the
//! engine holds a store handed in once close returns; a thread that dies is noticed, logged and
//! started again; and the background warm delivers what entities owe (unclean-restart repairs,
//! deferred work) without waiting for a touch, yielding to other pool work. Nothing sleeps to
//! synchronise: hooks and channels order the threads, `until` waits for a state the engine
//! reports, and `within` bounds a hang.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, entity, ns, payloads, recs, until, within,
};
use crossbeam::channel;
use portcullis::engine::{Deferred, OwnerSwitches};
use portcullis::store::{FileStore, Store, SyncPolicy};
use portcullis::{Engine, ManualClock};

const WAIT: Duration = Duration::from_secs(10);
/// Past the default 30 s lease.
const EXPIRE_MS: u64 = 30_001;

/// Whether a scan reads a namespace's coordinator rows (a sweep does).
fn sweeps(p: &portcullis::store::Partition) -> bool {
    p.as_bytes().starts_with(b"c/")
}

/// F9: every engine drives its own sweeper, so a store that hangs in one engine's sweep does
/// not hold up another engine's. Before, one thread served every sweeper of the process: the
/// second engine's pass on demand waited behind the first's.
#[test]
fn f9_a_slow_store_delays_only_its_own_engines_sweeps() {
    let clock = ManualClock::new(1_000_000);
    let slow = TestStore::with_clock(Arc::new(clock.clone()));
    let quick = TestStore::with_clock(Arc::new(clock.clone()));
    let machine = Arc::new(TestMachine::default());
    let a = builder(&machine, &slow).owner("a").open().unwrap();
    let b = builder(&machine, &quick).owner("b").open().unwrap();
    for engine in [&a, &b] {
        engine.register(&entity(1)).unwrap();
        engine.append(&entity(1), recs(&["r"])).unwrap();
    }
    clock.advance(EXPIRE_MS);
    let (held_tx, held) = channel::bounded::<()>(1);
    let (go_tx, go) = channel::bounded::<()>(1);
    slow.set_before_scan(move |p, _| {
        if sweeps(p) && held_tx.try_send(()).is_ok() {
            let _ = go.recv_timeout(WAIT);
        }
    });
    let kicked = {
        let sweeper = a.sweeper().unwrap().clone();
        std::thread::spawn(move || sweeper.sweep_now(WAIT))
    };
    held.recv_timeout(WAIT)
        .expect("a's sweep reached its store");
    let pass = b.sweeper().unwrap().sweep_now(WAIT);
    go_tx.send(()).unwrap();
    assert_eq!(
        pass.map(|p| p.deleted),
        Some(1),
        "b swept while a's store hung"
    );
    assert!(kicked.join().unwrap().is_some());
    slow.clear_hooks();
    a.close().unwrap();
    b.close().unwrap();
}

/// Opens a file store in `dir`, hands it to an engine that serves a fenced namespace (so its
/// sweeper runs) and writes, closes the engine, and drops every handle; answers what a second
/// open of the directory says.
fn reopen_after_close(dir: &std::path::Path, switches: OwnerSwitches) -> portcullis::Result<()> {
    let store: Arc<dyn Store> = Arc::new(
        FileStore::builder(dir)
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()?,
    );
    let engine = Engine::builder(Arc::new(TestMachine::default()))
        .store(Arc::clone(&store))
        .owner_switches_for_test(switches)
        .open()?;
    engine.register(&entity(1))?;
    engine.append(&entity(1), recs(&["r"]))?;
    assert!(engine.sweeper().is_some());
    engine.close()?;
    drop(engine);
    drop(store);
    FileStore::builder(dir).open().map(|_| ())
}

/// R11, F9: close stops and joins the engine's background thread (which drives the sweeper),
/// so once the engine is closed and dropped nothing holds a store handed in with
/// `EngineBuilder::store`: the directory opens again at once. Before, the process's sweeper
/// thread kept the closed engine's fence, and with it the store and its lock, until it next
/// woke (the sweep interval, a minute by default).
#[test]
fn r11_close_releases_a_store_handed_in_before_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    within("closing and reopening", move || {
        reopen_after_close(dir.path(), OwnerSwitches::default())
    })
    .expect("the directory opens again once the engine is closed and dropped");
}

/// The negative control: with close leaving the background thread running
/// (`OwnerSwitches::close_leaves_background`), the thread still holds the store, whose lock
/// refuses the second open.
#[test]
fn r11_negative_control_a_background_thread_left_running_keeps_the_store_locked() {
    let dir = tempfile::tempdir().unwrap();
    let switches = OwnerSwitches {
        close_leaves_background: true,
        ..OwnerSwitches::default()
    };
    let reopened = reopen_after_close(dir.path(), switches);
    assert!(
        matches!(reopened, Err(portcullis::Error::Locked { .. })),
        "{reopened:?}"
    );
}

/// Kills the background thread of an engine with a sweeper (a bug outside its guarded duties)
/// and makes a call; answers the engine.
fn killed(switches: OwnerSwitches) -> TestEngine {
    common::logs::start();
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .owner("killed")
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    engine.register(&entity(1)).unwrap();
    engine.append(&entity(1), recs(&["r"])).unwrap();
    assert!(engine.stats().background.running);
    engine.kill_background_for_test();
    until(|| engine.stats().background.last_death.is_some());
    assert!(!engine.stats().background.running);
    // Any call notices.
    engine.entities().unwrap();
    engine
}

/// R11: a background thread that dies is noticed: a log line says so, the engine's stats show
/// it, and the engine's next call starts it again, so renewals and sweeps go on. Before, a dead
/// sweeper thread went unnoticed and every later sweep was silently lost.
#[test]
fn r11_a_background_thread_that_dies_is_noticed_and_started_again() {
    let engine = killed(OwnerSwitches::default());
    let stats = engine.stats().background;
    assert!(stats.running, "{stats:?}");
    assert_eq!(stats.restarts, 1);
    assert!(common::logs::warned(&["background thread died"]));
    let pass = engine.sweeper().unwrap().sweep_now(WAIT);
    assert!(pass.is_some(), "the sweeper runs again");
    engine.close().unwrap();
}

/// The negative control: with deaths unwatched (`OwnerSwitches::background_death_unwatched`),
/// the thread stays dead after the call and the sweeper never sweeps again.
#[test]
fn r11_negative_control_an_unwatched_background_thread_stays_dead() {
    let switches = OwnerSwitches {
        background_death_unwatched: true,
        ..OwnerSwitches::default()
    };
    let engine = killed(switches);
    let stats = engine.stats().background;
    assert!(!stats.running && stats.restarts == 0, "{stats:?}");
    assert!(
        engine
            .sweeper()
            .unwrap()
            .sweep_now(Duration::from_millis(200))
            .is_none()
    );
}

/// Entities 1 to 3, each holding `a`, written by an engine that crashed, so the next holder of
/// their namespace owes each a repair.
fn crashed(machine: &Arc<TestMachine>) -> Arc<TestStore> {
    let store = TestStore::new();
    *machine.repair_records.lock() = recs(&["fix"]);
    let entities: Vec<_> = (1..=3).map(entity).collect();
    common::engine::crashed_with(machine, &store, &entities, &["a"]);
    store
}

/// R3, R6: the repairs owed after a crash are delivered without a touch: the restarted engine
/// resumes its namespace and the background warm restores every entity of it, running each
/// repair once. Before, an entity nobody touched kept its repair owed for ever.
#[test]
fn r3_r6_owed_repairs_are_delivered_without_a_touch() {
    let machine = Arc::new(TestMachine::default());
    let store = crashed(&machine);
    let engine = builder(&machine, &store)
        .background_warm(true)
        .open()
        .unwrap();
    until(|| machine.repairs.lock().len() == 3);
    until(|| {
        engine
            .stats()
            .background
            .warm
            .is_some_and(|w| w.finished && w.done == 3)
    });
    assert_eq!(engine.stats().phases.restored, 3);
    for i in 1..=3 {
        assert_eq!(payloads(&engine, &entity(i)).unwrap(), recs(&["a", "fix"]));
    }
    assert_eq!(machine.repairs.lock().len(), 3, "each repair ran once");
    engine.close().unwrap();
}

/// The switch: with the background warm off, nothing is restored until touched.
#[test]
fn r6_with_the_background_warm_off_nothing_restores_untouched() {
    let machine = Arc::new(TestMachine::default());
    let store = crashed(&machine);
    let engine = builder(&machine, &store).open().unwrap();
    engine.own(&ns()).unwrap();
    engine.owed_repairs(&ns()).unwrap();
    assert!(engine.stats().background.warm.is_none());
    assert_eq!(engine.stats().phases.restored, 0);
    assert!(machine.repairs.lock().is_empty());
    engine.close().unwrap();
}

/// R8, R6: work deferred to a pending entity is applied without a touch: the background warm
/// restores the entity, whose unit drains it. (The entity is made pending by a passivation
/// once the adoption's own warm has restored the namespace, so the deferral surely finds it
/// pending: deferring to it while that warm runs may find it restored, and apply at once.)
#[test]
fn r8_r6_deferred_work_is_applied_without_a_touch() {
    let store = common::engine::closed_with(2, &["a"]);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .background_warm(true)
        .open()
        .unwrap();
    // The adoption owes all of the namespace a warm.
    engine.own(&ns()).unwrap();
    until(|| machine.units_of(&entity(0)) == 1 && machine.units_of(&entity(1)) == 1);
    until(|| engine.stats().background.warm.is_some_and(|w| w.finished));
    assert!(engine.passivate(&entity(1)).unwrap());
    let deferred = engine.defer(&entity(1), b"d".to_vec()).unwrap();
    assert_eq!(deferred, Deferred::Queued);
    until(|| machine.units_of(&entity(1)) == 2);
    assert_eq!(payloads(&engine, &entity(1)).unwrap(), recs(&["a", "d"]));
    assert_eq!(machine.units_of(&entity(1)), 2, "the read shared that unit");
    engine.close().unwrap();
}

/// F9, R6: a warm that occupies every thread of the pool yields to other pool work between
/// entities, so a background revocation started meanwhile completes before the warm's next
/// entity. Before, with `pool_threads <= warm_parallelism`, it waited for the whole warm.
fn revocation_during_a_warm(switches: OwnerSwitches) -> bool {
    let store = common::engine::closed_with(3, &["a"]);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .pool_threads(1)
        .warm_parallelism(1)
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    engine.own(&ns()).unwrap();
    let other = portcullis::Namespace::new("other").unwrap();
    engine.bump_epoch(&other, 1).unwrap();
    let handle: Arc<parking_lot::Mutex<Option<portcullis::fence::RevocationHandle>>> =
        Arc::default();
    let done_before_second = Arc::new(AtomicBool::new(false));
    let units = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let (engine, handle) = (engine.clone(), Arc::clone(&handle));
        let (done, units) = (Arc::clone(&done_before_second), Arc::clone(&units));
        machine.set_hook(move |_| match units.fetch_add(1, Ordering::SeqCst) {
            0 => {
                let started = engine
                    .fence()
                    .revoke_in_background(&other, Default::default());
                *handle.lock() = Some(started);
            }
            1 => {
                let finished = handle
                    .lock()
                    .as_ref()
                    .and_then(|h| h.wait(Duration::ZERO))
                    .is_some();
                done.store(finished, Ordering::SeqCst);
            }
            _ => {}
        });
    }
    let progress = within("a warm", {
        let engine = engine.clone();
        move || engine.warm().unwrap().wait().unwrap()
    });
    assert_eq!(progress.done, 3);
    engine.close().unwrap();
    done_before_second.load(Ordering::SeqCst)
}

#[test]
fn f9_r6_a_background_revocation_does_not_wait_for_the_whole_warm() {
    assert!(revocation_during_a_warm(OwnerSwitches::default()));
}

/// The negative control: a warm that never yields (`OwnerSwitches::warm_never_yields`) keeps
/// the only pool thread until it ends; the revocation has not run when its second entity
/// restores.
#[test]
fn f9_r6_negative_control_a_warm_that_never_yields_holds_the_revocation_back() {
    let switches = OwnerSwitches {
        warm_never_yields: true,
        ..OwnerSwitches::default()
    };
    assert!(!revocation_during_a_warm(switches));
}
