//! A warm handle outliving its engine keeps neither the state machine nor any state alive
//! (SPEC R6, R11), and a wait from inside the engine is refused at once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{TestMachine, builder, closed_with, entity};
use portcullis::Error;

#[test]
fn r11_a_warm_handle_kept_after_the_engine_holds_nothing_of_it() {
    let store = closed_with(20, &["a", "b"]);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let warm = engine.warm().unwrap();
    engine.close().unwrap();
    drop(engine);
    assert_eq!(
        Arc::strong_count(&machine),
        1,
        "the machine (and with it every state) was dropped with the engine"
    );
    // The handle still answers: the warm ended (close stopped it).
    assert!(warm.wait_timeout(Duration::from_secs(60)));
    assert!(warm.progress().finished);
    assert!(warm.wait_for(Duration::from_secs(60)).unwrap());
    warm.stop();
}

#[test]
fn r6_waiting_for_the_warm_from_inside_the_engine_is_refused_at_once() {
    let store = closed_with(4, &["a"]);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let warm = engine.warm().unwrap();
    let hour = Duration::from_secs(3600);
    let inside = engine.read(&entity(0), |_| warm.wait_for(hour)).unwrap();
    assert!(
        matches!(inside, Err(Error::WouldDeadlock { .. })),
        "{inside:?}"
    );
    assert!(warm.wait_for(hour).unwrap());
    engine.close().unwrap();
}

/// Sums one byte of a 4 MiB buffer on the stack per record: more than a default 2 MiB thread
/// stack holds.
struct DeepStack;

impl portcullis::StateMachine for DeepStack {
    type State = u64;
    fn fresh(&self, _: &portcullis::EntityId) -> u64 {
        0
    }
    fn apply(
        &self,
        s: &mut u64,
        _: &portcullis::ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), portcullis::Rejection> {
        let mut big = [0u8; 4 << 20];
        big[record.len() % big.len()] = 1;
        *s += u64::from(std::hint::black_box(&big)[record.len() % (4 << 20)]);
        Ok(())
    }
    fn encode_checkpoint(&self, s: &u64) -> Result<Vec<u8>, portcullis::Rejection> {
        Ok(s.to_le_bytes().to_vec())
    }
    fn decode_checkpoint(
        &self,
        _: &portcullis::EntityId,
        b: &[u8],
    ) -> Result<u64, portcullis::Rejection> {
        b.try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| portcullis::Rejection::new("not 8 bytes"))
    }
}

#[test]
fn r6_the_pool_threads_stack_size_is_an_option() {
    let store: Arc<dyn portcullis::store::Store> = Arc::new(portcullis::store::MemoryStore::new());
    let open = |stack| {
        portcullis::Engine::builder(DeepStack)
            .store(Arc::clone(&store))
            .pool_threads(1)
            .pool_stack_size(stack)
    };
    assert!(matches!(open(1024).open(), Err(Error::InvalidArgument(_))));
    let engine = open(32 << 20).open().unwrap();
    for i in 0..3 {
        let e = portcullis::EntityId::new("deep", format!("e{i}")).unwrap();
        engine.register(&e).unwrap();
    }
    engine.close().unwrap();
    // Restored by the warm, on the pool: each apply needs more than 2 MiB of stack.
    let engine = open(32 << 20).open().unwrap();
    for i in 0..3 {
        let e = portcullis::EntityId::new("deep", format!("e{i}")).unwrap();
        assert_eq!(
            engine.defer(&e, vec![1]).unwrap(),
            portcullis::engine::Deferred::Queued
        );
    }
    let warm = engine.warm().unwrap();
    assert!(warm.wait().unwrap().refused == 0);
    engine.close().unwrap();
}

/// R6: a warm started while another thread is restoring an entity counts that entity and waits
/// for it, so once the warm has finished every entity it found unrestored is restored. Before,
/// it listed only the pending entities: with the background warm (on by default) restoring one
/// when `warm()` was called, the warm finished with that entity still being restored.
#[test]
fn r6_a_warm_waits_for_an_entity_another_thread_is_restoring() {
    let store = closed_with(6, &["a"]);
    let machine = Arc::new(TestMachine::default());
    let engine = Arc::new(
        builder(&machine, &store)
            .background_warm(false)
            .open()
            .unwrap(),
    );
    let (inside_tx, inside_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    machine.set_hook(move |e| {
        if *e == entity(0) {
            inside_tx.send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        }
    });
    let toucher = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || engine.read(&entity(0), |_| ()).unwrap())
    };
    inside_rx.recv().unwrap(); // entity 0's unit runs on the toucher
    let warm = engine.warm().unwrap();
    assert_eq!(
        warm.progress().total,
        6,
        "the entity being restored is counted"
    );
    go_tx.send(()).unwrap();
    let progress = warm.wait().unwrap();
    assert!(progress.finished);
    assert_eq!(progress.refused, 0);
    assert_eq!(engine.stats().phases.restored, 6);
    toucher.join().unwrap();
    assert_eq!(machine.units_of(&entity(0)), 1, "one unit for entity 0");
    engine.close().unwrap();
}

/// R11: dropping the last handle of an engine whose warm is running frees the machine (and
/// with it every state) before the drop returns, however the warm's workers and the engine's
/// background thread were placed. Before, a worker could still hold the restorer for a moment
/// after the close it was waited for returned, and the background thread could hold the engine
/// itself, so the machine was dropped later on one of their threads (C programs saw `destroy`
/// run after `pc_engine_free` returned).
#[test]
fn r11_dropping_the_last_handle_frees_the_machine_there_and_then() {
    for round in 0..40 {
        let store = closed_with(12, &["a", "b"]);
        let machine = Arc::new(TestMachine::default());
        let engine = builder(&machine, &store)
            .background_warm(true)
            .warm_on_open(true)
            .open()
            .unwrap();
        let clone = engine.clone();
        drop(engine);
        assert!(Arc::strong_count(&machine) > 1, "a handle is left");
        drop(clone);
        assert_eq!(Arc::strong_count(&machine), 1, "round {round}");
    }
}

/// R6: a warm worker does not wait on the gate of an entity another thread is restoring while
/// other entities are left: it restores them first and comes back to that one last, so two
/// warms over the same entities (the background warm and an explicit one) share the work
/// instead of taking turns. Before, a worker that met such an entity waited there (here, with
/// one worker, every other entity waited for the held unit).
#[test]
fn r6_a_warm_restores_the_others_before_waiting_for_an_entity_being_restored() {
    let store = closed_with(6, &["a"]);
    let machine = Arc::new(TestMachine::default());
    let engine = Arc::new(
        builder(&machine, &store)
            .pool_threads(1)
            .warm_parallelism(1)
            .open()
            .unwrap(),
    );
    let (inside_tx, inside_rx) = std::sync::mpsc::channel();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (inside_tx, started_tx, go_rx) = (
        std::sync::Mutex::new(inside_tx),
        std::sync::Mutex::new(started_tx),
        std::sync::Mutex::new(go_rx),
    );
    machine.set_hook(move |e| {
        if *e == entity(0) {
            inside_tx.lock().unwrap().send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        } else {
            started_tx.lock().unwrap().send(e.clone()).unwrap();
        }
    });
    let toucher = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || engine.read(&entity(0), |_| ()).unwrap())
    };
    inside_rx.recv().unwrap(); // entity 0's unit runs on the toucher
    let warm = engine.warm().unwrap();
    for _ in 1..6 {
        // A bound, not a synchronisation: the warm must get to every other entity first.
        let started = started_rx.recv_timeout(Duration::from_secs(60));
        assert!(started.is_ok(), "the warm waited on entity 0's gate");
    }
    go_tx.send(()).unwrap();
    assert!(warm.wait().unwrap().finished);
    toucher.join().unwrap();
    assert_eq!(engine.stats().phases.restored, 6);
    assert_eq!(machine.units_of(&entity(0)), 1, "one unit for entity 0");
    engine.close().unwrap();
}

/// R2, R6 under many threads: the background warm, an explicit warm and eight touching threads
/// over the same 200 entities restore each exactly once, and the explicit warm finishes with
/// every entity restored.
#[test]
fn r2_r6_two_warms_and_eight_touchers_restore_each_entity_once() {
    const ENTITIES: usize = 200;
    let store = closed_with(ENTITIES, &["a"]);
    let machine = Arc::new(TestMachine::default());
    let engine = Arc::new(
        builder(&machine, &store)
            .background_warm(true)
            .open()
            .unwrap(),
    );
    let start = Arc::new(std::sync::Barrier::new(9));
    let touchers: Vec<_> = (0..8)
        .map(|t| {
            let (engine, start) = (Arc::clone(&engine), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for i in 0..ENTITIES {
                    let e = entity((i * 7 + t * 31) % ENTITIES);
                    engine.read(&e, |_| ()).unwrap();
                }
            })
        })
        .collect();
    start.wait();
    let warm = engine.warm().unwrap();
    let progress = warm.wait().unwrap();
    assert!(progress.finished);
    assert_eq!(progress.refused, 0);
    assert_eq!(engine.stats().phases.restored, ENTITIES as u64);
    for t in touchers {
        t.join().unwrap();
    }
    for i in 0..ENTITIES {
        assert_eq!(machine.units_of(&entity(i)), 1, "entity {i}");
    }
    engine.close().unwrap();
}
