//! Truncating a log prefix covered by a checkpoint (SPEC L3). The rows are deleted in one batch
//! with the head update; compaction later frees their bytes.

use super::append::Guarded;
use super::checkpoint::stored_digest_at;
use super::head::HeadSnapshot;
use super::keys;
use crate::error::{Error, Result};
use crate::store::{Batch, Outcome, Partition, Store};

/// Deletes every record before `keep_from`, guarded on the head `at` as read.
///
/// Only history folded into the newest checkpoint may go: `keep_from` must not exceed the
/// checkpoint's seq + 1, so restore can always start from the checkpoint. The head keeps the
/// digest at `keep_from - 1` as its base, so what remains can still be verified (SPEC L4).
pub fn truncate_before(
    store: &dyn Store,
    p: &Partition,
    at: &HeadSnapshot,
    keep_from: u64,
) -> Result<Guarded<HeadSnapshot>> {
    let head = at.head;
    let covered = head.checkpoint.map_or(0, |c| c.seq) + 1;
    if keep_from > covered || keep_from > head.next_seq {
        return Err(Error::invalid(format!(
            "cannot truncate {p} before {keep_from}: only records up to the newest checkpoint ({}) may go",
            covered - 1
        )));
    }
    if keep_from <= head.first_seq {
        return Ok(Guarded::Committed(at.clone()));
    }
    let mut new_head = head;
    new_head.base_digest = stored_digest_at(store, p, &head, keep_from - 1)?;
    new_head.first_seq = keep_from;
    let batch = Batch::new()
        .guard(at.guard())
        .delete_range(keys::record_range(head.first_seq, keep_from))
        .put(keys::head_key(), new_head.encode());
    match store.apply(p, &batch)? {
        Outcome::Committed => Ok(Guarded::Committed(HeadSnapshot::written(new_head))),
        Outcome::PreconditionFailed { .. } => Ok(Guarded::HeadMoved),
        refused @ Outcome::DeadlinePassed { .. } => Ok(Guarded::Refused(refused)),
    }
}
