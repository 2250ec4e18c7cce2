//! Appending records (SPEC L1): consecutive sequence numbers, carried in one guarded batch with
//! the caller's own guards and row operations.

use super::digest::chain_digest;
use super::head::{HeadSnapshot, read_head};
use super::{APPEND_RETRIES, keys};
use crate::error::{Error, Result};
use crate::store::{Batch, MAX_VALUE_BYTES, Op, Outcome, Partition, Precondition, Store};

/// The largest record payload, in bytes: a value minus the record row's own framing.
pub const MAX_RECORD_BYTES: usize = MAX_VALUE_BYTES - 16;

/// What became of a guarded log write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Guarded<T> {
    /// The batch committed.
    Committed(T),
    /// The head row changed since it was read: another writer got there first. Nothing changed.
    HeadMoved,
    /// One of the caller's own preconditions failed, or its deadline passed; nothing changed.
    /// A `PreconditionFailed` index counts the caller's guards only, in the order they were
    /// added.
    Refused(Outcome),
}

impl<T> Guarded<T> {
    /// The committed value, or `None` if the write did not commit.
    pub fn committed(self) -> Option<T> {
        match self {
            Guarded::Committed(v) => Some(v),
            _ => None,
        }
    }
}

/// The result of a committed append.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Appended {
    /// The sequence number of the first record appended.
    pub first_seq: u64,
    /// The sequence number of the last record appended (`first_seq - 1` when no record was
    /// given and only the caller's operations were applied).
    pub last_seq: u64,
    /// The head as written, ready to guard the next write without re-reading it.
    pub head: HeadSnapshot,
}

/// Appends `records` to the log in `p`, reading the head first and retrying (at most 16
/// times) while another writer moves it; then [`Error::Unavailable`].
///
/// `extra` carries the caller's guards and row operations; they commit atomically with the
/// records or not at all.
pub fn append<R: AsRef<[u8]>>(
    store: &dyn Store,
    p: &Partition,
    records: &[R],
    extra: Batch,
) -> Result<Guarded<Appended>> {
    for _ in 0..APPEND_RETRIES {
        let head = read_head(store, p)?;
        match append_at(store, p, &head, records, extra.clone())? {
            Guarded::HeadMoved => continue,
            done => return Ok(done),
        }
    }
    Err(Error::Unavailable {
        reason: format!("the log of {p} kept moving under {APPEND_RETRIES} appends"),
        retry_after_ms: 10,
    })
}

/// An append planned but not applied: the batch to commit and what it will have done.
///
/// For callers that commit through another layer that adds its own guards in front (the fenced
/// write path): the head guard is the first guard of `batch`, so a failure at index 0 of this
/// batch means the head moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedAppend {
    /// The batch: the head guard, the caller's guards, the records, the new head, the caller's
    /// operations.
    pub batch: Batch,
    /// The result once `batch` has committed.
    pub appended: Appended,
}

/// Plans an append of `records` after the head `at` without applying it (SPEC L1).
///
/// Checks every record's size and refuses extra guards or operations on the log's own rows,
/// so nothing oversize or malformed ever reaches the store.
pub fn prepare_append<R: AsRef<[u8]>>(
    at: &HeadSnapshot,
    records: &[R],
    extra: Batch,
) -> Result<PreparedAppend> {
    check_extra(&extra)?;
    let mut head = at.head;
    let first_seq = head.next_seq;
    let mut batch = Batch::new().guard(at.guard());
    for guard in extra.guards() {
        batch = batch.guard(guard.clone());
    }
    for record in records {
        let payload = record.as_ref();
        if payload.len() > MAX_RECORD_BYTES {
            return Err(Error::TooLarge {
                what: "record",
                size: payload.len(),
                limit: MAX_RECORD_BYTES,
            });
        }
        let seq = head.next_seq;
        head.digest = chain_digest(head.digest, seq, payload);
        head.next_seq += 1;
        batch = batch.put(keys::record_key(seq), encode_record(head.digest, payload));
    }
    batch = batch.put(keys::head_key(), head.encode());
    for op in extra.ops() {
        batch = batch.op(op.clone());
    }
    Ok(PreparedAppend {
        batch,
        appended: Appended {
            first_seq,
            last_seq: head.next_seq - 1,
            head: HeadSnapshot::written(head),
        },
    })
}

/// Appends `records` after the head `at`, guarded on that head exactly as read (SPEC L1).
///
/// The batch holds, in order: the head guard, the caller's guards, one row per record, the new
/// head, then the caller's operations. Returns [`Guarded::HeadMoved`] if the head changed.
pub fn append_at<R: AsRef<[u8]>>(
    store: &dyn Store,
    p: &Partition,
    at: &HeadSnapshot,
    records: &[R],
    extra: Batch,
) -> Result<Guarded<Appended>> {
    let prepared = prepare_append(at, records, extra)?;
    Ok(match store.apply(p, &prepared.batch)? {
        Outcome::Committed => Guarded::Committed(prepared.appended),
        Outcome::PreconditionFailed { index: 0 } => Guarded::HeadMoved,
        Outcome::PreconditionFailed { index } => {
            Guarded::Refused(Outcome::PreconditionFailed { index: index - 1 })
        }
        refused @ Outcome::DeadlinePassed { .. } => Guarded::Refused(refused),
    })
}

/// Refuses caller operations or guards that would touch the log's own rows.
pub(crate) fn check_extra(extra: &Batch) -> Result<()> {
    let touches_log = extra.guards().iter().any(|g| match g {
        Precondition::Equals(k, _) | Precondition::Absent(k) | Precondition::Present(k) => {
            keys::is_log_key(k)
        }
        Precondition::NotAfter(_) => false,
    }) || extra.ops().iter().any(|op| match op {
        Op::Put(k, _) | Op::Delete(k) => keys::is_log_key(k),
        Op::DeleteRange(r) => keys::overlaps_log(r),
    });
    if touches_log {
        return Err(Error::invalid(
            "extra guards and operations may not touch the log's reserved rows (keys starting \\0log.)",
        ));
    }
    Ok(())
}

/// A record row's value: version, digest (8 bytes little-endian), payload.
pub(crate) fn encode_record(digest: u64, payload: &[u8]) -> Vec<u8> {
    let mut row = Vec::with_capacity(9 + payload.len());
    row.push(super::ROW_VERSION);
    row.extend_from_slice(&digest.to_le_bytes());
    row.extend_from_slice(payload);
    row
}

/// Splits a record row into digest and payload.
pub(crate) fn decode_record<'a>(p: &Partition, seq: u64, row: &'a [u8]) -> Result<(u64, &'a [u8])> {
    let body = super::strip_version(p, "log record", row)?;
    if body.len() < 8 {
        return Err(super::corrupt(p, format!("log record {seq} is truncated")));
    }
    let (digest, payload) = body.split_at(8);
    let digest = u64::from_le_bytes(digest.try_into().expect("split at 8"));
    Ok((digest, payload))
}
