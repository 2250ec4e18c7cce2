//! The restore unit (SPEC R3): the one sequence of steps that turns an entity's stored rows
//! into its in-memory state.
//!
//! 1. Load the newest checkpoint (checked against the head and the stored digest, SPEC L4) or
//!    start fresh.
//! 2. Replay the log tail, verifying the digest chain record by record.
//! 3. If the replayed tail was longer than the bound, publish a checkpoint now, before
//!    deferred work is applied.
//! 4. Move deferred work into the log in arrival order (SPEC R8) and fold it.
//! 5. For each term owed a repair in the entity's namespace (a holder that ended without
//!    releasing it) that this entity was not yet repaired for, in order, run the application's
//!    repair; its records and the "repaired for" mark commit in one batch per term. Then drain
//!    any work deferred to the entity meanwhile (by the repair itself).
//! 6. Publish a checkpoint if one is owed again (the repair changed state, or the records
//!    folded since the last checkpoint exceed the bound).
//!
//! Any refusal returns a [`Containment`] naming the step; the caller records it (SPEC R4).
//! A write the engine may not make now (the namespace's grant is stale or not held, or the
//! lease kept changing) is not a refusal: the unit stops with [`UnitFailure::Retry`], the entity
//! stays pending, and a later touch runs the whole unit again (SPEC F11).
//! Every call into the application is wrapped in `catch_unwind`, so a panic names its step.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use super::RestoreConfig;
use super::containment::{Containment, ReasonKind};
use super::keys;
use super::machine::{ApplyContext, Origin, Rejection, StateMachine};
use crate::entity::EntityId;
use crate::error::Error;
use crate::log::{self, Guarded, HeadSnapshot};
use crate::store::{Batch, Partition, Store};

/// An entity's state in memory, with the log head it has folded up to.
#[derive(Debug)]
pub struct Loaded<S> {
    /// The folded state.
    pub state: S,
    /// The head of the log as last written or read; the next write is guarded on it.
    pub head: HeadSnapshot,
    /// A write whose answer was lost (the store returned an error, so it may or may not have
    /// committed); the next write to the entity reads the head to settle it first.
    pub(crate) unsettled: Option<Unsettled>,
}

/// A head-guarded write whose outcome the engine does not know.
#[derive(Debug)]
pub(crate) struct Unsettled {
    /// The head the log has if the write committed.
    pub(crate) head_if_committed: crate::log::LogHead,
    /// The records it appended (none for a checkpoint or a truncation), from this sequence
    /// number on.
    pub(crate) first_seq: u64,
    pub(crate) records: Vec<Vec<u8>>,
}

/// What one restore unit did (SPEC R9).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnitReport {
    /// The checkpoint restore started from, if any.
    pub checkpoint_seq: Option<u64>,
    /// Log records replayed after the checkpoint.
    pub replayed: u64,
    /// Bytes of those records.
    pub replayed_bytes: u64,
    /// Deferred records moved into the log and folded.
    pub deferred: u64,
    /// Records the unclean-restart repairs appended.
    pub repaired: u64,
    /// Unclean-restart repairs run (one per owed term the entity had not been repaired for).
    pub repairs_run: u64,
    /// Whether the unit published a checkpoint.
    pub checkpoint_published: bool,
    /// Wall time of the unit.
    pub elapsed: Duration,
}

/// Rows read per deferred page; a page becomes one batch.
const DEFER_PAGE: usize = 64;
/// A deferred page stops growing past this many bytes, keeping its batch under the store's
/// 64 MiB limit (a single record may add up to 16 MiB more).
const DEFER_PAGE_BYTES: usize = 24 << 20;

enum Step {
    Store(Error),
    Contained(Containment),
}

impl From<Error> for Step {
    fn from(e: Error) -> Self {
        Step::Store(e)
    }
}

/// Why a unit did not finish.
pub(crate) enum UnitFailure {
    /// The entity must be contained with this reason (SPEC R4).
    Contained(Containment),
    /// The unit could not write now (fenced, not served, unavailable): the entity stays pending
    /// and the error goes to the toucher.
    Retry(Error),
}

impl From<Containment> for UnitFailure {
    fn from(c: Containment) -> Self {
        UnitFailure::Contained(c)
    }
}

/// Whether a store error during a unit is a reason to retry later rather than contain.
pub(crate) fn is_retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Fenced { .. } | Error::NotServed { .. } | Error::Unavailable { .. } | Error::Closed
    )
}

/// A store error met by a unit: retried later if it is transient or a fencing answer, else a
/// containment naming it.
fn failure(e: Error, checkpoint_step: bool) -> UnitFailure {
    if is_retryable(&e) {
        UnitFailure::Retry(e)
    } else {
        UnitFailure::Contained(Containment::from_store_error(&e, checkpoint_step))
    }
}

struct Unit<'a, M: StateMachine> {
    store: &'a dyn Store,
    machine: &'a M,
    entity: &'a EntityId,
    partition: Partition,
    config: &'a RestoreConfig,
    owed: &'a [u64],
}

/// Runs the whole unit for `entity`.
pub(crate) fn run<M: StateMachine>(
    store: &dyn Store,
    machine: &M,
    entity: &EntityId,
    config: &RestoreConfig,
) -> Result<(Loaded<M::State>, UnitReport), UnitFailure> {
    let started = Instant::now();
    // Restoring needs the namespace served: the unit may write (SPEC F11).
    let owed = (config.owed_repairs)(entity.namespace()).map_err(UnitFailure::Retry)?;
    let unit = Unit {
        store,
        machine,
        entity,
        partition: entity.partition(),
        config,
        owed: &owed,
    };
    let mut report = UnitReport::default();
    let (mut state, mut head) = unit.load_and_replay(&mut report)?;
    // A long replayed tail owes a checkpoint now, before deferred work is applied: a crash
    // during the rest of the unit then restarts from it (SPEC R3).
    let mut since_checkpoint = report.replayed;
    if since_checkpoint > config.checkpoint_tail_bound {
        unit.warn_long_tail(since_checkpoint);
        head = unit.publish_checkpoint(&state, head, &mut report)?;
        since_checkpoint = 0;
    }
    let deferred = report.deferred;
    head = unit.drain_deferred(&mut state, head, &mut report)?;
    since_checkpoint += report.deferred - deferred;
    head = unit.repair(&mut state, head, &mut report)?;
    // Work the repair left pending (deferred to this entity from inside the unit) is drained
    // before the entity is served. Only application code running on this thread can defer to
    // the entity while its unit runs (other threads wait on the gate), and since the drain
    // above only a repair has run any: without one there is nothing new to scan for.
    let deferred = report.deferred;
    if report.repairs_run > 0 {
        head = unit.drain_deferred(&mut state, head, &mut report)?;
    }
    since_checkpoint += report.repaired + report.deferred - deferred;
    // A repair that changed state owes a checkpoint, as does a long tail since the last one.
    if report.repaired > 0 || since_checkpoint > config.checkpoint_tail_bound {
        if since_checkpoint > config.checkpoint_tail_bound {
            unit.warn_long_tail(since_checkpoint);
        }
        head = unit.publish_checkpoint(&state, head, &mut report)?;
    }
    report.elapsed = started.elapsed();
    Ok((
        Loaded {
            state,
            head,
            unsettled: None,
        },
        report,
    ))
}

/// Calls into the application, turning a panic into a named containment.
fn app<T>(step: &str, f: impl FnOnce() -> T) -> Result<T, Containment> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| Containment::from_panic(step, &*payload))
}

impl<M: StateMachine> Unit<'_, M> {
    fn load_and_replay(
        &self,
        report: &mut UnitReport,
    ) -> Result<(M::State, HeadSnapshot), UnitFailure> {
        let (head, checkpoint) =
            log::load_restore_point(self.store, &self.partition).map_err(|e| failure(e, true))?;
        let (mut state, after_seq, after_digest) = match checkpoint {
            Some(c) => {
                report.checkpoint_seq = Some(c.seq);
                let decoded = app("checkpoint decode", || {
                    self.machine.decode_checkpoint(self.entity, &c.state)
                })?
                .map_err(|r| {
                    Containment::new(
                        ReasonKind::Decode,
                        format!("checkpoint at {} does not decode: {r}", c.seq),
                    )
                })?;
                (decoded, c.seq, c.digest)
            }
            None => {
                let fresh = app("fresh state", || self.machine.fresh(self.entity))?;
                (fresh, 0, log::GENESIS_DIGEST)
            }
        };
        let replayed = log::replay::<Step>(
            self.store,
            &self.partition,
            &head.head,
            after_seq,
            after_digest,
            |record| {
                report.replayed_bytes += record.payload.len() as u64;
                self.apply(&mut state, record.seq, Origin::Replay, &record.payload)
                    .map_err(Step::Contained)
            },
        );
        match replayed {
            Ok(n) => report.replayed = n,
            Err(Step::Store(e)) => return Err(failure(e, false)),
            Err(Step::Contained(c)) => return Err(c.into()),
        }
        Ok((state, head))
    }

    fn apply(
        &self,
        state: &mut M::State,
        seq: u64,
        origin: Origin,
        record: &[u8],
    ) -> Result<(), Containment> {
        let ctx = ApplyContext::new(self.entity, seq, origin);
        // The step's name is built only on a panic: this runs once per replayed record.
        catch_unwind(AssertUnwindSafe(|| self.machine.apply(state, &ctx, record)))
            .map_err(|payload| {
                Containment::from_panic(&format!("apply of record {seq}"), &*payload)
            })?
            .map_err(|r: Rejection| {
                Containment::new(ReasonKind::ApplyRefusal, format!("record {seq}: {r}"))
            })
    }

    /// Moves deferred rows into the log, a page per batch, then folds them (SPEC R8). Each batch
    /// deletes exactly the rows it appends, so a crash between batches neither loses nor
    /// repeats any deferred record.
    fn drain_deferred(
        &self,
        state: &mut M::State,
        mut head: HeadSnapshot,
        report: &mut UnitReport,
    ) -> Result<HeadSnapshot, UnitFailure> {
        let io = |e: Error| failure(e, false);
        loop {
            let page = self
                .store
                .scan(&self.partition, &keys::deferred_range(), None, DEFER_PAGE)
                .map_err(io)?;
            if page.entries.is_empty() {
                return Ok(head);
            }
            let mut records = Vec::new();
            let mut extra = Batch::new();
            let mut bytes = 0usize;
            for (key, value) in page.entries {
                if !records.is_empty() && bytes + value.len() > DEFER_PAGE_BYTES {
                    break;
                }
                bytes += value.len();
                extra = extra.present(key.clone()).delete(key);
                records.push(value);
            }
            let appended = self.append(&head, &records, extra, "deferred work")?;
            for (i, record) in records.iter().enumerate() {
                let seq = appended.first_seq + i as u64;
                self.apply(state, seq, Origin::Deferred, record)?;
            }
            report.deferred += records.len() as u64;
            head = appended.head;
        }
    }

    fn append(
        &self,
        head: &HeadSnapshot,
        records: &[Vec<u8>],
        extra: Batch,
        what: &str,
    ) -> Result<log::Appended, UnitFailure> {
        match log::append_at(self.store, &self.partition, head, records, extra) {
            Ok(Guarded::Committed(appended)) => Ok(appended),
            Ok(other) => Err(Containment::new(
                ReasonKind::Io,
                format!("appending {what}: rows changed under the restore unit ({other:?})"),
            )
            .into()),
            Err(e) => Err(failure(e, false)),
        }
    }

    /// Runs the unclean-restart repair once per owed term this entity has not been repaired
    /// for, in increasing order, each with its own label (SPEC R3, F11). The `\0repair` row
    /// holds the last term repaired; each repair's records and the row commit in one batch, so
    /// a crash before the batch reruns that repair and a crash after it never does.
    fn repair(
        &self,
        state: &mut M::State,
        mut head: HeadSnapshot,
        report: &mut UnitReport,
    ) -> Result<HeadSnapshot, UnitFailure> {
        if self.owed.is_empty() {
            return Ok(head);
        }
        let io = |e: Error| failure(e, false);
        let mut raw = self
            .store
            .get(&self.partition, &keys::repair_key())
            .map_err(io)?;
        for &term in self.owed {
            let done = match raw.as_deref() {
                Some(bytes) => u64::from_be_bytes(bytes.try_into().map_err(|_| {
                    Containment::new(
                        ReasonKind::CorruptRecord,
                        format!("the repair row of {} is malformed", self.entity),
                    )
                })?),
                None => 0,
            };
            if term <= done {
                continue;
            }
            let records = app("repair", || self.machine.repair(self.entity, state, term))?
                .map_err(|r| Containment::new(ReasonKind::RepairRefusal, r.reason))?;
            let guard = match &raw {
                Some(old) => Batch::new().equals(keys::repair_key(), old.clone()),
                None => Batch::new().absent(keys::repair_key()),
            };
            let mark = term.to_be_bytes().to_vec();
            let extra = guard.put(keys::repair_key(), mark.clone());
            let appended = self.append(&head, &records, extra, "repair records")?;
            for (i, record) in records.iter().enumerate() {
                self.apply(state, appended.first_seq + i as u64, Origin::Repair, record)?;
            }
            report.repaired += records.len() as u64;
            report.repairs_run += 1;
            head = appended.head;
            raw = Some(mark);
        }
        Ok(head)
    }

    fn warn_long_tail(&self, tail: u64) {
        ::log::warn!(
            "{}: folded a tail of {tail} records (bound {}); publishing a checkpoint",
            self.entity,
            self.config.checkpoint_tail_bound
        );
    }

    /// Publishes a checkpoint of `state` at the head's last record (SPEC L3).
    fn publish_checkpoint(
        &self,
        state: &M::State,
        head: HeadSnapshot,
        report: &mut UnitReport,
    ) -> Result<HeadSnapshot, UnitFailure> {
        let bytes = app("checkpoint encode", || {
            self.machine.encode_checkpoint(state)
        })?;
        let seq = head.head.last_seq();
        match log::write_checkpoint(self.store, &self.partition, &head, seq, bytes, Batch::new()) {
            Ok(Guarded::Committed(head)) => {
                report.checkpoint_published = true;
                Ok(head)
            }
            Ok(other) => Err(Containment::new(
                ReasonKind::Io,
                format!("publishing a checkpoint: rows changed under the restore unit ({other:?})"),
            )
            .into()),
            Err(e) => Err(failure(e, false)),
        }
    }
}
