//! What follows an append on the commit path: folding batches that became visible into the
//! readers' index, base records that bound the next load, and starting a background snapshot
//! or compaction when one is due.
//!
//! May call: the chain, journal, partition, scatter and compaction modules, and
//! [`Inner::write_snapshot`]. The append itself is in `FileStore`'s `apply` (`ops.rs`).

use crate::sync::atomic::Ordering;
use std::sync::Arc;

use super::partition::{self, CommitState, IndexOp, PartState, PendingOp};
use super::{Inner, chain, compaction, format};
use crate::error::Result;

impl Inner {
    /// Moves batches that are now visible from `pending` into the readers' index, in order.
    pub(super) fn fold(&self, state: &PartState, commit: &mut CommitState) {
        let visible = self.journal.visible_lsn();
        if commit.pending.front().is_none_or(|p| p.lsn > visible) {
            return;
        }
        let mut freed: Vec<(u32, u64)> = Vec::new();
        let mut view = state.view.write();
        while commit.pending.front().is_some_and(|p| p.lsn <= visible) {
            let pending = commit.pending.pop_front().expect("checked above");
            state.folded_lsn.store(pending.lsn, Ordering::Release);
            partition::apply_to_index(
                &mut view.index,
                pending.ops.into_iter().map(IndexOp::from),
                |at, bytes| freed.push((format::loc_segment(at), bytes)),
            );
        }
        drop(view);
        if !freed.is_empty() {
            self.space.add_all(freed);
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
        if commit.chain.len < due {
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
            partition::apply_to_index(&mut index, ops, |_, _| {});
        }
        self.write_base(state, commit, &index)
    }

    /// Writes the partition's base (see [`chain::write_base`]); what it supersedes of the
    /// chain is dead from now on.
    pub(super) fn write_base(
        &self,
        state: &PartState,
        commit: &mut CommitState,
        index: &partition::Index,
    ) -> Result<()> {
        let superseded =
            chain::write_base(&self.journal, state, commit, index, self.space.packed())?;
        self.space.add_all(superseded);
        Ok(())
    }

    /// Per segment: its scattered bytes and its dead bytes (what a heads snapshot keeps).
    pub(super) fn segment_counts(&self) -> Vec<(u32, u64, u64)> {
        let mut counts: std::collections::BTreeMap<u32, (u64, u64)> = Default::default();
        for (n, apart) in self.scatter.counts() {
            counts.entry(n).or_default().0 = apart;
        }
        for (n, dead) in self.space.counts() {
            counts.entry(n).or_default().1 = dead;
        }
        counts.into_iter().map(|(n, (a, d))| (n, a, d)).collect()
    }

    /// Starts what is due in the background after a commit whose record went to `segment`
    /// (every segment below it is sealed).
    pub(super) fn after_commit(self: &Arc<Self>, segment: u32) {
        let appended = self.journal.counters.bytes_appended.load(Ordering::Relaxed);
        let since = appended.saturating_sub(self.bytes_at_last_snapshot.load(Ordering::Relaxed));
        // Due by bytes, or (under a budget) because the overlay of heads reached its bound.
        let due =
            since >= self.config.snapshot_every_bytes || self.folds.due.load(Ordering::Relaxed);
        if due && !self.snapshot_running.swap(true, Ordering::AcqRel) {
            let inner = self.clone();
            self.config.spawner.spawn(move || {
                // A panic must not unwind out of a pool task (it would abort the host): it is
                // logged, and the next commit that finds a snapshot due starts another.
                let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    inner.write_snapshot()
                }));
                match written {
                    Ok(Ok(())) => {}
                    // A closed store writes nothing more: not a failure.
                    Ok(Err(crate::error::Error::Closed)) => {}
                    Ok(Err(e)) => {
                        log::warn!("background heads snapshot failed: {e}");
                        inner.snapshot_failed(e.to_string());
                    }
                    Err(_) => {
                        log::error!(
                            "background heads snapshot panicked; the next one is started by a later commit"
                        );
                        inner.snapshot_failed("it panicked".to_owned());
                    }
                }
                // Told before a test waiting for this snapshot is let go.
                inner.deliver_in_background();
                inner.snapshot_running.store(false, Ordering::Release);
                #[cfg(feature = "test-hooks")]
                inner.folds.background_done();
            });
        }
        if self.config.auto_compact
            && !self.compaction_running.load(Ordering::Acquire)
            && compaction::maybe_due(self, segment)
        {
            compaction::spawn(self);
        }
    }
}
