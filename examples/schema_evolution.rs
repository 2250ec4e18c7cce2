//! Changing record types without losing history: `cargo run --example schema_evolution`.
//!
//! Version 1 of a chat service writes rooms: messages, a rename, a checkpoint, more messages.
//! Version 2 adds a field to a record (`Posted::reply_to`), renames a variant (`Renamed` is
//! `Retitled`) and adds a field to the state (`authors`). It raises
//! [`TypedMachine::VERSION`] to 2 and brings version 1 up in its upcast hooks, so it restores
//! the old rooms from their version 1 checkpoint and history, reads that history as version 2
//! records, and writes version 2 from then on. Going back to version 1 afterwards is refused,
//! naming the versions: old code never guesses at new records. The rules are in
//! `docs/SCHEMA.md`; `tests/schema_evolution.rs` runs this example. Every claim it prints is
//! checked.

use std::path::Path;

use portcullis::typed::{self, Typed, TypedMachine};
use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Result};

/// Version 1's types, as the application had them.
mod v1 {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    pub enum Message {
        Posted { author: String, text: String },
        Renamed { title: String },
    }

    #[derive(Clone, Debug, Default, Serialize, Deserialize)]
    pub struct Room {
        pub title: String,
        pub messages: u64,
    }
}

/// Version 2's types: the current ones.
mod v2 {
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub enum Message {
        /// Gained `reply_to`: the message it answers.
        Posted {
            author: String,
            text: String,
            reply_to: Option<u64>,
        },
        /// Was `Renamed`.
        Retitled { title: String },
    }

    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct Room {
        pub title: String,
        pub messages: u64,
        /// New in version 2: who posted, in order of their first message.
        pub authors: Vec<String>,
    }
}

/// Version 1's machine.
struct ChatV1;

impl TypedMachine for ChatV1 {
    type Record = v1::Message;
    type State = v1::Room;

    fn fresh(&self, _: &EntityId) -> v1::Room {
        v1::Room::default()
    }

    fn apply(
        &self,
        room: &mut v1::Room,
        _: &ApplyContext<'_>,
        m: v1::Message,
    ) -> Result<(), Rejection> {
        match m {
            v1::Message::Posted { .. } => room.messages += 1,
            v1::Message::Renamed { title } => room.title = title,
        }
        Ok(())
    }
}

/// Version 2's machine: version 2 records and state, and the way up from version 1.
struct ChatV2;

impl TypedMachine for ChatV2 {
    type Record = v2::Message;
    type State = v2::Room;
    const VERSION: u32 = 2;

    fn fresh(&self, _: &EntityId) -> v2::Room {
        v2::Room::default()
    }

    fn apply(
        &self,
        room: &mut v2::Room,
        _: &ApplyContext<'_>,
        m: v2::Message,
    ) -> Result<(), Rejection> {
        match m {
            v2::Message::Posted { author, .. } => {
                room.messages += 1;
                if !room.authors.contains(&author) {
                    room.authors.push(author);
                }
            }
            v2::Message::Retitled { title } => room.title = title,
        }
        Ok(())
    }

    /// A version 1 record (also one written before versions existed) as version 2.
    fn upcast_record(&self, version: u32, bytes: &[u8]) -> Result<v2::Message, Rejection> {
        match version {
            1 => Ok(match typed::decode::<v1::Message>(bytes)? {
                v1::Message::Posted { author, text } => v2::Message::Posted {
                    author,
                    text,
                    reply_to: None,
                },
                v1::Message::Renamed { title } => v2::Message::Retitled { title },
            }),
            _ => Err(Rejection::new(format!(
                "no reader for records of version {version}"
            ))),
        }
    }

    /// A version 1 checkpoint as version 2. Version 1 did not keep the authors: they are
    /// learned again from the messages that follow.
    fn upcast_checkpoint(&self, version: u32, bytes: &[u8]) -> Result<v2::Room, Rejection> {
        match version {
            1 => typed::decode::<v1::Room>(bytes).map(|old| v2::Room {
                title: old.title,
                messages: old.messages,
                authors: Vec::new(),
            }),
            _ => Err(Rejection::new(format!(
                "no reader for checkpoints of version {version}"
            ))),
        }
    }
}

/// What the example saw, for `tests/schema_evolution.rs`.
#[derive(Debug)]
pub struct Summary {
    /// The room as version 2 restored it from version 1's checkpoint and history.
    pub restored_title: String,
    /// Messages counted after version 2 wrote its own.
    pub messages: u64,
    /// The refusal version 1 gave when it met version 2's records.
    pub rollback_refusal: String,
}

#[allow(dead_code)] // `main` is unused when `tests/schema_evolution.rs` includes this file.
fn main() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|source| Error::Io {
        context: "creating a temporary directory".into(),
        source,
    })?;
    run(dir.path()).map(|_| ())
}

fn posted(author: &str, text: &str) -> v1::Message {
    v1::Message::Posted {
        author: author.into(),
        text: text.into(),
    }
}

/// Runs every step on a store in `dir`.
pub fn run(dir: &Path) -> Result<Summary> {
    let room = EntityId::new("rooms", "lobby")?;

    // Version 1 writes a room and checkpoints it.
    let engine = Engine::builder(Typed(ChatV1)).directory(dir).open()?;
    engine.register(&room)?;
    engine.append_typed(
        &room,
        &[v1::Message::Renamed {
            title: "Lobby".into(),
        }],
    )?;
    engine.append_typed(&room, &[posted("ann", "hello"), posted("bo", "hi ann")])?;
    let at = engine.checkpoint(&room)?;
    engine.append_typed(
        &room,
        &[v1::Message::Renamed {
            title: "Front desk".into(),
        }],
    )?;
    engine.close()?;
    println!("version 1 wrote 4 records and a checkpoint at record {at}");

    // Version 2 restores the room from version 1's checkpoint and the record after it.
    let engine = Engine::builder(Typed(ChatV2)).directory(dir).open()?;
    let restored = engine.read(&room, v2::Room::clone)?;
    assert_eq!(restored.title, "Front desk");
    assert_eq!(restored.messages, 2);
    assert!(
        restored.authors.is_empty(),
        "version 1's checkpoint kept no authors"
    );
    println!(
        "version 2 restored \"{}\" with {} messages from version 1's checkpoint",
        restored.title, restored.messages
    );
    // Old history reads as version 2 records: the new field defaulted, the variant renamed.
    let history: Vec<(u64, v2::Message)> =
        engine.history_typed(&room, 1)?.collect::<Result<_>>()?;
    assert_eq!(
        history[0],
        (
            1,
            v2::Message::Retitled {
                title: "Lobby".into()
            }
        )
    );
    assert_eq!(
        history[1],
        (
            2,
            v2::Message::Posted {
                author: "ann".into(),
                text: "hello".into(),
                reply_to: None
            }
        )
    );
    println!(
        "version 2 reads version 1's {} records as its own",
        history.len()
    );

    // Version 2 writes its own records and checkpoint.
    let reply = v2::Message::Posted {
        author: "cy".into(),
        text: "welcome back".into(),
        reply_to: Some(2),
    };
    engine.append_typed(&room, &[reply])?;
    engine.checkpoint(&room)?;
    engine.close()?;
    let engine = Engine::builder(Typed(ChatV2)).directory(dir).open()?;
    let now = engine.read(&room, v2::Room::clone)?;
    assert_eq!(
        (now.messages, now.authors.clone()),
        (3, vec!["cy".to_string()])
    );
    engine.close()?;
    println!(
        "version 2 wrote a reply and restarted from its own checkpoint: {} messages",
        now.messages
    );

    // Going back to version 1 is refused, naming the versions: it never guesses.
    let engine = Engine::builder(Typed(ChatV1)).directory(dir).open()?;
    let refusal = match engine.read(&room, |r| r.messages) {
        Err(e @ Error::Contained { .. }) => e.to_string(),
        other => panic!("version 1 read version 2's room: {other:?}"),
    };
    assert!(
        refusal.contains("version 2, newer than this code's version 1"),
        "{refusal}"
    );
    engine.close()?;
    println!("version 1 refuses the room: {refusal}");

    Ok(Summary {
        restored_title: restored.title,
        messages: now.messages,
        rollback_refusal: refusal,
    })
}
