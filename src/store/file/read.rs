//! The read path of [`Inner`]: loading a partition's index on first use, catching up with
//! batches already decided, and reading values one at a time, merged, or a scan page at a time
//! into shared buffers ([`PageBuf`]).
//!
//! May call: the chain, journal, values and partition modules; records refusals in the
//! store's damage.

use crate::sync::atomic::Ordering;
use std::sync::Arc;

#[cfg(feature = "fault-injection")]
use super::SkipSync;
use super::format::{self, ValueLoc};
use super::partition::{self, CommitState, Load, Lookup, PartState};
use super::{Inner, Partition, chain, pool, values};
use crate::error::{Error, Result};
use crate::store::{Cursor, KeyRange};

/// One page of a scan read by [`Inner::read_page`]: keys end to end in one buffer, values in
/// another or lent from the cache of recent records, each value checksummed once per read.
#[derive(Default)]
pub(super) struct PageBuf {
    keys: Vec<u8>,
    key_ends: Vec<usize>,
    locs: Vec<ValueLoc>,
    values: values::ReadValues,
    /// Whether entries of the range follow the page.
    more: bool,
}

impl PageBuf {
    pub fn len(&self) -> usize {
        self.locs.len()
    }

    /// Entry `i`: its key and value, lent from the page's buffers.
    pub fn entry(&self, i: usize) -> (&[u8], &[u8]) {
        let key_start = if i == 0 { 0 } else { self.key_ends[i - 1] };
        (&self.keys[key_start..self.key_ends[i]], self.values.get(i))
    }

    /// Where the next page starts: after this page's last key, if entries follow it.
    pub fn next(&self) -> Option<Cursor> {
        match (self.more, self.len()) {
            (true, n) if n > 0 => Some(Cursor(self.entry(n - 1).0.to_vec())),
            _ => None,
        }
    }
}

impl pool::Reusable for PageBuf {
    fn clear(&mut self) {
        self.keys.clear();
        self.key_ends.clear();
        self.locs.clear();
        self.values.clear();
        self.more = false;
    }

    fn held(&self) -> usize {
        self.keys.capacity()
            + self.key_ends.capacity() * std::mem::size_of::<usize>()
            + self.locs.capacity() * std::mem::size_of::<ValueLoc>()
            + self.values.held()
    }
}

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
        .and_then(|(index, chain)| {
            // Every segment a value lives in must be there with an intact header: open
            // checked only the ones it scanned, so a damaged one is found here, and refuses
            // the partition like a damaged chain (SPEC S4).
            self.check_value_segments(&index)?;
            Ok((index, chain))
        });
        match loaded {
            Ok((index, chain)) => {
                let mut view = state.view.write();
                view.index = index;
                view.loaded = true;
                let chain_len = chain.len;
                commit.chain = chain;
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
        let mut values = values::ReadValues::default();
        self.read_values_lent(state, locs, &mut values)?;
        Ok((0..values.len()).map(|i| values.get(i).to_vec()).collect())
    }

    /// Reads many values without a buffer per value (see [`values::read_into`]).
    fn read_values_lent(
        &self,
        state: &PartState,
        locs: &[ValueLoc],
        values: &mut values::ReadValues,
    ) -> Result<()> {
        let check = self.value_checks();
        let recent = state.warm.load(Ordering::Relaxed).then_some(&self.recent);
        let from_recent =
            values::read_into(&self.journal, recent, locs, &state.name, check, values)?;
        if recent.is_some() && from_recent == 0 && !locs.is_empty() {
            state.warm.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Reads one page of a scan of `range` (already moved past the cursor): at most `limit`
    /// entries, in key order, into one [`PageBuf`], so a page costs a few buffers, not one per
    /// key and one per value. `None` if the partition has never been written.
    pub(super) fn read_page(
        &self,
        p: &Partition,
        range: &KeyRange,
        limit: usize,
    ) -> Result<Option<PageBuf>> {
        let Some(state) = self.readable(p)? else {
            return Ok(None);
        };
        // Taken from the store's pool, emptied, and given back by the caller when its entries
        // have been seen (`Inner::page_done`).
        let mut page = self.pages.take();
        if range.is_empty() {
            return Ok(Some(page));
        }
        // Pinned from taking the locations until the values are read (see `Journal::pin`);
        // released before the caller sees an entry, so its code never runs pinned.
        let _pin = self.journal.pin();
        {
            let view = state.view.read();
            let mut iter = view.index.range::<[u8], _>(range.as_bounds());
            for (k, v) in iter.by_ref().take(limit) {
                page.keys.extend_from_slice(k);
                page.key_ends.push(page.keys.len());
                page.locs.push(*v);
            }
            page.more = iter.next().is_some();
        }
        self.read_values_lent(&state, &page.locs, &mut page.values)?;
        Ok(Some(page))
    }

    /// Gives a page's buffers back for the next page to reuse.
    pub(super) fn page_done(&self, page: PageBuf) {
        self.pages.put(page);
    }

    /// Whether values read through a merged read or taken one by one from the recent records
    /// are checked (always, unless a test turned it off).
    fn value_checks(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        if self.config.skip_value_checks {
            return false;
        }
        true
    }
}
