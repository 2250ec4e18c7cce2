//! Dropping idle loaded partition indexes under a budget (SPEC S8, R10).
//!
//! Owns: the budget ([`FileStoreBuilder::max_loaded_partitions`](super::FileStoreBuilder)),
//! each touch's place in least-recently-touched order, and the unload itself.
//!
//! Unloading moves a partition from the table's `touched` map back to what open knows of a
//! partition nobody has touched: if it has no record (a state an `apply` that did not commit
//! made) or its head is still the one the table's snapshot pages hold, nothing at all;
//! otherwise its name and head in the table's overlay (which the next heads snapshot folds
//! back into its pages: see [`fold`](super::fold)). Its next touch loads its index again from
//! its chain. A partition is unloaded only if it is idle, which is decided under the table's
//! write lock:
//! - nobody else holds its state (`Arc::strong_count` is 1). Every user (a reader holding a
//!   value location, a writer between append and fold, compaction rewriting it) holds the
//!   state, and a state is only ever cloned out of the table under the table's lock, so nobody
//!   can start using it while the lock is held;
//! - no batch of it waits to become durable or visible (`pending` is empty), and the record
//!   its head names (a base record is written without waiting) is visible in the journal, so
//!   a reload reads the whole chain from the files;
//! - it is loaded, not refused (a refusal is kept by the damage record anyway).
//!
//! When more indexes are loaded than the budget, the caller that found it so (after its read
//! or batch, committed or not, holding no partition lock) unloads the least recently touched
//! idle ones down to three quarters of the budget, in one pass over the loaded partitions: a
//! pass per quarter of the budget's loads, so O(1) per load amortised. A pass that cannot get
//! back within the budget (more partitions in use at once than it allows) keeps the next one
//! from starting before another quarter of the budget's touches, so calls do not each look at
//! every loaded state meanwhile.

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::partition::{self, Load, PartState};
use super::table::Known;
use super::{FileStore, Inner};

/// The budget and the counters of unloading.
#[derive(Default)]
pub(super) struct IndexBudget {
    /// Touches so far; each touch stamps its partition with the next number.
    touches: AtomicU64,
    /// Set while a thread unloads (one at a time; others go on).
    unloading: AtomicBool,
    /// The touch before which no pass starts (set by a pass that left more loaded than the
    /// budget; 0: none).
    next_pass: AtomicU64,
    /// Indexes dropped since open.
    pub(super) unloaded: AtomicU64,
    /// Loaded states looked at by passes since open (a test checks a call's share stays
    /// bounded).
    examined: AtomicU64,
    /// Test-only negative control: unload partitions that are in use too.
    #[cfg(feature = "test-hooks")]
    pub(super) unguarded: AtomicBool,
    /// Test-only negative control: unload partitions whose newest record is not visible yet.
    #[cfg(feature = "test-hooks")]
    pub(super) before_visible: AtomicBool,
}

/// Checks the budget when dropped: made at the start of a call, before it takes any state, so
/// the check runs after the call has let go of them, whichever way it returns (an `apply` that
/// did not commit loads a partition too).
pub(super) struct CheckAfter<'a>(&'a Inner);

impl Drop for CheckAfter<'_> {
    fn drop(&mut self) {
        self.0.unload_idle();
    }
}

impl Inner {
    /// A check of the budget when the returned value is dropped (see [`CheckAfter`]).
    pub(super) fn budget_after_call(&self) -> CheckAfter<'_> {
        CheckAfter(self)
    }

    /// Records a touch of a partition (its place in least-recently-touched order).
    pub(super) fn touched(&self, state: &PartState) {
        if self.config.max_loaded_partitions.is_some() {
            let now = self.index_budget.touches.fetch_add(1, Ordering::Relaxed) + 1;
            state.last_touch.store(now, Ordering::Relaxed);
        }
    }

    /// Unloads least recently touched idle indexes if more than the budget are loaded. The
    /// caller holds no partition lock and no state of a partition it still needs.
    pub(super) fn unload_idle(&self) {
        let Some(max) = self.config.max_loaded_partitions else {
            return;
        };
        let max = max as u64;
        if self.loaded.load(Ordering::Relaxed) <= max {
            return;
        }
        let budget = &self.index_budget;
        let now = budget.touches.load(Ordering::Relaxed);
        if now < budget.next_pass.load(Ordering::Relaxed) {
            return;
        }
        if budget.unloading.swap(true, Ordering::AcqRel) {
            return;
        }
        let target = max - max / 4;
        // Read before the table's lock: the heads snapshot takes the journal's append mutex and
        // then the table. It only grows, so an older reading is a conservative one.
        let visible = self.journal.visible_lsn();
        let mut table = self.table.write();
        let excess = self.loaded.load(Ordering::Relaxed).saturating_sub(target) as usize;
        budget
            .examined
            .fetch_add(table.touched.len() as u64, Ordering::Relaxed);
        let mut stamps: Vec<u64> = table
            .touched
            .values()
            .filter(|s| self.idle(s, visible))
            .map(|s| s.last_touch.load(Ordering::Relaxed))
            .collect();
        let mut dropped = Vec::new();
        if excess > 0 && !stamps.is_empty() {
            let nth = excess.min(stamps.len()) - 1;
            let (_, &mut threshold, _) = stamps.select_nth_unstable(nth);
            let mut left = excess;
            let idle: Vec<Box<[u8]>> = table
                .touched
                .iter()
                .filter(|(_, s)| {
                    s.last_touch.load(Ordering::Relaxed) <= threshold && self.idle(s, visible)
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in idle {
                if left == 0 {
                    break;
                }
                let Some((name, state)) = table.touched.remove_entry(&name) else {
                    continue;
                };
                // No record (an apply that did not commit made the state), or a head still
                // the one the snapshot's pages hold, needs no entry; any other is kept in the
                // overlay, which wins over the pages.
                let head = partition::head_of(&state);
                if head != 0 && head != state.base_head.load(Ordering::Relaxed) {
                    let in_base = state.in_base.load(Ordering::Relaxed);
                    table.overlay.insert(name, Known { head, in_base });
                }
                left -= 1;
                self.loaded.fetch_sub(1, Ordering::Relaxed);
                budget.unloaded.fetch_add(1, Ordering::Relaxed);
                dropped.push(state);
            }
        }
        // Still over: too many in use at once. Wait for another quarter of the budget's
        // touches before looking at every loaded state again.
        let next = match self.loaded.load(Ordering::Relaxed) > max {
            true => now + max / 4 + 1,
            false => 0,
        };
        budget.next_pass.store(next, Ordering::Relaxed);
        self.note_overlay(table.overlay.len());
        drop(table);
        if !dropped.is_empty() {
            log::debug!(
                "dropped {} idle partition indexes (budget {max})",
                dropped.len()
            );
        }
        // The indexes are freed here, with no lock held.
        drop(dropped);
        budget.unloading.store(false, Ordering::Release);
    }

    /// Whether a loaded partition may be unloaded now (see the module docs). The caller holds
    /// the table's write lock, so nobody can take the state meanwhile.
    fn idle(&self, state: &Arc<PartState>, visible: u64) -> bool {
        // A base record is not waited for when written: a reload reads the chain from the
        // files, so its newest record must be there (written, and synced under a syncing
        // policy) before the index is dropped.
        #[cfg(feature = "test-hooks")]
        let visible = if self.index_budget.before_visible.load(Ordering::Relaxed) {
            u64::MAX
        } else {
            visible
        };
        // A state with no record (head 0) is idle on the same terms: nothing of it is in the
        // files, and its next touch finds nothing, as if it had never been touched.
        if state.head_lsn.load(Ordering::Acquire) > visible {
            return false;
        }
        #[cfg(feature = "test-hooks")]
        if self.index_budget.unguarded.load(Ordering::Relaxed) {
            return true;
        }
        if Arc::strong_count(state) != 1 {
            return false;
        }
        // Lock order: the table, then a partition's `commit`; never waited for here.
        state
            .commit
            .try_lock()
            .is_some_and(|c| c.pending.is_empty() && c.load == Load::Loaded)
    }
}

impl FileStore {
    /// Test hook: loaded partition states looked at by dropping passes since open.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn unload_examined_for_test(&self) -> u64 {
        self.inner.index_budget.examined.load(Ordering::Relaxed)
    }

    /// Test-only negative control: dropping idle indexes also drops partitions in use (a
    /// reader or writer holds them, a batch waits to become durable), so tests can show they
    /// catch the writes this loses.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_unload_unguarded_for_test(&self, unguarded: bool) {
        self.inner
            .index_budget
            .unguarded
            .store(unguarded, Ordering::Relaxed);
    }

    /// Test-only negative control: dropping idle indexes does not wait for the newest record
    /// (a base record written without waiting) to be in the files, so tests can show they
    /// catch the reload that then reads an unwritten record.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_unload_before_visible_for_test(&self, before: bool) {
        self.inner
            .index_budget
            .before_visible
            .store(before, Ordering::Relaxed);
    }
}
