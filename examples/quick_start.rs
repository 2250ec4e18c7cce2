// The README's quick start, verbatim below this header: `cargo run --example quick_start`.
// tests/quick_start.rs checks that the two agree and runs it.

use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Typed, TypedMachine};
use serde::{Deserialize, Serialize};

/// One record of a chat room's history.
#[derive(Serialize, Deserialize)]
enum Message {
    Posted { author: String, text: String },
}

/// A room's state, folded from its records; checkpoints store it.
#[derive(Clone, Default, Serialize, Deserialize)]
struct Room {
    messages: u64,
    last_author: Option<String>,
}

struct Chat;

impl TypedMachine for Chat {
    type Record = Message;
    type State = Room;

    fn fresh(&self, _room: &EntityId) -> Room {
        Room::default()
    }

    /// Refuses a command against the current state, before anything is written.
    fn check(&self, _room: &Room, _: &ApplyContext<'_>, record: &Message) -> Result<(), Rejection> {
        let Message::Posted { text, .. } = record;
        if text.is_empty() {
            return Err(Rejection::new("an empty message")); // refused: nothing is written
        }
        Ok(())
    }

    /// Folds a record that was written: it is history now, so it is not refused here.
    fn apply(
        &self,
        room: &mut Room,
        _: &ApplyContext<'_>,
        record: Message,
    ) -> Result<(), Rejection> {
        let Message::Posted { author, .. } = record;
        room.messages += 1;
        room.last_author = Some(author);
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let lobby = EntityId::new("chat", "lobby")?;

    // Open over a directory (created if missing), register an entity, write, read.
    let engine = Engine::builder(Typed(Chat)).directory(dir.path()).open()?;
    engine.register(&lobby)?;
    let post = |author: &str, text: &str| Message::Posted {
        author: author.into(),
        text: text.into(),
    };
    engine.append_typed(&lobby, &[post("ann", "hello"), post("bo", "hi ann")])?; // durable on return
    assert_eq!(engine.read(&lobby, |room| room.messages)?, 2);

    // A refused command answers `Error::Refused`: nothing is written, the room keeps serving.
    let refused = engine.append_typed(&lobby, &[post("bo", "")]);
    assert!(matches!(refused, Err(Error::Refused { .. })));
    assert_eq!(engine.read(&lobby, |room| room.messages)?, 2);

    // A checkpoint: a restart loads it and replays only the records after it.
    engine.checkpoint(&lobby)?;
    engine.append_typed(&lobby, &[post("ann", "bye")])?;
    engine.close()?;

    // Restart: open reads no history; the first touch restores the room, exactly once.
    let engine = Engine::builder(Typed(Chat)).directory(dir.path()).open()?;
    let warm = engine.warm()?; // restores every other entity in the background
    let room = engine.read(&lobby, Room::clone)?;
    assert_eq!(
        (room.messages, room.last_author.as_deref()),
        (3, Some("ann"))
    );
    warm.wait()?;
    engine.close()?;
    Ok(())
}
