//! Duties of the restore unit beyond replay (SPEC R3, R6, R8, R9): work the repair leaves
//! pending is drained before the entity is served, owed checkpoints are published before
//! deferred work is applied and again after a repair, the warm's summary names the entities it
//! refused, and what a warm asks the store per entity.

mod common;

use std::sync::Arc;

use common::engine::{TestMachine, TestStore, builder, crash, entity, payloads, recs};
use parking_lot::Mutex;
use portcullis::engine::Deferred;
use portcullis::log::{self, keys};
use portcullis::restore::Origin;
use portcullis::store::{Batch, Op, Store};

/// R3, R8: work deferred to an entity from inside its own unit (here by the unclean-restart
/// repair) is drained, in the same unit, before the entity is served.
#[test]
fn r3_work_the_repair_defers_is_drained_before_the_entity_is_served() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["fix"]);
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["one"])).unwrap();
        crash(engine);
    }
    let engine = builder(&machine, &store).open().unwrap();
    let deferred = Arc::new(Mutex::new(Vec::new()));
    {
        let engine = engine.clone();
        let deferred = Arc::clone(&deferred);
        *machine.on_repair.lock() = Some(Arc::new(move |e: &portcullis::EntityId| {
            deferred.lock().push(
                engine
                    .defer(e, b"follow-up".to_vec())
                    .map_err(|e| e.to_string()),
            );
        }));
    }
    machine.applied.lock().clear();
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        recs(&["one", "fix", "follow-up"])
    );
    assert_eq!(*deferred.lock(), vec![Ok(Deferred::Queued)]);
    let origins: Vec<_> = machine
        .applied
        .lock()
        .iter()
        .map(|(_, s, o)| (*s, *o))
        .collect();
    assert_eq!(
        origins,
        vec![
            (1, Origin::Replay),
            (2, Origin::Repair),
            (3, Origin::Deferred)
        ]
    );
    let rows = store
        .scan(
            &e.partition(),
            &portcullis::restore::keys::deferred_range(),
            None,
            10,
        )
        .unwrap();
    assert!(rows.entries.is_empty(), "nothing is left pending");
}

/// What one committed batch on the entity did, for the order check below.
fn kind_of(batch: &Batch) -> Option<String> {
    let mut kinds = Vec::new();
    for op in batch.ops() {
        match op {
            Op::Put(k, v) if *k == keys::checkpoint_key() => {
                let seq = log::Checkpoint::decode(&entity(1).partition(), v)
                    .unwrap()
                    .seq;
                kinds.push(format!("checkpoint at {seq}"));
            }
            Op::Delete(k) if k.starts_with(b"\0defer.") => kinds.push("deferred".to_owned()),
            Op::Put(k, _) if *k == portcullis::restore::keys::repair_key() => {
                kinds.push("repair".to_owned())
            }
            _ => {}
        }
    }
    kinds.dedup();
    (!kinds.is_empty()).then(|| kinds.join("+"))
}

/// R3: an owed checkpoint (the replayed tail is longer than the bound) is published before
/// deferred work is applied, and again after a repair that changed state.
#[test]
fn r3_owed_checkpoints_are_published_before_deferred_work_and_after_a_repair() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["fix"]);
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, recs(&["1", "2", "3", "4", "5"])).unwrap();
        crash(engine);
    }
    let engine = builder(&machine, &store)
        .checkpoint_tail_bound(2)
        .open()
        .unwrap();
    assert_eq!(engine.defer(&e, b"d".to_vec()).unwrap(), Deferred::Queued);
    let order = Arc::new(Mutex::new(Vec::new()));
    {
        let order = Arc::clone(&order);
        let p = e.partition();
        store.set_after_apply(move |q, batch| {
            if *q == p
                && let Some(kind) = kind_of(batch)
            {
                order.lock().push(kind);
            }
        });
    }
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        recs(&["1", "2", "3", "4", "5", "d", "fix"])
    );
    store.clear_hooks();
    assert_eq!(
        *order.lock(),
        vec![
            "checkpoint at 5".to_owned(),
            "deferred".to_owned(),
            "repair".to_owned(),
            "checkpoint at 7".to_owned(),
        ]
    );
}

/// R6, R9: the warm's summary names the entities it refused, up to a bound, besides counting
/// them.
#[test]
fn r9_the_warm_summary_names_the_refused_entities() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    {
        let engine = builder(&machine, &store).open().unwrap();
        for i in 0..22 {
            engine.register(&entity(i)).unwrap();
            engine.append(&entity(i), recs(&["ok"])).unwrap();
        }
        engine.close().unwrap();
    }
    // Entities 2..22 get a record apply refuses: 20 refusals.
    for i in 2..22 {
        log::append(
            &*store,
            &entity(i).partition(),
            &recs(&["!refuse"]),
            Batch::new(),
        )
        .unwrap()
        .committed()
        .unwrap();
    }
    let engine = builder(&machine, &store).open().unwrap();
    let progress = engine.warm().unwrap().wait().unwrap();
    assert_eq!((progress.done, progress.refused), (22, 20));
    let named = &progress.refused_entities;
    assert_eq!(named.len(), 16, "named up to the bound");
    let refused: Vec<_> = (2..22).map(entity).collect();
    assert!(named.iter().all(|e| refused.contains(e)), "{named:?}");
    let mut distinct = named.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 16);
}

/// R1, R6 (cost): with nothing deferred and no repair owed, the warm restores an entity in 4
/// store calls: the head and the checkpoint, the head again (to adopt the checkpoint only if
/// the head did not move), the records, and one scan of the deferred rows. It does not ask the
/// store whether an entity it listed exists, and scans the deferred rows a second time only
/// after a repair (whose own work is drained: see the first test above). Before: 6 calls.
#[test]
fn r6_the_warm_restores_an_entity_in_four_store_calls() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    {
        let engine = builder(&machine, &store).open().unwrap();
        for i in 0..21 {
            engine.register(&entity(i)).unwrap();
            engine.append(&entity(i), recs(&["a", "b"])).unwrap();
        }
        engine.close().unwrap();
    }
    let engine = builder(&machine, &store).open().unwrap();
    // The namespace is adopted by the first touch (fence rows): done before counting.
    assert_eq!(payloads(&engine, &entity(0)).unwrap(), recs(&["a", "b"]));
    let before = store.calls();
    let progress = engine.warm().unwrap().wait().unwrap();
    let calls = store.calls() - before;
    assert_eq!((progress.done, progress.refused), (20, 0));
    // One listing of the entity partitions, then 4 calls per entity.
    assert_eq!(calls, 1 + 20 * 4, "store calls of a warm of 20 entities");
    for i in 0..21 {
        assert_eq!(payloads(&engine, &entity(i)).unwrap(), recs(&["a", "b"]));
    }
}

/// A metrics hook that defers a record to each entity it sees restored, once.
#[derive(Default)]
struct DefersWhenRestored {
    engine: std::sync::OnceLock<common::engine::TestEngine>,
    done: Mutex<Vec<portcullis::EntityId>>,
}

impl portcullis::restore::Metrics for DefersWhenRestored {
    fn entity_restored(&self, entity: &portcullis::EntityId, _: &portcullis::restore::UnitReport) {
        let mut done = self.done.lock();
        if done.contains(entity) {
            return;
        }
        done.push(entity.clone());
        drop(done);
        let engine = self.engine.get().expect("set after open");
        let deferred = engine.defer(entity, b"late".to_vec());
        assert_eq!(deferred.unwrap(), Deferred::Queued);
    }
}

fn restore_whose_hook_defers(switches: portcullis::engine::OwnerSwitches) -> Vec<Vec<u8>> {
    let store = common::engine::closed_with(1, &["one"]);
    let machine = Arc::new(TestMachine::default());
    let hook = Arc::new(DefersWhenRestored::default());
    let engine = builder(&machine, &store)
        .metrics(Arc::clone(&hook) as Arc<dyn portcullis::restore::Metrics>)
        .owner_switches_for_test(switches)
        .open()
        .unwrap();
    hook.engine.set(engine.clone()).ok().unwrap();
    payloads(&engine, &entity(0)).unwrap()
}

/// R3, R8: work deferred to an entity from inside its own restore unit after the unit's last
/// drain (here by the `entity_restored` hook, which runs inside the unit) is drained before the
/// entity is served. Before, the unit drained again only after a repair, and the row waited for
/// the entity's next restore.
#[test]
fn r3_r8_work_deferred_after_the_last_drain_is_drained_before_the_entity_is_served() {
    let served = restore_whose_hook_defers(Default::default());
    assert_eq!(served, recs(&["one", "late"]));
}

/// The negative control: draining again only after a repair
/// (`OwnerSwitches::late_deferrals_undrained`, as before) serves the entity without it.
#[test]
fn r3_r8_negative_control_late_deferrals_left_undrained() {
    let switches = portcullis::engine::OwnerSwitches {
        late_deferrals_undrained: true,
        ..Default::default()
    };
    assert_eq!(restore_whose_hook_defers(switches), recs(&["one"]));
}
