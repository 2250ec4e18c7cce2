//! The write path: records decided against the current state, appended through the log in one
//! batch behind the fence's lease guards, then folded into the state (SPEC L1, R8, F2, F3).

use std::ops::RangeInclusive;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::Engine;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::log::{self, Guarded, MAX_RECORD_BYTES};
use std::sync::Arc;

use super::check::refused;
use super::settle::{did_not_commit, store_did_not_know};
use crate::restore::{
    ApplyContext, Containment, Deferral, Loaded, Origin, ReasonKind, Rejection, Slot, StateMachine,
    Unsettled,
};
use crate::store::{Batch, Outcome, Store};

/// What a write did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Written<T> {
    /// The sequence numbers the records got; `None` when the application decided to write
    /// nothing.
    pub seqs: Option<RangeInclusive<u64>>,
    /// The value the application's decision returned.
    pub value: T,
}

/// Where deferred work went (SPEC R8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deferred {
    /// The entity is pending: the record is stored durably and will be applied inside its
    /// restore unit.
    Queued,
    /// A deferral with the same id ([`Engine::defer_once`]) was accepted before; nothing was
    /// written this time.
    AlreadyAccepted,
    /// The entity was already restored: the record was appended at this sequence number.
    Applied {
        /// Its sequence number.
        seq: u64,
    },
}

impl<M: StateMachine> Engine<M> {
    /// Checks records before anything is written: size limits and the application's decoder
    /// (bad input never enters history, SPEC E1).
    fn check_records(&self, records: &[Vec<u8>]) -> Result<()> {
        for (i, record) in records.iter().enumerate() {
            if record.len() > MAX_RECORD_BYTES {
                return Err(Error::TooLarge {
                    what: "record",
                    size: record.len(),
                    limit: MAX_RECORD_BYTES,
                });
            }
            self.inner
                .restorer
                .machine()
                .validate(record)
                .map_err(|r| {
                    Error::invalid(format!("record {i} of the write does not decode: {r}"))
                })?;
        }
        Ok(())
    }

    /// Decides records from the entity's current state and appends them (SPEC E2).
    ///
    /// `decide` sees the state as of the last record and returns the records to append (none
    /// means no write) and a value handed back to the caller. The records are checked (their
    /// bytes by [`StateMachine::validate`], then each against the current state by
    /// [`StateMachine::check`]: a refusal answers [`Error::Refused`] and writes nothing, SPEC
    /// R12), appended in one batch guarded on the log head the state was folded to and
    /// carrying the fencing guards of the namespace's grant, then folded into the state. Writes
    /// to one entity are serialised; writes to different entities run in parallel. A decision
    /// that may refuse the command itself is [`try_write`](Self::try_write).
    ///
    /// Fencing (SPEC F2, F3, F11): the batch commits only under a usable lease at the grant
    /// this engine serves the namespace under (see [`Engine::own`]), guarded on that lease as
    /// read and on a deadline. If the grant is stale (another owner took the namespace over),
    /// the write is refused with [`Error::Fenced`], nothing is written, and this engine stops
    /// serving the namespace: every later call for it answers `Fenced` at once.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, unless
    /// [`EngineBuilder::register_on_first_write`](crate::EngineBuilder::register_on_first_write) is on.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    /// use portcullis::typed::encode;
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
    /// // Add 1 only while the total is below 10; hand back the total seen.
    /// let written = engine.write(&clicks, |total| {
    ///     let records = if *total < 10 { vec![encode(&1u64).unwrap()] } else { vec![] };
    ///     (records, *total)
    /// })?;
    /// assert_eq!((written.seqs, written.value), (Some(1..=1), 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn write<T>(
        &self,
        entity: &EntityId,
        decide: impl FnOnce(&M::State) -> (Vec<Vec<u8>>, T),
    ) -> Result<Written<T>> {
        self.write_extra(entity, Batch::new(), |state| Ok(decide(state)))
    }

    /// [`write`](Self::write) with `extra` guards and operations in the same batch, and a
    /// decision that may refuse ([`try_write`](Self::try_write)). A failed `extra` guard
    /// writes nothing and answers `seqs: None`.
    pub(super) fn write_extra<T>(
        &self,
        entity: &EntityId,
        extra: Batch,
        decide: impl FnOnce(&M::State) -> std::result::Result<(Vec<Vec<u8>>, T), Rejection>,
    ) -> Result<Written<T>> {
        let _open = self.enter()?;
        let slot = self.touch_for_write(entity)?;
        let mut decide = Some(decide);
        let restorer = &self.inner.restorer;
        let mut checkpoint_due = false;
        // Reported once the state lock is released: hooks never run under it (SPEC R11).
        let mut contained = None;
        let mut appended_report = None;
        let written = self.with_loaded(&slot, |loaded| {
            // A write whose answer was lost is settled before anything is decided on this state.
            self.settle(entity, &slot, loaded, &mut contained)?;
            let decide = decide.take().expect("called once");
            let (records, value) = decide(&loaded.state)
                .map_err(|r| self.refusal_told(entity, refused(entity, r.reason)))?;
            if records.is_empty() {
                return Ok(Written { seqs: None, value });
            }
            self.check_records(&records)?;
            // The state machine's check, against the state the write starts from, before
            // anything is committed: a refusal writes nothing (SPEC R12). A write whose own
            // guards fail would write nothing either (a `defer_once` retried after it was
            // accepted): it answers as the failed guard does, not as a refusal.
            if let Err(e) = self.check_with_state(entity, &slot, loaded, &records, &mut contained) {
                if matches!(e, Error::Refused { .. }) && self.guards_fail(entity, &extra)? {
                    return Ok(Written { seqs: None, value });
                }
                return Err(e);
            }
            // The log batch, planned once after the head the state was folded to, committed
            // through the fence under the namespace's grant: the fence puts its lease guard and
            // deadline in front of it, renews the lease if needed and re-plans a bounded number
            // of times (SPEC F2, F3, F11).
            let prepared = log::prepare_append(&loaded.head, &records, extra.clone())?;
            // From here until the state has folded every record, an unwind (a panic in the
            // store or the fence after the commit) leaves nobody able to tell what the state
            // holds: the guard fails the entity closed (SPEC R5).
            let unsure = Unsure::arm(restorer, &slot);
            let outcome = self.inner.owned.apply(&entity.partition(), &prepared.batch);
            let appended = match outcome {
                Ok(Outcome::Committed) => prepared.appended,
                Ok(Outcome::PreconditionFailed { index }) if index > 0 => {
                    // One of `extra`'s guards: nothing was written.
                    unsure.disarm();
                    return Ok(Written { seqs: None, value });
                }
                Ok(Outcome::PreconditionFailed { index: 0 }) => {
                    unsure.disarm();
                    let moved = Guarded::<()>::HeadMoved;
                    return Err(self.log_moved(&slot, "write", &moved, &mut contained));
                }
                Ok(other) => {
                    unsure.disarm();
                    return Err(Error::Unavailable {
                        reason: format!("the write to {entity} did not commit ({other:?})"),
                        retry_after_ms: 10,
                    });
                }
                Err(
                    e @ (Error::Fenced { .. } | Error::NotServed { .. } | Error::OwnerLive { .. }),
                ) => {
                    // Refused before the batch was applied: nothing committed, and the log
                    // may have moved under a new owner, which is no damage (SPEC F11, F12).
                    unsure.disarm();
                    return Err(e);
                }
                Err(e) => {
                    // The store failed, possibly after the batch committed: settle it by
                    // reading the head rather than guess (see `settle`).
                    unsure.disarm();
                    let unsettled = Unsettled {
                        head_if_committed: prepared.appended.head.head,
                        first_seq: prepared.appended.first_seq,
                        records: records.clone(),
                    };
                    let settled =
                        self.settle_failed_write(entity, &slot, loaded, unsettled, &mut contained)?;
                    return match settled {
                        Some(true) if store_did_not_know(&e) => {
                            let appended = &prepared.appended;
                            Ok(Written {
                                seqs: Some(appended.first_seq..=appended.last_seq),
                                value,
                            })
                        }
                        // Settled: it never commits, so the caller may retry it.
                        Some(false) if store_did_not_know(&e) => Err(did_not_commit(entity, &e)),
                        _ => Err(e),
                    };
                }
            };
            loaded.head = appended.head.clone();
            let bytes: usize = records.iter().map(Vec::len).sum();
            unsure.disarm();
            self.fold_written(
                entity,
                &slot,
                loaded,
                appended.first_seq,
                &records,
                &mut contained,
            )?;
            appended_report = Some((records.len() as u64, bytes as u64));
            checkpoint_due = self.checkpoint_due(&loaded.head.head);
            Ok(Written {
                seqs: Some(appended.first_seq..=appended.last_seq),
                value,
            })
        });
        if let Some(reason) = contained {
            restorer.report_contained(entity, &reason);
        }
        if let (Some((records, bytes)), Some(hook)) = (appended_report, restorer.metrics()) {
            hook.appended(entity, records, bytes);
        }
        let written = written?;
        if checkpoint_due {
            self.checkpoint_after_write(entity);
        }
        Ok(written)
    }

    /// Folds records the log now holds into the loaded state. A record that apply refuses or
    /// panics on contains the entity: it is durable, the state cannot fold it, and a restore
    /// would meet the same record. Runs under the state lock; `contained` is reported by the
    /// caller once the lock is released.
    pub(super) fn fold_written(
        &self,
        entity: &EntityId,
        slot: &Arc<Slot<M::State>>,
        loaded: &mut Loaded<M::State>,
        first_seq: u64,
        records: &[Vec<u8>],
        contained: &mut Option<Arc<Containment>>,
    ) -> Result<()> {
        let restorer = &self.inner.restorer;
        // Armed until every record is folded: an unwind out of here leaves nobody able to
        // tell what the state holds, so the guard fails the entity closed (SPEC R5).
        let unsure = Unsure::arm(restorer, slot);
        for (i, record) in records.iter().enumerate() {
            let seq = first_seq + i as u64;
            let machine = restorer.machine();
            let ctx = ApplyContext::new(entity, seq, Origin::Live);
            let folded = catch_unwind(AssertUnwindSafe(|| {
                machine.apply(&mut loaded.state, &ctx, record)
            }));
            let reason = match folded {
                Ok(Ok(())) => continue,
                Ok(Err(r)) => Containment::new(
                    ReasonKind::ApplyRefusal,
                    format!(
                        "record {seq} was appended but apply refused it: {r}; check accepted it, \
                         so the code and the history disagree (a bug; refusals belong in \
                         check): fix the code, then release the entity"
                    ),
                ),
                Err(payload) => {
                    Containment::from_panic(&format!("apply of written record {seq}"), &*payload)
                }
            };
            unsure.disarm();
            let (error, reason) = restorer.contain_restored(slot, reason);
            *contained = Some(reason);
            return Err(error);
        }
        unsure.disarm();
        Ok(())
    }

    /// Appends records as they are (SPEC L1). Returns their sequence numbers.
    ///
    /// An empty list is refused: there is nothing to append. Each record is checked against
    /// the current state first ([`StateMachine::check`], SPEC R12): a refusal answers
    /// [`Error::Refused`] and writes nothing.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, unless
    /// [`EngineBuilder::register_on_first_write`](crate::EngineBuilder::register_on_first_write) is on.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    /// use portcullis::typed::encode;
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
    /// let seqs = engine.append(&clicks, vec![encode(&2u64)?, encode(&3u64)?])?;
    /// assert_eq!(seqs, 1..=2);
    /// assert_eq!(engine.read(&clicks, |t| *t)?, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn append(&self, entity: &EntityId, records: Vec<Vec<u8>>) -> Result<RangeInclusive<u64>> {
        if records.is_empty() {
            return Err(Error::invalid("append needs at least one record"));
        }
        self.check_records(&records)?;
        let written = self.write(entity, move |_| (records, ()))?;
        Ok(written.seqs.expect("records were not empty"))
    }

    /// Queues a record for an entity without restoring it (SPEC R8).
    ///
    /// If the entity is pending, the record is stored durably before this returns and is
    /// applied inside its restore unit, after its log tail and in arrival order. If it is
    /// already restored, the record is appended at once. Deferred records are checked like any
    /// write first: their bytes at once ([`StateMachine::validate`]); against the state
    /// ([`StateMachine::check`]) at once for a restored entity (a refusal answers
    /// [`Error::Refused`] and writes nothing), and inside the restore unit for a pending one,
    /// where a record the state refuses is set aside rather than appended (see
    /// [`refused_deferrals`](Self::refused_deferrals), SPEC R12). Like every engine write, the
    /// deferred row (or the append) is fenced under the namespace's grant (SPEC F11).
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, unless
    /// [`EngineBuilder::register_on_first_write`](crate::EngineBuilder::register_on_first_write) is on.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    /// use portcullis::engine::Deferred;
    /// use portcullis::typed::encode;
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
    /// engine.append_typed(&clicks, &[1])?; // restored now, so a deferral is applied at once
    /// assert_eq!(engine.defer(&clicks, encode(&4u64)?)?, Deferred::Applied { seq: 2 });
    /// assert_eq!(engine.read(&clicks, |t| *t)?, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer(&self, entity: &EntityId, record: Vec<u8>) -> Result<Deferred> {
        let _open = self.enter()?;
        self.inner.owners.serving(entity.namespace())?;
        self.check_records(std::slice::from_ref(&record))?;
        self.defer_with(entity, record, Batch::new())
    }

    /// [`defer`](Self::defer), at most once per `id` for the entity (issue: a retry after an
    /// ambiguous failure must not double the work). The record and a marker of `id` commit in
    /// one batch, guarded on the marker being absent, so a retry of a deferral that did commit
    /// (its answer was lost, or an error came after the commit) writes nothing and answers
    /// [`Deferred::AlreadyAccepted`]: the caller learns the record is durable. Markers are kept
    /// (one small row per id); choose ids the application can bound (request ids, say).
    /// `id` is 1 to 256 bytes.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, unless
    /// [`EngineBuilder::register_on_first_write`](crate::EngineBuilder::register_on_first_write) is on.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    /// use portcullis::engine::Deferred;
    /// use portcullis::typed::encode;
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
    /// let first = engine.defer_once(&clicks, b"request-17", encode(&4u64)?)?;
    /// assert!(matches!(first, Deferred::Applied { .. } | Deferred::Queued));
    /// // A retry of the same request writes nothing.
    /// assert_eq!(engine.defer_once(&clicks, b"request-17", encode(&4u64)?)?, Deferred::AlreadyAccepted);
    /// assert_eq!(engine.read(&clicks, |t| *t)?, 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer_once(&self, entity: &EntityId, id: &[u8], record: Vec<u8>) -> Result<Deferred> {
        if id.is_empty() || id.len() > 256 {
            return Err(Error::invalid("a deferral id must be 1 to 256 bytes"));
        }
        let _open = self.enter()?;
        self.inner.owners.serving(entity.namespace())?;
        self.check_records(std::slice::from_ref(&record))?;
        let marker = crate::restore::keys::defer_id_key(id);
        let extra = Batch::new().absent(marker.clone()).put(marker, Vec::new());
        self.defer_with(entity, record, extra)
    }

    fn defer_with(&self, entity: &EntityId, record: Vec<u8>, extra: Batch) -> Result<Deferred> {
        let deferral = self.registering(entity, || {
            self.inner.restorer.defer(entity, &record, &extra)
        })?;
        match deferral {
            Deferral::Queued => {
                // Applied inside the entity's restore unit: the background warm runs it, so
                // the work does not wait for a touch (SPEC R6, R8).
                self.inner.owe_entity(entity);
                Ok(Deferred::Queued)
            }
            Deferral::Duplicate => Ok(Deferred::AlreadyAccepted),
            Deferral::AlreadyRestored => {
                let records = vec![record];
                let written = self.write_extra(entity, extra, move |_| Ok((records, ())))?;
                Ok(match written.seqs {
                    Some(seqs) => Deferred::Applied { seq: *seqs.start() },
                    None => Deferred::AlreadyAccepted,
                })
            }
        }
    }
}

/// Armed while a write may have committed but its records are not folded yet: dropped armed
/// (an unwind), it fails the entity closed, since nobody can tell what its state holds
/// (SPEC R5).
struct Unsure<'a, M: StateMachine> {
    restorer: &'a crate::restore::Restorer<M>,
    slot: &'a crate::restore::Slot<M::State>,
    armed: bool,
}

impl<'a, M: StateMachine> Unsure<'a, M> {
    fn arm(
        restorer: &'a crate::restore::Restorer<M>,
        slot: &'a crate::restore::Slot<M::State>,
    ) -> Self {
        Unsure {
            restorer,
            slot,
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<M: StateMachine> Drop for Unsure<'_, M> {
    fn drop(&mut self) {
        if self.armed {
            self.restorer.fail_closed(self.slot);
        }
    }
}
