//! The head row of an entity log: where the log stands (SPEC L1, L4).
//!
//! Every write to the log is guarded on the head row exactly as it was read, and rewrites it in
//! the same batch, so the head is the log's single point of serialisation.

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
}

impl LogHead {
    /// The head of a log that has never been written.
    pub const fn empty() -> Self {
        LogHead {
            next_seq: 1,
            first_seq: 1,
            base_digest: GENESIS_DIGEST,
            digest: GENESIS_DIGEST,
            checkpoint: None,
        }
    }

    /// The sequence number of the last record appended (0 when none was).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Encodes the head as a row value.
    pub fn encode(&self) -> Vec<u8> {
        encode_row(self)
    }

    /// Decodes a head row, naming `p` if it is malformed.
    pub fn decode(p: &Partition, row: &[u8]) -> Result<Self> {
        let head: LogHead = decode_row(p, "log head", row)?;
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
