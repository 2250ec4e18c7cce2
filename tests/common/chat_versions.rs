//! Three versions of one chat room's record and state types, as an application changes them
//! over time (SPEC E7), and a typed machine for each.
//!
//! - Version 1: `Joined`, `Said { user, text }`, `Left`; the room keeps members and lines.
//! - Version 2 adds a field (`Said::reply_to`) and renames a variant (`Left` is `Departed`),
//!   and the room counts the lines said. It reads version 1 through its upcast hooks.
//! - Version 3 keeps version 2's records and stores members with the record they joined at:
//!   a checkpoint version 2 does not read.

use std::collections::BTreeMap;

use portcullis::typed::{self, TypedMachine};
use portcullis::{ApplyContext, EntityId, Rejection};

pub mod v1 {
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub enum Msg {
        Joined { user: String },
        Said { user: String, text: String },
        Left { user: String },
    }

    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Room {
        pub members: Vec<String>,
        pub lines: Vec<String>,
    }
}

pub mod v2 {
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub enum Msg {
        Joined {
            user: String,
        },
        Said {
            user: String,
            text: String,
            reply_to: Option<u64>,
        },
        Departed {
            user: String,
        },
    }

    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Room {
        pub members: Vec<String>,
        pub lines: Vec<String>,
        pub said: u64,
    }
}

pub mod v3 {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Room {
        /// Each member, with the record they joined at (0: before version 3).
        pub members: BTreeMap<String, u64>,
        pub lines: Vec<String>,
    }
}

pub fn joined1(user: &str) -> v1::Msg {
    v1::Msg::Joined { user: user.into() }
}

pub fn said1(user: &str, text: &str) -> v1::Msg {
    v1::Msg::Said {
        user: user.into(),
        text: text.into(),
    }
}

pub fn left1(user: &str) -> v1::Msg {
    v1::Msg::Left { user: user.into() }
}

pub fn joined2(user: &str) -> v2::Msg {
    v2::Msg::Joined { user: user.into() }
}

pub fn said2(user: &str, text: &str, reply_to: Option<u64>) -> v2::Msg {
    v2::Msg::Said {
        user: user.into(),
        text: text.into(),
        reply_to,
    }
}

pub fn departed2(user: &str) -> v2::Msg {
    v2::Msg::Departed { user: user.into() }
}

fn line(user: &str, text: &str, reply_to: Option<u64>) -> String {
    match reply_to {
        Some(seq) => format!("{user} (re {seq}): {text}"),
        None => format!("{user}: {text}"),
    }
}

/// Version 1's machine.
pub struct Chat1;

impl TypedMachine for Chat1 {
    type Record = v1::Msg;
    type State = v1::Room;

    fn fresh(&self, _: &EntityId) -> v1::Room {
        v1::Room::default()
    }

    fn apply(
        &self,
        room: &mut v1::Room,
        _: &ApplyContext<'_>,
        msg: v1::Msg,
    ) -> Result<(), Rejection> {
        match msg {
            v1::Msg::Joined { user } => room.members.push(user),
            v1::Msg::Said { user, text } => room.lines.push(line(&user, &text, None)),
            v1::Msg::Left { user } => room.members.retain(|m| *m != user),
        }
        Ok(())
    }
}

/// Version 1's record as version 2 reads it.
pub fn record_1_to_2(msg: v1::Msg) -> v2::Msg {
    match msg {
        v1::Msg::Joined { user } => v2::Msg::Joined { user },
        v1::Msg::Said { user, text } => v2::Msg::Said {
            user,
            text,
            reply_to: None,
        },
        v1::Msg::Left { user } => v2::Msg::Departed { user },
    }
}

fn apply2(room: &mut v2::Room, msg: v2::Msg) {
    match msg {
        v2::Msg::Joined { user } => room.members.push(user),
        v2::Msg::Said {
            user,
            text,
            reply_to,
        } => {
            room.lines.push(line(&user, &text, reply_to));
            room.said += 1;
        }
        v2::Msg::Departed { user } => room.members.retain(|m| *m != user),
    }
}

/// Version 2's machine, with upcast hooks for version 1.
pub struct Chat2;

impl TypedMachine for Chat2 {
    type Record = v2::Msg;
    type State = v2::Room;
    const VERSION: u32 = 2;

    fn fresh(&self, _: &EntityId) -> v2::Room {
        v2::Room::default()
    }

    fn apply(
        &self,
        room: &mut v2::Room,
        _: &ApplyContext<'_>,
        msg: v2::Msg,
    ) -> Result<(), Rejection> {
        apply2(room, msg);
        Ok(())
    }

    fn upcast_record(&self, version: u32, bytes: &[u8]) -> Result<v2::Msg, Rejection> {
        match version {
            1 => typed::decode::<v1::Msg>(bytes).map(record_1_to_2),
            _ => Err(Rejection::new(format!("no reader for version {version}"))),
        }
    }

    fn upcast_checkpoint(&self, version: u32, bytes: &[u8]) -> Result<v2::Room, Rejection> {
        match version {
            1 => typed::decode::<v1::Room>(bytes).map(|room| v2::Room {
                said: room.lines.len() as u64,
                members: room.members,
                lines: room.lines,
            }),
            _ => Err(Rejection::new(format!("no reader for version {version}"))),
        }
    }
}

/// Version 2's machine without upcast hooks: the defaults refuse.
pub struct Chat2Bare;

impl TypedMachine for Chat2Bare {
    type Record = v2::Msg;
    type State = v2::Room;
    const VERSION: u32 = 2;

    fn fresh(&self, e: &EntityId) -> v2::Room {
        Chat2.fresh(e)
    }

    fn apply(
        &self,
        room: &mut v2::Room,
        ctx: &ApplyContext<'_>,
        msg: v2::Msg,
    ) -> Result<(), Rejection> {
        Chat2.apply(room, ctx, msg)
    }
}

/// Version 3's machine: version 2's records, a new state; reads versions 1 and 2.
pub struct Chat3;

impl TypedMachine for Chat3 {
    type Record = v2::Msg;
    type State = v3::Room;
    const VERSION: u32 = 3;

    fn fresh(&self, _: &EntityId) -> v3::Room {
        v3::Room::default()
    }

    fn apply(
        &self,
        room: &mut v3::Room,
        ctx: &ApplyContext<'_>,
        msg: v2::Msg,
    ) -> Result<(), Rejection> {
        match msg {
            v2::Msg::Joined { user } => {
                room.members.insert(user, ctx.seq);
            }
            v2::Msg::Said {
                user,
                text,
                reply_to,
            } => room.lines.push(line(&user, &text, reply_to)),
            v2::Msg::Departed { user } => {
                room.members.remove(&user);
            }
        }
        Ok(())
    }

    fn upcast_record(&self, version: u32, bytes: &[u8]) -> Result<v2::Msg, Rejection> {
        match version {
            1 => typed::decode::<v1::Msg>(bytes).map(record_1_to_2),
            2 => typed::decode::<v2::Msg>(bytes),
            _ => Err(Rejection::new(format!("no reader for version {version}"))),
        }
    }

    fn upcast_checkpoint(&self, version: u32, bytes: &[u8]) -> Result<v3::Room, Rejection> {
        let from = |members: Vec<String>, lines| v3::Room {
            members: members
                .into_iter()
                .map(|m| (m, 0))
                .collect::<BTreeMap<_, _>>(),
            lines,
        };
        match version {
            1 => typed::decode::<v1::Room>(bytes).map(|r| from(r.members, r.lines)),
            2 => typed::decode::<v2::Room>(bytes).map(|r| from(r.members, r.lines)),
            _ => Err(Rejection::new(format!("no reader for version {version}"))),
        }
    }
}
