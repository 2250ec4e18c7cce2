//! The README's quick start (SPEC R12): the example `examples/quick_start.rs` is the README's
//! code block verbatim, it runs, and its machine refuses an empty message before anything is
//! written, leaving the room serving. Before the change the quick start refused the empty
//! message in `apply`: the message was written and the room contained for good.

use std::path::Path;

/// The README's quick-start code block.
fn readme_block() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let section = readme
        .split_once("## Quick start: an engine of entities")
        .expect("README.md has the quick start")
        .1;
    let code = section
        .split_once("```rust\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the quick start has a ```rust block")
        .0;
    code.to_owned()
}

#[test]
fn the_readme_quick_start_is_the_quick_start_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = std::fs::read_to_string(root.join("examples/quick_start.rs")).unwrap();
    let body: String = example
        .lines()
        .skip_while(|l| l.starts_with("//"))
        .skip_while(|l| l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        body,
        readme_block(),
        "examples/quick_start.rs must be the README's quick start, verbatim"
    );
}

mod quick_start {
    include!("../examples/quick_start.rs");

    use std::sync::Arc;

    use portcullis::store::{KeyRange, MemoryStore, Store};

    type Rows = Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>;

    /// Every row of every partition of the store.
    fn rows(store: &MemoryStore) -> Rows {
        store
            .list_partitions(b"")
            .unwrap()
            .into_iter()
            .map(|p| {
                let entries = store.entries(&p, KeyRange::all()).map(Result::unwrap);
                (p.to_string(), entries.collect())
            })
            .collect()
    }

    #[test]
    fn r12_the_quick_start_runs() {
        main().unwrap();
    }

    fn scenario(
        skip_checks: bool,
    ) -> (
        portcullis::Result<std::ops::RangeInclusive<u64>>,
        Rows,
        Rows,
        Engine<Typed<Chat>>,
    ) {
        let store = Arc::new(MemoryStore::new());
        let engine = Engine::builder(Typed(Chat))
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .open()
            .unwrap();
        engine.set_skip_checks_for_test(skip_checks);
        let lobby = EntityId::new("chat", "lobby").unwrap();
        engine.register(&lobby).unwrap();
        let post = |text: &str| Message::Posted {
            author: "ann".into(),
            text: text.into(),
        };
        engine.append_typed(&lobby, &[post("hello")]).unwrap();
        let before = rows(&store);
        let answer = engine.append_typed(&lobby, &[post("")]);
        let after = rows(&store);
        (answer, before, after, engine)
    }

    #[test]
    fn r12_the_quick_starts_empty_message_is_refused_nothing_is_written_and_the_room_serves() {
        let (answer, before, after, engine) = scenario(false);
        let lobby = EntityId::new("chat", "lobby").unwrap();
        match answer {
            Err(Error::Refused { entity, reason }) => {
                assert_eq!(
                    (entity.as_str(), reason.as_str()),
                    ("chat/lobby", "an empty message")
                );
            }
            other => panic!("the empty message must be refused, got {other:?}"),
        }
        assert_eq!(
            Error::Refused {
                entity: String::new(),
                reason: String::new()
            }
            .code(),
            17
        );
        assert_eq!(
            before, after,
            "a refused write changes no row (no record, head or lease)"
        );
        assert_eq!(engine.history(&lobby, 1).unwrap().count(), 1);
        assert!(engine.containment(&lobby).unwrap().is_none());
        // The room keeps serving: the next message is record 2.
        let post = Message::Posted {
            author: "bo".into(),
            text: "still here".into(),
        };
        assert_eq!(engine.append_typed(&lobby, &[post]).unwrap(), 2..=2);
        let room = engine.read(&lobby, Room::clone).unwrap();
        assert_eq!(
            (room.messages, room.last_author.as_deref()),
            (2, Some("bo"))
        );
    }

    /// Negative control: without the check the empty message is written, and the room stays
    /// serving only because this machine's `apply` folds it (the refusal is lost).
    #[test]
    fn r12_negative_control_without_check_the_empty_message_is_written() {
        let (answer, before, after, engine) = scenario(true);
        assert_eq!(answer.unwrap(), 2..=2);
        assert_ne!(before, after);
        let lobby = EntityId::new("chat", "lobby").unwrap();
        assert_eq!(engine.history(&lobby, 1).unwrap().count(), 2);
    }
}
