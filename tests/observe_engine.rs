//! SPEC E8 for the engine: its listener hears of refusals, containments, warms, revocations,
//! take-overs, depositions, sweeps, failed owner lease renewals and the events of the store it
//! opened, with no lock of the engine or the store held (a listener that calls back into the
//! engine does not deadlock; the negative control, which hands each event over where it is
//! emitted, does).

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, closed_with, entity, owner_builder, recs,
    revoke_to_complete, within,
};
use crossbeam::channel::{Receiver, unbounded};
use parking_lot::Mutex;
use portcullis::engine::TakeOver;
use portcullis::observe::{DegradedCause, Event, Listener};
use portcullis::store::Partition;
use portcullis::{Engine, Error, Rejection};

fn channel_listener() -> (Arc<dyn Listener>, Receiver<Event>) {
    let (tx, rx) = unbounded();
    (Arc::new(move |e: &Event| drop(tx.send(e.clone()))), rx)
}

fn names(rx: &Receiver<Event>) -> Vec<&'static str> {
    rx.try_iter().map(|e| e.name()).collect()
}

#[test]
fn e8_a_refusal_is_told_when_the_call_returns() {
    let (listener, rx) = channel_listener();
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).listener(listener).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    let refused = engine.try_write(&e, |_| -> Result<(Vec<Vec<u8>>, ()), Rejection> {
        Err(Rejection::new("not today"))
    });
    assert!(matches!(refused, Err(Error::Refused { .. })));
    let told: Vec<Event> = rx.try_iter().collect();
    assert!(
        matches!(told.as_slice(), [Event::Refused { entity: who, reason, .. }] if *who == e && reason == "not today"),
        "{told:?}"
    );
}

#[test]
fn e8_a_containment_is_told_and_the_metrics_hook_still_hears_it() {
    #[derive(Default)]
    struct Count(Mutex<u64>);
    impl portcullis::restore::Metrics for Count {
        fn entity_contained(
            &self,
            _: &portcullis::EntityId,
            _: &portcullis::restore::Containment,
            _: Duration,
        ) {
            *self.0.lock() += 1;
        }
    }
    let (listener, rx) = channel_listener();
    let hook = Arc::new(Count::default());
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .metrics(hook.clone())
        .listener(listener)
        .open()
        .unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["ok"])).unwrap();
    assert!(matches!(
        engine.append(&e, recs(&["!refuse"])),
        Err(Error::Contained { .. })
    ));
    let told: Vec<Event> = rx.try_iter().collect();
    assert!(
        matches!(told.as_slice(), [Event::Contained { entity: who, .. }] if *who == e),
        "{told:?}"
    );
    assert_eq!(*hook.0.lock(), 1, "the metrics hook is still called");
}

#[test]
fn e8_a_warm_is_told_when_it_finishes() {
    let store = closed_with(3, &["a", "b"]);
    let (listener, rx) = channel_listener();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).listener(listener).open().unwrap();
    let progress = engine.warm().unwrap().wait().unwrap();
    assert_eq!(progress.done, 3);
    // Told on the warm's last worker, after its waiters woke: wait for it.
    let finished = rx
        .iter()
        .find(|e| matches!(e, Event::WarmFinished { .. }))
        .unwrap();
    assert!(matches!(finished, Event::WarmFinished { progress: p, .. } if p.done == 3));
}

#[test]
fn e8_a_take_over_is_told_to_the_taker_and_the_deposition_to_the_deposed() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (to_a, from_a) = channel_listener();
    let (to_b, from_b) = channel_listener();
    let a = owner_builder(&machine, &store, "a")
        .listener(to_a)
        .open()
        .unwrap();
    let b = owner_builder(&machine, &store, "b")
        .listener(to_b)
        .open()
        .unwrap();
    let ns = entity(1).namespace().clone();
    a.own(&ns).unwrap();
    a.register(&entity(1)).unwrap();
    let grant = b.take_over(&ns, TakeOver::new().force(true)).unwrap();
    assert_eq!(
        names(&from_b),
        ["revocation_started", "revocation_completed", "took_over"]
    );
    assert!(matches!(
        a.append(&entity(1), recs(&["late"])),
        Err(Error::Fenced { .. })
    ));
    let told: Vec<Event> = from_a.try_iter().collect();
    assert!(
        matches!(told.as_slice(), [Event::Deposed { namespace, epoch, .. }] if *namespace == ns && *epoch == grant),
        "{told:?}"
    );
    assert_eq!(b.stats().namespaces.len(), 1);
    assert_eq!(b.stats().namespaces[0].epoch, grant);
    assert!(a.stats().namespaces.is_empty());
}

#[test]
fn e8_revocation_is_told_once_when_it_completes() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (listener, rx) = channel_listener();
    let engine = owner_builder(&machine, &store, "b")
        .listener(listener)
        .open()
        .unwrap();
    let ns = entity(1).namespace().clone();
    engine.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&engine, &ns);
    revoke_to_complete(&engine, &ns); // complete again: told once
    assert_eq!(names(&rx), ["revocation_started", "revocation_completed"]);
}

#[test]
fn e8_a_failed_renewal_is_told_and_degrades_the_engine_until_one_succeeds() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (listener, rx) = channel_listener();
    let engine = builder(&machine, &store)
        .renew_owner_lease(false)
        .listener(listener)
        .open()
        .unwrap();
    *store.fail_writes_of.lock() = Some(Partition::new("s/engine").unwrap());
    assert!(engine.renew_owner_lease().is_err());
    assert_eq!(names(&rx), ["renewal_failed"]);
    let degraded = engine.stats().degraded.expect("degraded");
    assert_eq!(degraded.cause, DegradedCause::OwnerLeaseNotRenewed);
    *store.fail_writes_of.lock() = None;
    engine.renew_owner_lease().unwrap();
    assert_eq!(engine.stats().degraded, None);
}

#[test]
fn e8_a_sweep_pass_is_told_from_the_background_thread() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let (listener, rx) = channel_listener();
    let engine = builder(&machine, &store).listener(listener).open().unwrap();
    engine.register(&entity(1)).unwrap(); // adopts the namespace, fenced: the sweeper starts
    let pass = engine
        .sweeper()
        .expect("a sweeper")
        .sweep_now(Duration::from_secs(10))
        .expect("a pass");
    let swept = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the pass is told");
    assert!(matches!(swept, Event::Swept { pass: p, .. } if p == pass));
}

#[test]
fn e8_the_engine_hears_the_events_of_the_store_it_opened() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, rx) = channel_listener();
    let engine = Engine::builder(Arc::new(TestMachine::default()))
        .directory(dir.path())
        .file_store(|b| b.stall_threshold(Duration::ZERO))
        .pool_threads(2)
        .listener(listener)
        .open()
        .unwrap();
    // Opening wrote through the store already: stalls, each sync slower than nothing.
    let _ = rx.try_iter().count();
    engine.register(&entity(1)).unwrap();
    engine.append(&entity(1), recs(&["a"])).unwrap();
    let told = names(&rx);
    assert!(
        !told.is_empty() && told.iter().all(|n| *n == "commit_stall"),
        "{told:?}"
    );
    let stats = engine.stats();
    assert!(stats.store.stalls >= told.len() as u64);
    assert_eq!(stats.degraded, None);
}

/// An engine whose listener calls back into it (stats, a read and a write of another entity)
/// on every event (bounded), over a workload that emits from restore, the write path, the
/// owners' map (a deposition) and fencing.
fn calls_back(at_emit: bool) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let slot: Arc<OnceLock<TestEngine>> = Arc::new(OnceLock::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (me, log) = (Arc::clone(&slot), Arc::clone(&seen));
    let listener: Arc<dyn Listener> = Arc::new(move |e: &Event| {
        let mut seen = log.lock();
        seen.push(e.name());
        let n = seen.len();
        drop(seen);
        let Some(engine) = me.get() else { return };
        let _ = engine.stats();
        let _ = engine.read(&entity(9), |s| s.records.len());
        if n < 20 {
            let _ = engine.append(&entity(9), recs(&["side"]));
        }
    });
    let a = owner_builder(&machine, &store, "a");
    let a = if at_emit {
        a.listener_at_emit_for_test(listener)
    } else {
        a.listener(listener)
    }
    .open()
    .unwrap();
    let _ = slot.set(a.clone());
    let ns = entity(1).namespace().clone();
    a.own(&ns).unwrap();
    a.register(&entity(9)).unwrap();
    a.register(&entity(1)).unwrap();
    a.append(&entity(1), recs(&["ok"])).unwrap();
    let _ = a.try_write(&entity(1), |_| -> Result<(Vec<Vec<u8>>, ()), Rejection> {
        Err(Rejection::new("no"))
    });
    let _ = a.append(&entity(1), recs(&["!refuse"])); // contained
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    b.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&b, &ns);
    b.own(&ns).unwrap();
    let _ = a.append(&entity(9), recs(&["late"])); // fenced: a is deposed
    let seen = seen.lock().clone();
    for name in ["refused", "contained", "deposed"] {
        assert!(seen.contains(&name), "{name} was not told: {seen:?}");
    }
}

#[test]
fn e8_a_listener_that_calls_back_into_the_engine_does_not_deadlock() {
    within("an engine whose listener calls back into it", || {
        calls_back(false)
    });
}

/// The negative control of the lock rule: handed over where it is emitted (the deposition,
/// under the owners' map), the same listener deadlocks.
#[test]
fn control_engine_events_handed_over_under_the_emitters_lock_deadlock_a_listener_that_calls_back() {
    common::engine::stays_deadlocked(|| calls_back(true));
}

#[test]
fn e8_close_from_inside_a_listener_is_refused_not_a_deadlock() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let slot: Arc<OnceLock<TestEngine>> = Arc::new(OnceLock::new());
    let answer = Arc::new(Mutex::new(None));
    let (me, out) = (Arc::clone(&slot), Arc::clone(&answer));
    let engine = builder(&machine, &store)
        .listener(Arc::new(move |_: &Event| {
            if let Some(engine) = me.get() {
                *out.lock() = Some(engine.close());
            }
        }))
        .open()
        .unwrap();
    let _ = slot.set(engine.clone());
    engine.register(&entity(1)).unwrap();
    let _ = engine.try_write(&entity(1), |_| -> Result<(Vec<Vec<u8>>, ()), Rejection> {
        Err(Rejection::new("no"))
    });
    assert!(matches!(
        answer.lock().take(),
        Some(Err(Error::WouldDeadlock { .. }))
    ));
    engine.close().unwrap();
}

/// The engine's budgets are in its stats beside what they bound, and the store's budget too
/// when the engine opened the store.
#[test]
fn e8_the_engine_stats_carry_the_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::builder(Arc::new(TestMachine::default()))
        .directory(dir.path())
        .max_resident_entities(2)
        .max_loaded_partitions(3)
        .open()
        .unwrap();
    for i in 1..=4 {
        engine.register(&entity(i)).unwrap();
        engine.append(&entity(i), recs(&["a"])).unwrap();
    }
    let stats = engine.stats();
    assert_eq!(stats.max_resident_entities, Some(2));
    assert_eq!(stats.passivation.budget, Some(2));
    assert_eq!(stats.store.max_loaded_partitions, Some(3));
    assert_eq!(stats.phases.entities, 4);
    assert_eq!(stats.namespaces.len(), 1);
}

/// A warm that cannot restore an entity (its store read fails) tells which one and why, and
/// counts it as refused. The I/O error contained the entity (SPEC R4, told first); released,
/// it restores on its next touch once the store answers.
#[test]
fn e8_an_entity_the_warm_could_not_restore_is_told() {
    let store = closed_with(3, &["a", "b"]);
    let (listener, rx) = channel_listener();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).listener(listener).open().unwrap();
    *store.fail_reads_of.lock() = Some(entity(1).partition());
    let progress = engine.warm().unwrap().wait().unwrap();
    assert_eq!((progress.done, progress.refused), (3, 1), "{progress:?}");
    // Told on the warm's workers, the last after its waiters woke: wait for the summary.
    let mut told = Vec::new();
    for event in rx.iter() {
        let last = matches!(event, Event::WarmFinished { .. });
        told.push(event);
        if last {
            break;
        }
    }
    let about_e1: Vec<(&str, String)> = told
        .iter()
        .filter_map(|e| match e {
            Event::Contained { entity: who, .. } if *who == entity(1) => {
                Some(("contained", String::new()))
            }
            Event::WarmFailed {
                entity: who, error, ..
            } if *who == entity(1) => Some(("warm_failed", error.clone())),
            _ => None,
        })
        .collect();
    assert!(
        matches!(about_e1.as_slice(), [("contained", _), ("warm_failed", error)] if error.contains("injected read failure")),
        "{told:?}"
    );
    *store.fail_reads_of.lock() = None;
    assert!(matches!(
        engine.read(&entity(1), |_| ()),
        Err(Error::Contained { .. })
    ));
    assert!(engine.release(&entity(1)).unwrap());
    assert_eq!(
        common::engine::payloads(&engine, &entity(1)).unwrap(),
        recs(&["a", "b"])
    );
}
