//! The expired-lease sweeper (SPEC F9): deletes leased-shard rows whose lease has expired,
//! each guarded on the row as read, so a renewal that races the sweep always wins. On a store
//! without deadlines it first retires the entity's lease (`deadline_less.rs`).

use super::revoke::{MAX_PAGES, PAGE_ROWS};
use super::rows;
use super::stats::Counters;
use super::{Fence, HookPoint};
use crate::entity::Namespace;
use crate::error::Result;
use crate::store::{Batch, Cursor};

/// What one sweep step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Rows deleted.
    pub deleted: u64,
    /// Rows that were expired but changed before they could be deleted.
    pub raced: u64,
    /// Whether rows remain beyond what this step scanned.
    pub more: bool,
}

impl Fence {
    /// Scans up to 8 pages of leased-shard rows and deletes the expired ones, each guarded on
    /// the row as read (SPEC F9). Bounded by pages (F8).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use portcullis::{EntityId, ManualClock, store::{Batch, MemoryStore}, fence::*};
    /// let clock = Arc::new(ManualClock::new(0));
    /// let fence = Fence::new(Arc::new(MemoryStore::with_clock(clock.clone())), clock.clone(), FenceConfig::default());
    /// let e = EntityId::new("ns", "e").unwrap();
    /// fence.write(&e, 0, Batch::new()).unwrap();
    /// clock.advance(30_000);
    /// assert_eq!(fence.sweep_step(e.namespace()).unwrap().deleted, 1);
    /// ```
    pub fn sweep_step(&self, ns: &Namespace) -> Result<SweepReport> {
        let keys = &self.inner.keys;
        let coordinator = ns.coordinator_partition();
        let mut report = SweepReport::default();
        let mut cursor: Option<Cursor> = None;
        for _ in 0..MAX_PAGES {
            let page = self.inner.store.scan(
                &coordinator,
                &keys.shard_range(),
                cursor.as_ref(),
                PAGE_ROWS,
            )?;
            for (key, raw, row, entity) in rows::decode_shard_page(keys, ns, &page.entries)? {
                if self.now() < row.expires_at_ms {
                    continue;
                }
                // Without deadlines, no lease a held write is guarded on may outlive its row.
                if !self.retire_lease(&entity, &row)? {
                    report.raced += 1;
                    continue;
                }
                self.hook(HookPoint::SweepBeforeDelete, Some(&entity));
                let batch = Batch::new()
                    .equals(key.clone(), raw.clone())
                    .delete(key.clone());
                if self.inner.store.apply(&coordinator, &batch)?.is_committed() {
                    Counters::bump(&self.inner.counters.swept);
                    report.deleted += 1;
                } else {
                    report.raced += 1;
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => return Ok(report),
            }
        }
        report.more = true;
        Ok(report)
    }
}
