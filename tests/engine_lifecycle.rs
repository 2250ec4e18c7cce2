//! The engine's lifecycle (SPEC R11): dropping an engine closes it cleanly, `close` is bounded
//! and stops the warm and every background driver, and drivers run on the engine's own pool.
//! No test sleeps to synchronise; `within` only bounds a hang.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{TestMachine, TestStore, builder, entity, payloads, recs, within};
use crossbeam::channel;
use parking_lot::{Condvar, Mutex};
use portcullis::fence::{DriverLimits, FenceHooks, HookPoint};
use portcullis::{EntityId, Error, ManualClock};

/// R11: dropping the last handle closes the engine cleanly, like `close`: the next open owes
/// no repair and runs none.
#[test]
fn r11_dropping_an_engine_closes_it_cleanly() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["one"])).unwrap();
        let clone = engine.clone();
        drop(engine);
        // A clone still holds it open.
        assert_eq!(payloads(&clone, &e).unwrap(), recs(&["one"]));
        drop(clone);
    }
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(engine.unclean_previous(), None, "the drop closed cleanly");
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["one"]));
    assert!(machine.repairs.lock().is_empty());
    // `close` still reports what went wrong: here the clean-shutdown row cannot be written.
    *store.fail_writes_of.lock() = Some(portcullis::store::Partition::new("s/engine").unwrap());
    let err = engine.close().unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}

/// R11: `close` is bounded. A restore unit that never ends (application code stuck) makes
/// `close` give up after its bound with `Unavailable` instead of hanging; calls made after
/// that answer `Closed`.
#[test]
fn r11_close_is_bounded_when_a_unit_does_not_end() {
    let store = TestStore::new();
    {
        let machine = Arc::new(TestMachine::default());
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&entity(0)).unwrap();
        engine.close().unwrap();
    }
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .close_timeout(Duration::from_millis(100))
        .open()
        .unwrap();
    let (entered_tx, entered_rx) = channel::bounded::<()>(1);
    let (go_tx, go_rx) = channel::bounded::<()>(1);
    machine.set_hook(move |_| {
        entered_tx.send(()).unwrap();
        go_rx.recv().unwrap();
    });
    let warm = engine.warm().unwrap();
    entered_rx.recv().unwrap();
    let closed = {
        let engine = engine.clone();
        within("close with a stuck restore unit", move || engine.close())
    };
    let err = closed.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("warm"), "{err}");
    assert!(matches!(
        engine.read(&entity(0), |_| ()),
        Err(Error::Closed)
    ));
    go_tx.send(()).unwrap();
    assert!(warm.wait().unwrap().finished);
}

/// Records the name of the thread a revocation slice runs on.
#[derive(Debug, Default)]
struct SliceThreads(Mutex<Vec<Option<String>>>, Condvar);

impl FenceHooks for SliceThreads {
    fn at(&self, point: HookPoint, _: Option<&EntityId>) {
        if point == HookPoint::SliceBeforeCheckpoint {
            let name = std::thread::current().name().map(str::to_owned);
            self.0.lock().push(name);
            self.1.notify_all();
        }
    }
}

impl SliceThreads {
    /// Waits (bounded) until at least one slice has run, so close meets a running driver.
    fn wait_for_a_slice(&self) {
        let mut names = self.0.lock();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while names.is_empty() {
            assert!(
                !self.1.wait_until(&mut names, deadline).timed_out(),
                "no revocation slice ran within 30 s"
            );
        }
    }
}

/// R11, F9: a background revocation started through the engine runs on the engine's pool, and
/// `close` stops it (it reports `complete: false`) instead of leaving it running.
#[test]
fn r11_close_stops_the_revocation_driver_which_runs_on_the_engines_pool() {
    let clock = Arc::new(ManualClock::new(100_000));
    let store = TestStore::with_clock(clock.clone());
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .clock(clock.clone())
        .open()
        .unwrap();
    let ns = entity(0).namespace().clone();
    let threads = Arc::new(SliceThreads::default());
    engine.fence().set_hooks(threads.clone());
    // A recovery hold-off with the clock standing still: revocation cannot complete, and the
    // driver waits between slices until it is cancelled.
    engine.mark_lease_table_recovered(&ns).unwrap();
    engine.bump_epoch(&ns, 1).unwrap();
    let limits = DriverLimits::default().with_idle_pause(Duration::from_secs(3_600));
    let handle = engine.fence().revoke_in_background(&ns, limits);
    threads.wait_for_a_slice();
    {
        let engine = engine.clone();
        within("close with a revocation driver running", move || {
            engine.close().unwrap()
        });
    }
    let report = handle
        .wait(Duration::from_secs(10))
        .expect("close stopped the driver")
        .unwrap();
    assert!(!report.complete);
    let names = threads.0.lock().clone();
    assert!(!names.is_empty());
    assert!(
        names
            .iter()
            .all(|n| n.as_deref().is_some_and(|n| n.starts_with("portcullis-"))),
        "slices ran on {names:?}"
    );
}

/// Closes an engine that owes its namespace a repair for 20 entities, each restored (and so
/// repaired) and then passivated (its slot gone, so only its repair row tells), over a store
/// whose every repair-row read takes 100 ms (a slow store), with a close timeout of 50 ms;
/// answers how many repair rows the close read and the repairs owed afterwards.
fn close_owing_repairs(switches: portcullis::engine::OwnerSwitches) -> (usize, Vec<u64>) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let entities: Vec<EntityId> = (0..20).map(entity).collect();
    common::engine::crashed_with(&machine, &store, &entities, &["a"]);
    let engine = builder(&machine, &store)
        .close_timeout(Duration::from_millis(50))
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    let ns = common::engine::ns();
    engine.own(&ns).unwrap();
    assert_eq!(engine.owed_repairs(&ns).unwrap().len(), 1);
    for e in &entities {
        payloads(&engine, e).unwrap();
        assert!(engine.passivate(e).unwrap());
    }
    assert_eq!(engine.stats().passivation.slots, 0);
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let reads = Arc::clone(&reads);
        let (never, slow) = channel::bounded::<()>(1);
        store.set_before_get(move |_, key| {
            let _kept = &never; // never sends, never hangs up
            if key == b"\0repair" {
                reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // A slow store: the read takes 100 ms (nobody ever sends).
                let _ = slow.recv_timeout(Duration::from_millis(100));
            }
        });
    }
    engine.close().unwrap();
    store.clear_hooks();
    let reads = reads.load(std::sync::atomic::Ordering::SeqCst);
    let next = builder(&machine, &store).open().unwrap();
    let owed = next.owed_repairs(&ns).unwrap();
    next.close().unwrap();
    (reads, owed)
}

/// R11, F11: close is bounded when repairs are owed: telling whether every entity of a
/// namespace had its owed repairs reads their repair rows one at a time only until the close
/// deadline, then keeps the repairs owed for the next holder. Before, close read every row
/// whatever the deadline (here 20 reads of 100 ms past a 50 ms bound).
#[test]
fn r11_close_is_bounded_when_repairs_are_owed() {
    let (reads, owed) = within("a close owing repairs", || {
        close_owing_repairs(Default::default())
    });
    assert!(
        reads <= 1,
        "{reads} repair rows read past the close deadline"
    );
    assert_eq!(owed.len(), 1, "unsure, the repairs stay owed: {owed:?}");
}

/// The negative control: with the check unbounded (`OwnerSwitches::unbounded_repair_check`),
/// close reads every row.
#[test]
fn r11_negative_control_an_unbounded_repair_check_reads_every_row() {
    let switches = portcullis::engine::OwnerSwitches {
        unbounded_repair_check: true,
        ..Default::default()
    };
    let (reads, owed) = close_owing_repairs(switches);
    assert_eq!(reads, 20);
    assert!(
        owed.is_empty(),
        "every row was read: all repaired, {owed:?}"
    );
}
