//! The head row of an entity log: where the log stands (SPEC L1, L4).
//!
//! Every write to the log is guarded on the head row exactly as it was read, and rewrites it in
//! the same batch, so the head is the log's single point of serialisation.
//!
//! A *seal* rewrites the head with nothing changed but its count of settlements: after a write
//! whose answer was lost, it makes sure no delayed copy of that write (guarded on the head as
//! it was) can ever commit (SPEC F12). A head never sealed is stored exactly as before seals
//! existed (row version 1); a sealed one carries the count (row version 2).

use serde::{Deserialize, Serialize};

use super::checkpoint::CheckpointMark;
use super::digest::GENESIS_DIGEST;
use super::{decode_row, encode_row, keys};
use crate::error::Result;
use crate::store::{Partition, Precondition, Store};

/// Where an entity log stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LogHead {
    /// The sequence number the next appended record gets (1 for an empty log).
    pub next_seq: u64,
    /// The oldest record still stored; equals `next_seq` when no record is retained.
    pub first_seq: u64,
    /// The digest of record `first_seq - 1` (the genesis digest when nothing was truncated),
    /// so retained history can be verified without the truncated prefix.
    pub base_digest: u64,
    /// The digest of record `next_seq - 1` (SPEC L4).
    pub digest: u64,
    /// The newest checkpoint's sequence number and digest, if one was written (SPEC L3).
    pub checkpoint: Option<CheckpointMark>,
    /// How many times a write whose answer was lost was settled by sealing this log (see
    /// [`seal`]): each seal moves the head, so no delayed copy of a write planned before it
    /// can commit.
    pub settlements: u64,
}

/// The head row as stored while `settlements` is 0: row version 1, the format from before seals
/// existed (so stores written then stay as they are).
#[derive(Serialize, Deserialize)]
struct HeadV1 {
    next_seq: u64,
    first_seq: u64,
    base_digest: u64,
    digest: u64,
    checkpoint: Option<CheckpointMark>,
}

/// The head row of a sealed log: row version 2.
#[derive(Serialize, Deserialize)]
struct HeadV2 {
    next_seq: u64,
    first_seq: u64,
    base_digest: u64,
    digest: u64,
    checkpoint: Option<CheckpointMark>,
    settlements: u64,
}

/// The row version of a sealed head.
const SEALED_VERSION: u8 = 2;

impl LogHead {
    /// The head of a log that has never been written.
    pub const fn empty() -> Self {
        LogHead {
            next_seq: 1,
            first_seq: 1,
            base_digest: GENESIS_DIGEST,
            digest: GENESIS_DIGEST,
            checkpoint: None,
            settlements: 0,
        }
    }

    /// The sequence number of the last record appended (0 when none was).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Encodes the head as a row value (version 1 unless the log was ever sealed).
    pub fn encode(&self) -> Vec<u8> {
        let LogHead {
            next_seq,
            first_seq,
            base_digest,
            digest,
            checkpoint,
            settlements,
        } = *self;
        if settlements == 0 {
            return encode_row(&HeadV1 {
                next_seq,
                first_seq,
                base_digest,
                digest,
                checkpoint,
            });
        }
        let mut out = vec![SEALED_VERSION];
        out.extend(
            postcard::to_stdvec(&HeadV2 {
                next_seq,
                first_seq,
                base_digest,
                digest,
                checkpoint,
                settlements,
            })
            .expect("postcard encodes plain structs"),
        );
        out
    }

    /// Decodes a head row, naming `p` if it is malformed.
    pub fn decode(p: &Partition, row: &[u8]) -> Result<Self> {
        let head = match row.first() {
            Some(&SEALED_VERSION) => {
                let v: HeadV2 = postcard::from_bytes(&row[1..]).map_err(|e| {
                    super::corrupt(p, format!("the log head row does not decode: {e}"))
                })?;
                LogHead {
                    next_seq: v.next_seq,
                    first_seq: v.first_seq,
                    base_digest: v.base_digest,
                    digest: v.digest,
                    checkpoint: v.checkpoint,
                    settlements: v.settlements,
                }
            }
            _ => {
                let v: HeadV1 = decode_row(p, "log head", row)?;
                LogHead {
                    next_seq: v.next_seq,
                    first_seq: v.first_seq,
                    base_digest: v.base_digest,
                    digest: v.digest,
                    checkpoint: v.checkpoint,
                    settlements: 0,
                }
            }
        };
        if head.next_seq == 0 || head.first_seq == 0 || head.first_seq > head.next_seq {
            return Err(super::corrupt(
                p,
                format!(
                    "the log head is inconsistent: first_seq {} next_seq {}",
                    head.first_seq, head.next_seq
                ),
            ));
        }
        Ok(head)
    }
}

impl Default for LogHead {
    fn default() -> Self {
        LogHead::empty()
    }
}

/// A head as read from the store, with the exact bytes read so that a later write can be
/// guarded on them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadSnapshot {
    /// The decoded head.
    pub head: LogHead,
    raw: Option<Vec<u8>>,
}

impl HeadSnapshot {
    /// A snapshot from a head row's value as read (`None` when the row is absent).
    pub fn from_row(p: &Partition, raw: Option<Vec<u8>>) -> Result<Self> {
        let head = match &raw {
            Some(bytes) => LogHead::decode(p, bytes)?,
            None => LogHead::empty(),
        };
        Ok(HeadSnapshot { head, raw })
    }

    /// The snapshot of a head this module has just written.
    pub(crate) fn written(head: LogHead) -> Self {
        let raw = Some(head.encode());
        HeadSnapshot { head, raw }
    }

    /// The precondition that holds only while the head row is exactly as read.
    pub fn guard(&self) -> Precondition {
        match &self.raw {
            Some(bytes) => Precondition::Equals(keys::head_key(), bytes.clone()),
            None => Precondition::Absent(keys::head_key()),
        }
    }
}

/// Reads the head row of the log in partition `p` (an empty head if the log was never written).
pub fn read_head(store: &dyn Store, p: &Partition) -> Result<HeadSnapshot> {
    HeadSnapshot::from_row(p, store.get(p, &keys::head_key())?)
}

/// Seals the log at `at` (SPEC F12): rewrites the head with one more settlement, guarded on the
/// head exactly as read. Once it commits, no write planned against `at` or any head before it
/// (a delayed copy of a write whose answer was lost) can commit: its head guard fails. Nothing
/// else of the log changes. Answers [`Guarded::HeadMoved`](super::Guarded::HeadMoved) if the
/// head is no longer `at`.
pub fn seal(
    store: &dyn Store,
    p: &Partition,
    at: &HeadSnapshot,
) -> Result<super::Guarded<HeadSnapshot>> {
    let mut head = at.head;
    head.settlements += 1;
    let batch = crate::store::Batch::new()
        .guard(at.guard())
        .put(keys::head_key(), head.encode());
    Ok(match store.apply(p, &batch)? {
        crate::store::Outcome::Committed => super::Guarded::Committed(HeadSnapshot::written(head)),
        crate::store::Outcome::PreconditionFailed { .. } => super::Guarded::HeadMoved,
        refused => super::Guarded::Refused(refused),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_never_sealed_is_stored_as_before_and_a_sealed_one_round_trips() {
        let p = Partition::new("e/ns/x").unwrap();
        let mut head = LogHead::empty();
        head.next_seq = 3;
        // Version 1, byte for byte the format from before seals.
        let v1 = head.encode();
        assert_eq!(v1[0], 1);
        assert_eq!(LogHead::decode(&p, &v1).unwrap(), head);
        head.settlements = 2;
        let v2 = head.encode();
        assert_eq!(v2[0], SEALED_VERSION);
        assert_ne!(v1, v2, "a seal moves the head row");
        assert_eq!(LogHead::decode(&p, &v2).unwrap(), head);
        assert!(LogHead::decode(&p, &[3, 0]).is_err());
    }
}
