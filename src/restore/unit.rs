//! The restore unit (SPEC R3): the one sequence of steps that turns an entity's stored rows
//! into its in-memory state.
//!
//! 1. Load the newest checkpoint (checked against the head and the stored digest, SPEC L4) or
//!    start fresh. A checkpoint the machine does not decode (written by a version the code no
//!    longer reads, say) is not fatal while the whole history is stored: the unit starts fresh
//!    instead and owes a checkpoint (SPEC E7); with the history truncated, it contains.
//! 2. Replay the log tail, verifying the digest chain record by record.
//! 3. If the replayed tail was longer than the bound, or the checkpoint could not be decoded,
//!    publish a checkpoint now, before deferred work is applied.
//! 4. Check deferred work against the state in arrival order (SPEC R8, R12): move what
//!    `check` accepts into the log, one record per batch, and fold it; set aside what it
//!    refuses (`refused.rs`).
//! 5. For each term owed a repair in the entity's namespace (a holder that ended without
//!    releasing it) that this entity was not yet repaired for, in order, run the application's
//!    repair; its records and the "repaired for" mark commit in one batch per term. Then drain
//!    any work deferred to the entity meanwhile (by the repair itself).
//! 6. Publish a checkpoint if one is owed again (the repair changed state, or the records
//!    folded since the last checkpoint exceed the bound).
//!
//! A checkpoint the machine's `encode_checkpoint` refuses is not published (steps 3 and 6):
//! the unit logs a warning and goes on, since the folded state is sound.
//!
//! Any refusal returns a [`Containment`] naming the step; the caller records it (SPEC R4).
//! A write the engine may not make now (the namespace's grant is stale or not held, or the
//! lease kept changing) is not a refusal: the unit stops with [`UnitFailure::Retry`], the entity
//! stays pending, and a later touch runs the whole unit again (SPEC F11).
//! Every call into the application is wrapped in `catch_unwind`, so a panic names its step.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use super::RestoreConfig;
use super::containment::{Containment, ReasonKind};
use super::fresh::{self, Fresh};
use super::keys;
use super::machine::{ApplyContext, Origin, Rejection, StateMachine};
use super::refused::RefusedDeferral;
use super::telemetry::MetricsHook;
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
    /// A checkpoint the machine could not decode (its sequence number): restore replayed the
    /// whole history instead and published a checkpoint in the current encoding (SPEC E7).
    pub checkpoint_unreadable: Option<u64>,
    /// Log records replayed after the checkpoint.
    pub replayed: u64,
    /// Bytes of those records.
    pub replayed_bytes: u64,
    /// Deferred records moved into the log and folded.
    pub deferred: u64,
    /// Deferred records the state refused, set aside instead of appended (SPEC R8, R12).
    pub deferred_refused: u64,
    /// Records the unclean-restart repairs appended.
    pub repaired: u64,
    /// Unclean-restart repairs run (one per owed term the entity had not been repaired for).
    pub repairs_run: u64,
    /// Whether the unit published a checkpoint.
    pub checkpoint_published: bool,
    /// Wall time of the unit.
    pub elapsed: Duration,
    /// The term of the namespace holding the entity was restored under (one per adoption of
    /// the namespace by any owner, SPEC F11): its state serves only that holding.
    pub term: u64,
}

/// Deferred rows read per scan.
const DEFER_PAGE: usize = 64;
/// A batch of refused deferred rows stops growing past this many bytes, keeping it under the
/// store's 64 MiB limit (a single record may add up to 16 MiB more).
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
    /// The namespace was adopted again while the unit ran: its state belongs to a holding that
    /// ended, so nothing is installed and the entity stays pending (SPEC F11).
    Stale,
}

impl From<Containment> for UnitFailure {
    fn from(c: Containment) -> Self {
        UnitFailure::Contained(c)
    }
}

/// Whether a store error during a unit is a reason to retry later rather than contain. A
/// batch whose answer was lost (`OutcomeUnknown`) is retried too: every step of a unit reads
/// the store again and is idempotent, and the next unit seals the log first, so the lost batch
/// either committed before it (and is found) or never commits (SPEC F12).
pub(crate) fn is_retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Fenced { .. }
            | Error::NotServed { .. }
            | Error::OwnerLive { .. }
            | Error::Unavailable { .. }
            | Error::Closed
            | Error::Exhausted { .. }
            | Error::OutcomeUnknown { .. }
    )
}

/// How many times a unit reads the head and tries to seal it before it retries later.
const SEAL_ATTEMPTS: usize = 4;

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
    metrics: &'a MetricsHook,
    checks: bool,
    /// Whether a checkpoint that does not decode falls back to replaying the whole history
    /// (off only as a test's negative control).
    checkpoint_fallback: bool,
    /// Whether the `\0fresh` row names records this unit has folded (`fresh.rs`): deleted
    /// before the entity is served.
    fresh_pending: Cell<bool>,
}

/// Whether a restore unit replays the whole history when the checkpoint does not decode (SPEC
/// E7). Always, except when a test turns it off to show that the tests of the fallback catch
/// its absence (a negative control).
#[derive(Debug, Default)]
pub(crate) struct FallbackSwitch {
    #[cfg(feature = "test-hooks")]
    off: crate::sync::atomic::AtomicBool,
}

impl FallbackSwitch {
    /// Whether the fallback is on.
    pub(crate) fn on(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        {
            !self.off.load(crate::sync::atomic::Ordering::Relaxed)
        }
        #[cfg(not(feature = "test-hooks"))]
        {
            true
        }
    }

    /// Test-only: turn the fallback off.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_off(&self, off: bool) {
        self.off.store(off, crate::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs the whole unit for `entity` (`owner` is the registry's identity in the thread's marks).
/// `checks` says whether deferred records are checked
/// against the state (always, except under a test's negative control); refused ones are
/// reported to `metrics`. `checkpoint_fallback` is off only as a test's negative control: an
/// undecodable checkpoint then contains the entity even with its history stored.
pub(crate) fn run<M: StateMachine>(
    (store, owner): (&dyn Store, usize),
    machine: &M,
    entity: &EntityId,
    config: &RestoreConfig,
    (metrics, checks, checkpoint_fallback): (&MetricsHook, bool, bool),
    seal_first: &mut bool,
) -> Result<UnitDone<M::State>, UnitFailure> {
    let started = config.clock.instant();
    // Restoring needs the namespace served: the unit may write (SPEC F11). Its state belongs
    // to this holding (`term`): installed only while the namespace is still held under it.
    let (term, owed) = (config.owed_repairs)(entity.namespace()).map_err(UnitFailure::Retry)?;
    super::restoring::set_unit_term(owner, entity, term);
    if *seal_first {
        // An earlier unit lost a batch's answer: seal the log first, so that batch either
        // committed already (and this unit reads it) or never commits (SPEC F12).
        seal(store, &entity.partition())?;
        *seal_first = false;
    }
    let unit = Unit {
        store,
        machine,
        entity,
        partition: entity.partition(),
        config,
        owed: &owed,
        metrics,
        checks,
        checkpoint_fallback,
        fresh_pending: Cell::new(false),
    };
    let mut report = UnitReport {
        term,
        ..UnitReport::default()
    };
    let (mut state, mut head) = unit.load_and_replay(&mut report)?;
    // A long replayed tail owes a checkpoint now, before deferred work is applied: a crash
    // during the rest of the unit then restarts from it (SPEC R3). So does a checkpoint that
    // did not decode: the next restore starts from one in the current encoding (SPEC E7).
    let mut since_checkpoint = report.replayed;
    if since_checkpoint > config.checkpoint_tail_bound || report.checkpoint_unreadable.is_some() {
        if since_checkpoint > config.checkpoint_tail_bound {
            unit.warn_long_tail(since_checkpoint);
        }
        head = unit.publish_checkpoint(&state, head, &mut report)?;
        since_checkpoint = 0;
    }
    let deferred = report.deferred;
    head = unit.drain_deferred(&mut state, head, &mut report)?;
    let mut drained_at = super::restoring::self_deferrals();
    since_checkpoint += report.deferred - deferred;
    head = unit.repair(&mut state, head, &mut report)?;
    // Work deferred to this entity since (from inside the unit: the repair, `apply` of its
    // records) is drained before the entity is served. Only application code running on this
    // thread can defer to the entity while its unit runs (other threads wait on the gate), and
    // it counts what it defers, so without such a deferral there is nothing new to scan for.
    let deferred = report.deferred;
    let late = config.guards.late_deferrals_undrained;
    if (late && report.repairs_run > 0)
        || (!late && super::restoring::self_deferrals() != drained_at)
    {
        head = unit.drain_deferred(&mut state, head, &mut report)?;
        drained_at = super::restoring::self_deferrals();
    }
    since_checkpoint += report.repaired + report.deferred - deferred;
    // A repair that changed state owes a checkpoint, as does a long tail since the last one.
    if report.repaired > 0 || since_checkpoint > config.checkpoint_tail_bound {
        if since_checkpoint > config.checkpoint_tail_bound {
            unit.warn_long_tail(since_checkpoint);
        }
        head = unit.publish_checkpoint(&state, head, &mut report)?;
    }
    // Work the checkpoint's encoding deferred is drained too.
    head = unit.drain_late(&mut state, head, &mut report, &mut drained_at)?;
    // A holding that ended while the unit ran: its state is installed nowhere (SPEC F11).
    if !config.guards.stale_holding_served && (config.term_now)(entity.namespace()) != Some(term) {
        return Err(UnitFailure::Stale);
    }
    report.elapsed = config.clock.instant().saturating_duration_since(started);
    Ok((
        Loaded {
            state,
            head,
            unsettled: None,
        },
        report,
        (
            term,
            Tail {
                drained_at,
                fresh_pending: unit.fresh_pending.get(),
            },
        ),
    ))
}

/// The unit's last steps, after its report went to the metrics hook (still inside the unit):
/// drains what the hook deferred to the entity, if anything, then deletes the `\0fresh` row if
/// it still names records the unit folded (`fresh.rs`), before the entity is served.
pub(crate) fn finish<M: StateMachine>(
    store: &dyn Store,
    machine: &M,
    entity: &EntityId,
    config: &RestoreConfig,
    (metrics, checks): (&MetricsHook, bool),
    (loaded, report, tail): (&mut Loaded<M::State>, &mut UnitReport, Tail),
) -> Result<(), UnitFailure> {
    let unit = Unit {
        store,
        machine,
        entity,
        partition: entity.partition(),
        config,
        owed: &[],
        metrics,
        checks,
        checkpoint_fallback: true,
        fresh_pending: Cell::new(tail.fresh_pending),
    };
    let mut drained_at = tail.drained_at;
    let head = loaded.head.clone();
    let head = unit.drain_late(&mut loaded.state, head, report, &mut drained_at)?;
    loaded.head = unit.folded_fresh(head)?;
    Ok(())
}

/// Seals an entity's log (`log::seal`) at whatever head it has now.
fn seal(store: &dyn Store, p: &Partition) -> Result<(), UnitFailure> {
    for _ in 0..SEAL_ATTEMPTS {
        let head = log::read_head(store, p).map_err(|e| failure(e, false))?;
        match log::seal(store, p, &head).map_err(|e| failure(e, false))? {
            Guarded::Committed(_) => return Ok(()),
            _ => continue,
        }
    }
    Err(UnitFailure::Retry(Error::Unavailable {
        reason: format!("the log of {p} kept moving while a lost answer was settled"),
        retry_after_ms: 10,
    }))
}

/// What a unit that succeeded hands back: the state, its report, the term of the holding it was
/// restored under, and where it stands for its last steps (see `finish`).
pub(crate) type UnitDone<S> = (Loaded<S>, UnitReport, (u64, Tail));

/// Where a unit that succeeded stands for its last steps (`finish`): the count of deferrals made
/// from inside units on this thread when it last drained, and whether its `\0fresh` row still
/// names records it has folded (SPEC R3, R8).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tail {
    drained_at: u64,
    fresh_pending: bool,
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
        let (fresh_key, entity_key) = (fresh::key(), keys::entity_key());
        let (head, checkpoint, rows) =
            log::load_restore_point_with(self.store, &self.partition, &[&fresh_key, &entity_key])
                .map_err(|e| failure(e, true))?;
        let mut rows = rows.into_iter();
        let (fresh_row, marker) = (rows.next().flatten(), rows.next().flatten());
        // A partition without the registration marker is no entity: only the fence wrote
        // there (a lease pushed or retired for an entity never registered).
        if marker.is_none() && !self.config.guards.phantom_partitions_are_entities {
            return Err(UnitFailure::Retry(crate::Error::UnknownEntity(
                self.entity.to_string(),
            )));
        }
        // Records appended with a first-use origin whose fold is not known to have happened
        // (a crash, or a retried unit) are folded with that origin (`fresh.rs`).
        let fresh = match fresh_row {
            Some(row) => Some(Fresh::decode(&self.partition, &row).map_err(|e| failure(e, false))?),
            None => None,
        };
        self.fresh_pending.set(fresh.is_some());
        let fresh = fresh.filter(|_| !self.config.guards.first_use_origin_forgotten);
        let (mut state, after_seq, after_digest) = match checkpoint {
            Some(c) => {
                let decoded = app("checkpoint decode", || {
                    self.machine.decode_checkpoint(self.entity, &c.state)
                })?;
                match decoded {
                    Ok(decoded) => {
                        report.checkpoint_seq = Some(c.seq);
                        (decoded, c.seq, c.digest)
                    }
                    Err(why) => self.without_checkpoint(&head, c.seq, &why, report)?,
                }
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
                let origin = Fresh::origin_of(fresh.as_ref(), record.seq);
                self.apply(&mut state, record.seq, origin, &record.payload)
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

    /// Where restore starts when the checkpoint at `seq` does not decode (SPEC E7): from a
    /// fresh state, replaying the whole history, when nothing of it was truncated (the log
    /// keeps only its newest checkpoint, so there is no older one to fall back to). Otherwise
    /// the entity is contained, with the machine's reason (a typed machine's names the
    /// versions).
    fn without_checkpoint(
        &self,
        head: &HeadSnapshot,
        seq: u64,
        why: &Rejection,
        report: &mut UnitReport,
    ) -> Result<(M::State, u64, u64), Containment> {
        let first = head.head.first_seq;
        if first != 1 || !self.checkpoint_fallback {
            let replay = if first != 1 {
                format!(
                    "; the history before it was truncated (records from {first} on are kept), \
                     so it cannot be replayed instead"
                )
            } else {
                String::new()
            };
            return Err(Containment::new(
                ReasonKind::Decode,
                format!("checkpoint at {seq} does not decode: {why}{replay}"),
            ));
        }
        ::log::warn!(
            "{}: the checkpoint at {seq} does not decode ({why}); replaying the whole history \
             instead and publishing a new checkpoint",
            self.entity
        );
        report.checkpoint_unreadable = Some(seq);
        let fresh = app("fresh state", || self.machine.fresh(self.entity))?;
        Ok((fresh, 0, log::GENESIS_DIGEST))
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
                let why = match origin {
                    // Checked against this very state a moment ago (see `drain_deferred`).
                    Origin::Deferred => format!(
                        "deferred record {seq} was appended after check accepted it, but apply \
                         refused it: {r}; the code and the history disagree (a bug in the state \
                         machine): fix the code, then release the entity"
                    ),
                    _ => format!(
                        "record {seq} is in the history but apply refused it: {r}; the code and \
                         the history disagree (a bug, or a record type that changed; refusals \
                         belong in check): fix the code, then release the entity"
                    ),
                };
                Containment::new(ReasonKind::ApplyRefusal, why)
            })
    }

    /// Asks the state machine whether the deferred record that would be `seq` may be written
    /// now (SPEC R12). A panic contains the entity; a refusal is the inner `Err`.
    fn check(
        &self,
        state: &M::State,
        seq: u64,
        record: &[u8],
    ) -> Result<Result<(), Rejection>, Containment> {
        if !self.checks {
            return Ok(Ok(()));
        }
        let ctx = ApplyContext::new(self.entity, seq, Origin::Deferred);
        catch_unwind(AssertUnwindSafe(|| self.machine.check(state, &ctx, record))).map_err(
            |payload| {
                Containment::from_panic(&format!("check of deferred record {seq}"), &*payload)
            },
        )
    }

    /// Drains the deferred rows in acceptance order (SPEC R8, R12). Each record is checked
    /// against the state after every deferred record before it, so the records are committed
    /// one at a time: a batch appends one record `check` accepted, writes the refused rows of
    /// the records it refused before that one, and deletes exactly the deferred rows it
    /// covers (each guarded `Present`); then the record is folded. So a crash between batches
    /// neither loses nor repeats a deferred record, and never both keeps and sets one aside;
    /// and a record is folded as `Deferred` only once it is durable, exactly once.
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
            let mut extra = Batch::new();
            let mut refused: Vec<RefusedDeferral> = Vec::new();
            let mut bytes = 0usize;
            for (key, value) in page.entries {
                if !refused.is_empty() && bytes + value.len() > DEFER_PAGE_BYTES {
                    // Refused rows only: commit them before they grow past the batch limit.
                    head =
                        self.set_aside(head, std::mem::take(&mut extra), &mut refused, report)?;
                    bytes = 0;
                }
                let seq = head.head.next_seq;
                extra = extra.present(key.clone()).delete(key.clone());
                match self.check(state, seq, &value)? {
                    Ok(()) => {
                        let mark = Fresh {
                            first: seq,
                            last: seq,
                            origin: Origin::Deferred,
                        };
                        let batch = std::mem::take(&mut extra).put(fresh::key(), mark.encode());
                        let appended = self.append(&head, &[&value], batch, "deferred work")?;
                        self.fresh_pending.set(true);
                        head = appended.head;
                        report.deferred += 1;
                        self.report_refused(&mut refused, report);
                        bytes = 0;
                        self.apply(state, seq, Origin::Deferred, &value)?;
                    }
                    Err(rejection) => {
                        let r =
                            RefusedDeferral::new(self.entity, &key, seq, &rejection.reason, value);
                        bytes += r.record.len() + r.reason.len();
                        extra = extra.put(r.key.clone(), r.encode_row());
                        refused.push(r);
                    }
                }
            }
            if !refused.is_empty() {
                head = self.set_aside(head, extra, &mut refused, report)?;
            }
        }
    }

    /// Commits a batch that only sets refused deferred records aside (and deletes their
    /// deferred rows), then reports them.
    fn set_aside(
        &self,
        head: HeadSnapshot,
        extra: Batch,
        refused: &mut Vec<RefusedDeferral>,
        report: &mut UnitReport,
    ) -> Result<HeadSnapshot, UnitFailure> {
        let none: [&[u8]; 0] = [];
        // The records before it were folded: the row names nothing any more.
        let extra = extra.delete(fresh::key());
        let appended = self.append(&head, &none, extra, "refused deferred work")?;
        self.fresh_pending.set(false);
        self.report_refused(refused, report);
        Ok(appended.head)
    }

    /// Reports refused deferred records whose batch committed (SPEC R9).
    fn report_refused(&self, refused: &mut Vec<RefusedDeferral>, report: &mut UnitReport) {
        report.deferred_refused += refused.len() as u64;
        for r in refused.drain(..) {
            r.report(self.metrics);
        }
    }

    fn append<R: AsRef<[u8]>>(
        &self,
        head: &HeadSnapshot,
        records: &[R],
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
            // Its records, if any, are first folded with `Origin::Repair` (`fresh.rs`).
            let extra = if records.is_empty() {
                extra.delete(fresh::key())
            } else {
                let first = head.head.next_seq;
                let fresh = Fresh {
                    first,
                    last: first + records.len() as u64 - 1,
                    origin: Origin::Repair,
                };
                extra.put(fresh::key(), fresh.encode())
            };
            let appended = self.append(&head, &records, extra, "repair records")?;
            self.fresh_pending.set(!records.is_empty());
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

    /// Deletes the `\0fresh` row if it still names records this unit folded (`fresh.rs`).
    fn folded_fresh(&self, head: HeadSnapshot) -> Result<HeadSnapshot, UnitFailure> {
        if !self.fresh_pending.get() || self.config.guards.first_use_origin_forgotten {
            return Ok(head);
        }
        let none: [&[u8]; 0] = [];
        let extra = Batch::new().delete(fresh::key());
        let appended = self.append(&head, &none, extra, "the first-use mark")?;
        self.fresh_pending.set(false);
        Ok(appended.head)
    }

    /// Drains again if code inside the unit deferred work to the entity since the last drain
    /// (`drained_at`), so nothing deferred from inside the unit is left for a later touch.
    fn drain_late(
        &self,
        state: &mut M::State,
        head: HeadSnapshot,
        report: &mut UnitReport,
        drained_at: &mut u64,
    ) -> Result<HeadSnapshot, UnitFailure> {
        if self.config.guards.late_deferrals_undrained
            || super::restoring::self_deferrals() == *drained_at
        {
            return Ok(head);
        }
        let head = self.drain_deferred(state, head, report)?;
        *drained_at = super::restoring::self_deferrals();
        Ok(head)
    }

    fn warn_long_tail(&self, tail: u64) {
        ::log::warn!(
            "{}: folded a tail of {tail} records (bound {}); publishing a checkpoint",
            self.entity,
            self.config.checkpoint_tail_bound
        );
    }

    /// Publishes a checkpoint of `state` at the head's last record (SPEC L3). If the machine's
    /// `encode_checkpoint` refuses the state, nothing is published and the unit goes on (the
    /// state is sound; only its checkpoint is missing, and the next restore owes it again).
    fn publish_checkpoint(
        &self,
        state: &M::State,
        head: HeadSnapshot,
        report: &mut UnitReport,
    ) -> Result<HeadSnapshot, UnitFailure> {
        let encoded = app("checkpoint encode", || {
            self.machine.encode_checkpoint(state)
        })?;
        let bytes = match encoded {
            Ok(bytes) => bytes,
            Err(r) => {
                ::log::warn!(
                    "{}: the checkpoint the restore owes was not published: encode_checkpoint \
                     refused the state ({r})",
                    self.entity
                );
                return Ok(head);
            }
        };
        let seq = head.head.last_seq();
        // The checkpoint holds every record folded so far: the `\0fresh` row goes with it.
        let extra = if self.fresh_pending.get() {
            Batch::new().delete(fresh::key())
        } else {
            Batch::new()
        };
        match log::write_checkpoint(self.store, &self.partition, &head, seq, bytes, extra) {
            Ok(Guarded::Committed(head)) => {
                report.checkpoint_published = true;
                self.fresh_pending.set(false);
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
