//! Checkpoints (SPEC L3): an entity's folded state at a sequence number, with the digest of the
//! history it folds (SPEC L4).
//!
//! Only the newest checkpoint is kept, in one row; its `(seq, digest)` mark is also kept in the
//! head row, and both are written in one batch guarded on the head, so the head always names the
//! checkpoint that restore will load.

use serde::{Deserialize, Serialize};

use super::append::{Guarded, check_extra, decode_record};
use super::head::{HeadSnapshot, LogHead, read_head};
use super::read::walk_to;
use super::{corrupt, decode_row, encode_row, keys};
use crate::error::{Error, Result};
use crate::store::{Batch, Outcome, Partition, Store};

/// A checkpoint's position: the sequence number it folds up to and the digest there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMark {
    /// The last record folded into the state.
    pub seq: u64,
    /// The running digest at `seq`.
    pub digest: u64,
}

/// An entity's folded state at a sequence number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The last record folded into `state` (0: no record).
    pub seq: u64,
    /// The running digest at `seq` (SPEC L4).
    pub digest: u64,
    /// The application's encoding of its state.
    pub state: Vec<u8>,
}

impl Checkpoint {
    /// Its position.
    pub fn mark(&self) -> CheckpointMark {
        CheckpointMark {
            seq: self.seq,
            digest: self.digest,
        }
    }

    /// Encodes the checkpoint as a row value.
    pub fn encode(&self) -> Vec<u8> {
        encode_row(self)
    }

    /// Decodes a checkpoint row, naming `p` if it is malformed.
    pub fn decode(p: &Partition, row: &[u8]) -> Result<Self> {
        decode_row(p, "checkpoint", row)
    }
}

/// The digest at `seq` as the stored history records it: the head's digests at the edges,
/// otherwise the record row's.
pub(crate) fn stored_digest_at(
    store: &dyn Store,
    p: &Partition,
    head: &LogHead,
    seq: u64,
) -> Result<u64> {
    if seq == head.last_seq() {
        return Ok(head.digest);
    }
    if seq + 1 == head.first_seq {
        return Ok(head.base_digest);
    }
    if seq < head.first_seq || seq > head.last_seq() {
        return Err(Error::invalid(format!(
            "sequence number {seq} is outside the retained log of {p} ({}..={})",
            head.first_seq.saturating_sub(1),
            head.last_seq()
        )));
    }
    let row = store
        .get(p, &keys::record_key(seq))?
        .ok_or_else(|| corrupt(p, format!("log record {seq} is missing")))?;
    Ok(decode_record(p, seq, &row)?.0)
}

/// Writes a checkpoint of `state` at `seq`, guarded on the head `at` as read (SPEC L3).
///
/// `seq` must lie in the retained log (or just before it) and must not be older than the
/// newest checkpoint; its digest is taken from history, never from the caller. `extra` carries
/// the caller's guards and operations in the same batch.
pub fn write_checkpoint(
    store: &dyn Store,
    p: &Partition,
    at: &HeadSnapshot,
    seq: u64,
    state: Vec<u8>,
    extra: Batch,
) -> Result<Guarded<HeadSnapshot>> {
    check_extra(&extra)?;
    if let Some(mark) = at.head.checkpoint
        && seq < mark.seq
    {
        return Err(Error::invalid(format!(
            "a checkpoint at {seq} is older than the newest checkpoint of {p} at {}",
            mark.seq
        )));
    }
    let digest = stored_digest_at(store, p, &at.head, seq)?;
    let checkpoint = Checkpoint { seq, digest, state };
    let mut head = at.head;
    head.checkpoint = Some(checkpoint.mark());
    let mut batch = Batch::new().guard(at.guard());
    for guard in extra.guards() {
        batch = batch.guard(guard.clone());
    }
    batch = batch
        .put(keys::checkpoint_key(), checkpoint.encode())
        .put(keys::head_key(), head.encode());
    for op in extra.ops() {
        batch = batch.op(op.clone());
    }
    match store.apply(p, &batch)? {
        Outcome::Committed => Ok(Guarded::Committed(HeadSnapshot::written(head))),
        Outcome::PreconditionFailed { index: 0 } => Ok(Guarded::HeadMoved),
        Outcome::PreconditionFailed { index } => {
            Ok(Guarded::Refused(Outcome::PreconditionFailed {
                index: index - 1,
            }))
        }
        refused @ Outcome::DeadlinePassed { .. } => Ok(Guarded::Refused(refused)),
    }
}

/// Reads the head and the newest checkpoint from one consistent view, and checks that the
/// checkpoint agrees with the head and with the digest the stored history records at its
/// sequence number (SPEC L3, L4). This is where restore starts.
///
/// A mismatch is [`Error::Corrupt`]: restoring from that checkpoint would fold a history other
/// than the one stored.
///
/// The checkpoint is adopted only if the head still reads the same once the stored digest
/// has been read (the record row is a separate read): a head that moved meanwhile (another
/// writer checkpointed or truncated) means the comparison proved nothing, and the load starts
/// over, at most three times, then answers `Unavailable` (SPEC L4).
pub fn load_restore_point(
    store: &dyn Store,
    p: &Partition,
) -> Result<(HeadSnapshot, Option<Checkpoint>)> {
    load_restore_point_with(store, p, &[]).map(|(head, checkpoint, _)| (head, checkpoint))
}

/// A restore point (the head and its checkpoint) and the extra rows read with it.
pub(crate) type RestorePoint = (HeadSnapshot, Option<Checkpoint>, Vec<Option<Vec<u8>>>);

/// [`load_restore_point`], reading the rows `extra` in the same view as the head (one store
/// call for the head, the checkpoint and them): they are as they were at that head.
pub(crate) fn load_restore_point_with(
    store: &dyn Store,
    p: &Partition,
    extra: &[&[u8]],
) -> Result<RestorePoint> {
    for _ in 0..3 {
        let (head, checked, rows) = load_once(store, p, extra)?;
        if read_head(store, p)? == head {
            return checked.map(|checkpoint| (head, checkpoint, rows));
        }
    }
    Err(Error::Unavailable {
        reason: format!("the log head of {p} kept moving while its checkpoint was loaded"),
        retry_after_ms: 10,
    })
}

/// One attempt: the head read, and the checkpoint checked against it (an error in the second
/// part is judged only if the head did not move meanwhile).
#[allow(clippy::type_complexity)]
fn load_once(
    store: &dyn Store,
    p: &Partition,
    extra: &[&[u8]],
) -> Result<(
    HeadSnapshot,
    Result<Option<Checkpoint>>,
    Vec<Option<Vec<u8>>>,
)> {
    let head_key = keys::head_key();
    let ckpt_key = keys::checkpoint_key();
    let mut wanted: Vec<&[u8]> = vec![&head_key, &ckpt_key];
    wanted.extend_from_slice(extra);
    let mut rows = store.get_many(p, &wanted)?;
    let extras = rows.split_off(2);
    let ckpt_row = rows.pop().flatten();
    let head = HeadSnapshot::from_row(p, rows.pop().flatten())?;
    let checked = check_checkpoint(store, p, &head, ckpt_row);
    Ok((head, checked, extras))
}

fn check_checkpoint(
    store: &dyn Store,
    p: &Partition,
    head: &HeadSnapshot,
    ckpt_row: Option<Vec<u8>>,
) -> Result<Option<Checkpoint>> {
    let Some(mark) = head.head.checkpoint else {
        return Ok(None);
    };
    let row = ckpt_row.ok_or_else(|| {
        corrupt(
            p,
            format!(
                "the head names a checkpoint at {} but it is missing",
                mark.seq
            ),
        )
    })?;
    let checkpoint = Checkpoint::decode(p, &row)?;
    if checkpoint.mark() != mark {
        return Err(corrupt(
            p,
            format!(
                "the checkpoint row ({}, {:016x}) does not match the head's mark ({}, {:016x})",
                checkpoint.seq, checkpoint.digest, mark.seq, mark.digest
            ),
        ));
    }
    if checkpoint.seq > head.head.last_seq() || checkpoint.seq + 1 < head.head.first_seq {
        return Err(corrupt(
            p,
            format!(
                "the checkpoint at {} lies outside the retained log {}..={}",
                checkpoint.seq,
                head.head.first_seq,
                head.head.last_seq()
            ),
        ));
    }
    let stored = stored_digest_at(store, p, &head.head, checkpoint.seq)?;
    if stored != checkpoint.digest {
        return Err(checkpoint_mismatch(p, &checkpoint.mark(), stored));
    }
    Ok(Some(checkpoint))
}

fn checkpoint_mismatch(p: &Partition, mark: &CheckpointMark, history: u64) -> Error {
    corrupt(
        p,
        format!(
            "the checkpoint at {} has digest {:016x} but its history gives {history:016x}",
            mark.seq, mark.digest
        ),
    )
}

/// Recomputes the digest chain of the retained history up to `mark.seq`, from the head's base
/// digest, and checks it against the mark (SPEC L4).
///
/// It only reads rows, so it can run off the entity's lock (records below the head never
/// change). Cost grows with the retained history; use it for audits, not on every restore.
pub fn verify_checkpoint_against_history(
    store: &dyn Store,
    p: &Partition,
    mark: &CheckpointMark,
) -> Result<()> {
    let head = read_head(store, p)?.head;
    if mark.seq > head.last_seq() || mark.seq + 1 < head.first_seq {
        return Err(Error::invalid(format!(
            "the checkpoint at {} lies outside the retained log of {p}",
            mark.seq
        )));
    }
    let computed = walk_to::<Error>(
        store,
        p,
        &head,
        head.first_seq - 1,
        head.base_digest,
        mark.seq,
        |_| Ok(()),
    )?;
    if computed != mark.digest {
        return Err(checkpoint_mismatch(p, mark, computed));
    }
    Ok(())
}
