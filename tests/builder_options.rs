//! Builder options that spare every application the same boilerplate (issue: less
//! boilerplate): the file store's sync policy and options without building it, registration
//! on first write, and a checkpoint every N records (SPEC S3, L3, E2).

mod common;

use std::sync::Arc;

use common::engine::{TestMachine, TestStore, builder};
use portcullis::engine::Engine;
use portcullis::log;
use portcullis::store::{Store, SyncPolicy};
use portcullis::{EntityId, Error};

fn room(name: &str) -> EntityId {
    EntityId::new("test", name).unwrap()
}

fn file_engine(
    dir: &std::path::Path,
    configure: impl FnOnce(
        portcullis::EngineBuilder<Arc<TestMachine>>,
    ) -> portcullis::EngineBuilder<Arc<TestMachine>>,
) -> Engine<Arc<TestMachine>> {
    let machine = Arc::new(TestMachine::default());
    configure(Engine::builder(machine).directory(dir).pool_threads(1))
        .open()
        .unwrap()
}

#[test]
fn s3_the_builder_chooses_the_file_stores_sync_policy() {
    let writes = |engine: &Engine<Arc<TestMachine>>| {
        let e = room("r");
        engine.register(&e).unwrap();
        for _ in 0..5 {
            engine.append(&e, vec![b"x".to_vec()]).unwrap();
        }
        engine.stats().store.syncs
    };
    let dir = tempfile::tempdir().unwrap();
    let syncing = file_engine(dir.path(), |b| b);
    assert!(
        writes(&syncing) >= 5,
        "the default policy syncs every commit"
    );
    syncing.close().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let never = file_engine(dir.path(), |b| {
        b.sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
    });
    assert_eq!(writes(&never), 0, "the chosen policy reached the store");
    never.close().unwrap();
}

#[test]
fn e2_other_file_store_options_apply_and_cannot_be_mixed_with_a_given_store() {
    let dir = tempfile::tempdir().unwrap();
    let engine = file_engine(dir.path(), |b| {
        b.file_store(|s| s.segment_bytes(4096).auto_compact(false))
    });
    let e = room("r");
    engine.register(&e).unwrap();
    for _ in 0..20 {
        engine.append(&e, vec![vec![7; 500]]).unwrap();
    }
    assert!(
        engine.stats().store.segments > 1,
        "small segments roll over"
    );
    engine.close().unwrap();

    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let err = builder(&machine, &store)
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .open()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[test]
fn e2_register_on_first_write_registers_writes_only_when_asked() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let strict = builder(&machine, &store).open().unwrap();
    let ghost = room("ghost");
    for err in [
        strict
            .write(&ghost, |_| (vec![b"x".to_vec()], ()))
            .unwrap_err(),
        strict.append(&ghost, vec![b"x".to_vec()]).unwrap_err(),
        strict.defer(&ghost, b"x".to_vec()).unwrap_err(),
    ] {
        assert!(matches!(err, Error::UnknownEntity(_)), "{err}");
    }
    strict.close().unwrap();

    let lenient = builder(&machine, &store)
        .register_on_first_write(true)
        .open()
        .unwrap();
    // Reads never register.
    assert!(matches!(
        lenient.read(&ghost, |_| ()).unwrap_err(),
        Error::UnknownEntity(_)
    ));
    lenient
        .write(&room("w"), |_| (vec![b"w".to_vec()], ()))
        .unwrap();
    lenient.append(&room("a"), vec![b"a".to_vec()]).unwrap();
    lenient.defer(&room("d"), b"d".to_vec()).unwrap();
    for (name, record) in [("w", b"w"), ("a", b"a"), ("d", b"d")] {
        let folded = lenient.read(&room(name), |s| s.records.clone()).unwrap();
        assert_eq!(folded, vec![(1, record.to_vec())], "{name}");
    }
    assert_eq!(lenient.entities().unwrap().len(), 3);
}

#[test]
fn l3_checkpoint_every_publishes_a_checkpoint_every_n_records() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .checkpoint_every(3)
        .open()
        .unwrap();
    let e = room("r");
    engine.register(&e).unwrap();
    let newest = || {
        log::read_head(&*store as &dyn Store, &e.partition())
            .unwrap()
            .head
            .checkpoint
            .map(|c| c.seq)
    };
    engine
        .append(&e, vec![b"1".to_vec(), b"2".to_vec()])
        .unwrap();
    assert_eq!(newest(), None);
    engine.append(&e, vec![b"3".to_vec()]).unwrap();
    assert_eq!(newest(), Some(3));
    for i in 4..=7 {
        engine.append(&e, vec![i.to_string().into_bytes()]).unwrap();
    }
    assert_eq!(newest(), Some(6));
    assert!(engine.verify_checkpoint(&e).unwrap());
    engine.close().unwrap();

    let err = builder(&machine, &store)
        .checkpoint_every(0)
        .open()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}
