//! The first-use mark (SPEC R3, R8): which records a restore unit appended but whose first
//! fold, with their first-use origin ([`Origin::Deferred`] or [`Origin::Repair`]), is not yet
//! known to have happened.
//!
//! A unit appends a deferred record (or a repair's records) in one batch and folds them right
//! after, with their first-use origin, so the application runs their side effects once. If the
//! process crashes in between, or the batch's answer is lost and the unit is retried, the next
//! unit meets them as stored history; folded as [`Origin::Replay`] their side effects would
//! never happen, and work accepted as `Queued` would lose them. So each such batch also writes
//! the `\0fresh` row naming its records and their origin, replacing the row of the batch before
//! (whose records the unit had folded before it planned this one); the unit deletes the row once
//! it has folded the last of them (with its owed checkpoint if it publishes one, else in a
//! batch of its own). A unit that finds the row folds those records (the ones after its
//! checkpoint) with the origin the row names.
//!
//! This is at least once: a crash after the fold and before the row is deleted folds the last
//! batch's records with their first-use origin again at the next restore. Applications whose
//! side effects must not repeat make them idempotent (keyed by entity and sequence number).
//!
//! Owns the row's format. Calls nothing.

use serde::{Deserialize, Serialize};

use super::machine::Origin;
use crate::store::Partition;

const FRESH: &[u8] = b"\0fresh";

/// The row's key.
pub(crate) fn key() -> Vec<u8> {
    FRESH.to_vec()
}

/// Records `first..=last`, appended with their first-use origin not yet known folded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fresh {
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) origin: Origin,
}

#[derive(Serialize, Deserialize)]
struct Row {
    first: u64,
    last: u64,
    /// 1: deferred, 2: repair.
    origin: u8,
}

impl Fresh {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let origin = match self.origin {
            Origin::Repair => 2,
            _ => 1,
        };
        crate::log::encode_row(&Row {
            first: self.first,
            last: self.last,
            origin,
        })
    }

    pub(crate) fn decode(p: &Partition, row: &[u8]) -> crate::Result<Self> {
        let row: Row = crate::log::decode_row(p, "first-use mark", row)?;
        let origin = match row.origin {
            1 => Origin::Deferred,
            2 => Origin::Repair,
            other => {
                return Err(crate::Error::corrupt(
                    p.to_string(),
                    format!("the first-use mark names an unknown origin {other}"),
                ));
            }
        };
        Ok(Fresh {
            first: row.first,
            last: row.last,
            origin,
        })
    }

    /// The origin a replay folds record `seq` with.
    pub(crate) fn origin_of(fresh: Option<&Fresh>, seq: u64) -> Origin {
        match fresh {
            Some(f) if (f.first..=f.last).contains(&seq) => f.origin,
            _ => Origin::Replay,
        }
    }
}
