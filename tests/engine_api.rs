//! The blocking API's handling of bad input and of calls after close (E1, E2).

mod common;

use std::sync::Arc;

use common::engine::{TestEngine, TestMachine, TestStore, builder, entity, payloads};
use portcullis::engine::Engine;
use portcullis::log::{self, MAX_RECORD_BYTES};
use portcullis::store::{MemoryStore, Store, StoreLimits};
use portcullis::{EntityId, Error};

/// E2: every public handle that threads share is `Send + Sync`.
#[test]
fn e2_handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TestEngine>();
    assert_send_sync::<portcullis::engine::History>();
    assert_send_sync::<portcullis::restore::Warm>();
    assert_send_sync::<portcullis::fence::Fence>();
    assert_send_sync::<portcullis::fence::RevocationHandle>();
    assert_send_sync::<portcullis::store::FileStore>();
    assert_send_sync::<portcullis::store::MemoryStore>();
    assert_send_sync::<portcullis::store::Entries>();
    assert_send_sync::<Arc<dyn portcullis::store::Store>>();
    assert_send_sync::<portcullis::ManualClock>();
    assert_send_sync::<portcullis::SharedClock>();
    assert_send_sync::<Error>();
    // A builder is not shared, but it may be handed to another thread to open there.
    fn assert_send<T: Send>() {}
    assert_send::<portcullis::engine::EngineBuilder<Arc<TestMachine>>>();
}

/// E2: registering answers `false` for an entity that already exists, also after a reopen,
/// and never rewrites its marker (which keeps the incarnation that registered it).
#[test]
fn e2_register_is_false_for_an_existing_entity_and_keeps_its_marker() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    let marker = || {
        use portcullis::store::Store;
        store
            .get(&e.partition(), &portcullis::restore::keys::entity_key())
            .unwrap()
    };
    {
        let engine = builder(&machine, &store).open().unwrap();
        assert!(engine.register(&e).unwrap());
        assert!(!engine.register(&e).unwrap());
        engine.close().unwrap();
    }
    let first = marker().expect("registered");
    assert_eq!(first, 1u64.to_be_bytes().to_vec());
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(engine.incarnation(), 2);
    assert!(
        !engine.register(&e).unwrap(),
        "it exists from incarnation 1"
    );
    assert_eq!(marker().unwrap(), first, "the marker was rewritten");
    // Registering does not touch (restore) the entity either.
    assert_eq!(engine.stats().units_run, 0);
}

#[test]
fn e1_unknown_entities_are_refused_clearly() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let ghost = EntityId::new("test", "ghost").unwrap();
    for err in [
        engine.read(&ghost, |_| ()).unwrap_err(),
        engine.append(&ghost, vec![b"x".to_vec()]).unwrap_err(),
        engine.defer(&ghost, b"x".to_vec()).unwrap_err(),
        engine.checkpoint(&ghost).unwrap_err(),
        engine.release(&ghost).unwrap_err(),
    ] {
        assert!(matches!(err, Error::UnknownEntity(_)), "{err}");
        assert_eq!(err.code(), 12);
    }
    assert!(engine.register(&ghost).unwrap());
    assert!(!engine.register(&ghost).unwrap());
    assert!(payloads(&engine, &ghost).unwrap().is_empty());
}

#[test]
fn e1_bad_records_are_refused_and_lose_nothing() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    engine.append(&e, vec![b"keep".to_vec()]).unwrap();
    let big = vec![0u8; MAX_RECORD_BYTES + 1];
    let err = engine
        .append(&e, vec![b"ok".to_vec(), big.clone()])
        .unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { what: "record", .. }),
        "{err}"
    );
    assert!(matches!(engine.defer(&e, big), Err(Error::TooLarge { .. })));
    let err = engine
        .append(&e, vec![b"ok".to_vec(), b"!bad".to_vec()])
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("does not decode"));
    assert!(matches!(
        engine.append(&e, vec![]),
        Err(Error::InvalidArgument(_))
    ));
    // A decision to write nothing writes nothing.
    let nothing = engine.write(&e, |s| (Vec::new(), s.records.len())).unwrap();
    assert_eq!((nothing.seqs, nothing.value), (None, 1));
    assert_eq!(payloads(&engine, &e).unwrap(), vec![b"keep".to_vec()]);
    assert_eq!(
        log::read_head(&*store, &e.partition())
            .unwrap()
            .head
            .next_seq,
        2
    );
    // A write decided from the state gets the next sequence numbers.
    let w = engine
        .write(&e, |s| {
            (vec![format!("n{}", s.records.len()).into_bytes()], ())
        })
        .unwrap();
    assert_eq!(w.seqs, Some(2..=2));
}

#[test]
fn e1_calls_after_close_answer_closed_and_close_twice_is_harmless() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    engine.append(&e, vec![b"x".to_vec()]).unwrap();
    engine.close().unwrap();
    engine.close().unwrap();
    assert!(matches!(engine.read(&e, |_| ()), Err(Error::Closed)));
    assert!(matches!(
        engine.append(&e, vec![b"y".to_vec()]),
        Err(Error::Closed)
    ));
    assert!(matches!(
        engine.defer(&e, b"y".to_vec()),
        Err(Error::Closed)
    ));
    assert!(matches!(engine.register(&entity(2)), Err(Error::Closed)));
    assert!(matches!(engine.warm(), Err(Error::Closed)));
    assert!(matches!(engine.checkpoint(&e), Err(Error::Closed)));
    // Nothing was lost: a new engine sees the record, and the close was clean.
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(engine.unclean_previous(), None);
    assert_eq!(payloads(&engine, &e).unwrap(), vec![b"x".to_vec()]);
}

#[test]
fn e2_open_needs_a_store_and_sane_settings() {
    let machine = Arc::new(TestMachine::default());
    assert!(matches!(
        Engine::builder(Arc::clone(&machine)).open(),
        Err(Error::InvalidArgument(_))
    ));
    let store = TestStore::new();
    assert!(matches!(
        builder(&machine, &store).warm_parallelism(0).open(),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn l3_checkpoint_with_truncation_keeps_the_state() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = builder(&machine, &store)
            .truncate_after_checkpoint(true)
            .open()
            .unwrap();
        engine.register(&e).unwrap();
        engine
            .append(&e, vec![b"1".to_vec(), b"2".to_vec()])
            .unwrap();
        assert_eq!(engine.checkpoint(&e).unwrap(), 2);
        engine.append(&e, vec![b"3".to_vec()]).unwrap();
        assert!(engine.verify_checkpoint(&e).unwrap());
        engine.close().unwrap();
    }
    let head = log::read_head(&*store, &e.partition()).unwrap().head;
    assert_eq!(head.first_seq, 3);
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        vec![b"1".to_vec(), b"2".to_vec(), b"3".to_vec()]
    );
}

#[test]
fn e2_the_file_store_is_the_default_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let machine = Arc::new(TestMachine::default());
    let e = entity(1);
    {
        let engine = Engine::builder(Arc::clone(&machine))
            .directory(dir.path())
            .open()
            .unwrap();
        engine.register(&e).unwrap();
        engine.append(&e, vec![b"durable".to_vec()]).unwrap();
        engine.close().unwrap();
    }
    let engine = Engine::builder(Arc::clone(&machine))
        .directory(dir.path())
        .open()
        .unwrap();
    assert_eq!((engine.incarnation(), engine.unclean_previous()), (2, None));
    assert_eq!(payloads(&engine, &e).unwrap(), vec![b"durable".to_vec()]);
    engine.close().unwrap();
}

#[test]
fn f3_engine_writes_commit_under_the_grant_epoch_and_stale_grants_are_fenced() {
    use portcullis::fence::{RevokeBudget, RevokeProgress};
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(1);
    let ns = e.namespace().clone();
    engine.register(&e).unwrap();
    let grant = engine.own(&ns).unwrap();
    assert_eq!(engine.append(&e, vec![b"a".to_vec()]).unwrap(), 1..=1);
    engine.bump_epoch(&ns, grant + 1).unwrap();
    let mut slices = 0;
    while engine.revoke_step(&ns, RevokeBudget::default()).unwrap() != RevokeProgress::Complete {
        slices += 1;
        assert!(slices < 100, "revocation did not complete");
    }
    // Under the old grant: refused, nothing written.
    let err = engine.append(&e, vec![b"stale".to_vec()]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Fenced {
                grant: 0,
                current: 1
            }
        ),
        "{err}"
    );
    assert_eq!(
        log::read_head(&*store, &e.partition())
            .unwrap()
            .head
            .next_seq,
        2
    );
    // Deposed until adopted again; then the entity keeps going, with no gap in its log.
    assert!(matches!(
        payloads(&engine, &e).unwrap_err(),
        Error::Fenced { .. }
    ));
    assert_eq!(engine.own(&ns).unwrap(), grant + 1);
    assert_eq!(engine.append(&e, vec![b"b".to_vec()]).unwrap(), 2..=2);
    assert_eq!(
        payloads(&engine, &e).unwrap(),
        vec![b"a".to_vec(), b"b".to_vec()]
    );
}

/// The test kit's store wrapper answers for the store it wraps (SPEC S11): its limits and
/// whether it evaluates deadlines. Otherwise an engine over a store without deadlines would
/// put `NotAfter` on its fenced writes and have them refused.
#[test]
fn the_test_store_forwards_the_limits_and_deadline_support_of_the_store_it_wraps() {
    let limits = StoreLimits::DEFAULT.with_max_batch_ops(64);
    let store = TestStore::over(MemoryStore::new().with_limits(limits).without_deadlines());
    assert_eq!(store.limits(), limits);
    assert!(!store.evaluates_deadlines());
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(0);
    engine.register(&e).unwrap();
    assert_eq!(engine.append(&e, vec![b"a".to_vec()]).unwrap(), 1..=1);
    assert_eq!(payloads(&engine, &e).unwrap(), vec![b"a".to_vec()]);
}
