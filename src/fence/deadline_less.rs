//! Fencing on a store without server-side deadlines (SPEC S11, F7).
//!
//! Owns the rule that replaces `NotAfter` when [`Store::evaluates_deadlines`] is `false` (the
//! etcd backend): a fenced write is then guarded on its lease exactly as read and on nothing
//! else, so a write held before its apply can commit at any later time while that lease
//! stays in place. An expiry therefore proves nothing on such a store; only overwriting the
//! lease does. Hence:
//!
//! - revocation treats a row as done only once it is acknowledged at the current epoch, so an
//!   expired row is pushed to like a live one (`revoke.rs` asks [`Fence::expired_row_is_done`]);
//! - a pushed lease carries expiry 0, so it is never usable on any clock and the first write
//!   under it renews (which commits a leased-shard row first);
//! - a renewal keeps the acknowledgement of the row it replaces even when that row expired
//!   (`lease.rs` asks [`Fence::row_keeping_ack`]);
//! - the sweeper retires an entity's lease (overwrites it with a fresh, never-usable value,
//!   guarded on the lease as read, over an absent lease too) before it deletes the expired
//!   row ([`Fence::retire_lease`]), so no lease a held write is guarded on outlives its row.
//!
//! None of this reads a clock, so on such a store F7 does not depend on clock skew. On a store
//! with deadlines every function here answers what the deadline rule needs and writes nothing.
//!
//! [`Store::evaluates_deadlines`]: crate::store::Store::evaluates_deadlines

use super::Fence;
use super::guard_as_read;
use super::rows::{self, LeaseRow, ShardRow};
use super::stats::Counters;
use crate::entity::EntityId;
use crate::error::Result;
use crate::store::Batch;

impl Fence {
    /// Whether fenced writes carry a `NotAfter` deadline (the store checks it at commit).
    pub(super) fn carries_deadlines(&self) -> bool {
        self.inner.server_deadlines
    }

    /// Whether revocation may treat an expired leased-shard row as done without pushing: only
    /// when every write planned under its lease carried a deadline that has passed.
    pub(super) fn expired_row_is_done(&self) -> bool {
        self.inner.server_deadlines || self.switches().expired_row_done_without_push
    }

    /// The lease expiry a push writes: the row's on a store with deadlines; 0 (never usable)
    /// without, so a pushed lease is never written to without a renewal and its row.
    pub(super) fn pushed_expiry(&self, row: &ShardRow) -> u64 {
        if self.inner.server_deadlines {
            row.expires_at_ms
        } else {
            0
        }
    }

    /// The row whose acknowledgement a renewal keeps (SPEC F2): `live_row` on a store with
    /// deadlines (an expired row's lease can carry no write any more), `row` even when expired
    /// without, since a write held under the row's lease can still commit until a push
    /// overwrites it.
    pub(super) fn row_keeping_ack(
        &self,
        row: Option<ShardRow>,
        live_row: Option<ShardRow>,
    ) -> Option<ShardRow> {
        if self.inner.server_deadlines || self.switches().renewal_acks_expired_row {
            live_row
        } else {
            row
        }
    }

    /// Before the sweeper deletes `entity`'s expired row: on a store without deadlines,
    /// overwrites the entity's lease with a fresh, never-usable value (expiry 0, a grant id no
    /// write was planned under), guarded on the lease as read, over an absent lease too. Every
    /// write held under the old lease (or under its absence, a renewal whose row this is) then
    /// fails its guard. `false` when the row must stay: a renewal newer than the row wrote the
    /// lease, or the lease changed under the write (the sweep of this row counts as raced).
    /// On a store with deadlines: `true`, nothing written.
    pub(super) fn retire_lease(&self, entity: &EntityId, row: &ShardRow) -> Result<bool> {
        let switches = self.switches();
        if self.inner.server_deadlines || switches.sweep_without_retiring_lease {
            return Ok(true);
        }
        let lease_key = self.inner.keys.lease();
        let partition = entity.partition();
        let lease_raw = self.inner.store.get(&partition, lease_key)?;
        let lease: Option<LeaseRow> = rows::decode_opt("lease row", lease_raw.as_deref())?;
        let epoch = match lease {
            // A renewal newer than this row wrote the lease: the row is not this lease's.
            Some(l) if l.expires_at_ms > row.expires_at_ms => return Ok(false),
            Some(l) => l.epoch.max(row.epoch),
            None if switches.retire_only_present_leases => return Ok(true),
            None => row.epoch,
        };
        let retired = LeaseRow {
            epoch,
            expires_at_ms: 0,
            grant_id: self.next_grant_id(),
        };
        let batch = guard_as_read(Batch::new(), lease_key, lease_raw.as_deref())
            .put(lease_key.to_vec(), rows::encode(&retired));
        if self.inner.store.apply(&partition, &batch)?.is_committed() {
            Counters::bump(&self.inner.counters.pushes);
            Ok(true)
        } else {
            Ok(false)
        }
    }
}
