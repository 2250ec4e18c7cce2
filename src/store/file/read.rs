//! The read path of [`Inner`]: loading a partition's index on first use, catching up with
//! batches already decided, and reading values one at a time or merged.
//!
//! May call: the chain, journal, values and partition modules; records refusals in the
//! store's damage.

use std::sync::Arc;
use std::sync::atomic::Ordering;

#[cfg(feature = "fault-injection")]
use super::SkipSync;
use super::format::{self, ValueLoc};
use super::partition::{self, CommitState, Load, Lookup, PartState};
use super::{Inner, Partition, chain, values};
use crate::error::{Error, Result};

impl Inner {
    fn ensure_loaded(&self, state: &PartState) -> Result<()> {
        if state.view.read().loaded {
            return Ok(());
        }
        let mut commit = state.commit.lock();
        self.load_locked(state, &mut commit)
    }

    /// Makes reads linearizable: a read waits for the batches of this partition that were
    /// committed before it began (appended, and so already decided) to become durable, then
    /// sees them. Readers never see a batch that a crash could still take away, and a reader
    /// that lost a compare-and-set sees the batch that beat it on its next read.
    fn catch_up(&self, state: &PartState) {
        let appended = state.appended_lsn.load(Ordering::Acquire);
        if appended <= state.folded_lsn.load(Ordering::Acquire) {
            return;
        }
        // If the sync fails the batch never becomes visible; the durable view is still right.
        if self.journal.wait_durable(appended).is_ok() {
            self.fold(state, &mut state.commit.lock());
        }
    }

    /// Builds the partition's index on first access (SPEC S5, S8).
    pub(super) fn load_locked(&self, state: &PartState, commit: &mut CommitState) -> Result<()> {
        match &commit.load {
            Load::Loaded => return Ok(()),
            Load::Corrupt(detail) => return Err(state.corrupt_error(detail)),
            Load::NotLoaded => {}
        }
        if let Some(detail) = self.refusal(state.hash) {
            log::warn!("partition {} refused: {detail}", state.name);
            commit.load = Load::Corrupt(detail.clone());
            return Err(state.corrupt_error(&detail));
        }
        let loaded = chain::load_index(
            &self.journal,
            &self.recent,
            state,
            partition::head_of(state),
        )
        .and_then(|(index, chain_len)| {
            // Every segment a value lives in must be there with an intact header: open
            // checked only the ones it scanned, so a damaged one is found here, and refuses
            // the partition like a damaged chain (SPEC S4).
            self.check_value_segments(&index)?;
            Ok((index, chain_len))
        });
        match loaded {
            Ok((index, chain_len)) => {
                let mut view = state.view.write();
                view.index = index;
                view.loaded = true;
                commit.chain_len = chain_len;
                commit.load = Load::Loaded;
                self.loaded.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "loaded partition {} ({} keys, chain {})",
                    state.name,
                    view.index.len(),
                    chain_len
                );
                Ok(())
            }
            Err(Error::Corrupt { what, detail }) => {
                log::warn!("partition {} refused: {what}: {detail}", state.name);
                let detail = format!("{what}: {detail}");
                // Remembered across snapshots and reopens until an operator accepts it.
                self.damage
                    .lock()
                    .refuse(state.hash, Some(state.name.as_bytes()), detail.clone());
                commit.load = Load::Corrupt(detail.clone());
                Err(state.corrupt_error(&detail))
            }
            Err(other) => Err(other),
        }
    }

    /// Checks the header of every segment `index` has a value in (each one once per open:
    /// see [`Journal::segment`](super::journal::Journal::segment)).
    fn check_value_segments(&self, index: &partition::Index) -> Result<()> {
        #[cfg(feature = "fault-injection")]
        if self
            .config
            .skip_syncs
            .contains(&SkipSync::ValueSegmentCheck)
        {
            return Ok(());
        }
        let mut seen = std::collections::BTreeSet::new();
        for v in index.values() {
            let segment = self::format::loc_segment(v.at);
            if seen.insert(segment) {
                self.journal.segment(segment)?;
            }
        }
        Ok(())
    }

    /// A partition ready for reading: loaded, with the batches already decided for it durable
    /// and visible (see [`Inner::catch_up`]). `None` if it has never been written.
    pub(super) fn readable(&self, p: &Partition) -> Result<Option<Arc<PartState>>> {
        let Some(state) = self.part(p, false)? else {
            self.check_absent(p)?;
            return Ok(None);
        };
        self.ensure_loaded(&state)?;
        self.catch_up(&state);
        // Over budget: drop idle indexes (this one is held, so it stays).
        self.unload_idle();
        Ok(Some(state))
    }

    /// The newest committed value of `key`, pending batches included: what a precondition
    /// checked now would see. The caller holds the partition's `commit` lock.
    pub(super) fn latest_value(
        &self,
        state: &PartState,
        commit: &CommitState,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let _pin = self.journal.pin();
        self.latest_value_in(state, commit, &state.view.read(), key)
    }

    pub(super) fn latest_value_in(
        &self,
        state: &PartState,
        commit: &CommitState,
        view: &partition::View,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        match commit.lookup(view, key) {
            Lookup::Pending(value) => Ok(value),
            Lookup::Durable(None) => Ok(None),
            Lookup::Durable(Some(v)) => self.read_value(state, &v).map(Some),
        }
    }

    pub(super) fn read_value(&self, state: &PartState, v: &ValueLoc) -> Result<Vec<u8>> {
        if state.warm.load(Ordering::Relaxed) {
            if let Some(value) = self.recent.value(v, self.value_checks()) {
                return Ok(value);
            }
            state.warm.store(false, Ordering::Relaxed);
        }
        self.journal.read_value(v, &state.name)
    }

    /// Reads many values with as few reads as possible (see [`values`]); answers in order.
    pub(super) fn read_values(&self, state: &PartState, locs: &[ValueLoc]) -> Result<Vec<Vec<u8>>> {
        let check = self.value_checks();
        let recent = state.warm.load(Ordering::Relaxed).then_some(&self.recent);
        let (values, from_recent) =
            values::read_many(&self.journal, recent, locs, &state.name, check)?;
        if recent.is_some() && from_recent == 0 && !locs.is_empty() {
            state.warm.store(false, Ordering::Relaxed);
        }
        Ok(values)
    }

    /// Whether values read through a merged read or the recent records are checked (always,
    /// unless a test turned it off).
    fn value_checks(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        if self.config.skip_value_checks {
            return false;
        }
        true
    }
}
