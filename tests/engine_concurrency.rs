//! Concurrency of restore: the herd on one gate (R2), many entities touched from many threads
//! while a warm runs (R2, R6), stopping a warm (R6), independence of entities (R2), and
//! whole-engine answers (R7). Bounded in threads and time; no test sleeps to synchronise.

mod common;

use std::sync::{Arc, Barrier, OnceLock};
use std::time::Duration;

use common::engine::{TestEngine, TestMachine, TestStore, builder, entity, until};
use crossbeam::channel;
use portcullis::Error;
use portcullis::log;
use portcullis::store::Batch;

/// Registers `n` entities with `records` records each, then closes, so they reopen pending.
fn seeded(n: usize, records: usize) -> Arc<TestStore> {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    for i in 0..n {
        engine.register(&entity(i)).unwrap();
        if records > 0 {
            let recs = (0..records).map(|r| vec![r as u8]).collect();
            engine.append(&entity(i), recs).unwrap();
        }
    }
    engine.close().unwrap();
    store
}

#[test]
fn r2_herd_of_64_touches_runs_one_unit_and_shares_its_outcome() {
    const THREADS: usize = 64;
    let store = seeded(1, 3);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let handle: Arc<OnceLock<TestEngine>> = Arc::new(OnceLock::new());
    handle.set(engine.clone()).ok().unwrap();
    {
        let handle = Arc::clone(&handle);
        // Hold the unit until every other toucher is parked on the gate.
        machine.set_hook(move |_| {
            let engine = handle.get().unwrap();
            until(|| engine.stats().phases.waiting >= (THREADS - 1) as u64);
        });
    }
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let engine = engine.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                engine
                    .read(&entity(0), |s| s.records.clone())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(machine.units_of(&entity(0)), 1);
    assert_eq!(engine.stats().units_run, 1);
    assert!(outcomes.iter().all(|o| o == &outcomes[0]));
    assert_eq!(outcomes[0].as_ref().unwrap().len(), 3);
}

#[test]
fn r2_herd_on_a_refusing_entity_gets_one_refusal() {
    const THREADS: usize = 64;
    let store = seeded(1, 1);
    let p = entity(0).partition();
    log::append(&*store, &p, &[b"!refuse".to_vec()], Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let engine = engine.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                engine.read(&entity(0), |_| ()).unwrap_err().to_string()
            })
        })
        .collect();
    let outcomes: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(outcomes.iter().all(|o| o == &outcomes[0]));
    assert!(outcomes[0].contains("apply-refusal"), "{}", outcomes[0]);
    assert_eq!(machine.units_of(&entity(0)), 1);
}

/// A small deterministic shuffle (xorshift), so each thread touches in its own order.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

#[test]
fn r2_r6_ten_thousand_entities_from_eight_threads_during_a_warm_restore_once_each() {
    const N: usize = 10_000;
    const THREADS: usize = 8;
    let store = seeded(N, 1);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .warm_parallelism(4)
        .open()
        .unwrap();
    assert_eq!(engine.stats().phases.pending, N as u64);
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = engine.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                for i in shuffled(N, 0x9e37_79b9 + t as u64) {
                    let n = engine.read(&entity(i), |s| s.records.len()).unwrap();
                    assert_eq!(n, 1);
                }
            })
        })
        .collect();
    let warm = engine.warm().unwrap();
    barrier.wait();
    for t in threads {
        t.join().unwrap();
    }
    let progress = warm.wait().unwrap();
    assert!(progress.finished && !progress.stopped);
    assert_eq!(
        (progress.done, progress.total, progress.refused),
        (N as u64, N as u64, 0)
    );
    let units = machine.units.lock();
    assert_eq!(units.len(), N);
    assert!(
        units.values().all(|&n| n == 1),
        "some entity restored twice"
    );
    drop(units);
    let stats = engine.stats();
    assert_eq!(
        (stats.units_run, stats.phases.restored),
        (N as u64, N as u64)
    );
}

#[test]
fn r6_during_a_stop_a_touch_of_a_running_unit_answers_unavailable_at_once() {
    let store = seeded(5, 1);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .warm_parallelism(1)
        .open()
        .unwrap();
    let blocked = entity(3);
    let (entered_tx, entered_rx) = channel::bounded::<()>(1);
    let (go_tx, go_rx) = channel::bounded::<()>(1);
    {
        let blocked = blocked.clone();
        machine.set_hook(move |e| {
            if *e == blocked {
                entered_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }
        });
    }
    let warm = engine.warm().unwrap();
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the warm reached the entity");
    // One toucher parks on the gate before the stop...
    let early = {
        let engine = engine.clone();
        let blocked = blocked.clone();
        std::thread::spawn(move || engine.read(&blocked, |_| ()))
    };
    until(|| engine.stats().phases.waiting == 1);
    warm.stop();
    // ...and is woken with Unavailable; a toucher arriving during the stop gets it at once.
    let (late_tx, late_rx) = channel::bounded(1);
    {
        let engine = engine.clone();
        let blocked = blocked.clone();
        std::thread::spawn(move || late_tx.send(engine.read(&blocked, |_| ())).unwrap());
    }
    let late = late_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the touch did not wait");
    assert!(matches!(late, Err(Error::Unavailable { .. })), "{late:?}");
    assert!(matches!(
        early.join().unwrap(),
        Err(Error::Unavailable { .. })
    ));
    // Let the unit finish: the stop drains, and the entity was restored exactly once.
    go_tx.send(()).unwrap();
    let progress = warm.wait().unwrap();
    assert!(progress.finished && progress.stopped);
    // One worker: it restored the entities before the blocked one, then the blocked one, and
    // started nothing after the stop.
    assert_eq!(engine.stats().phases.restored, progress.done);
    assert_eq!(engine.read(&blocked, |s| s.records.len()).unwrap(), 1);
    assert_eq!(machine.units_of(&blocked), 1);
    // After the stop, everything still pending restores on touch.
    for i in 0..5 {
        engine.read(&entity(i), |_| ()).unwrap();
    }
    assert_eq!(engine.stats().units_run, 5);
}

#[test]
fn r2_a_blocked_unit_never_delays_another_entity() {
    let store = seeded(2, 1);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let (entered_tx, entered_rx) = channel::bounded::<()>(1);
    let (go_tx, go_rx) = channel::bounded::<()>(1);
    machine.set_hook(move |e| {
        if *e == entity(0) {
            entered_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        }
    });
    let slow = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.read(&entity(0), |s| s.records.len()))
    };
    entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let (tx, rx) = channel::bounded(1);
    {
        let engine = engine.clone();
        std::thread::spawn(move || {
            tx.send(engine.read(&entity(1), |s| s.records.len()))
                .unwrap()
        });
    }
    let other = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("entity 1 waited on entity 0");
    assert_eq!(other.unwrap(), 1);
    go_tx.send(()).unwrap();
    assert_eq!(slow.join().unwrap().unwrap(), 1);
}

#[test]
fn r7_whole_engine_answers_fold_every_entity_after_the_warm() {
    let store = seeded(20, 0);
    {
        let machine = Arc::new(TestMachine::default());
        let engine = builder(&machine, &store).open().unwrap();
        for i in 0..20 {
            let recs = (0..i).map(|r| vec![r as u8]).collect::<Vec<_>>();
            if !recs.is_empty() {
                engine.append(&entity(i), recs).unwrap();
            }
        }
        engine.close().unwrap();
    }
    let p = entity(5).partition();
    log::append(&*store, &p, &[b"!refuse".to_vec()], Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let (total, contained) = engine
        .fold_all(0usize, |acc, _, s| acc + s.records.len())
        .unwrap();
    assert_eq!(contained, 1);
    assert_eq!(total, (0..20).sum::<usize>() - 5);
    assert_eq!(engine.stats().phases.pending, 0);
    assert_eq!(engine.stats().units_run, 20);
}
