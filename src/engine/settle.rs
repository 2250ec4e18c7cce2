//! Settling a write whose answer was lost (SPEC S2, R5, F12).
//!
//! A store may fail after a batch committed, or commit it after it answered: an etcd request
//! that timed out after it was sent ([`Error::OutcomeUnknown`]) may still be in the network and
//! commit later (a delayed copy). The engine then does not know which head the entity's log
//! has, nor which it will have. Guessing either way is wrong: keeping the old head makes the
//! next write fail its head guard and contain a healthy entity ("the log changed under the
//! engine"); taking the new one folds records that may never exist. So the write is remembered
//! on the loaded entity as [`Unsettled`] and settled: at once if the store answers, else before
//! the next write or checkpoint of that entity.
//!
//! Settling reads the head. The head the write produces means it committed: its records are
//! folded. The head as before means it has not committed *yet*, which proves nothing: so the
//! log is sealed (`log::seal`: the head rewritten with one more settlement, guarded on the head
//! as read), after which no copy of the write, guarded on the old head, can ever commit. Only
//! once the seal commits is the write taken for not committed, and the call answers so. A seal
//! whose own answer is lost is settled the same way on the next try (a later seal fences an
//! earlier one too). Only this engine writes the entity's log under its grant while the entity
//! is loaded, so any other head is proof that something else wrote: the namespace's next holder
//! if the epoch moved past the grant (the lost write was fenced: the holding is deposed and the
//! call answers `Fenced`), else damage (a real containment).
//!
//! Calls only the log (to read the head and seal it) and the restorer (to fold and to
//! contain).

use std::sync::Arc;

use super::Engine;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::log;
use crate::restore::{Containment, Loaded, Slot, StateMachine, Unsettled};

/// What a settlement found.
pub(super) enum Settled {
    /// Nothing was unsettled.
    Nothing,
    /// The write did not commit, and never will: the log is sealed past it.
    NotCommitted,
    /// The write committed; its records (if any) are folded into the state.
    Committed,
}

/// How many times a settlement reads the head and tries to seal it before it gives up for now
/// (the write stays unsettled).
const SEAL_ATTEMPTS: usize = 4;

impl<M: StateMachine> Engine<M> {
    /// Settles the entity's unsettled write, if it has one (see the module documentation).
    /// Runs under the entity's state lock. A failed read or seal leaves the write unsettled
    /// and answers that error; a head that is neither before nor after the write contains the
    /// entity.
    pub(super) fn settle(
        &self,
        entity: &EntityId,
        slot: &Arc<Slot<M::State>>,
        loaded: &mut Loaded<M::State>,
        contained: &mut Option<Arc<Containment>>,
    ) -> Result<Settled> {
        if loaded.unsettled.is_none() {
            return Ok(Settled::Nothing);
        }
        let p = entity.partition();
        let same_records =
            |a: &log::LogHead, b: &log::LogHead| a.next_seq == b.next_seq && a.digest == b.digest;
        for _ in 0..SEAL_ATTEMPTS {
            let unsettled = loaded.unsettled.as_ref().expect("checked above");
            let now = log::read_head(&*self.inner.store, &p)?;
            if !unsettled.records.is_empty()
                && same_records(&now.head, &unsettled.head_if_committed)
            {
                let Unsettled {
                    first_seq, records, ..
                } = loaded.unsettled.take().expect("checked above");
                ::log::info!(
                    "{entity}: a write whose answer was lost did commit (records {first_seq}..); folding it"
                );
                loaded.head = now;
                self.fold_written(entity, slot, loaded, first_seq, &records, contained)?;
                return Ok(Settled::Committed);
            }
            if !same_records(&now.head, &loaded.head.head) {
                loaded.unsettled = None;
                // Moved by the namespace's next holder (a take-over fenced this one: the lost
                // write failed its lease guard, and its head guard now fails for ever): no
                // damage, the holding is deposed (SPEC F11, F12).
                if !self.inner.owners.switches().settle_contains_deposed
                    && let Some(ended) = self.inner.owners.ended(entity.namespace())?
                {
                    ::log::info!(
                        "{entity}: a write whose answer was lost found the log moved by the \
                         namespace's next holder; it did not commit ({ended})"
                    );
                    return Err(ended);
                }
                let what = format!(
                    "settling of a write whose answer was lost (the log's next sequence number is {})",
                    now.head.next_seq
                );
                let moved = log::Guarded::<()>::HeadMoved;
                return Err(self.log_moved(slot, &what, &moved, contained));
            }
            // No record was added. A checkpoint or truncation whose answer was lost changes only
            // the head's metadata, so the head as read is adopted either way: once sealed.
            let metadata_moved = unsettled.records.is_empty()
                && (now.head.checkpoint, now.head.first_seq)
                    != (loaded.head.head.checkpoint, loaded.head.head.first_seq);
            let sealed = if self.inner.owners.switches().unsealed_settlement {
                now // the negative control: an unchanged head taken for proof, as before
            } else {
                match log::seal(&*self.inner.owned, &p, &now)? {
                    log::Guarded::Committed(sealed) => sealed,
                    // The head moved meanwhile (the write's copy landed): look again.
                    _ => continue,
                }
            };
            loaded.unsettled = None;
            loaded.head = sealed;
            return Ok(if metadata_moved {
                Settled::Committed
            } else {
                Settled::NotCommitted
            });
        }
        Err(Error::Unavailable {
            reason: format!(
                "the log of {entity} kept moving while a write whose answer was lost was settled"
            ),
            retry_after_ms: 10,
        })
    }

    /// Records a write whose store call failed as unsettled and tries to settle it at once.
    /// Answers whether it is now known to have committed (`Ok(Some(true))`), known never to
    /// commit (`Ok(Some(false))`), or still unknown (`Ok(None)`); any error of the settlement is
    /// dropped in favour of the write's own error, which the caller returns.
    pub(super) fn settle_failed_write(
        &self,
        entity: &EntityId,
        slot: &Arc<Slot<M::State>>,
        loaded: &mut Loaded<M::State>,
        unsettled: Unsettled,
        contained: &mut Option<Arc<Containment>>,
    ) -> Result<Option<bool>> {
        loaded.unsettled = Some(unsettled);
        match self.settle(entity, slot, loaded, contained) {
            Ok(Settled::Committed) => Ok(Some(true)),
            Ok(Settled::NotCommitted | Settled::Nothing) => Ok(Some(false)),
            Err(e) if contained.is_some() => Err(e),
            Err(e) => {
                ::log::debug!("{entity}: could not settle a failed write yet: {e}");
                Ok(None)
            }
        }
    }
}

/// The answer of a write whose answer was lost and that was settled as never committing: the
/// caller may retry it.
pub(super) fn did_not_commit(entity: &EntityId, e: &Error) -> Error {
    Error::Unavailable {
        reason: format!(
            "a write to {entity} lost its answer ({e}); it was settled: it did not commit and \
             never will, so it may be retried"
        ),
        retry_after_ms: 0,
    }
}

/// Whether an error from the store leaves the batch's outcome unknown to the store itself, so
/// that a settling read that finds it committed makes the write a success.
pub(super) fn store_did_not_know(e: &Error) -> bool {
    matches!(e, Error::OutcomeUnknown { .. })
}
