//! Bounded, resumable revocation slices (SPEC F4, F5, F6, F8).
//!
//! A slice reads the epoch, the recovery marker and the checkpoint in one call; scans
//! leased-shard rows in pages of 4 from the checkpoint; pushes the current epoch to entities
//! whose live row is not yet acknowledged at it; acknowledges each push only after it
//! committed; and ends by writing the checkpoint guarded on the epoch and marker as read, which
//! is also the proof that neither changed during the slice. On a store without deadlines an
//! expired row is not done until it is pushed to and acknowledged (`deadline_less.rs`).

use super::rows::{self, CheckpointRow, LeaseRow, RecoveryRow, ScanPosition, ShardRow};
use super::stats::Counters;
use super::{Fence, HookPoint, guard_as_read};
use crate::entity::{EntityId, Namespace};
use crate::error::Result;
use crate::store::{Batch, Cursor};

/// Leased-shard rows read per scan page (SPEC F4).
pub const PAGE_ROWS: usize = 4;
/// The most pages one slice scans (SPEC F4).
pub const MAX_PAGES: usize = 8;
/// The most entities one slice pushes to (SPEC F4).
pub const MAX_PUSHES: usize = 4;
/// How many times one push retries after a racing renewal changed the lease (SPEC F8).
const MAX_PUSH_ATTEMPTS: usize = 4;

/// How much work one revocation slice may do (SPEC F4). The page and push limits are capped
/// at the SPEC's maxima; the time budget is read on the planner's clock.
///
/// Every budget makes progress: limits are clamped to at least one page, one push and 1 ms,
/// and a slice always makes its first push, however much of the time budget the scan spent
/// (a budget that never pushes would leave revocation `Pending` forever).
///
/// ```
/// use portcullis::fence::RevokeBudget;
/// let budget = RevokeBudget::default().with_time_ms(20).with_max_pushes(2);
/// assert_eq!(budget.max_pushes(), 2);
/// assert_eq!(RevokeBudget::default().with_max_pages(100).max_pages(), 8);
/// // Zero is clamped to the least that makes progress.
/// assert_eq!(RevokeBudget::default().with_max_pushes(0).max_pushes(), 1);
/// assert_eq!(RevokeBudget::default().with_time_ms(0).time_ms(), 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RevokeBudget {
    time_ms: u64,
    max_pages: usize,
    max_pushes: usize,
}

impl Default for RevokeBudget {
    /// 50 ms, 8 pages, 4 pushes.
    fn default() -> Self {
        RevokeBudget {
            time_ms: 50,
            max_pages: MAX_PAGES,
            max_pushes: MAX_PUSHES,
        }
    }
}

impl RevokeBudget {
    /// Sets the time budget in ms (on the planner's clock), at least 1.
    pub fn with_time_ms(mut self, time_ms: u64) -> Self {
        self.time_ms = time_ms.max(1);
        self
    }

    /// Sets the page limit, capped at 8 and at least 1.
    pub fn with_max_pages(mut self, pages: usize) -> Self {
        self.max_pages = pages.clamp(1, MAX_PAGES);
        self
    }

    /// Sets the push limit, capped at 4 and at least 1.
    pub fn with_max_pushes(mut self, pushes: usize) -> Self {
        self.max_pushes = pushes.clamp(1, MAX_PUSHES);
        self
    }

    /// The time budget in ms.
    pub fn time_ms(&self) -> u64 {
        self.time_ms
    }

    /// The page limit.
    pub fn max_pages(&self) -> usize {
        self.max_pages
    }

    /// The push limit.
    pub fn max_pushes(&self) -> usize {
        self.max_pushes
    }
}

/// What a revocation slice found (SPEC F5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum RevokeProgress {
    /// Every leased-shard row is acknowledged at the current epoch or expired, the epoch did
    /// not change during the slice, and no recovery hold-off is pending: no write planned
    /// under an older epoch can commit any more (SPEC F7).
    Complete,
    /// More work (or waiting) is needed.
    Pending {
        /// A lower bound on the rows (or hold-offs) still in the way; at least 1.
        remaining: u64,
    },
}

/// A push that committed and awaits its acknowledgement (test-only handle, public with the
/// feature `test-hooks`).
#[derive(Clone, Debug)]
pub struct PendingAck {
    ns: Namespace,
    entity: EntityId,
    row_raw: Vec<u8>,
    row: ShardRow,
    epoch_raw: Option<Vec<u8>>,
    epoch: u64,
}

/// What the lease-writing half of a push did.
enum PushLease {
    /// The lease committed; acknowledge with the row as last read.
    Pushed(PendingAck),
    /// While retrying, the row turned out already acknowledged at the epoch.
    AlreadyAcknowledged,
    /// No lease was written (a racing renewal, a changed epoch, or retries spent).
    NotPushed,
}

/// What one push achieved.
enum PushResult {
    /// The lease was written at the current epoch and the row acknowledged.
    Acknowledged,
    /// Not acknowledged (a racing renewal, a changed epoch, or retries spent): still pending.
    NotAcknowledged,
}

impl Fence {
    /// Runs one bounded revocation slice for the namespace's current epoch (SPEC F4, F5).
    ///
    /// Resumes from the checkpoint when it was written for the same epoch and recovery marker.
    /// Bounded by pages, pushes and time, so a frozen clock cannot hang it (F8).
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
    /// let _ = fence.write(&job, 0, Batch::new().put("state", "queued"))?; // leases job-1 at epoch 0
    /// fence.bump_epoch(&ns, 1)?;
    /// let mut slices = 0;
    /// while fence.revoke_step(&ns, RevokeBudget::default().with_max_pages(4))? != RevokeProgress::Complete {
    ///     slices += 1; // each slice is bounded; run the next when convenient
    /// }
    /// assert!(slices < 10);
    /// # Ok(())
    /// # }
    /// ```
    pub fn revoke_step(&self, ns: &Namespace, budget: RevokeBudget) -> Result<RevokeProgress> {
        let _span = crate::observe::span!("portcullis.revoke_slice", namespace = ns);
        Counters::bump(&self.inner.counters.slices);
        let keys = &self.inner.keys;
        let config = self.inner.config;
        let coordinator = ns.coordinator_partition();
        let started = self.now();
        let (current_key, recovery_key, checkpoint_key) =
            (keys.current(), keys.recovery(), keys.checkpoint());
        let read = self.inner.store.get_many(
            &coordinator,
            &[&current_key, &recovery_key, &checkpoint_key],
        )?;
        let epoch = rows::decode_epoch(read[0].as_deref())?;
        let recovery: Option<RecoveryRow> =
            rows::decode_opt("recovery marker", read[1].as_deref())?;
        let checkpoint: Option<CheckpointRow> =
            rows::decode_opt("revocation checkpoint", read[2].as_deref())?;
        let resumed_at = recovery.map(|r| r.resumed_at_ms);

        // SPEC F4: a checkpoint is valid only for the same epoch and recovery marker.
        let start = match checkpoint {
            Some(cp) if cp.epoch == epoch && cp.recovery == resumed_at => cp.cursor,
            _ => ScanPosition::Start,
        };

        let mut position = start.clone();
        let mut prefix_complete = true;
        let mut incomplete: u64 = 0;
        let mut more_to_scan = false;
        if position != ScanPosition::Done {
            let mut scan_cursor = match &position {
                ScanPosition::After(key) => Some(Cursor::after_key(key.clone())),
                _ => None,
            };
            let mut pushes = 0;
            let mut pages = 0;
            let mut out_of_budget = false;
            let mut reached_end = false;
            // SPEC F8: bounded by pages as well as by time.
            while pages < budget.max_pages() && !out_of_budget {
                let page = self.inner.store.scan(
                    &coordinator,
                    &keys.shard_range(),
                    scan_cursor.as_ref(),
                    PAGE_ROWS,
                )?;
                pages += 1;
                for (key, raw, row, entity) in rows::decode_shard_page(keys, ns, &page.entries)? {
                    let now = self.now();
                    // SPEC F5: acknowledged at exactly this epoch. A row acknowledged above it
                    // (a coordinator restored from an older copy) vouches for nothing now.
                    // On a store without deadlines an expired row is pushed to like a live one.
                    let expired = self.expired_row_is_done() && now >= row.expires_at_ms;
                    let mut complete = row.acked_epoch == epoch || expired;
                    if !complete {
                        // The first push of a slice is always made, so every slice progresses.
                        let time_spent =
                            pushes > 0 && now.saturating_sub(started) >= budget.time_ms();
                        if pushes < budget.max_pushes() && !time_spent {
                            pushes += 1;
                            let pushed =
                                self.push(&entity, ns, raw, row, read[0].as_deref(), epoch)?;
                            complete = matches!(pushed, PushResult::Acknowledged);
                        } else {
                            // Out of pushes or time: this row waits for the next slice.
                            out_of_budget = true;
                        }
                    }
                    if complete && prefix_complete {
                        position = ScanPosition::After(key.clone());
                    } else if !complete {
                        prefix_complete = false;
                        incomplete += 1;
                    }
                    if out_of_budget {
                        break;
                    }
                }
                match page.next {
                    Some(next) if !out_of_budget => scan_cursor = Some(next),
                    Some(_) => more_to_scan = true,
                    None if out_of_budget => {}
                    None => {
                        reached_end = true;
                        break;
                    }
                }
            }
            if !reached_end {
                more_to_scan = true;
            }
            if reached_end && prefix_complete {
                position = ScanPosition::Done;
            }
        }

        let now = self.now();
        let hold_off_until = resumed_at.map(|r| {
            r.saturating_add(config.epoch_lease_ms())
                .saturating_add(config.lease_margin_ms())
        });
        let holding_off = hold_off_until.is_some_and(|until| now < until)
            && !self.switches().ignore_recovery_hold_off;

        self.hook(HookPoint::SliceBeforeCheckpoint, None);
        // The checkpoint write, guarded on the epoch and the recovery marker as read, proves
        // that neither changed during the slice (SPEC F5).
        let new_checkpoint = CheckpointRow {
            epoch,
            recovery: resumed_at,
            cursor: position.clone(),
        };
        let mut batch = guard_as_read(Batch::new(), &current_key, read[0].as_deref());
        batch = guard_as_read(batch, &recovery_key, read[1].as_deref());
        batch = batch.put(checkpoint_key, rows::encode(&new_checkpoint));
        let unchanged = self.inner.store.apply(&coordinator, &batch)?.is_committed();

        let remaining = incomplete + u64::from(more_to_scan) + u64::from(holding_off);
        if unchanged && position == ScanPosition::Done && !holding_off {
            self.told_complete(ns, epoch);
            log::debug!(
                "{:?} revocation of {ns} to {epoch} complete",
                self.inner.kind
            );
            return Ok(RevokeProgress::Complete);
        }
        log::debug!(
            "{:?} revocation of {ns} to {epoch} pending: {remaining} remaining, epoch unchanged: {unchanged}",
            self.inner.kind
        );
        Ok(RevokeProgress::Pending {
            remaining: remaining.max(1),
        })
    }

    /// Pushes the current epoch to one entity, then acknowledges it (SPEC F4). Never
    /// acknowledges without a committed push.
    fn push(
        &self,
        entity: &EntityId,
        ns: &Namespace,
        row_raw: &[u8],
        row: ShardRow,
        epoch_raw: Option<&[u8]>,
        epoch: u64,
    ) -> Result<PushResult> {
        let observer = self.inner.push_observer.read().clone();
        if let Some(observe) = observer {
            observe(entity);
        }
        let pending = PendingAck {
            ns: ns.clone(),
            entity: entity.clone(),
            row_raw: row_raw.to_vec(),
            row,
            epoch_raw: epoch_raw.map(<[u8]>::to_vec),
            epoch,
        };
        match self.push_lease(pending)? {
            PushLease::Pushed(pending) => {
                self.hook(HookPoint::PushBeforeAck, Some(entity));
                self.acknowledge(&pending)
            }
            PushLease::AlreadyAcknowledged => Ok(PushResult::Acknowledged),
            PushLease::NotPushed => Ok(PushResult::NotAcknowledged),
        }
    }

    /// Writes the entity's lease at the current epoch with the row's expiry, guarded on the
    /// lease as read; after a lost race, re-reads the epoch and the row and retries (bounded).
    fn push_lease(&self, mut pending: PendingAck) -> Result<PushLease> {
        let keys = &self.inner.keys;
        let partition = pending.entity.partition();
        let shard_key = keys.shard(&pending.entity);
        if self.switches().ack_before_push {
            // Negative control only: claim a push that never happened.
            return Ok(PushLease::Pushed(pending));
        }
        for _ in 0..MAX_PUSH_ATTEMPTS {
            self.hook(HookPoint::PushBeforeLeaseRead, Some(&pending.entity));
            let lease_raw = self.inner.store.get(&partition, keys.lease())?;
            let lease: Option<LeaseRow> = rows::decode_opt("lease row", lease_raw.as_deref())?;
            if let Some(lease) = lease
                && (lease.epoch > pending.epoch || lease.expires_at_ms > pending.row.expires_at_ms)
            {
                // A racing renewal got there first; its row will be looked at again.
                return Ok(PushLease::NotPushed);
            }
            let pushed = LeaseRow {
                epoch: pending.epoch,
                expires_at_ms: self.pushed_expiry(&pending.row),
                grant_id: pending.row.grant_id,
            };
            self.hook(HookPoint::PushBeforeLeaseWrite, Some(&pending.entity));
            let batch = guard_as_read(Batch::new(), keys.lease(), lease_raw.as_deref())
                .put(keys.lease().to_vec(), rows::encode(&pushed));
            if self.inner.store.apply(&partition, &batch)?.is_committed() {
                Counters::bump(&self.inner.counters.pushes);
                return Ok(PushLease::Pushed(pending));
            }
            // The lease changed under us (a renewal): re-read the epoch and the row, retry.
            let read = self.inner.store.get_many(
                &pending.ns.coordinator_partition(),
                &[&keys.current(), &shard_key],
            )?;
            if read[0] != pending.epoch_raw {
                return Ok(PushLease::NotPushed);
            }
            let Some(fresh_raw) = read[1].clone() else {
                return Ok(PushLease::NotPushed);
            };
            pending.row = rows::decode("leased-shard row", &fresh_raw)?;
            pending.row_raw = fresh_raw;
            if pending.row.acked_epoch == pending.epoch {
                return Ok(PushLease::AlreadyAcknowledged);
            }
        }
        Ok(PushLease::NotPushed)
    }

    /// Test-only: the push half of a revocation for one entity, without its acknowledgement,
    /// so property tests can interleave other steps in between. `None` if the entity's row
    /// needs no push (absent, expired or already acknowledged) or the push did not commit.
    #[cfg(feature = "test-hooks")]
    pub fn push_without_ack(&self, entity: &EntityId) -> Result<Option<PendingAck>> {
        let keys = &self.inner.keys;
        let ns = entity.namespace();
        let read = self.inner.store.get_many(
            &ns.coordinator_partition(),
            &[&keys.current(), &keys.shard(entity)],
        )?;
        let epoch = rows::decode_epoch(read[0].as_deref())?;
        let Some(row_raw) = read[1].clone() else {
            return Ok(None);
        };
        let row: ShardRow = rows::decode("leased-shard row", &row_raw)?;
        if row.acked_epoch == epoch
            || (self.expired_row_is_done() && self.now() >= row.expires_at_ms)
        {
            return Ok(None);
        }
        let pending = PendingAck {
            ns: ns.clone(),
            entity: entity.clone(),
            row_raw,
            row,
            epoch_raw: read[0].clone(),
            epoch,
        };
        match self.push_lease(pending)? {
            PushLease::Pushed(pending) => Ok(Some(pending)),
            PushLease::AlreadyAcknowledged | PushLease::NotPushed => Ok(None),
        }
    }

    /// Test-only: the acknowledgement half; `true` if it committed.
    #[cfg(feature = "test-hooks")]
    pub fn acknowledge_pushed(&self, pending: &PendingAck) -> Result<bool> {
        Ok(matches!(
            self.acknowledge(pending)?,
            PushResult::Acknowledged
        ))
    }

    /// Sets the row's `acked_epoch`, guarded on the row as read and the epoch as observed.
    fn acknowledge(&self, pending: &PendingAck) -> Result<PushResult> {
        let keys = &self.inner.keys;
        let shard_key = keys.shard(&pending.entity);
        let acked = ShardRow {
            acked_epoch: pending.epoch,
            ..pending.row
        };
        let mut batch = Batch::new();
        if !self.switches().drop_ack_row_guard {
            batch = batch.equals(shard_key.clone(), pending.row_raw.clone());
        }
        batch = guard_as_read(batch, &keys.current(), pending.epoch_raw.as_deref())
            .put(shard_key, rows::encode(&acked));
        let outcome = self
            .inner
            .store
            .apply(&pending.ns.coordinator_partition(), &batch)?;
        if outcome.is_committed() {
            Counters::bump(&self.inner.counters.acks);
            Ok(PushResult::Acknowledged)
        } else {
            Ok(PushResult::NotAcknowledged)
        }
    }
}
