//! Checkpoints through the engine (SPEC L3, L4): publishing an entity's checkpoint (and the
//! truncation it may bring), and auditing the newest checkpoint against the history it folds.
//!
//! Owns the audit's retry bound and how a checkpoint's lost answer is remembered as unsettled.
//! Calls [`crate::log`] for the rows, [`crate::restore`] for the slot and containment, and the
//! engine's touch, lifecycle and settle helpers (`mod.rs`, `lifecycle.rs`, `settle.rs`).

use super::Engine;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::log::{self, Guarded};
use crate::restore::{self, Containment, ReasonKind, StateMachine};

/// The error of a checkpoint whose state [`StateMachine::encode_checkpoint`] refused: nothing
/// was published.
pub(super) fn unencodable(entity: &EntityId, r: &restore::Rejection) -> Error {
    super::check::refused(
        entity,
        format!("encode_checkpoint refused the state, so no checkpoint was published ({r})"),
    )
}

/// How many times [`Engine::verify_checkpoint`] audits again when the checkpoint or history
/// root moved during its walk.
pub(crate) const AUDIT_ATTEMPTS: usize = 3;

impl<M: StateMachine> Engine<M> {
    /// Publishes a checkpoint of an entity's state at its last record (SPEC L3), and truncates
    /// the history it covers if so configured. Returns the checkpoint's sequence number.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, and
    /// [`Error::Refused`] if [`StateMachine::encode_checkpoint`] refused the state: then
    /// nothing is published and the entity keeps serving (its next restore replays the history
    /// from the checkpoint before).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1, 2, 3])?;
    /// assert_eq!(engine.checkpoint(&clicks)?, 3); // covers records 1 to 3
    /// assert_eq!(engine.verify_checkpoint(&clicks)?, true);
    /// # Ok(())
    /// # }
    /// ```
    pub fn checkpoint(&self, entity: &EntityId) -> Result<u64> {
        let _open = self.enter()?;
        let slot = self.touch(entity)?;
        let restorer = &self.inner.restorer;
        // Fenced under the namespace's grant, like every engine write (SPEC F11).
        let store = &*self.inner.owned;
        let p = entity.partition();
        let mut contained = None;
        let done = self.with_loaded(&slot, |loaded| {
            self.settle(entity, &slot, loaded, &mut contained)?;
            let bytes = restorer
                .machine()
                .encode_checkpoint(&loaded.state)
                .map_err(|r| self.refusal_told(entity, unencodable(entity, &r)))?;
            let seq = loaded.head.head.last_seq();
            let written =
                log::write_checkpoint(store, &p, &loaded.head, seq, bytes, Default::default());
            match self.unless_lost(loaded, written)? {
                Guarded::Committed(head) => loaded.head = head,
                other => return Err(self.log_moved(&slot, "checkpoint", &other, &mut contained)),
            }
            if self.inner.truncate_after_checkpoint {
                let truncated = log::truncate_before(store, &p, &loaded.head, seq + 1);
                match self.unless_lost(loaded, truncated)? {
                    Guarded::Committed(head) => loaded.head = head,
                    other => {
                        return Err(self.log_moved(&slot, "truncation", &other, &mut contained));
                    }
                }
            }
            Ok(seq)
        });
        if let Some(reason) = contained {
            restorer.report_contained(entity, &reason);
        }
        done
    }

    /// Passes a checkpoint's or truncation's answer on; a failed one is remembered as
    /// unsettled (it adds no records, so the next write adopts whatever head it left).
    fn unless_lost<T>(
        &self,
        loaded: &mut restore::Loaded<M::State>,
        answer: Result<T>,
    ) -> Result<T> {
        answer.inspect_err(|_| {
            loaded.unsettled = Some(restore::Unsettled {
                head_if_committed: loaded.head.head,
                first_seq: loaded.head.head.next_seq,
                records: Vec::new(),
            });
        })
    }

    /// Checks an entity's newest checkpoint against the history it folds by recomputing the
    /// digest chain (SPEC L4). It reads rows only and holds no entity lock while it runs. A
    /// mismatch contains the entity and is returned as its refusal.
    ///
    /// The walk is adopted only if, once it ends, the head still names the same checkpoint
    /// and the same history root (first retained record and its base digest): a checkpoint
    /// with truncation that lands during the walk deletes records the walk has not read yet,
    /// which is not damage, and a checkpoint replaced during the walk was not the one
    /// verified. The audit then starts over (at most 3 times, then
    /// `Unavailable`).
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// assert_eq!(engine.verify_checkpoint(&clicks)?, false); // no checkpoint yet
    /// engine.append_typed(&clicks, &[7])?;
    /// engine.checkpoint(&clicks)?;
    /// assert_eq!(engine.verify_checkpoint(&clicks)?, true); // it folds the history it covers
    /// # Ok(())
    /// # }
    /// ```
    pub fn verify_checkpoint(&self, entity: &EntityId) -> Result<bool> {
        let _open = self.enter()?;
        self.inner.owners.serving(entity.namespace())?;
        // Answers UnknownEntity for an entity never registered; makes no slot unless the audit
        // finds something to contain.
        self.inner.restorer.existing(entity)?;
        let store = &*self.inner.store;
        let p = entity.partition();
        for _ in 0..AUDIT_ATTEMPTS {
            let before = log::read_head(store, &p)?.head;
            let Some(mark) = before.checkpoint else {
                return Ok(false);
            };
            let walked = log::verify_checkpoint_against_history(store, &p, &mark);
            let after = log::read_head(store, &p)?.head;
            let root = |h: &log::LogHead| (h.checkpoint, h.first_seq, h.base_digest);
            if root(&after) != root(&before) {
                ::log::debug!(
                    "{entity}: its checkpoint or history root moved during an audit; auditing again"
                );
                continue;
            }
            return match walked {
                Ok(()) => Ok(true),
                Err(e @ Error::Corrupt { .. }) => {
                    let reason = Containment::new(ReasonKind::CorruptCheckpoint, e.to_string());
                    let slot = self.inner.restorer.slot(entity)?;
                    Err(self.inner.restorer.contain_unless_running(&slot, reason))
                }
                Err(e) => Err(e),
            };
        }
        Err(Error::Unavailable {
            reason: format!(
                "the checkpoint of {entity} changed during each of {AUDIT_ATTEMPTS} audits"
            ),
            retry_after_ms: 10,
        })
    }
}
