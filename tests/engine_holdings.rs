//! State belongs to the holding it was restored under (SPEC F11, F12, R2, R11): an engine that
//! adopts a namespace again (after a take-over, a bump of its own, a release) never serves or
//! installs state restored under its earlier holding, and the re-adoption waits for no entity a
//! call still holds. Hangs are bounded by `within` (a watchdog naming what hung); nothing
//! sleeps to synchronise: channels and store hooks order the threads.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{
    TestMachine, TestStore, builder, entity, ns, owner_builder, payloads, recs, revoke_to_complete,
    within,
};
use crossbeam::channel;
use portcullis::engine::{OwnerSwitches, TakeOver};
use portcullis::{EntityId, Error, Namespace};

/// Whether a batch writes a namespace's owner row.
fn writes_owner_row(batch: &portcullis::store::Batch) -> bool {
    batch.ops().iter().any(|op| match op {
        portcullis::store::Op::Put(k, _) => k.as_slice() == b"engine.owner",
        _ => false,
    })
}

/// Runs the scenario of the R11 test below with `switches`; answers `None` if it did not end
/// within `bound` (a deadlock), else what the closure's `verify_checkpoint` answered and how
/// many units restored entity 1.
fn readoption_while_a_closure_holds_an_entity(
    switches: OwnerSwitches,
    bound: Duration,
) -> Option<(String, u64, Vec<Vec<u8>>)> {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .owner("a")
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    let x = entity(1);
    engine.register(&x).unwrap();
    engine.append(&x, recs(&["x1"])).unwrap();
    let elsewhere = EntityId::new("elsewhere", "y").unwrap();
    let (in_closure_tx, in_closure) = channel::bounded::<()>(1);
    let (adopting_tx, adopting) = channel::bounded::<()>(1);
    // The re-adoption's owner-row write: it holds `adopting` from here on.
    store.set_before_apply(move |p, batch| {
        if p.as_bytes() == b"c/test" && writes_owner_row(batch) {
            let _ = adopting_tx.try_send(());
        }
    });
    let (done_tx, done) = channel::bounded(2);
    {
        let engine = engine.clone();
        let x = x.clone();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            let answer = engine.read(&x, |_| {
                in_closure_tx.send(()).unwrap();
                adopting.recv().unwrap();
                // A first use of a namespace not adopted yet, from a closure (documented as
                // allowed): it adopts, so it needs `adopting`.
                format!("{:?}", engine.verify_checkpoint(&elsewhere))
            });
            let _ = done_tx.send(answer.unwrap());
        });
    }
    in_closure.recv().unwrap();
    {
        let engine = engine.clone();
        std::thread::spawn(move || {
            // The engine bumps its own namespace and adopts it again at the new epoch.
            engine.bump_epoch(&ns(), 1).unwrap();
            revoke_to_complete(&engine, &ns());
            let _ = done_tx.send(format!("{:?}", engine.own(&ns())));
        });
    }
    let mut answers = Vec::new();
    for _ in 0..2 {
        match done.recv_timeout(bound) {
            Ok(answer) => answers.push(answer),
            Err(_) => {
                // Deadlocked: the stuck threads keep the engine.
                std::mem::forget(engine);
                return None;
            }
        }
    }
    store.clear_hooks();
    let verified = answers
        .into_iter()
        .find(|a| a.contains("UnknownEntity") || a.contains("Err"))
        .unwrap_or_default();
    let records = payloads(&engine, &x).unwrap();
    let units = machine.units_of(&x);
    engine.close().unwrap();
    Some((verified, units, records))
}

/// R11, F11: a re-adoption forgets the state restored under the old holding only once it no
/// longer holds the `adopting` mutex, and waits for no entity in use. Before, it waited for
/// each entity's state lock under that mutex, so a `read` closure that called
/// `verify_checkpoint` of a namespace not adopted yet (a first use, which adopts) closed a
/// cycle. The entity the closure held is restored again at its next touch.
#[test]
fn r11_a_readoption_waits_for_no_entity_a_closure_holds() {
    let (verified, units, records) = within("a re-adoption racing a closure", || {
        readoption_while_a_closure_holds_an_entity(
            OwnerSwitches::default(),
            Duration::from_secs(10),
        )
    })
    .expect("a re-adoption and a closure adopting another namespace deadlocked");
    assert!(verified.contains("UnknownEntity"), "{verified}");
    assert_eq!(records, recs(&["x1"]));
    assert_eq!(
        units, 2,
        "state restored under the old holding is restored again"
    );
}

/// The negative control of the test above: with the state forgotten under `adopting`, waiting
/// for each state lock (`OwnerSwitches::readopt_under_adopting`), the two calls deadlock.
#[test]
fn r11_negative_control_forgetting_under_the_adopting_mutex_deadlocks() {
    let switches = OwnerSwitches {
        readopt_under_adopting: true,
        ..OwnerSwitches::default()
    };
    let outcome = readoption_while_a_closure_holds_an_entity(switches, Duration::from_secs(3));
    assert!(outcome.is_none(), "expected a deadlock, got {outcome:?}");
}

/// What the unit of entity 1 in engine `a` saw when it spanned a re-adoption, and what a write
/// after it did.
struct Spanned {
    read: Vec<Vec<u8>>,
    log: Vec<Vec<u8>>,
    append: Result<(), Error>,
    repairs: Vec<(EntityId, u64)>,
}

/// Owner `a` holds the namespace; entity 1 is pending in `a` (passivated). A read in `a` starts
/// its unit, which pauses once it has read the head. Meanwhile `b` takes the namespace over
/// (forced: `a` is live), writes `b1` to entity 1 and crashes; then `a` takes it back (`b`'s
/// lease has lapsed). Then the paused unit goes on.
fn unit_spanning_a_readoption(switches: OwnerSwitches) -> Spanned {
    let store = TestStore::new();
    let machine_a = Arc::new(TestMachine::default());
    let machine_b = Arc::new(TestMachine::default());
    *machine_a.repair_records.lock() = recs(&["fix-a"]);
    *machine_b.repair_records.lock() = recs(&["fix-b"]);
    let a = owner_builder(&machine_a, &store, "a")
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    let b = owner_builder(&machine_b, &store, "b").open().unwrap();
    let space: Namespace = ns();
    let x = entity(1);
    a.own(&space).unwrap();
    a.register(&x).unwrap();
    a.append(&x, recs(&["a1"])).unwrap();
    assert!(a.passivate(&x).unwrap());
    let (started_tx, started) = channel::bounded::<()>(1);
    let (go_tx, go) = channel::bounded::<()>(1);
    let first = std::sync::atomic::AtomicBool::new(true);
    machine_a.set_hook(move |_| {
        // Only the first unit pauses.
        if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            started_tx.send(()).unwrap();
            go.recv().unwrap();
        }
    });
    let reader = {
        let a = a.clone();
        let x = x.clone();
        std::thread::spawn(move || payloads(&a, &x))
    };
    started.recv().unwrap();
    b.take_over(&space, TakeOver::new().force(true)).unwrap();
    b.append(&x, recs(&["b1"])).unwrap();
    common::engine::crash(b);
    a.take_over(&space, TakeOver::new()).unwrap();
    go_tx.send(()).unwrap();
    let read = reader.join().unwrap().unwrap();
    let append = a.append(&x, recs(&["a2"])).map(|_| ());
    let log = a
        .history(&x, 1)
        .unwrap()
        .map(|r| r.unwrap().payload)
        .collect();
    let repairs = machine_a.repairs.lock().clone();
    std::mem::forget(a);
    Spanned {
        read,
        log,
        append,
        repairs,
    }
}

/// F11, R3: a restore unit that started under one holding and ends after the namespace was
/// taken over and adopted again installs nothing: the entity is restored again under the new
/// holding, with the other owner's record and the repair owed for its term, and keeps serving.
/// Before, the unit installed state restored before the take-over: stale (no `b1`), its owed
/// repair skipped, and the next write found the log moved and contained the entity.
#[test]
fn f11_a_unit_that_spans_a_readoption_installs_nothing() {
    let spanned = within("a unit spanning a re-adoption", || {
        unit_spanning_a_readoption(OwnerSwitches::default())
    });
    // b's unit ran a's owed repair (fix-b); a's second unit ran b's (fix-a).
    assert_eq!(spanned.read, recs(&["a1", "fix-b", "b1", "fix-a"]));
    spanned.append.expect("the entity keeps serving");
    assert_eq!(spanned.log, recs(&["a1", "fix-b", "b1", "fix-a", "a2"]));
    assert_eq!(spanned.repairs.len(), 1, "{:?}", spanned.repairs);
}

/// The negative control: with state restored under an earlier holding installed and served
/// (`OwnerSwitches::stale_holding_served`), the read is stale and the next write contains the
/// entity.
#[test]
fn f11_negative_control_a_unit_spanning_a_readoption_installs_stale_state() {
    let switches = OwnerSwitches {
        stale_holding_served: true,
        ..OwnerSwitches::default()
    };
    let spanned = within("a unit spanning a re-adoption", move || {
        unit_spanning_a_readoption(switches)
    });
    assert_eq!(spanned.read, recs(&["a1"]), "stale state served");
    assert!(
        matches!(spanned.append, Err(Error::Contained { .. })),
        "{:?}",
        spanned.append
    );
    assert!(spanned.repairs.is_empty(), "the owed repair was skipped");
}
