//! Settling a write whose answer was lost (SPEC S2, R5).
//!
//! A store may fail after a batch committed: an etcd request that timed out after it was
//! sent ([`Error::OutcomeUnknown`]), a connection lost on the way back. The engine then does
//! not know which head the entity's log has. Guessing either way is wrong: keeping the old
//! head makes the next write fail its head guard and contain a healthy entity ("the log
//! changed under the engine"); taking the new one folds records that may not exist. So the
//! write is remembered on the loaded entity as [`Unsettled`] and settled by reading the head:
//! at once if the store answers, else before the next write or checkpoint of that entity.
//! Only this engine writes the entity's log under its grant while the entity is loaded, so the
//! head read is either the one before the write, the one the write would produce, or proof
//! that something else wrote (a real containment).
//!
//! Calls only the log (to read the head) and the restorer (to fold and to contain).

use std::sync::Arc;

use super::Engine;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::log;
use crate::restore::{Containment, Loaded, Slot, StateMachine, Unsettled};

/// What a settling read found.
pub(super) enum Settled {
    /// Nothing was unsettled.
    Nothing,
    /// The write did not commit: the head is as before it.
    NotCommitted,
    /// The write committed; its records (if any) are folded into the state.
    Committed,
}

impl<M: StateMachine> Engine<M> {
    /// Settles the entity's unsettled write, if it has one, by reading its head. Runs under
    /// the entity's state lock. A failed read leaves the write unsettled and answers the
    /// read's error; a head that is neither before nor after the write contains the entity.
    pub(super) fn settle(
        &self,
        entity: &EntityId,
        slot: &Arc<Slot<M::State>>,
        loaded: &mut Loaded<M::State>,
        contained: &mut Option<Arc<Containment>>,
    ) -> Result<Settled> {
        let Some(unsettled) = loaded.unsettled.as_ref() else {
            return Ok(Settled::Nothing);
        };
        let now = log::read_head(&*self.inner.store, &entity.partition())?;
        let same_records =
            |a: &log::LogHead, b: &log::LogHead| a.next_seq == b.next_seq && a.digest == b.digest;
        if !unsettled.records.is_empty() && now.head == unsettled.head_if_committed {
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
        if same_records(&now.head, &loaded.head.head) {
            // No record was added. A checkpoint or truncation whose answer was lost changes only
            // the head's metadata, so the head as read is adopted either way.
            let committed = unsettled.records.is_empty() && now.head != loaded.head.head;
            loaded.unsettled = None;
            loaded.head = now;
            return Ok(if committed {
                Settled::Committed
            } else {
                Settled::NotCommitted
            });
        }
        loaded.unsettled = None;
        let what = format!(
            "settling of a write whose answer was lost (the log's next sequence number is {})",
            now.head.next_seq
        );
        let moved = log::Guarded::<()>::HeadMoved;
        Err(self.log_moved(slot, &what, &moved, contained))
    }

    /// Records a write whose store call failed as unsettled and tries to settle it at once.
    /// Answers whether it is now known to have committed (`Ok(true)`); any error of the read
    /// is dropped in favour of the write's own error, which the caller returns.
    pub(super) fn settle_failed_write(
        &self,
        entity: &EntityId,
        slot: &Arc<Slot<M::State>>,
        loaded: &mut Loaded<M::State>,
        unsettled: Unsettled,
        contained: &mut Option<Arc<Containment>>,
    ) -> Result<bool> {
        loaded.unsettled = Some(unsettled);
        match self.settle(entity, slot, loaded, contained) {
            Ok(Settled::Committed) => Ok(true),
            Ok(Settled::NotCommitted | Settled::Nothing) => Ok(false),
            Err(e) if contained.is_some() => Err(e),
            Err(e) => {
                ::log::debug!("{entity}: could not settle a failed write yet: {e}");
                Ok(false)
            }
        }
    }
}

/// Whether an error from the store leaves the batch's outcome unknown to the store itself, so
/// that a settling read that finds it committed makes the write a success.
pub(super) fn store_did_not_know(e: &Error) -> bool {
    matches!(e, Error::OutcomeUnknown { .. })
}
