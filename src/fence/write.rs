//! The lease-and-write path (SPEC F2, F3): a write commits only under a usable lease, guarded
//! on that lease exactly as read and on a deadline checked by the store at commit.
//!
//! This file owns the attempt: planning it over every fence, committing a renewal's
//! leased-shard row, applying the entity batch and re-planning within a bound, and which rows a
//! write may touch. Each fence's reading of its lease is in `lease.rs`. Calls the store.

use std::ops::Bound;

use super::rows::FENCE_ROWS_PREFIX;
use super::stats::Counters;
use super::{Fence, HookPoint};
use crate::entity::{EntityId, RESERVED_KEY_PREFIX};
use crate::error::{Error, Result};
use crate::store::{Batch, KeyRange, Op, Outcome, Precondition, check_guards};

/// How many times a write re-plans after a failed lease guard, a lost renewal race or a
/// passed deadline before it answers `Unavailable` (SPEC F3, F8).
const MAX_WRITE_ATTEMPTS: usize = 4;

/// One fence and the grant epoch a write was planned under (see [`write_under`]).
#[derive(Clone, Copy, Debug)]
pub struct FenceGrant<'a> {
    /// The fence.
    pub fence: &'a Fence,
    /// The epoch (or authority generation) the caller planned the write under.
    pub grant: u64,
}

/// What a planning closure sees on each attempt of a fenced write.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WritePlan {
    /// The lease epoch the write will commit under, one per fence in the order given.
    pub epochs: Vec<u64>,
    /// The planner's clock when this attempt was planned.
    pub plan_time_ms: u64,
    /// The earliest `NotAfter` deadline the batch carries (store clock); `u64::MAX` when it
    /// carries none (a store without deadlines, or an unfenced namespace).
    pub deadline_ms: u64,
    /// Whether this attempt renews a lease first.
    pub renewal: bool,
    /// 0 for the first attempt, 1 for the first re-plan, ...
    pub attempt: usize,
}

/// What became of a fenced write. Fenced and unavailable writes are errors
/// ([`Error::Fenced`], [`Error::Unavailable`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum WriteOutcome {
    /// The batch committed under these lease epochs (one per fence, in the order given).
    Committed {
        /// The lease epoch of each fence.
        epochs: Vec<u64>,
    },
    /// The caller's own precondition at `index` (into the caller's batch) did not hold;
    /// nothing of the batch was written.
    PreconditionFailed {
        /// Index into the caller's [`Batch::guards`].
        index: usize,
    },
    /// The planning closure chose not to write; no lease state was written.
    Declined,
}

/// One planned attempt.
enum Attempt {
    Declined,
    /// The caller's own precondition at this index already fails; nothing was written.
    Refused(usize),
    LostRace,
    Ready(PlannedWrite),
}

/// A write that has been planned (its lease read and, if needed, its leased-shard row
/// committed) but not yet applied to the entity. Test-only handle, so property tests can
/// interleave other steps between planning and applying (public with the feature
/// `test-hooks`); [`write_under`] uses it too.
#[derive(Debug)]
pub struct PlannedWrite {
    fence: Fence,
    entity: EntityId,
    batch: Batch,
    fence_guards: usize,
    epochs: Vec<u64>,
}

impl PlannedWrite {
    /// The lease epochs this write will commit under.
    #[cfg(feature = "test-hooks")]
    pub fn epochs(&self) -> &[u64] {
        &self.epochs
    }

    /// Applies the planned batch once. `None` when the lease guard failed or the deadline
    /// passed (the caller would re-plan).
    #[cfg(feature = "test-hooks")]
    pub fn apply(self) -> Result<Option<WriteOutcome>> {
        Ok(match self.apply_once()? {
            Applied::Done(outcome) => Some(outcome),
            Applied::Retry { .. } => None,
        })
    }

    fn apply_once(self) -> Result<Applied> {
        let entity = &self.entity;
        self.fence.hook(HookPoint::WriteBeforeApply, Some(entity));
        match self
            .fence
            .inner
            .store
            .apply(&entity.partition(), &self.batch)?
        {
            Outcome::Committed => {
                Counters::bump(&self.fence.inner.counters.writes_committed);
                Ok(Applied::Done(WriteOutcome::Committed {
                    epochs: self.epochs,
                }))
            }
            Outcome::PreconditionFailed { index } if index >= self.fence_guards => {
                Ok(Applied::Done(WriteOutcome::PreconditionFailed {
                    index: index - self.fence_guards,
                }))
            }
            Outcome::PreconditionFailed { .. } => {
                log::debug!("lease of {entity} changed since it was read");
                Ok(Applied::Retry { store_now_ms: 0 })
            }
            Outcome::DeadlinePassed { now_ms } => {
                log::debug!("write to {entity} passed its deadline (store clock {now_ms})");
                Ok(Applied::Retry {
                    store_now_ms: now_ms,
                })
            }
        }
    }
}

/// What one apply of a planned write did.
enum Applied {
    Done(WriteOutcome),
    /// Re-plan. `store_now_ms` is the store's clock when it refused a passed deadline (0
    /// otherwise): if it is ahead of the planner's by less than the margin, the next plan
    /// reads time as at least that, so a lagging planner renews instead of re-using a lease
    /// whose deadline the store has already passed.
    Retry {
        store_now_ms: u64,
    },
}

/// Plans one attempt: reads every fence's lease, asks the caller for its batch, commits any
/// renewal's leased-shard rows, and assembles the entity batch.
fn plan_attempt(
    fences: &[FenceGrant<'_>],
    entity: &EntityId,
    attempt: usize,
    access: RowAccess,
    not_before_ms: u64,
    plan: &mut impl FnMut(&WritePlan) -> Option<Batch>,
) -> Result<Attempt> {
    let mut prepared = Vec::with_capacity(fences.len());
    for fg in fences {
        prepared.push(fg.fence.prepare(entity, fg.grant, not_before_ms)?);
    }
    let write_plan = WritePlan {
        epochs: prepared.iter().map(|p| p.lease_epoch).collect(),
        plan_time_ms: prepared[0].plan_time_ms,
        deadline_ms: fences
            .iter()
            .zip(&prepared)
            .filter(|(fg, _)| fg.fence.carries_deadlines())
            .map(|(_, p)| p.deadline_ms)
            .min()
            .unwrap_or(u64::MAX),
        renewal: prepared.iter().any(|p| p.renewal.is_some()),
        attempt,
    };
    let Some(user) = plan(&write_plan) else {
        return Ok(Attempt::Declined);
    };
    refuse_reserved_keys(&user, access)?;

    // SPEC F2: a refused write leaves no lease state behind. A renewal commits the leased-shard
    // row before the entity batch can be checked, so check the caller's own preconditions
    // first (one read). A precondition that changes between this check and the commit can
    // still leave a row behind; it expires, and the sweeper deletes it.
    if prepared.iter().any(|p| p.renewal.is_some())
        && let Some(index) = first_failing_guard(fences[0].fence, entity, &user)?
    {
        return Ok(Attempt::Refused(index));
    }

    // SPEC F2: the leased-shard row commits in the coordinator before the entity's lease.
    let coordinator = entity.namespace().coordinator_partition();
    for (fg, p) in fences.iter().zip(&prepared) {
        if let Some((reservation, _)) = &p.renewal {
            fg.fence.hook(HookPoint::RenewalBeforeRow, Some(entity));
            if !fg
                .fence
                .inner
                .store
                .apply(&coordinator, reservation)?
                .is_committed()
            {
                return Ok(Attempt::LostRace);
            }
            Counters::bump(&fg.fence.inner.counters.renewals);
            fg.fence.hook(HookPoint::RenewalAfterRow, Some(entity));
        }
    }

    let mut batch = Batch::new();
    for (fg, p) in fences.iter().zip(&prepared) {
        batch = fg.fence.add_fence_guards(batch, p);
    }
    let fence_guards = batch.guards().len();
    batch.extend(user);
    Ok(Attempt::Ready(PlannedWrite {
        fence: fences[0].fence.clone(),
        entity: entity.clone(),
        batch,
        fence_guards,
        epochs: write_plan.epochs,
    }))
}

/// The index of the first of the caller's key preconditions that does not hold now, read in
/// one `get_many`. Deadlines are left to the commit, where the store's clock decides them.
fn first_failing_guard(fence: &Fence, entity: &EntityId, user: &Batch) -> Result<Option<usize>> {
    let keys: Vec<&[u8]> = user
        .guards()
        .iter()
        .filter_map(|g| match g {
            Precondition::Equals(k, _) | Precondition::Absent(k) | Precondition::Present(k) => {
                Some(k.as_slice())
            }
            Precondition::NotAfter(_) => None,
        })
        .collect();
    if keys.is_empty() {
        return Ok(None);
    }
    let mut values = fence
        .inner
        .store
        .get_many(&entity.partition(), &keys)?
        .into_iter();
    // The store's own rule, fed the values just read in guard order; a clock standing at 0
    // lets every deadline pass, for the commit to decide.
    let refused = check_guards(user.guards(), || 0, |_| Ok(values.next().flatten()))?;
    Ok(match refused {
        Some(Outcome::PreconditionFailed { index }) => Some(index),
        _ => None,
    })
}

impl Fence {
    /// Writes `batch` to `entity` under the caller's `grant` epoch (SPEC F2, F3).
    ///
    /// Renews the entity's lease first if it is not usable. Answers
    /// [`WriteOutcome::Committed`], the caller's own precondition failure as
    /// [`WriteOutcome::PreconditionFailed`], [`Error::Fenced`] if the grant is older than the
    /// lease, or [`Error::Unavailable`] after a bounded number of re-plans.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// let first = Batch::new().absent("state").put("state", "queued");
    /// assert_eq!(fence.write(&job, 0, first.clone())?, WriteOutcome::Committed { epochs: vec![0] });
    /// assert_eq!(fence.write(&job, 0, first)?, WriteOutcome::PreconditionFailed { index: 0 });
    /// # Ok(())
    /// # }
    /// ```
    pub fn write(&self, entity: &EntityId, grant: u64, batch: Batch) -> Result<WriteOutcome> {
        self.write_with(entity, grant, |_| Some(batch.clone()))
    }

    /// Like [`Fence::write`], but `plan` builds the batch on each attempt from what the fence
    /// found (the lease epoch the write will commit under), or declines with `None`, in which
    /// case no lease state is written.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// // Plan the batch from what the fence found; decline to write under a renewal.
    /// let outcome = fence.write_with(&job, 0, |plan| {
    ///     let epoch = plan.epochs[0].to_string();
    ///     Some(Batch::new().put("state", "queued").put("epoch", epoch))
    /// })?;
    /// assert_eq!(outcome, WriteOutcome::Committed { epochs: vec![0] });
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_with(
        &self,
        entity: &EntityId,
        grant: u64,
        plan: impl FnMut(&WritePlan) -> Option<Batch>,
    ) -> Result<WriteOutcome> {
        write_under(&[FenceGrant { fence: self, grant }], entity, plan)
    }

    /// Like [`Fence::write_with`], for the engine's own rows (its log, deferred work, repair
    /// and registration markers); crate-internal, so nothing public can reach those rows.
    pub(crate) fn write_engine_rows_with(
        &self,
        entity: &EntityId,
        grant: u64,
        plan: impl FnMut(&WritePlan) -> Option<Batch>,
    ) -> Result<WriteOutcome> {
        write_under_engine_rows(&[FenceGrant { fence: self, grant }], entity, plan)
    }
}

/// A write guarded by several fences at once (SPEC F10: the epoch fence and the authority
/// fence), for the layer above that composes them. Every fence must share one store; the
/// entity batch carries each fence's guards, then the caller's.
///
/// ```
/// # use std::sync::Arc;
/// # use portcullis::{EntityId, ManualClock, store::{Batch, MemoryStore}, fence::*};
/// let clock = Arc::new(ManualClock::new(0));
/// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
/// let epochs = Fence::new(store.clone(), clock.clone(), FenceConfig::default());
/// let authority = Fence::with_kind(store, clock, FenceConfig::default(), FenceKind::Authority);
/// let e = EntityId::new("ns", "e1").unwrap();
/// let grants = [FenceGrant { fence: &epochs, grant: 0 }, FenceGrant { fence: &authority, grant: 0 }];
/// let outcome = write_under(&grants, &e, |plan| {
///     assert_eq!(plan.epochs, vec![0, 0]);
///     Some(Batch::new().put(b"k".to_vec(), b"v".to_vec()))
/// }).unwrap();
/// assert!(matches!(outcome, WriteOutcome::Committed { .. }));
/// ```
pub fn write_under(
    fences: &[FenceGrant<'_>],
    entity: &EntityId,
    plan: impl FnMut(&WritePlan) -> Option<Batch>,
) -> Result<WriteOutcome> {
    write_under_as(fences, entity, RowAccess::Application, plan)
}

/// Like [`write_under`], for the engine's own rows: the batch may touch the entity's reserved
/// rows (log, deferred work, repair and registration markers), never a fence's lease.
pub(crate) fn write_under_engine_rows(
    fences: &[FenceGrant<'_>],
    entity: &EntityId,
    plan: impl FnMut(&WritePlan) -> Option<Batch>,
) -> Result<WriteOutcome> {
    write_under_as(fences, entity, RowAccess::Engine, plan)
}

/// Which rows of the entity partition a write's own operations may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowAccess {
    /// Application rows only: no key that starts with the reserved byte `0x00`.
    Application,
    /// Also the engine's reserved rows, but never a fence's lease.
    Engine,
}

/// Refuses a batch whose operations touch rows its caller may not (issue: nothing reachable
/// from `Engine::fence()` may corrupt an entity's log). Guards may read any key.
fn refuse_reserved_keys(user: &Batch, access: RowAccess) -> Result<()> {
    let forbidden: &[u8] = match access {
        RowAccess::Application => &[RESERVED_KEY_PREFIX],
        RowAccess::Engine => FENCE_ROWS_PREFIX,
    };
    let touches = user.ops().iter().any(|op| match op {
        Op::Put(k, _) | Op::Delete(k) => k.starts_with(forbidden),
        Op::DeleteRange(r) => overlaps_prefix(r, forbidden),
    });
    if !touches {
        return Ok(());
    }
    Err(Error::invalid(match access {
        RowAccess::Application => format!(
            "a fenced write may not touch a reserved key (first byte {RESERVED_KEY_PREFIX:#04x}): \
             those rows hold the entity's log, deferred work, repair and registration markers \
             and leases; use keys with another first byte"
        ),
        RowAccess::Engine => "a fenced write may not touch the fence's lease rows".to_string(),
    }))
}

/// Whether any key that starts with `prefix` (non-empty) lies in `range`.
fn overlaps_prefix(range: &KeyRange, prefix: &[u8]) -> bool {
    let within = KeyRange::prefix(prefix);
    let (Bound::Included(lo), Bound::Excluded(hi)) = (&within.start, &within.end) else {
        return true;
    };
    let starts_before_hi = match &range.start {
        Bound::Included(s) | Bound::Excluded(s) => s < hi,
        Bound::Unbounded => true,
    };
    let ends_after_lo = match &range.end {
        Bound::Included(e) => e >= lo,
        Bound::Excluded(e) => e > lo,
        Bound::Unbounded => true,
    };
    !range.is_empty() && starts_before_hi && ends_after_lo
}

fn write_under_as(
    fences: &[FenceGrant<'_>],
    entity: &EntityId,
    access: RowAccess,
    mut plan: impl FnMut(&WritePlan) -> Option<Batch>,
) -> Result<WriteOutcome> {
    if fences.is_empty() {
        return Err(Error::invalid("a fenced write needs at least one fence"));
    }
    // The latest store clock a passed deadline reported: later plans read time as at least
    // this (see `Applied::Retry`).
    let mut not_before_ms = 0;
    for attempt in 0..MAX_WRITE_ATTEMPTS {
        match plan_attempt(fences, entity, attempt, access, not_before_ms, &mut plan)? {
            Attempt::Declined => return Ok(WriteOutcome::Declined),
            Attempt::Refused(index) => return Ok(WriteOutcome::PreconditionFailed { index }),
            Attempt::LostRace => {
                log::debug!("renewal for {entity} lost a race; re-planning");
            }
            Attempt::Ready(planned) => match planned.apply_once()? {
                Applied::Done(outcome) => return Ok(outcome),
                Applied::Retry { store_now_ms } => {
                    // Within the skew the safety argument assumes (below the margin) only: a
                    // store further ahead breaks that assumption, and the write stays refused.
                    let fence = fences[0].fence;
                    let ahead = store_now_ms.saturating_sub(fence.now());
                    if ahead < fence.inner.config.lease_margin_ms() {
                        not_before_ms = not_before_ms.max(store_now_ms);
                    }
                }
            },
        }
    }
    Err(Error::Unavailable {
        reason: format!(
            "the lease of {entity} kept changing or expiring; {MAX_WRITE_ATTEMPTS} attempts failed"
        ),
        retry_after_ms: 10,
    })
}

impl Fence {
    /// Test-only: plans one attempt of a write (committing a renewal's leased-shard row if one
    /// is needed) without applying it. `None` if the renewal lost a race.
    #[cfg(feature = "test-hooks")]
    pub fn plan_write_once(
        &self,
        entity: &EntityId,
        grant: u64,
        batch: Batch,
    ) -> Result<Option<PlannedWrite>> {
        let fences = [FenceGrant { fence: self, grant }];
        let access = RowAccess::Application;
        match plan_attempt(&fences, entity, 0, access, 0, &mut |_| Some(batch.clone()))? {
            Attempt::Ready(planned) => Ok(Some(planned)),
            Attempt::LostRace | Attempt::Declined | Attempt::Refused(_) => Ok(None),
        }
    }
}
