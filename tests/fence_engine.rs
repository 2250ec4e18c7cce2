//! The fence as the engine exposes it ([`Engine::fence`]): nothing reachable from there can
//! corrupt an entity's log or restore rows (issue "the engine as a fenced owner", item 4).

mod common;

use std::sync::Arc;

use common::engine::{TestMachine, TestStore, builder, entity, payloads};
use portcullis::Error;
use portcullis::fence::{FenceGrant, write_under};
use portcullis::store::{Batch, KeyRange, Store};

/// Every write through the engine's fence that touches a reserved row of the entity (its log
/// head, a record, its checkpoint, deferred work, the repair marker, the registration marker)
/// is refused with nothing changed, and the entity keeps serving its history.
#[test]
fn engine_fence_refuses_writes_to_reserved_rows() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    engine.append(&e, vec![b"one".to_vec()]).unwrap();
    engine.checkpoint(&e).unwrap();
    engine.append(&e, vec![b"two".to_vec()]).unwrap();

    let reserved: Vec<Vec<u8>> = vec![
        portcullis::log::keys::head_key(),
        portcullis::log::keys::record_key(2),
        portcullis::log::keys::checkpoint_key(),
        portcullis::restore::keys::deferred_key(1, 1),
        portcullis::restore::keys::repair_key(),
        portcullis::restore::keys::entity_key(),
        b"\0anything.else".to_vec(),
    ];
    let fence = engine.fence();
    let before = rows_of(&*store, &e);
    for key in &reserved {
        for batch in [
            Batch::new().put(key.clone(), b"x".to_vec()),
            Batch::new().delete(key.clone()),
            Batch::new()
                .put(b"app".to_vec(), b"ok".to_vec())
                .delete(key.clone()),
        ] {
            let err = fence.write(&e, 0, batch.clone()).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{key:?}: {err}");
            assert!(err.to_string().contains("reserved"), "{err}");
            let err = fence
                .write_with(&e, 0, |_| Some(batch.clone()))
                .unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{key:?}: {err}");
            let grants = [FenceGrant { fence, grant: 0 }];
            let err = write_under(&grants, &e, |_| Some(batch.clone())).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{key:?}: {err}");
        }
    }
    for range in [
        KeyRange::all(),
        KeyRange::prefix(b"\0"),
        KeyRange::prefix(b"\0log.rec"),
        portcullis::restore::keys::deferred_range(),
        KeyRange::between(b"".to_vec(), b"\x01".to_vec()),
    ] {
        let err = fence
            .write(&e, 0, Batch::new().delete_range(range.clone()))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{range:?}: {err}");
    }
    assert_eq!(rows_of(&*store, &e), before, "nothing was written");

    // Application rows (any first byte but 0x00) are still the caller's.
    let ok = Batch::new()
        .put(b"app".to_vec(), b"ok".to_vec())
        .delete_range(KeyRange::from(b"\x01".to_vec()));
    assert!(matches!(
        fence.write(&e, 0, ok).unwrap(),
        portcullis::fence::WriteOutcome::Committed { .. }
    ));
    // Writes through the engine still commit, and a restore from the store (a new engine
    // over it) finds the whole history intact.
    engine.append(&e, vec![b"three".to_vec()]).unwrap();
    engine.close().unwrap();
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
    );
}

fn rows_of(store: &dyn Store, e: &portcullis::EntityId) -> Vec<(Vec<u8>, Vec<u8>)> {
    store
        .scan(&e.partition(), &KeyRange::all(), None, 10_000)
        .unwrap()
        .entries
}
