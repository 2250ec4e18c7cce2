//! What follows an append on the commit path: folding batches that became visible into the
//! readers' index, base records that bound the next load, and starting a background snapshot
//! or compaction when one is due.
//!
//! May call: the chain, journal, partition, scatter and compaction modules, and
//! [`Inner::write_snapshot`]. The append itself is in `FileStore`'s `apply` (`ops.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::partition::{self, CommitState, IndexOp, PartState, PendingOp};
use super::{Inner, chain, compaction};
use crate::error::Result;

impl Inner {
    /// Moves batches that are now visible from `pending` into the readers' index, in order.
    pub(super) fn fold(&self, state: &PartState, commit: &mut CommitState) {
        let visible = self.journal.visible_lsn();
        if commit.pending.front().is_none_or(|p| p.lsn > visible) {
            return;
        }
        let mut view = state.view.write();
        while commit.pending.front().is_some_and(|p| p.lsn <= visible) {
            let pending = commit.pending.pop_front().expect("checked above");
            state.folded_lsn.store(pending.lsn, Ordering::Release);
            let freed = partition::apply_to_index(
                &mut view.index,
                pending.ops.into_iter().map(IndexOp::from),
            );
            self.garbage_bytes.fetch_add(freed, Ordering::Relaxed);
        }
    }

    /// Writes a base record once the chain since the last one is long enough, so the next
    /// load walks a bounded chain. Not waited on: it only shortens future loads. Batches still
    /// in flight are folded into the base (it follows them in the journal, so a crash that
    /// keeps the base keeps them too); a hot partition thus gets bases even under constant load.
    pub(super) fn maybe_write_base(
        &self,
        state: &PartState,
        commit: &mut CommitState,
    ) -> Result<()> {
        let view = state.view.read();
        let due = self
            .config
            .base_every_records
            .max((view.index.len() / 8) as u32);
        if commit.chain_len < due {
            return Ok(());
        }
        if commit.pending.is_empty() {
            return self.write_base(state, commit, &view.index);
        }
        let mut index = view.index.clone();
        drop(view);
        for pending in &commit.pending {
            let ops = pending.ops.iter().map(|op| match op {
                PendingOp::Put(k, v, _) => IndexOp::Put(k.clone(), *v),
                PendingOp::Delete(k) => IndexOp::Delete(k.clone().into_boxed_slice()),
                PendingOp::DeleteRange(r) => IndexOp::DeleteRange(r.clone()),
            });
            partition::apply_to_index(&mut index, ops);
        }
        self.write_base(state, commit, &index)
    }

    pub(super) fn write_base(
        &self,
        state: &PartState,
        commit: &mut CommitState,
        index: &partition::Index,
    ) -> Result<()> {
        chain::write_base(&self.journal, state, commit, index)
    }

    /// Starts what is due in the background after a commit whose record went to `segment`
    /// (every segment below it is sealed).
    pub(super) fn after_commit(self: &Arc<Self>, segment: u32) {
        let appended = self.journal.counters.bytes_appended.load(Ordering::Relaxed);
        let since = appended.saturating_sub(self.bytes_at_last_snapshot.load(Ordering::Relaxed));
        if since >= self.config.snapshot_every_bytes
            && !self.snapshot_running.swap(true, Ordering::AcqRel)
        {
            let inner = self.clone();
            rayon::spawn(move || {
                if let Err(e) = inner.write_snapshot() {
                    log::warn!("background heads snapshot failed: {e}");
                }
                inner.snapshot_running.store(false, Ordering::Release);
            });
        }
        if self.config.auto_compact
            && !self.compaction_running.load(Ordering::Acquire)
            && (self.scatter.maybe_due(segment) || compaction::worth_compacting(self))
        {
            compaction::spawn(self);
        }
    }
}
