//! A state the machine's `encode_checkpoint` refuses (SPEC L3): nothing is published, the
//! caller learns why, and the entity keeps serving. An explicit checkpoint answers `Refused`;
//! a checkpoint owed after a write is skipped and the write stays committed; one a restore
//! unit owes is skipped and the entity is served.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::engine::{TestMachine, TestStore, builder, entity, payloads, recs};
use portcullis::Error;
use portcullis::log;
use portcullis::store::Store;

fn checkpoint_seq(store: &Arc<TestStore>, e: &portcullis::EntityId) -> Option<u64> {
    let head = log::read_head(&**store as &dyn Store, &e.partition()).unwrap();
    head.head.checkpoint.map(|c| c.seq)
}

#[test]
fn l3_a_refused_encode_publishes_nothing_and_says_why() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    let engine = builder(&machine, &store).open().unwrap();
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a", "b"])).unwrap();
    assert_eq!(engine.checkpoint(&e).unwrap(), 2);
    engine.append(&e, recs(&["c"])).unwrap();
    machine.refuse_in_encode.store(true, Ordering::SeqCst);
    let err = engine.checkpoint(&e).unwrap_err();
    assert!(matches!(err, Error::Refused { .. }), "{err}");
    let said = err.to_string();
    assert!(said.contains("this state does not encode"), "{said}");
    assert!(said.contains("no checkpoint was published"), "{said}");
    assert_eq!(
        checkpoint_seq(&store, &e),
        Some(2),
        "the older checkpoint stays the newest"
    );
    // The entity keeps serving, and restores from the older checkpoint and the history.
    engine.append(&e, recs(&["d"])).unwrap();
    engine.close().unwrap();
    machine.refuse_in_encode.store(false, Ordering::SeqCst);
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b", "c", "d"]));
}

#[test]
fn l3_a_checkpoint_owed_after_a_write_that_cannot_be_encoded_leaves_the_write_committed() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    let engine = builder(&machine, &store)
        .checkpoint_every(1)
        .open()
        .unwrap();
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["a"])).unwrap();
    assert_eq!(checkpoint_seq(&store, &e), Some(1));
    machine.refuse_in_encode.store(true, Ordering::SeqCst);
    let seqs = engine.append(&e, recs(&["b"])).unwrap();
    assert_eq!(*seqs.start(), 2, "the write committed and says so");
    assert_eq!(
        checkpoint_seq(&store, &e),
        Some(1),
        "the owed checkpoint was not published"
    );
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b"]));
    engine.close().unwrap();
    machine.refuse_in_encode.store(false, Ordering::SeqCst);
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(payloads(&engine, &e).unwrap(), recs(&["a", "b"]));
}

#[test]
fn l3_a_checkpoint_a_restore_owes_that_cannot_be_encoded_is_skipped_and_the_entity_served() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store).open().unwrap();
        engine.register(&e).unwrap();
        for i in 0..10u8 {
            engine.append(&e, vec![vec![i]]).unwrap();
        }
        engine.close().unwrap();
    }
    machine.refuse_in_encode.store(true, Ordering::SeqCst);
    let engine = builder(&machine, &store)
        .checkpoint_tail_bound(4)
        .open()
        .unwrap();
    assert_eq!(
        payloads(&engine, &e).unwrap().len(),
        10,
        "served, not contained"
    );
    assert!(engine.containment(&e).unwrap().is_none());
    assert_eq!(checkpoint_seq(&store, &e), None, "nothing was published");
}
