//! Typed records and states (SPEC E6), and history and partition scans as iterators (SPEC L2,
//! S1), through the public API only.

mod common;

use std::sync::Arc;

use common::engine::TestStore;
use portcullis::engine::{Engine, EngineBuilder};
use portcullis::log;
use portcullis::store::{Batch, Entries, KeyRange, MemoryStore, Partition, Store};
use portcullis::typed::{Typed, TypedMachine};
use portcullis::{ApplyContext, EntityId, Error, Rejection};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Msg {
    Joined { user: String },
    Said { user: String, text: String },
    Left { user: String },
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Room {
    members: Vec<String>,
    lines: Vec<(u64, String)>,
}

struct Chat;

impl TypedMachine for Chat {
    type Record = Msg;
    type State = Room;

    fn fresh(&self, _: &EntityId) -> Room {
        Room::default()
    }

    fn apply(&self, room: &mut Room, ctx: &ApplyContext<'_>, msg: Msg) -> Result<(), Rejection> {
        match msg {
            Msg::Joined { user } => room.members.push(user),
            Msg::Said { user, text } => {
                if !room.members.contains(&user) {
                    return Err(Rejection::new(format!("{user} is not in the room")));
                }
                room.lines.push((ctx.seq, format!("{user}: {text}")));
            }
            Msg::Left { user } => room.members.retain(|m| *m != user),
        }
        Ok(())
    }
}

fn builder(store: &Arc<TestStore>) -> EngineBuilder<Typed<Chat>> {
    Engine::builder(Typed(Chat))
        .store(Arc::clone(store) as Arc<dyn Store>)
        .pool_threads(1)
}

fn said(user: &str, text: &str) -> Msg {
    Msg::Said {
        user: user.into(),
        text: text.into(),
    }
}

fn joined(user: &str) -> Msg {
    Msg::Joined { user: user.into() }
}

#[test]
fn e6_typed_records_fold_checkpoint_and_restore_after_restart() {
    let store = TestStore::new();
    let room = EntityId::new("chat", "lobby").unwrap();
    let expected = {
        let engine = builder(&store).open().unwrap();
        engine.register(&room).unwrap();
        engine
            .append_typed(&room, &[joined("ann"), said("ann", "hi")])
            .unwrap();
        assert_eq!(engine.checkpoint(&room).unwrap(), 2);
        engine.append_typed(&room, &[said("ann", "bye")]).unwrap();
        let state = engine.read(&room, Room::clone).unwrap();
        assert_eq!(state.lines.len(), 2);
        engine.close().unwrap();
        state
    };
    // The restart restores from the typed checkpoint and replays the one typed record after it.
    let engine = builder(&store).open().unwrap();
    assert_eq!(engine.read(&room, Room::clone).unwrap(), expected);
    let history: Vec<(u64, Msg)> = engine
        .history_typed(&room, 1)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        history,
        vec![
            (1, joined("ann")),
            (2, said("ann", "hi")),
            (3, said("ann", "bye"))
        ]
    );
    engine.close().unwrap();
}

#[test]
fn e6_raw_bytes_stay_available_and_undecodable_ones_are_refused() {
    let store = TestStore::new();
    let engine = builder(&store).open().unwrap();
    let room = EntityId::new("chat", "raw").unwrap();
    engine.register(&room).unwrap();
    // Bytes that decode as a record are accepted through the raw call.
    let raw = portcullis::typed::encode(&joined("bo")).unwrap();
    assert_eq!(engine.append(&room, vec![raw]).unwrap(), 1..=1);
    // Bytes that do not decode never enter history.
    let err = engine.append(&room, vec![vec![0xff; 3]]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = engine.defer(&room, vec![9]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(engine.history(&room, 1).unwrap().count(), 1);
    assert_eq!(engine.read(&room, |r| r.members.clone()).unwrap(), ["bo"]);
}

#[test]
fn e6_write_typed_decides_on_the_state_and_may_write_nothing() {
    let store = TestStore::new();
    let engine = builder(&store).open().unwrap();
    let room = EntityId::new("chat", "decide").unwrap();
    engine.register(&room).unwrap();
    let speak = |user: &'static str| {
        engine
            .write_typed(&room, move |r: &Room| {
                if r.members.iter().any(|m| m == user) {
                    (vec![said(user, "hello")], true)
                } else {
                    (vec![], false)
                }
            })
            .unwrap()
    };
    let refused = speak("cy");
    assert!(!refused.value);
    assert_eq!(refused.seqs, None);
    engine.append_typed(&room, &[joined("cy")]).unwrap();
    let spoken = speak("cy");
    assert!(spoken.value);
    assert_eq!(spoken.seqs, Some(2..=2));
    // A typed deferral of a restored entity is appended at once.
    engine
        .defer_typed(&room, &Msg::Left { user: "cy".into() })
        .unwrap();
    assert!(engine.read(&room, |r| r.members.is_empty()).unwrap());
}

#[test]
fn e6_a_record_that_does_not_decode_in_history_contains_only_its_entity() {
    let store = TestStore::new();
    let bad = EntityId::new("chat", "bad").unwrap();
    let good = EntityId::new("chat", "good").unwrap();
    {
        let engine = builder(&store).open().unwrap();
        engine.register(&bad).unwrap();
        engine.register(&good).unwrap();
        engine.append_typed(&good, &[joined("ann")]).unwrap();
        engine.close().unwrap();
    }
    // Written below the engine, as a damaged or foreign writer would: no validation there.
    log::append(&*store, &bad.partition(), &[vec![0xff, 0xff]], Batch::new())
        .unwrap()
        .committed()
        .unwrap();
    let engine = builder(&store).open().unwrap();
    let err = engine.read(&bad, |_| ()).unwrap_err();
    assert!(
        matches!(&err, Error::Contained { reason, .. } if reason.contains("record 1")),
        "{err}"
    );
    // The typed history names the record that does not decode.
    let mut history = engine.history_typed(&bad, 1).unwrap();
    assert!(matches!(history.next(), Some(Err(Error::Corrupt { .. }))));
    assert!(history.next().is_none());
    assert_eq!(engine.read(&good, |r| r.members.len()).unwrap(), 1);
}

#[test]
fn l2_history_is_an_iterator_over_pages_and_refuses_unknown_entities() {
    let store = TestStore::new();
    let engine = builder(&store).open().unwrap();
    let room = EntityId::new("chat", "long").unwrap();
    engine.register(&room).unwrap();
    engine.append_typed(&room, &[joined("ann")]).unwrap();
    // More than one page of history (pages are 256 records).
    let lines: Vec<Msg> = (0..600).map(|i| said("ann", &i.to_string())).collect();
    engine.append_typed(&room, &lines).unwrap();
    let seqs: Vec<u64> = engine
        .history(&room, 1)
        .unwrap()
        .map(|r| r.unwrap().seq)
        .collect();
    assert_eq!(seqs, (1..=601).collect::<Vec<_>>());
    assert_eq!(engine.history(&room, 600).unwrap().count(), 2);
    assert_eq!(engine.history(&room, 602).unwrap().count(), 0);
    let ghost = EntityId::new("chat", "ghost").unwrap();
    assert!(matches!(
        engine.history(&ghost, 1).unwrap_err(),
        Error::UnknownEntity(_)
    ));
    engine.close().unwrap();
    assert!(matches!(
        engine.history(&room, 1).unwrap_err(),
        Error::Closed
    ));
}

#[test]
fn s1_entries_iterates_every_page_of_a_range_in_order() {
    let store = MemoryStore::new();
    let p = Partition::new("inventory").unwrap();
    for k in 0u16..700 {
        let key = format!("item/{k:04}").into_bytes();
        store
            .apply(&p, &Batch::new().put(key, k.to_be_bytes().to_vec()))
            .unwrap()
            .is_committed();
    }
    store
        .apply(&p, &Batch::new().put(b"other".to_vec(), b"x".to_vec()))
        .unwrap()
        .is_committed();
    let keys: Vec<Vec<u8>> = store
        .entries(&p, KeyRange::prefix(b"item/"))
        .map(|e| e.unwrap().0)
        .collect();
    let expected: Vec<Vec<u8>> = (0..700)
        .map(|k| format!("item/{k:04}").into_bytes())
        .collect();
    assert_eq!(keys, expected);
    // Through a `dyn Store`, with small pages, the same answer.
    let shared: Arc<dyn Store> = Arc::new(store);
    let small: Vec<Vec<u8>> = Entries::new(&*shared, p.clone(), KeyRange::prefix(b"item/"))
        .page_size(7)
        .map(|e| e.unwrap().0)
        .collect();
    assert_eq!(small, expected);
    shared.close().unwrap();
    let mut after_close = Entries::new(&*shared, p, KeyRange::all());
    assert!(matches!(after_close.next(), Some(Err(Error::Closed))));
    assert!(after_close.next().is_none());
}
