//! Golden files (SPEC E7): a file store written by earlier code, checked in under
//! `tests/data/golden-typed/`, must stay readable. A change to the typed encoding (the version
//! envelope, postcard, the record layout) or to the store's format that breaks it fails here.
//!
//! The store holds the namespace `golden`, one entity per case, with the chat types of
//! `tests/common/chat_versions.rs`:
//!
//! | entity | written by | records | checkpoint |
//! | --- | --- | --- | --- |
//! | `unversioned` | code before versions (`Typed`, no envelope) | 1-4 unenveloped | at 2, unenveloped |
//! | `unversioned-truncated` | code before versions, truncating | 3 unenveloped (1-2 truncated) | at 2, unenveloped |
//! | `mixed` | code before versions, then versions 1 and 2 | 1-2 unenveloped, 3 v1, 4-5 v2 | at 3, v1 |
//! | `v1` | version 1 | 1-3 v1 | at 2, v1 |
//! | `v2` | version 2 | 1-3 v2 | at 2, v2 |
//! | `v3` | version 3 | 1-3 v2 records written as v3 | at 2, v3 |
//! | `future` | version 2, checkpointed by version 3 | 1-2 v2 | at 2, v3 |
//! | `future-truncated` | the same, truncating | 1-2 v2 (truncated) | at 2, v3 |
//!
//! How it was made: the unversioned part by the code before versions (commit 4441151, where
//! `Typed` wrote plain postcard), with the steps of [`write_unversioned_part`] run through
//! `Typed`; then the rest by [`write_versioned_part`] over the same directory. To make it
//! again (only when a change of format is intended, and said in the changelog):
//! `PORTCULLIS_GOLDEN_DIR=<empty dir> cargo test --test golden -- --ignored --test-threads=1`
//! runs both (the first with [`Unversioned`], which writes the bytes `Typed` wrote before
//! versions; `e7_the_generator_writes_the_unversioned_part_as_typed_did` checks that), then
//! copy the directory over `tests/data/golden-typed/`. The tests read a copy: opening a store
//! writes to it.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::chat_versions::{
    Chat1, Chat2, Chat3, departed2, joined1, joined2, left1, said1, said2, v1, v2,
};
use parking_lot::Mutex;
use portcullis::engine::Engine;
use portcullis::log;
use portcullis::restore::{ApplyContext, Metrics, ReasonKind, Rejection, UnitReport};
use portcullis::store::{FileStore, Partition, Store};
use portcullis::typed::{self, Typed, TypedMachine};
use portcullis::{EntityId, Error, StateMachine};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/golden-typed");

fn golden(id: &str) -> EntityId {
    EntityId::new("golden", id).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A copy of the golden store in a temporary directory.
fn golden_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    copy_dir(Path::new(GOLDEN), &path);
    (dir, path)
}

#[derive(Default)]
struct Reports(Mutex<Vec<(EntityId, UnitReport)>>);

impl Metrics for Reports {
    fn entity_restored(&self, entity: &EntityId, report: &UnitReport) {
        self.0.lock().push((entity.clone(), report.clone()));
    }
}

impl Reports {
    fn of(&self, e: &EntityId) -> UnitReport {
        let reports = self.0.lock();
        let found = reports.iter().rev().find(|(x, _)| x == e);
        found.expect("a report").1.clone()
    }
}

fn open<T: TypedMachine>(machine: T, dir: &Path) -> (Engine<Typed<T>>, Arc<Reports>) {
    let reports = Arc::new(Reports::default());
    let engine = Engine::builder(Typed(machine))
        .directory(dir)
        .pool_threads(1)
        .metrics(Arc::clone(&reports) as Arc<dyn Metrics>)
        .open()
        .unwrap();
    (engine, reports)
}

fn history<T: TypedMachine>(engine: &Engine<Typed<T>>, e: &EntityId) -> Vec<(u64, T::Record)> {
    engine
        .history_typed(e, 1)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn room2(members: &[&str], lines: &[&str], said: u64) -> v2::Room {
    v2::Room {
        members: members.iter().map(|m| m.to_string()).collect(),
        lines: lines.iter().map(|l| l.to_string()).collect(),
        said,
    }
}

fn contained_reason<M: StateMachine>(engine: &Engine<M>, e: &EntityId) -> String {
    let err = engine.read(e, |_| ()).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{e}: {err}");
    err.to_string()
}

fn assert_says(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{message} should say {part:?}");
    }
}

#[test]
fn e7_the_golden_store_is_read_by_version_2() {
    let (_dir, path) = golden_copy();
    let (engine, reports) = open(Chat2, &path);
    let read = |id: &str| engine.read(&golden(id), v2::Room::clone).unwrap();

    // Written before versions: records and checkpoint read as version 1, through the upcasts.
    assert_eq!(read("unversioned"), room2(&["bo"], &["ann: hi"], 1));
    assert_eq!(reports.of(&golden("unversioned")).checkpoint_seq, Some(2));
    assert_eq!(
        history(&engine, &golden("unversioned")),
        [
            (1, joined2("ann")),
            (2, said2("ann", "hi", None)),
            (3, joined2("bo")),
            (4, departed2("ann"))
        ]
    );
    // Only the checkpoint is left of the first two records: it must be read, not replayed.
    assert_eq!(
        read("unversioned-truncated"),
        room2(&["cy"], &["cy: before", "cy: after"], 2)
    );
    let report = reports.of(&golden("unversioned-truncated"));
    assert_eq!((report.checkpoint_seq, report.replayed), (Some(2), 1));
    assert_eq!(
        history(&engine, &golden("unversioned-truncated")),
        [(3, said2("cy", "after", None))]
    );
    // Unenveloped, version 1 and version 2 records in one history, a version 1 checkpoint.
    assert_eq!(
        read("mixed"),
        room2(&[], &["fay: old", "fay: v1", "fay (re 3): v2"], 3)
    );
    let report = reports.of(&golden("mixed"));
    assert_eq!((report.checkpoint_seq, report.replayed), (Some(3), 2));
    assert_eq!(history(&engine, &golden("mixed")).len(), 5);
    assert_eq!(read("v1"), room2(&[], &["dee: one"], 1));
    assert_eq!(read("v2"), room2(&[], &["eve (re 1): two"], 1));
    assert_eq!(
        history(&engine, &golden("v2"))[1],
        (2, said2("eve", "two", Some(1)))
    );
    for id in ["unversioned", "unversioned-truncated", "mixed", "v1", "v2"] {
        let report = reports.of(&golden(id));
        assert_eq!(report.checkpoint_unreadable, None, "{id}");
        assert!(!report.checkpoint_published, "{id}");
    }

    // A version 3 checkpoint over stored history: replayed instead, and re-checkpointed.
    assert_eq!(read("future"), room2(&["gus"], &["gus: soon"], 1));
    let report = reports.of(&golden("future"));
    assert_eq!(report.checkpoint_unreadable, Some(2));
    assert!(report.checkpoint_published);
    // With the history truncated, contained, naming the versions.
    let message = contained_reason(&engine, &golden("future-truncated"));
    assert_says(
        &message,
        &[
            "decode-error",
            "checkpoint at 2",
            "version 3, newer than this code's version 2",
            "truncated",
        ],
    );
    assert_eq!(
        engine
            .containment(&golden("future-truncated"))
            .unwrap()
            .unwrap()
            .kind,
        ReasonKind::Decode
    );
    // Version 3 records: refused, never guessed.
    let message = contained_reason(&engine, &golden("v3"));
    assert_says(&message, &["record 1", "written by version 3"]);
    engine.close().unwrap();

    // The lazily written checkpoint is version 2's: the next restore starts from it.
    let (engine, reports) = open(Chat2, &path);
    assert_eq!(
        engine.read(&golden("future"), v2::Room::clone).unwrap(),
        room2(&["gus"], &["gus: soon"], 1)
    );
    let report = reports.of(&golden("future"));
    assert_eq!((report.checkpoint_seq, report.replayed), (Some(2), 0));
    engine.close().unwrap();
}

#[test]
fn e7_the_golden_store_is_read_by_version_3() {
    let (_dir, path) = golden_copy();
    let (engine, reports) = open(Chat3, &path);
    let members = |id: &str| {
        let room = engine.read(&golden(id), Clone::clone).unwrap();
        (room.members.into_iter().collect::<Vec<_>>(), room.lines)
    };
    assert_eq!(
        members("unversioned"),
        (vec![("bo".into(), 3)], vec!["ann: hi".to_string()])
    );
    assert_eq!(members("mixed").1.len(), 3);
    assert_eq!(members("v2").1, ["eve (re 1): two"]);
    assert_eq!(
        members("v3"),
        (vec![], vec!["ivy: three".to_string()]),
        "version 3's own records and checkpoint"
    );
    // Version 3 folded the records itself before it checkpointed: gus joined at record 1.
    assert_eq!(
        members("future"),
        (vec![("gus".into(), 1)], vec!["gus: soon".into()])
    );
    assert_eq!(members("future-truncated").1, ["hal: gone"]);
    for (id, report) in reports.0.lock().iter() {
        assert_eq!(report.checkpoint_unreadable, None, "{id}");
    }
    engine.close().unwrap();
}

#[test]
fn e7_the_golden_store_is_read_by_version_1_up_to_version_1() {
    let (_dir, path) = golden_copy();
    let (engine, _) = open(Chat1, &path);
    let room = engine.read(&golden("unversioned"), Clone::clone).unwrap();
    assert_eq!(
        room,
        v1::Room {
            members: vec!["bo".into()],
            lines: vec!["ann: hi".into()],
        }
    );
    assert_eq!(
        engine.read(&golden("v1"), |r| r.lines.clone()).unwrap(),
        ["dee: one"]
    );
    // Version 2's records are not taken for version 1's, even where the bytes would decode.
    let message = contained_reason(&engine, &golden("v2"));
    assert_says(
        &message,
        &["written by version 2, newer than this code's version 1"],
    );
    engine.close().unwrap();
}

/// The raw rows of an entity in a store opened read-only in spirit (nothing is written).
fn rows(store: &dyn Store, id: &str) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let p: Partition = golden(id).partition();
    let page = log::read_log(store, &p, 1, 100).unwrap();
    let (_, checkpoint) = log::load_restore_point(store, &p).unwrap();
    (
        page.records.into_iter().map(|r| r.payload).collect(),
        checkpoint.map(|c| c.state),
    )
}

/// The stored bytes are exactly what this code writes for the same values: a change to the
/// envelope or to postcard's encoding of these types fails here before it breaks a store.
#[test]
fn e7_the_golden_bytes_are_what_this_code_writes() {
    let (_dir, path) = golden_copy();
    let store = FileStore::open(&path).unwrap();
    let plain = |m: &v1::Msg| typed::encode(m).unwrap();
    let (records, checkpoint) = rows(&store, "unversioned");
    let expected = [
        joined1("ann"),
        said1("ann", "hi"),
        joined1("bo"),
        left1("ann"),
    ];
    assert_eq!(records, expected.iter().map(plain).collect::<Vec<_>>());
    let room = v1::Room {
        members: vec!["ann".into()],
        lines: vec!["ann: hi".into()],
    };
    assert_eq!(checkpoint.unwrap(), typed::encode(&room).unwrap());
    for record in &records {
        assert!(!typed::split_version(record).unwrap().enveloped);
    }

    let (records, checkpoint) = rows(&store, "v1");
    let chat1 = Typed(Chat1);
    let expected = [joined1("dee"), said1("dee", "one"), left1("dee")];
    let encoded: Vec<_> = expected
        .iter()
        .map(|m| chat1.encode_record(m).unwrap())
        .collect();
    assert_eq!(records, encoded);
    assert_eq!(records[0], b"\x81\x00\x00\x03dee");
    let state = chat1.decode_checkpoint(&golden("v1"), &checkpoint.clone().unwrap());
    assert_eq!(
        chat1.encode_checkpoint(&state.unwrap()).unwrap(),
        checkpoint.unwrap()
    );

    let (records, checkpoint) = rows(&store, "v2");
    let chat2 = Typed(Chat2);
    let expected = [
        joined2("eve"),
        said2("eve", "two", Some(1)),
        departed2("eve"),
    ];
    let encoded: Vec<_> = expected
        .iter()
        .map(|m| chat2.encode_record(m).unwrap())
        .collect();
    assert_eq!(records, encoded);
    assert_eq!(records[1], b"\x82\x00\x01\x03eve\x03two\x01\x01");
    assert_eq!(
        checkpoint.unwrap(),
        typed::encode_versioned(2, &room2(&["eve"], &["eve (re 1): two"], 1)).unwrap()
    );

    let (_, checkpoint) = rows(&store, "future");
    assert_eq!(
        typed::split_version(&checkpoint.unwrap()).unwrap().version,
        3
    );
    store.close().unwrap();
}

#[test]
fn e7_the_generator_writes_the_unversioned_part_as_typed_did() {
    let dir = tempfile::tempdir().unwrap();
    write_unversioned_part(dir.path());
    let (_golden, path) = golden_copy();
    let (written, checked_in) = (
        FileStore::open(dir.path()).unwrap(),
        FileStore::open(&path).unwrap(),
    );
    for id in ["unversioned", "unversioned-truncated"] {
        assert_eq!(rows(&written, id), rows(&checked_in, id), "{id}");
    }
    // `mixed` got more records later; its first two are the unversioned part's.
    assert_eq!(rows(&written, "mixed").0, rows(&checked_in, "mixed").0[..2]);
    written.close().unwrap();
    checked_in.close().unwrap();
}

// ---- The generator ---------------------------------------------------------------------

/// What `Typed` was before versions: records and checkpoints as plain postcard.
struct Unversioned<T>(T);

impl<T: TypedMachine> StateMachine for Unversioned<T> {
    type State = T::State;

    fn fresh(&self, entity: &EntityId) -> T::State {
        self.0.fresh(entity)
    }

    fn apply(
        &self,
        state: &mut T::State,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        self.0.apply(state, ctx, typed::decode(record)?)
    }

    fn encode_checkpoint(&self, state: &T::State) -> Result<Vec<u8>, Rejection> {
        Ok(typed::encode(state).unwrap())
    }

    fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<T::State, Rejection> {
        typed::decode(bytes)
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        typed::decode::<T::Record>(record).map(|_| ())
    }
}

fn unversioned(records: &[v1::Msg]) -> Vec<Vec<u8>> {
    records.iter().map(|m| typed::encode(m).unwrap()).collect()
}

/// The part written before versions existed.
fn write_unversioned_part(dir: &Path) {
    let store: Arc<dyn Store> = Arc::new(
        FileStore::builder(dir)
            .segment_bytes(64 << 10)
            .open()
            .unwrap(),
    );
    let open = |truncate: bool| {
        Engine::builder(Unversioned(Chat1))
            .store(Arc::clone(&store))
            .pool_threads(1)
            .truncate_after_checkpoint(truncate)
            .open()
            .unwrap()
    };
    let engine = open(false);
    let e = golden("unversioned");
    engine.register(&e).unwrap();
    engine
        .append(&e, unversioned(&[joined1("ann"), said1("ann", "hi")]))
        .unwrap();
    assert_eq!(engine.checkpoint(&e).unwrap(), 2);
    engine
        .append(&e, unversioned(&[joined1("bo"), left1("ann")]))
        .unwrap();
    let e = golden("mixed");
    engine.register(&e).unwrap();
    engine
        .append(&e, unversioned(&[joined1("fay"), said1("fay", "old")]))
        .unwrap();
    assert_eq!(engine.checkpoint(&e).unwrap(), 2);
    engine.close().unwrap();
    let engine = open(true);
    let e = golden("unversioned-truncated");
    engine.register(&e).unwrap();
    engine
        .append(&e, unversioned(&[joined1("cy"), said1("cy", "before")]))
        .unwrap();
    assert_eq!(engine.checkpoint(&e).unwrap(), 2);
    engine
        .append(&e, unversioned(&[said1("cy", "after")]))
        .unwrap();
    engine.close().unwrap();
    store.close().unwrap();
}

/// The part written by versions 1, 2 and 3 of the chat types.
fn write_versioned_part(dir: &Path) {
    let store: Arc<dyn Store> = Arc::new(
        FileStore::builder(dir)
            .segment_bytes(64 << 10)
            .open()
            .unwrap(),
    );
    let one = Engine::builder(Typed(Chat1))
        .store(Arc::clone(&store))
        .pool_threads(1)
        .open()
        .unwrap();
    let e = golden("v1");
    one.register(&e).unwrap();
    one.append_typed(&e, &[joined1("dee"), said1("dee", "one")])
        .unwrap();
    assert_eq!(one.checkpoint(&e).unwrap(), 2);
    one.append_typed(&e, &[left1("dee")]).unwrap();
    let e = golden("mixed");
    one.append_typed(&e, &[said1("fay", "v1")]).unwrap();
    assert_eq!(one.checkpoint(&e).unwrap(), 3);
    one.close().unwrap();

    let two = Engine::builder(Typed(Chat2))
        .store(Arc::clone(&store))
        .pool_threads(1)
        .open()
        .unwrap();
    let e = golden("v2");
    two.register(&e).unwrap();
    two.append_typed(&e, &[joined2("eve"), said2("eve", "two", Some(1))])
        .unwrap();
    assert_eq!(two.checkpoint(&e).unwrap(), 2);
    two.append_typed(&e, &[departed2("eve")]).unwrap();
    let e = golden("mixed");
    two.append_typed(&e, &[said2("fay", "v2", Some(3)), departed2("fay")])
        .unwrap();
    for (id, user, text) in [
        ("future", "gus", "soon"),
        ("future-truncated", "hal", "gone"),
    ] {
        let e = golden(id);
        two.register(&e).unwrap();
        two.append_typed(&e, &[joined2(user), said2(user, text, None)])
            .unwrap();
    }
    two.close().unwrap();

    for truncate in [false, true] {
        let three = Engine::builder(Typed(Chat3))
            .store(Arc::clone(&store))
            .pool_threads(1)
            .truncate_after_checkpoint(truncate)
            .open()
            .unwrap();
        if truncate {
            let e = golden("future-truncated");
            assert_eq!(three.checkpoint(&e).unwrap(), 2);
        } else {
            let e = golden("v3");
            three.register(&e).unwrap();
            three
                .append_typed(&e, &[joined2("ivy"), said2("ivy", "three", None)])
                .unwrap();
            assert_eq!(three.checkpoint(&e).unwrap(), 2);
            three.append_typed(&e, &[departed2("ivy")]).unwrap();
            assert_eq!(three.checkpoint(&golden("future")).unwrap(), 2);
        }
        three.close().unwrap();
    }
    store.close().unwrap();
}

fn generator_dir() -> Option<PathBuf> {
    std::env::var_os("PORTCULLIS_GOLDEN_DIR").map(PathBuf::from)
}

/// Generator, step 1 (see the module docs): the part written before versions.
#[test]
#[ignore = "writes the golden store; run by hand with PORTCULLIS_GOLDEN_DIR"]
fn golden_1_write_the_unversioned_part() {
    if let Some(dir) = generator_dir() {
        write_unversioned_part(&dir);
    }
}

/// Generator, step 2: the versioned part, over the directory step 1 wrote.
#[test]
#[ignore = "writes the golden store; run by hand with PORTCULLIS_GOLDEN_DIR"]
fn golden_2_write_the_versioned_part() {
    if let Some(dir) = generator_dir() {
        write_versioned_part(&dir);
    }
}
