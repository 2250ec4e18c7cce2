//! A chat service on typed records: `cargo run --example chat`.
//!
//! Eight writer threads post to 32 rooms of one engine; the engine closes, opens again over
//! the same directory, answers at once (no room is restored yet), and a background warm
//! restores the rooms while a reader touches one of them first. Records and states are the
//! application's own serde types ([`portcullis::typed`]); rooms are registered on first write
//! and checkpointed every 100 messages by the builder. The machine refuses an empty message
//! and a rename to the room's own title in `check`, before anything is written (SPEC R12).

use std::time::Instant;

use portcullis::store::SyncPolicy;
use portcullis::typed::{Typed, TypedMachine};
use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Result};
use serde::{Deserialize, Serialize};

/// One record of a room's history.
#[derive(Debug, Serialize, Deserialize)]
enum Message {
    Posted { author: String, text: String },
    Renamed { title: String },
}

/// A room's folded state; it is also what a checkpoint stores.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Room {
    title: String,
    messages: u64,
    last: Option<(String, String)>,
}

struct Chat;

impl TypedMachine for Chat {
    type Record = Message;
    type State = Room;

    fn fresh(&self, room: &EntityId) -> Room {
        Room {
            title: String::from_utf8_lossy(room.id()).into_owned(),
            ..Room::default()
        }
    }

    /// Refuses a command the room does not allow, before anything is written (SPEC R12): the
    /// write answers `Error::Refused` and the room keeps serving.
    fn check(&self, room: &Room, _: &ApplyContext<'_>, message: &Message) -> Result<(), Rejection> {
        match message {
            Message::Posted { text, .. } if text.is_empty() => {
                Err(Rejection::new("an empty message"))
            }
            Message::Renamed { title } if *title == room.title => Err(Rejection::new(format!(
                "the room is already called {title}"
            ))),
            _ => Ok(()),
        }
    }

    /// Folds a record that was written: it is history, so this never refuses it.
    fn apply(
        &self,
        room: &mut Room,
        _: &ApplyContext<'_>,
        message: Message,
    ) -> Result<(), Rejection> {
        match message {
            Message::Posted { author, text } => {
                room.messages += 1;
                room.last = Some((author, text));
            }
            Message::Renamed { title } => room.title = title,
        }
        Ok(())
    }
}

const WRITERS: usize = 8;
const ROOMS: usize = 32;
const POSTS_PER_WRITER: usize = 250;

fn open(dir: &std::path::Path) -> Result<Engine<Typed<Chat>>> {
    Engine::builder(Typed(Chat))
        .directory(dir)
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .register_on_first_write(true)
        .checkpoint_every(100)
        .open()
}

fn room(i: usize) -> Result<EntityId> {
    EntityId::new("chat", format!("room-{i}"))
}

fn main() -> Result<()> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let engine = open(dir.path())?;
    let started = Instant::now();
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let engine = &engine;
                s.spawn(move || -> Result<()> {
                    for i in 0..POSTS_PER_WRITER {
                        let post = Message::Posted {
                            author: format!("writer-{w}"),
                            text: format!("message {i}"),
                        };
                        engine.append_typed(&room((w * 7 + i) % ROOMS)?, &[post])?;
                    }
                    Ok(())
                })
            })
            .collect();
        writers
            .into_iter()
            .try_for_each(|w| w.join().expect("a writer thread panicked"))
    })?;
    let rename = |title: &str| Message::Renamed {
        title: title.into(),
    };
    engine.append_typed(&room(0)?, &[rename("general")])?;
    // Refused commands write nothing, and the room keeps serving.
    let empty = Message::Posted {
        author: "writer-0".into(),
        text: String::new(),
    };
    for refused in [rename("general"), empty] {
        match engine.append_typed(&room(0)?, &[refused]) {
            Err(Error::Refused { reason, .. }) => println!("refused: {reason}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    println!(
        "{} posts by {WRITERS} threads to {ROOMS} rooms in {:.1?}",
        WRITERS * POSTS_PER_WRITER,
        started.elapsed()
    );
    engine.close()?;

    // Open again: ready at once, every room pending until touched or warmed.
    let started = Instant::now();
    let engine = open(dir.path())?;
    println!("reopened in {:.1?}", started.elapsed());
    let warm = engine.warm()?;
    let general = engine.read(&room(0)?, Room::clone)?;
    println!(
        "{}: {} messages, the last by {:?}",
        general.title,
        general.messages,
        general.last.map(|(author, _)| author)
    );
    let progress = warm.wait()?;
    let (total, contained) = engine.fold_all(0, |sum, _, room| sum + room.messages)?;
    assert_eq!(total, (WRITERS * POSTS_PER_WRITER) as u64);
    assert_eq!(contained, 0);
    println!(
        "warm restored {} rooms in {:.1?}; {total} messages in all",
        progress.done, progress.elapsed
    );
    let recent: Vec<_> = engine
        .history_typed(&room(0)?, 1)?
        .take(2)
        .collect::<Result<_>>()?;
    println!("the first two records of room-0: {recent:?}");
    engine.close()
}
