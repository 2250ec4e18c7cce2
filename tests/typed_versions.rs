//! Versioned typed records and checkpoints (SPEC E7), through the public API: every record and
//! checkpoint carries its version, upcast hooks read older ones, a newer one is refused, and a
//! checkpoint the code does not read falls back to the history (or contains the entity,
//! naming the versions, when the history is truncated).

mod common;

use std::sync::Arc;

use common::chat_versions::{
    Chat1, Chat2, Chat2Bare, Chat3, departed2, joined1, joined2, left1, said1, said2, v1, v2,
};
use common::engine::TestStore;
use parking_lot::Mutex;
use portcullis::engine::{Engine, EngineBuilder};
use portcullis::log;
use portcullis::restore::{Metrics, ReasonKind, UnitReport};
use portcullis::store::{Batch, Store};
use portcullis::typed::{self, Typed, TypedMachine};
use portcullis::{EntityId, Error};

#[derive(Default)]
struct Reports(Mutex<Vec<UnitReport>>);

impl Metrics for Reports {
    fn entity_restored(&self, _: &EntityId, report: &UnitReport) {
        self.0.lock().push(report.clone());
    }
}

fn builder<T: TypedMachine>(machine: T, store: &Arc<TestStore>) -> EngineBuilder<Typed<T>> {
    Engine::builder(Typed(machine))
        .store(Arc::clone(store) as Arc<dyn Store>)
        .pool_threads(1)
}

/// Opens an engine with a metrics hook that keeps every unit's report.
fn reporting<T: TypedMachine>(
    machine: T,
    store: &Arc<TestStore>,
) -> (Engine<Typed<T>>, Arc<Reports>) {
    let reports = Arc::new(Reports::default());
    let engine = builder(machine, store)
        .metrics(Arc::clone(&reports) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    (engine, reports)
}

fn room(name: &str) -> EntityId {
    EntityId::new("chat", name).unwrap()
}

fn raw_history<M: portcullis::StateMachine>(engine: &Engine<M>, e: &EntityId) -> Vec<Vec<u8>> {
    engine
        .history(e, 1)
        .unwrap()
        .map(|r| r.unwrap().payload)
        .collect()
}

fn checkpoint_bytes(store: &Arc<TestStore>, e: &EntityId) -> (u64, Vec<u8>) {
    let (_, checkpoint) = log::load_restore_point(&**store, &e.partition()).unwrap();
    let checkpoint = checkpoint.expect("a checkpoint");
    (checkpoint.seq, checkpoint.state)
}

/// Version 1 writes a room: ann joins and speaks, a checkpoint at 2, ann leaves.
fn written_by_version_1(store: &Arc<TestStore>, e: &EntityId) {
    let engine = builder(Chat1, store).open().unwrap();
    engine.register(e).unwrap();
    engine
        .append_typed(e, &[joined1("ann"), said1("ann", "hi")])
        .unwrap();
    assert_eq!(engine.checkpoint(e).unwrap(), 2);
    engine.append_typed(e, &[left1("ann")]).unwrap();
    engine.close().unwrap();
}

#[test]
fn e7_every_typed_record_and_checkpoint_carries_its_version() {
    let store = TestStore::new();
    let e = room("carried");
    written_by_version_1(&store, &e);
    let engine = builder(Chat2, &store).open().unwrap();
    engine.append_typed(&e, &[said2("bo", "yo", None)]).unwrap();
    let history = raw_history(&engine, &e);
    let versions: Vec<u32> = history
        .iter()
        .map(|r| typed::split_version(r).unwrap().version)
        .collect();
    assert_eq!(versions, [1, 1, 1, 2]);
    // Two bytes each: the version in one byte with its top bit set, then a zero byte.
    assert_eq!(
        history[0],
        [&[0x81, 0x00][..], &typed::encode(&joined1("ann")).unwrap()].concat()
    );
    assert_eq!(&history[3][..2], [0x82, 0x00]);
    assert_eq!(&checkpoint_bytes(&store, &e).1[..2], [0x81, 0x00]);
    assert_eq!(engine.checkpoint(&e).unwrap(), 4);
    assert_eq!(&checkpoint_bytes(&store, &e).1[..2], [0x82, 0x00]);
    // A deferral and a write's decision carry it too.
    engine.defer_typed(&e, &joined2("cy")).unwrap();
    engine
        .write_typed(&e, |_| (vec![departed2("cy")], ()))
        .unwrap();
    let history = raw_history(&engine, &e);
    assert!(history[4..].iter().all(|r| r[..2] == [0x82, 0x00]));
}

#[test]
fn e7_adding_a_field_and_renaming_a_variant_reads_old_history_through_the_upcasts() {
    let store = TestStore::new();
    let e = room("upcast");
    written_by_version_1(&store, &e);
    let (engine, reports) = reporting(Chat2, &store);
    let expected = v2::Room {
        members: vec![],
        lines: vec!["ann: hi".into()],
        said: 1,
    };
    assert_eq!(engine.read(&e, v2::Room::clone).unwrap(), expected);
    // The version 1 checkpoint was read through upcast_checkpoint, not replaced by a replay.
    let report = reports.0.lock()[0].clone();
    assert_eq!((report.checkpoint_seq, report.replayed), (Some(2), 1));
    assert_eq!(report.checkpoint_unreadable, None);
    // History reads as version 2 records: the field defaulted, the variant renamed.
    let history: Vec<(u64, v2::Msg)> = engine
        .history_typed(&e, 1)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        history,
        [
            (1, joined2("ann")),
            (2, said2("ann", "hi", None)),
            (3, departed2("ann"))
        ]
    );
    // Version 2 records follow, and a restart reads both versions again.
    engine
        .append_typed(&e, &[joined2("bo"), said2("bo", "back", Some(2))])
        .unwrap();
    engine.close().unwrap();
    let engine = builder(Chat2, &store).open().unwrap();
    let state = engine.read(&e, v2::Room::clone).unwrap();
    assert_eq!(state.lines, ["ann: hi", "bo (re 2): back"]);
    assert_eq!((state.members, state.said), (vec!["bo".to_string()], 2));
}

#[test]
fn e7_bytes_written_without_an_envelope_are_version_1() {
    let store = TestStore::new();
    let e = room("unenveloped");
    {
        // Raw postcard, as typed records and checkpoints were written before versions.
        let engine = builder(Chat1, &store).open().unwrap();
        engine.register(&e).unwrap();
        let old = [joined1("ann"), said1("ann", "old")].map(|m| typed::encode(&m).unwrap());
        engine.append(&e, old.to_vec()).unwrap();
        engine.close().unwrap();
        let p = e.partition();
        let head = log::read_head(&*store, &p).unwrap();
        let state = v1::Room {
            members: vec!["ann".into()],
            lines: vec!["ann: old".into()],
        };
        let bytes = typed::encode(&state).unwrap();
        log::write_checkpoint(&*store, &p, &head, 2, bytes, Batch::new())
            .unwrap()
            .committed()
            .unwrap();
    }
    let (engine, reports) = reporting(Chat2, &store);
    let state = engine.read(&e, v2::Room::clone).unwrap();
    assert_eq!((state.members, state.said), (vec!["ann".to_string()], 1));
    assert_eq!(reports.0.lock()[0].checkpoint_seq, Some(2));
    let history: Vec<(u64, v2::Msg)> = engine
        .history_typed(&e, 1)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(history[1], (2, said2("ann", "old", None)));
}

#[test]
fn e7_without_an_upcast_old_records_contain_the_entity_naming_both_versions() {
    let store = TestStore::new();
    let e = room("no-upcast");
    written_by_version_1(&store, &e);
    let engine = builder(Chat2Bare, &store).open().unwrap();
    let err = engine.read(&e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    let message = err.to_string();
    for part in [
        "record 1",
        "written by version 1",
        "this code is version 2",
        "upcast_record",
    ] {
        assert!(message.contains(part), "{message} should say {part:?}");
    }
    // history_typed refuses the same record, naming the versions, and stops.
    let mut history = engine.history_typed(&e, 1).unwrap();
    let err = history.next().unwrap().unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("version 1"), "{err}");
    assert!(history.next().is_none());
}

#[test]
fn e7_a_record_of_a_newer_version_is_refused_never_guessed() {
    let store = TestStore::new();
    let e = room("newer");
    {
        let engine = builder(Chat2, &store).open().unwrap();
        engine.register(&e).unwrap();
        // Version 2's Joined has the same postcard bytes as version 1's: only the version
        // tells them apart.
        engine.append_typed(&e, &[joined2("ann")]).unwrap();
        engine.close().unwrap();
    }
    let engine = builder(Chat1, &store).open().unwrap();
    let err = engine.read(&e, |_| ()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("apply-refusal"), "{message}");
    assert!(
        message.contains("written by version 2, newer than this code's version 1"),
        "{message}"
    );
    // Nor does version 1 code accept version 2 bytes through its raw calls.
    let other = room("newer-raw");
    engine.register(&other).unwrap();
    let bytes = typed::encode_versioned(2, &joined2("bo")).unwrap();
    let err = engine.append(&other, vec![bytes]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("version 2"), "{err}");
}

/// Version 2 writes a room; version 3 restores it and checkpoints in version 3 (with the
/// history it covers truncated, if `truncate`); then the code is rolled back to version 2.
fn checkpointed_by_version_3(store: &Arc<TestStore>, e: &EntityId, truncate: bool) {
    let engine = builder(Chat2, store).open().unwrap();
    engine.register(e).unwrap();
    engine
        .append_typed(e, &[joined2("ann"), said2("ann", "hi", None)])
        .unwrap();
    engine.close().unwrap();
    let engine = builder(Chat3, store)
        .truncate_after_checkpoint(truncate)
        .open()
        .unwrap();
    assert_eq!(engine.checkpoint(e).unwrap(), 2);
    engine.close().unwrap();
    assert_eq!(&checkpoint_bytes(store, e).1[..2], [0x83, 0x00]);
}

#[test]
fn e7_a_checkpoint_of_a_version_the_code_does_not_read_falls_back_to_the_history() {
    let store = TestStore::new();
    let e = room("rolled-back");
    checkpointed_by_version_3(&store, &e, false);
    let (engine, reports) = reporting(Chat2, &store);
    let expected = v2::Room {
        members: vec!["ann".into()],
        lines: vec!["ann: hi".into()],
        said: 1,
    };
    assert_eq!(engine.read(&e, v2::Room::clone).unwrap(), expected);
    let report = reports.0.lock()[0].clone();
    assert_eq!(report.checkpoint_unreadable, Some(2));
    assert_eq!((report.checkpoint_seq, report.replayed), (None, 2));
    assert!(report.checkpoint_published);
    // Re-checkpointed in version 2, at the same record.
    let (seq, bytes) = checkpoint_bytes(&store, &e);
    assert_eq!((seq, &bytes[..2]), (2, &[0x82, 0x00][..]));
    engine.close().unwrap();
    let (engine, reports) = reporting(Chat2, &store);
    assert_eq!(engine.read(&e, v2::Room::clone).unwrap(), expected);
    let report = reports.0.lock()[0].clone();
    assert_eq!((report.checkpoint_seq, report.replayed), (Some(2), 0));
}

#[test]
fn e7_with_the_history_truncated_an_unreadable_checkpoint_contains_naming_the_versions() {
    let store = TestStore::new();
    let e = room("rolled-back-truncated");
    checkpointed_by_version_3(&store, &e, true);
    let engine = builder(Chat2, &store).open().unwrap();
    let err = engine.read(&e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    assert_eq!(
        engine.containment(&e).unwrap().unwrap().kind,
        ReasonKind::Decode
    );
    let message = err.to_string();
    for part in [
        "checkpoint at 2",
        "written by version 3, newer than this code's version 2",
        "truncated",
    ] {
        assert!(message.contains(part), "{message} should say {part:?}");
    }
    // Version 3 reads it: the checkpoint is intact, only this code cannot read it.
    engine.close().unwrap();
    let engine = builder(Chat3, &store).open().unwrap();
    assert_eq!(engine.read(&e, |r| r.lines.len()).unwrap(), 1);
}
