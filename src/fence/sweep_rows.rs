//! One sweep over a namespace's leased-shard rows (SPEC F8, F9): [`Fence::sweep_step`], the
//! bounded page walk that deletes expired rows each guarded on the row as read, and the pass a
//! background sweeper runs over every namespace it is given, resuming a longer table where the
//! previous pass stopped.
//!
//! Owns the page bounds of a background pass and where a stopped sweep resumes. Calls the
//! store (scans and guarded deletes of coordinator rows) and, on a store without deadlines,
//! the lease retirement of `deadline_less.rs`; the scheduling of passes is in `sweep.rs`.

use crate::sync::HashMap;

use super::revoke::{MAX_PAGES, PAGE_ROWS};
use super::rows;
use super::stats::Counters;
use super::sweep::SweepPass;
use super::{Fence, HookPoint};
use crate::entity::Namespace;
use crate::error::Result;
use crate::store::{Batch, Cursor};

/// Rows the background sweeper reads per page.
const BACKGROUND_PAGE_ROWS: usize = 64;
/// The most pages one background pass reads per namespace (65,536 rows); the rest of a larger
/// table is swept by the next passes, each resuming where the last one stopped.
const BACKGROUND_MAX_PAGES: usize = 1024;

/// What one sweep step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// clock.advance(30_000); // the lease expires
    /// assert_eq!(fence.sweep_step(&ns)?.deleted, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sweep_step(&self, ns: &Namespace) -> Result<SweepReport> {
        self.sweep_pages(ns, None, PAGE_ROWS, MAX_PAGES, &|| false)
            .map(|(report, _)| report)
    }

    /// Sweeps from `from` (the start if `None`) for at most `max_pages` pages of `page_rows`,
    /// stopping early when `stop` answers true. Answers the report and where to resume.
    fn sweep_pages(
        &self,
        ns: &Namespace,
        from: Option<Cursor>,
        page_rows: usize,
        max_pages: usize,
        stop: &dyn Fn() -> bool,
    ) -> Result<(SweepReport, Resume)> {
        let keys = &self.inner.keys;
        let coordinator = ns.coordinator_partition();
        let mut report = SweepReport::default();
        let mut cursor = from;
        for _ in 0..max_pages {
            let page = self.inner.store.scan(
                &coordinator,
                &keys.shard_range(),
                cursor.as_ref(),
                page_rows,
            )?;
            for (key, raw, row, entity) in rows::decode_shard_page(keys, ns, &page.entries)? {
                if self.now() < row.expires_at_ms {
                    continue;
                }
                if stop() {
                    // Resume before this row: strictly after the key preceding it.
                    report.more = true;
                    let at = cursor_before(&page.entries, key, cursor);
                    return Ok((report, Resume::From(at)));
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
                None => return Ok((report, Resume::Done)),
            }
        }
        report.more = true;
        Ok((report, Resume::From(cursor)))
    }

    /// One pass over every listed namespace.
    pub(super) fn sweep_pass(
        &self,
        namespaces: &dyn Fn() -> Vec<Namespace>,
        cursors: &mut HashMap<Namespace, Cursor>,
        stop: &dyn Fn() -> bool,
    ) -> SweepPass {
        let list = namespaces();
        cursors.retain(|ns, _| list.contains(ns));
        let mut pass = SweepPass::default();
        for ns in list {
            if stop() {
                break;
            }
            pass.namespaces += 1;
            let from = cursors.remove(&ns);
            match self.sweep_pages(&ns, from, BACKGROUND_PAGE_ROWS, BACKGROUND_MAX_PAGES, stop) {
                Ok((report, resume)) => {
                    pass.deleted += report.deleted;
                    pass.raced += report.raced;
                    if let Resume::From(at) = resume {
                        pass.unfinished += 1;
                        if let Some(at) = at {
                            cursors.insert(ns, at);
                        }
                    }
                }
                Err(e) => {
                    pass.failed += 1;
                    log::warn!(
                        "sweeping the expired leases of {ns} failed (retried at the next pass): {e}"
                    );
                }
            }
        }
        log::debug!("lease sweep pass: {pass:?}");
        pass
    }
}

/// Where a sweep that stopped early resumes.
enum Resume {
    /// It reached the end of the table.
    Done,
    /// From this cursor (`None`: from the start).
    From(Option<Cursor>),
}

/// A cursor that resumes at `key` of `entries` (strictly after the key before it), or at the
/// start of the page if `key` is its first entry.
fn cursor_before(
    entries: &[(Vec<u8>, Vec<u8>)],
    key: &[u8],
    page_start: Option<Cursor>,
) -> Option<Cursor> {
    match entries.iter().position(|(k, _)| k.as_slice() == key) {
        Some(at) if at > 0 => Some(Cursor::after_key(entries[at - 1].0.clone())),
        _ => page_start,
    }
}
