//! The engine's background sweeper of expired leased-shard rows (SPEC F9, F11, R11): on by
//! default, so rows never pile up; it can be turned off; close stops it promptly. Time is a
//! manual clock; the tests wait for the sweeper's passes on its own condition variable, and a
//! pause hook holds a pass mid-way. Nothing sleeps.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::engine::{TestEngine, TestMachine, TestStore, builder, entity, ns};
use crossbeam::channel::{self, Receiver, Sender};
use portcullis::fence::{FenceHooks, HookPoint};
use portcullis::store::Store;
use portcullis::{EntityId, ManualClock, Namespace};

const WAIT: Duration = Duration::from_secs(10);
/// Past the default 30 s lease.
const EXPIRE_MS: u64 = 30_001;

struct Setup {
    clock: ManualClock,
    store: Arc<TestStore>,
    machine: Arc<TestMachine>,
}

fn setup() -> Setup {
    let clock = ManualClock::new(1_000_000);
    Setup {
        store: TestStore::with_clock(Arc::new(clock.clone())),
        clock,
        machine: Arc::new(TestMachine::default()),
    }
}

/// Writes to `n` entities, each taking a lease and leaving a leased-shard row.
fn write_entities(engine: &TestEngine, n: usize) {
    for i in 1..=n {
        engine.register(&entity(i)).unwrap();
        engine.append(&entity(i), vec![b"r".to_vec()]).unwrap();
    }
}

fn shard_rows(engine: &TestEngine, store: &TestStore) -> usize {
    store
        .inner
        .scan(
            &ns().coordinator_partition(),
            &engine.fence().keys().shard_range(),
            None,
            1_000,
        )
        .unwrap()
        .entries
        .len()
}

#[test]
fn f9_the_engine_sweeps_expired_lease_rows_in_the_background_by_default() {
    let s = setup();
    let engine = builder(&s.machine, &s.store)
        .sweep_interval(Duration::from_millis(1))
        .open()
        .unwrap();
    assert!(engine.sweeper().is_none(), "no namespace served yet");
    write_entities(&engine, 10);
    let sweeper = engine.sweeper().expect("on by default").clone();
    assert_eq!(shard_rows(&engine, &s.store), 10);
    // Passes before the leases expire delete nothing.
    let passes = sweeper.passes();
    assert!(sweeper.wait_for_passes(passes + 2, WAIT));
    assert_eq!(shard_rows(&engine, &s.store), 10, "live leases are kept");
    s.clock.advance(EXPIRE_MS);
    // A pass that began after the leases expired, found by the sweeper on its own interval.
    let passes = sweeper.passes();
    assert!(sweeper.wait_for_passes(passes + 2, WAIT));
    assert_eq!(
        shard_rows(&engine, &s.store),
        0,
        "every expired row was swept"
    );
    // The entities write on: a new lease and row each.
    engine.append(&entity(1), vec![b"again".to_vec()]).unwrap();
    assert_eq!(shard_rows(&engine, &s.store), 1);
}

#[test]
fn f9_the_default_interval_and_a_pass_on_demand() {
    let s = setup();
    let engine = builder(&s.machine, &s.store).open().unwrap();
    write_entities(&engine, 3);
    let sweeper = engine.sweeper().unwrap();
    assert_eq!(
        sweeper.interval(),
        portcullis::engine::DEFAULT_SWEEP_INTERVAL
    );
    s.clock.advance(EXPIRE_MS);
    let pass = sweeper.sweep_now(WAIT).expect("a pass ran");
    assert_eq!((pass.namespaces, pass.deleted, pass.unfinished), (1, 3, 0));
    assert_eq!(shard_rows(&engine, &s.store), 0);
}

#[test]
fn f9_with_the_sweeper_off_expired_rows_stay() {
    let s = setup();
    let engine = builder(&s.machine, &s.store)
        .sweep_expired_leases(false)
        .open()
        .unwrap();
    assert!(engine.sweeper().is_none());
    write_entities(&engine, 4);
    s.clock.advance(EXPIRE_MS);
    assert_eq!(shard_rows(&engine, &s.store), 4, "nothing swept them");
    // They were sweepable: an explicit step deletes them.
    assert_eq!(engine.fence().sweep_step(&ns()).unwrap().deleted, 4);
}

#[test]
fn f9_an_engine_serving_only_unfenced_namespaces_runs_no_sweeper() {
    // An unfenced namespace has no leased-shard rows: an application that never hands over
    // pays for no sweeper. The first fenced namespace starts it.
    let s = setup();
    let engine = builder(&s.machine, &s.store)
        .own_unfenced(Namespace::new("local").unwrap())
        .open()
        .unwrap();
    assert!(engine.sweeper().is_none());
    engine.own(&ns()).unwrap();
    assert!(engine.sweeper().expect("started").is_running());
}

#[test]
fn f9_a_zero_sweep_interval_is_refused() {
    let s = setup();
    let err = builder(&s.machine, &s.store)
        .sweep_interval(Duration::ZERO)
        .open()
        .unwrap_err();
    assert!(
        matches!(err, portcullis::Error::InvalidArgument(_)),
        "{err}"
    );
}

#[test]
fn r11_close_stops_the_sweeper_promptly() {
    let s = setup();
    let engine = builder(&s.machine, &s.store)
        .sweep_interval(Duration::from_secs(3_600))
        .own(ns())
        .open()
        .unwrap();
    let sweeper = engine.sweeper().unwrap().clone();
    assert!(sweeper.is_running());
    let started = Instant::now();
    engine.close().unwrap();
    let took = started.elapsed();
    assert!(!sweeper.is_running(), "close ended the sweeper");
    assert!(
        took < Duration::from_secs(5),
        "close waited {took:?} for an idle sweeper"
    );
    assert!(
        sweeper.sweep_now(WAIT).is_none(),
        "an ended sweeper runs no pass"
    );
}

/// Holds the sweeper before each delete until the test lets it go.
#[derive(Debug)]
struct HoldDeletes {
    reached: Sender<EntityId>,
    go: Receiver<()>,
}

impl FenceHooks for HoldDeletes {
    fn at(&self, point: HookPoint, entity: Option<&EntityId>) {
        if point == HookPoint::SweepBeforeDelete {
            let _ = self.reached.send(entity.unwrap().clone());
            let _ = self.go.recv_timeout(WAIT);
        }
    }
}

#[test]
fn r11_a_stopped_sweeper_ends_after_the_row_it_is_deleting() {
    let s = setup();
    let engine = builder(&s.machine, &s.store).open().unwrap();
    write_entities(&engine, 20);
    let sweeper = engine.sweeper().unwrap().clone();
    s.clock.advance(EXPIRE_MS);
    let (reached_tx, reached) = channel::unbounded();
    let (go, go_rx) = channel::unbounded();
    engine.fence().set_hooks(Arc::new(HoldDeletes {
        reached: reached_tx,
        go: go_rx,
    }));
    let kicker = {
        let sweeper = sweeper.clone();
        std::thread::spawn(move || sweeper.sweep_now(WAIT))
    };
    reached
        .recv_timeout(WAIT)
        .expect("the pass reached its first delete");
    // Ask it to stop while it holds the first row, then let that delete go.
    assert!(!sweeper.stop(Duration::ZERO), "still held in the hook");
    go.send(()).unwrap();
    assert!(sweeper.stop(WAIT), "the sweeper ended");
    let pass = kicker
        .join()
        .unwrap()
        .expect("the stopped pass still reported");
    assert_eq!(pass.deleted, 1, "it stopped after the row it was deleting");
    assert!(reached.try_recv().is_err(), "no further delete was begun");
    assert_eq!(shard_rows(&engine, &s.store), 19);
    engine.close().unwrap();
}
