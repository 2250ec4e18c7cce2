//! One fence's part of a write attempt (SPEC F2, F3): reading the entity's lease, deciding
//! whether it is usable or must be renewed (and the leased-shard row a renewal commits first),
//! and the guards the entity batch then carries.
//!
//! Owns the lease arithmetic (usable, deadline, renewal expiry) and the [`Prepared`] record of
//! an attempt. Calls the store (reads only: the lease, and the coordinator once per renewal)
//! and the fence's row codecs; the attempt itself, its commits and retries are in `write.rs`.

use super::rows::{self, LeaseRow, ShardRow};
use super::{Fence, guard_as_read, unfenced};
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::store::Batch;

/// An unfenced namespace's epoch is 0 for ever: a grant above it is a caller error.
fn check_unfenced_grant(fence: &Fence, ns: &crate::entity::Namespace, grant: u64) -> Result<()> {
    if grant > 0 {
        return Err(Error::invalid(format!(
            "the grant epoch {grant} is ahead of the {:?} of {ns} (0: it is unfenced); use 0",
            fence.inner.kind
        )));
    }
    Ok(())
}

/// One fence's part of an attempt: what was read, and what the entity batch must carry.
pub(super) struct Prepared {
    pub(super) lease_raw: Option<Vec<u8>>,
    pub(super) lease_epoch: u64,
    /// Set when the attempt renews: the coordinator batch to commit first, and the lease to
    /// write in the entity batch.
    pub(super) renewal: Option<(Batch, LeaseRow)>,
    /// `min(expires_at_ms - lease_margin_ms, plan_time + max_apply_window_ms)`.
    pub(super) deadline_ms: u64,
    pub(super) plan_time_ms: u64,
    /// The namespace is unfenced: the entity batch carries no guard of this fence.
    pub(super) unfenced: bool,
}

impl Prepared {
    fn unfenced(now: u64) -> Prepared {
        Prepared {
            lease_raw: None,
            lease_epoch: 0,
            renewal: None,
            deadline_ms: u64::MAX,
            plan_time_ms: now,
            unfenced: true,
        }
    }
}

impl Fence {
    /// Whether a lease may still be used at `now`: present, and
    /// `expires_at_ms - lease_margin_ms - now >= min_lease_budget_ms` (SPEC F2).
    pub(crate) fn usable(&self, lease: &LeaseRow, now: u64) -> bool {
        let c = &self.inner.config;
        i128::from(lease.expires_at_ms) - i128::from(c.lease_margin_ms()) - i128::from(now)
            >= i128::from(c.min_lease_budget_ms())
    }

    /// Reads the entity's lease and, if it is not usable, the coordinator once, and decides
    /// what the attempt must commit. Writes nothing. Time is read as at least
    /// `not_before_ms` (a store clock that refused an earlier attempt's deadline): reading
    /// time later only makes a lease less usable and a renewal's expiry later, both safe.
    pub(super) fn prepare(
        &self,
        entity: &EntityId,
        grant: u64,
        not_before_ms: u64,
    ) -> Result<Prepared> {
        let c = self.inner.config;
        let keys = &self.inner.keys;
        let now = self.now().max(not_before_ms);
        let ns = entity.namespace();
        if self.known_unfenced(ns) {
            // An unfenced namespace: no lease, no row, no store call before the write.
            check_unfenced_grant(self, ns, grant)?;
            return Ok(Prepared::unfenced(now));
        }
        let lease_raw = self.inner.store.get(&entity.partition(), keys.lease())?;
        let lease: Option<LeaseRow> = rows::decode_opt("lease row", lease_raw.as_deref())?;
        let apply_window_end = now.saturating_add(c.max_apply_window_ms());

        if let Some(lease) = lease {
            if grant < lease.epoch {
                // SPEC F3: a grant older than the lease's epoch is fenced, usable or not.
                return Err(Error::Fenced {
                    grant,
                    current: lease.epoch,
                });
            }
            if grant == lease.epoch && self.usable(&lease, now) {
                return Ok(Prepared {
                    lease_raw,
                    lease_epoch: lease.epoch,
                    renewal: None,
                    deadline_ms: (lease.expires_at_ms - c.lease_margin_ms()).min(apply_window_end),
                    plan_time_ms: now,
                    unfenced: false,
                });
            }
        }

        // SPEC F2: renew. Read the coordinator once: the epoch, this entity's row, and whether
        // the namespace was declared unfenced.
        let coordinator = ns.coordinator_partition();
        let (current_key, shard_key, unfenced_key) =
            (keys.current(), keys.shard(entity), keys.unfenced());
        let read = self
            .inner
            .store
            .get_many(&coordinator, &[&current_key, &shard_key, &unfenced_key])?;
        if unfenced::decode_unfenced(read[2].as_deref())?.is_some() {
            self.remember_unfenced(ns);
            check_unfenced_grant(self, ns, grant)?;
            return Ok(Prepared::unfenced(now));
        }
        let current = rows::decode_epoch(read[0].as_deref())?;
        let row: Option<ShardRow> = rows::decode_opt("leased-shard row", read[1].as_deref())?;
        if grant < current {
            return Err(Error::Fenced { grant, current });
        }
        if grant > current {
            return Err(Error::invalid(format!(
                "the grant epoch {grant} is ahead of the {:?} of {} ({current}); use current_epoch",
                self.inner.kind,
                entity.namespace()
            )));
        }
        let live_row = row.filter(|r| now < r.expires_at_ms);
        let expires_at_ms = live_row
            .map_or(0, |r| r.expires_at_ms)
            .max(now.saturating_add(c.epoch_lease_ms()));
        let grant_id = self.next_grant_id();
        let new_row = ShardRow {
            epoch: current,
            expires_at_ms,
            // A live row keeps its acknowledgement: the entity may still hold an older lease
            // until this renewal's entity batch commits. An absent or expired row's lease is
            // past its deadline, so the entity is safely at the current epoch. Without
            // server-side deadlines an expired row keeps it too (`deadline_less.rs`).
            acked_epoch: self
                .row_keeping_ack(row, live_row)
                .map_or(current, |r| r.acked_epoch),
            grant_id,
        };
        // Guarded on the epoch and the row as read, and on "not unfenced": no row is created
        // after a declaration (this renewal then re-plans and finds it).
        let mut reservation = guard_as_read(Batch::new(), &current_key, read[0].as_deref());
        reservation = guard_as_read(reservation, &shard_key, read[1].as_deref());
        reservation = reservation
            .absent(unfenced_key)
            .put(shard_key, rows::encode(&new_row));
        let new_lease = LeaseRow {
            epoch: current,
            expires_at_ms,
            grant_id,
        };
        Ok(Prepared {
            lease_raw,
            lease_epoch: current,
            renewal: Some((reservation, new_lease)),
            deadline_ms: expires_at_ms
                .saturating_sub(c.lease_margin_ms())
                .min(apply_window_end),
            plan_time_ms: now,
            unfenced: false,
        })
    }

    /// The guards (and, for a renewal, the lease write) this fence adds to the entity batch.
    pub(super) fn add_fence_guards(&self, batch: Batch, p: &Prepared) -> Batch {
        if p.unfenced {
            return batch;
        }
        let switches = self.switches();
        let lease_key = self.inner.keys.lease();
        let mut batch = batch;
        if !switches.drop_lease_guard {
            batch = guard_as_read(batch, lease_key, p.lease_raw.as_deref());
        }
        if !switches.drop_deadline && self.carries_deadlines() {
            batch = batch.not_after(p.deadline_ms);
        }
        if let Some((_, lease)) = &p.renewal {
            batch = batch.put(lease_key.to_vec(), rows::encode(lease));
        }
        batch
    }
}
