//! Locking rules for application code (SPEC R11, R2, R3): metrics hooks run with no internal
//! lock held and may call back in; closures that hold an entity are refused (never deadlocked)
//! when they call back in for an entity; restore units that touch each other in a cycle are
//! refused instead of waiting forever; a slow deferral stalls nobody else. No test sleeps to
//! synchronise: barriers and channels order the threads, and `within` only bounds a hang.

mod common;

use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, closed_with, entity, payloads, recs, within,
    writes_deferral,
};
use crossbeam::channel;
use parking_lot::Mutex;
use portcullis::engine::OwnerSwitches;
use portcullis::restore::{Containment, Metrics};
use portcullis::{EntityId, Error};

/// Registers `n` entities with one record each and closes, so they reopen pending.
fn seeded(n: usize) -> Arc<TestStore> {
    closed_with(n, &["r"])
}

fn is_would_deadlock<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(e @ Error::WouldDeadlock { .. }) if e.code() == 13)
}

/// A metrics hook that calls back into the engine from every hook it receives.
#[derive(Default)]
struct CallsBack {
    engine: OnceLock<TestEngine>,
    seen: Mutex<Vec<String>>,
}

impl CallsBack {
    fn engine(&self) -> &TestEngine {
        self.engine.get().expect("set after open")
    }
}

impl Metrics for CallsBack {
    fn deferred(&self, entity: &EntityId, _: usize) {
        let stats = self.engine().stats();
        let pending = self.engine().containment(entity).map(|c| c.is_none());
        self.seen.lock().push(format!(
            "deferred {entity}: {} pending, not contained: {pending:?}",
            stats.phases.pending
        ));
    }

    fn appended(&self, entity: &EntityId, records: u64, _: u64) {
        let folded = self.engine().read(entity, |s| s.records.len());
        self.seen
            .lock()
            .push(format!("appended {records} to {entity}: read {folded:?}"));
    }

    fn entity_contained(&self, entity: &EntityId, reason: &Containment, _: Duration) {
        let again = self.engine().containment(entity).map(|c| c.map(|c| c.kind));
        let stats = self.engine().stats();
        self.seen.lock().push(format!(
            "contained {entity} ({}): {again:?}, {} contained",
            reason.kind.name(),
            stats.phases.contained
        ));
    }
}

/// R11: metrics hooks run with no internal lock held, so a hook may call `stats`, `containment`
/// or even `read` of the entity it reports on.
#[test]
fn r11_metrics_hooks_may_call_back_into_the_engine() {
    let store = seeded(2);
    let machine = Arc::new(TestMachine::default());
    let hook = Arc::new(CallsBack::default());
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&hook) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    hook.engine.set(engine.clone()).ok().unwrap();
    let (a, b) = (entity(0), entity(1));
    {
        let engine = engine.clone();
        let a = a.clone();
        within("a deferral whose hook calls stats", move || {
            engine.defer(&a, b"d".to_vec()).unwrap()
        });
    }
    {
        let engine = engine.clone();
        let b = b.clone();
        within("an append whose hook reads the same entity", move || {
            engine.append(&b, recs(&["x"])).unwrap()
        });
    }
    {
        let engine = engine.clone();
        let b = b.clone();
        let refused = within("a write whose refusal hook calls back", move || {
            engine.append(&b, recs(&["!refuse"]))
        });
        assert!(
            matches!(refused, Err(Error::Contained { .. })),
            "{refused:?}"
        );
    }
    let seen = hook.seen.lock().clone();
    assert_eq!(
        seen,
        vec![
            format!("deferred {a}: 2 pending, not contained: Ok(true)"),
            format!("appended 1 to {b}: read Ok(2)"),
            format!("contained {b} (apply-refusal): Ok(Some(ApplyRefusal)), 1 contained"),
        ]
    );
}

/// R11: a slow deferral (its store write blocked) does not stall the warm's listing of pending
/// entities, `stats`, or the first touch of another entity.
#[test]
fn r11_a_slow_deferral_stalls_nobody_else() {
    let store = seeded(3);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let (entered_tx, entered_rx) = channel::bounded::<()>(1);
    let (go_tx, go_rx) = channel::bounded::<()>(1);
    store.set_before_apply(move |_, batch| {
        if writes_deferral(batch) {
            entered_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        }
    });
    let deferring = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.defer(&entity(0), b"slow".to_vec()))
    };
    entered_rx.recv().unwrap();
    {
        let engine = engine.clone();
        let pending = within("stats during a slow deferral", move || {
            engine.stats().phases.pending
        });
        assert_eq!(pending, 3);
    }
    {
        let engine = engine.clone();
        within("a warm started during a slow deferral", move || {
            engine.warm().unwrap()
        });
    }
    {
        let engine = engine.clone();
        let n = within("a first touch during a slow deferral", move || {
            engine.read(&entity(2), |s| s.records.len()).unwrap()
        });
        assert_eq!(n, 1);
    }
    go_tx.send(()).unwrap();
    deferring.join().unwrap().unwrap();
    store.clear_hooks();
    engine.current_warm().unwrap().wait().unwrap();
    assert_eq!(payloads(&engine, &entity(0)).unwrap(), recs(&["r", "slow"]));
}

/// R11: closures run while the engine holds their entity. Calling back in for an entity from
/// there is refused with `WouldDeadlock` (code 13) instead of hanging; calls that touch no
/// entity (stats, containment) are fine.
#[test]
fn r11_closures_that_call_back_for_an_entity_are_refused_not_deadlocked() {
    let store = seeded(2);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let (a, b) = (entity(0), entity(1));
    let inner = {
        let engine = engine.clone();
        let (a, b) = (a.clone(), b.clone());
        within("a read closure calling back in", move || {
            engine
                .read(&a, |_| {
                    (
                        engine.read(&a, |s| s.records.len()),
                        engine.read(&b, |s| s.records.len()),
                        engine.append(&a, recs(&["x"])),
                        engine.defer(&b, b"x".to_vec()),
                        engine.checkpoint(&a),
                        engine.close(),
                        engine.stats().phases.restored,
                        engine.containment(&a).map(|c| c.is_none()),
                    )
                })
                .unwrap()
        })
    };
    assert!(is_would_deadlock(&inner.0), "{:?}", inner.0);
    assert!(is_would_deadlock(&inner.1), "{:?}", inner.1);
    assert!(is_would_deadlock(&inner.2), "{:?}", inner.2);
    assert!(is_would_deadlock(&inner.3), "{:?}", inner.3);
    assert!(is_would_deadlock(&inner.4), "{:?}", inner.4);
    assert!(is_would_deadlock(&inner.5), "{:?}", inner.5);
    assert_eq!(inner.6, 1);
    assert!(inner.7.unwrap());
    let from_decide = {
        let engine = engine.clone();
        let a = a.clone();
        within("a write's decide calling back in", move || {
            engine
                .write(&a, |_| {
                    let inner = engine.read(&a, |_| ());
                    (recs(&["y"]), inner)
                })
                .unwrap()
        })
    };
    assert!(is_would_deadlock(&from_decide.value));
    let from_fold = {
        let engine = engine.clone();
        let b = b.clone();
        within("a fold_all closure calling back in", move || {
            engine
                .fold_all(Vec::new(), |mut acc, _, _| {
                    acc.push(is_would_deadlock(&engine.read(&b, |_| ())));
                    acc.push(is_would_deadlock(&engine.fold_all((), |_, _, _| ())));
                    acc
                })
                .unwrap()
        })
    };
    assert_eq!(from_fold.0, vec![true; 4]);
    // Nothing was left held: the engine serves normally afterwards.
    assert_eq!(payloads(&engine, &a).unwrap(), recs(&["r", "y"]));
    assert_eq!(payloads(&engine, &b).unwrap(), recs(&["r"]));
    engine.close().unwrap();
}

/// R11, R2: a unit of A that touches B while a unit of B touches A: one of the two inner
/// touches is refused with `WouldDeadlock`, the other waits and succeeds, and both entities
/// restore (each exactly once).
#[test]
fn r11_units_that_touch_each_other_are_refused_not_deadlocked() {
    let store = seeded(2);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let handle: Arc<OnceLock<TestEngine>> = Arc::new(OnceLock::new());
    handle.set(engine.clone()).ok().unwrap();
    type Seen = Vec<(EntityId, Result<usize, u32>)>;
    let inner: Arc<Mutex<Seen>> = Arc::default();
    let both_inside = Arc::new(Barrier::new(2));
    {
        let handle = Arc::clone(&handle);
        let inner = Arc::clone(&inner);
        let both_inside = Arc::clone(&both_inside);
        machine.set_hook(move |e| {
            let other = if *e == entity(0) {
                entity(1)
            } else {
                entity(0)
            };
            // Both units are running before either touches the other.
            both_inside.wait();
            let engine = handle.get().unwrap();
            let seen = engine
                .read(&other, |s| s.records.len())
                .map_err(|e| e.code());
            inner.lock().push((e.clone(), seen));
        });
    }
    let (done_tx, done_rx) = channel::unbounded();
    for i in 0..2 {
        let engine = engine.clone();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            let outer = engine.read(&entity(i), |s| s.records.len());
            done_tx.send((i, outer)).unwrap();
        });
    }
    for _ in 0..2 {
        let (i, outer) = done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("two units touching each other deadlocked");
        assert_eq!(outer.unwrap(), 1, "entity {i} restored");
    }
    let inner = inner.lock().clone();
    assert_eq!(inner.len(), 2);
    let refused: Vec<_> = inner.iter().filter(|(_, r)| *r == Err(13)).collect();
    let served: Vec<_> = inner.iter().filter(|(_, r)| *r == Ok(1)).collect();
    assert_eq!((refused.len(), served.len()), (1, 1), "{inner:?}");
    assert_eq!(machine.units_of(&entity(0)), 1);
    assert_eq!(machine.units_of(&entity(1)), 1);
    assert_eq!(engine.stats().units_run, 2);
}

/// R11, R6: `Warm::wait` waits for every warm worker, so called from inside a restore unit (a
/// warm worker's own unit, which the warm cannot finish without) or from a closure that holds
/// an entity it would wait for itself. It is refused with `WouldDeadlock` instead of hanging;
/// from outside any call it waits as before.
#[test]
fn r11_warm_wait_from_inside_a_unit_or_closure_is_refused_not_deadlocked() {
    let store = seeded(2);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .warm_parallelism(1)
        .open()
        .unwrap();
    let (warm_tx, warm_rx) = channel::unbounded::<portcullis::restore::Warm>();
    let inner: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let inner = Arc::clone(&inner);
        machine.set_hook(move |_| {
            // The unit runs on the warm's only worker; the warm cannot finish before it.
            let warm = warm_rx.recv().unwrap();
            inner.lock().push(format!("{:?}", warm.wait()));
        });
    }
    let warm = engine.warm().unwrap();
    for _ in 0..2 {
        warm_tx.send(warm.clone()).unwrap();
    }
    let progress = {
        let warm = warm.clone();
        within("a warm whose unit waits for it", move || warm.wait())
    };
    let inner = inner.lock().clone();
    assert_eq!(inner.len(), 2, "{inner:?}");
    assert!(
        inner.iter().all(|r| r.contains("WouldDeadlock")),
        "{inner:?}"
    );
    let progress = progress.unwrap();
    assert!(progress.finished && progress.refused == 0, "{progress:?}");
    let from_closure = {
        let engine = engine.clone();
        within("a read closure waiting for the warm", move || {
            engine
                .read(&entity(0), |_| format!("{:?}", warm.wait()))
                .unwrap()
        })
    };
    assert!(from_closure.contains("WouldDeadlock"), "{from_closure}");
    engine.close().unwrap();
}

/// A `deferred` hook that reads the entity it reports on, and what the read saw.
#[derive(Default)]
struct ReadsDeferred {
    engine: OnceLock<TestEngine>,
    seen: Mutex<Vec<String>>,
}

impl Metrics for ReadsDeferred {
    fn deferred(&self, entity: &EntityId, _: usize) {
        let engine = self.engine.get().expect("set after open");
        let folded = engine.read(entity, |s| s.records.len());
        self.seen.lock().push(format!("{entity}: {folded:?}"));
    }
}

fn deferral_whose_hook_reads(switches: OwnerSwitches) -> (TestEngine, Arc<ReadsDeferred>) {
    let store = seeded(1);
    let machine = Arc::new(TestMachine::default());
    let hook = Arc::new(ReadsDeferred::default());
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&hook) as Arc<dyn Metrics>)
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    hook.engine.set(engine.clone()).ok().unwrap();
    (engine, hook)
}

/// R11, R8: the `deferred` hook runs once the deferral's row is written and the entity's gate
/// no longer counts it, so a hook that reads that very entity restores it (the deferred record
/// folded) instead of waiting for its own deferral for ever.
#[test]
fn r11_a_deferred_hook_may_read_the_entity_it_reports_on() {
    let (engine, hook) = deferral_whose_hook_reads(OwnerSwitches::default());
    let deferred = {
        let engine = engine.clone();
        within("a deferral whose hook reads the same entity", move || {
            engine.defer(&entity(0), b"d".to_vec())
        })
    };
    assert_eq!(deferred.unwrap(), portcullis::engine::Deferred::Queued);
    assert_eq!(*hook.seen.lock(), vec![format!("{}: Ok(2)", entity(0))]);
    assert_eq!(payloads(&engine, &entity(0)).unwrap(), recs(&["r", "d"]));
    engine.close().unwrap();
}

/// The negative control of the test above: with the hook run while the deferral still counts
/// in the gate (`OwnerSwitches::deferred_hook_under_gate`), the hook's read parks on the gate
/// that its own thread holds open: a deadlock (seen as a waiter that never leaves).
#[test]
fn r11_negative_control_a_deferred_hook_under_the_gate_deadlocks() {
    let switches = OwnerSwitches {
        deferred_hook_under_gate: true,
        ..OwnerSwitches::default()
    };
    let (engine, hook) = deferral_whose_hook_reads(switches);
    let stuck = engine.clone();
    std::thread::spawn(move || stuck.defer(&entity(0), b"d".to_vec()));
    common::engine::until(|| engine.stats().phases.waiting == 1);
    assert!(hook.seen.lock().is_empty(), "the hook's read never returns");
    // The parked thread waits for itself for ever: the engine is leaked with it.
    std::mem::forget(engine);
}

/// What a state's destructor runs, if anything.
type OnDrop = Arc<Mutex<Option<Arc<dyn Fn() + Send + Sync>>>>;

/// A state whose destructor runs a hook (application code calling back into the engine).
struct Noisy {
    on_drop: OnDrop,
}

struct NoisyState {
    on_drop: OnDrop,
}

impl Drop for NoisyState {
    fn drop(&mut self) {
        let hook = self.on_drop.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }
}

impl portcullis::StateMachine for Noisy {
    type State = NoisyState;
    fn fresh(&self, _: &EntityId) -> NoisyState {
        NoisyState {
            on_drop: Arc::clone(&self.on_drop),
        }
    }
    fn apply(
        &self,
        _: &mut NoisyState,
        _: &portcullis::ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), portcullis::Rejection> {
        if record == b"!refuse" {
            return Err(portcullis::Rejection::new("refused"));
        }
        Ok(())
    }
    fn encode_checkpoint(&self, _: &NoisyState) -> Result<Vec<u8>, portcullis::Rejection> {
        Ok(Vec::new())
    }
    fn decode_checkpoint(
        &self,
        _: &EntityId,
        _: &[u8],
    ) -> Result<NoisyState, portcullis::Rejection> {
        Ok(self.fresh(&entity(0)))
    }
}

/// Releases a contained entity whose state's destructor asks the engine for that entity's
/// containment; answers what the destructor saw, or `None` if the release deadlocked.
fn release_with_a_noisy_destructor(switches: OwnerSwitches) -> Option<Vec<String>> {
    let on_drop: OnDrop = Arc::default();
    let store = TestStore::new();
    let engine = portcullis::Engine::builder(Noisy {
        on_drop: Arc::clone(&on_drop),
    })
    .store(store as Arc<dyn portcullis::store::Store>)
    .background_warm(false)
    .owner_switches_for_test(switches)
    .open()
    .unwrap();
    let e = entity(0);
    engine.register(&e).unwrap();
    let err = engine.append(&e, recs(&["!refuse"])).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let (engine, seen, e) = (engine.clone(), Arc::clone(&seen), e.clone());
        *on_drop.lock() = Some(Arc::new(move || {
            let contained = engine.containment(&e).map(|c| c.is_some());
            seen.lock().push(format!("{contained:?}"));
        }));
    }
    let (tx, rx) = channel::bounded(1);
    {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let _ = tx.send(engine.release(&e));
        });
    }
    match rx.recv_timeout(Duration::from_secs(3)) {
        Ok(released) => {
            assert!(released.unwrap());
            *on_drop.lock() = None;
            let seen = seen.lock().clone();
            engine.close().unwrap();
            Some(seen)
        }
        Err(_) => {
            std::mem::forget(engine); // deadlocked: its threads keep it
            None
        }
    }
}

/// R11: `release` drops a contained entity's state with no internal lock held: its destructor
/// is application code and may call back into the engine (here for the same entity's
/// containment, which it finds released). Before, it ran under the entity's state lock and gate,
/// and that call deadlocked.
#[test]
fn r11_release_runs_the_state_destructor_with_no_lock_held() {
    let seen = release_with_a_noisy_destructor(OwnerSwitches::default())
        .expect("the release deadlocked in the state's destructor");
    assert_eq!(seen, vec!["Ok(false)".to_owned()]);
}

/// The negative control: with the destructor run under the locks
/// (`OwnerSwitches::drop_state_under_locks`), the release deadlocks.
#[test]
fn r11_negative_control_a_destructor_under_the_locks_deadlocks_the_release() {
    let switches = OwnerSwitches {
        drop_state_under_locks: true,
        ..OwnerSwitches::default()
    };
    assert!(release_with_a_noisy_destructor(switches).is_none());
}
