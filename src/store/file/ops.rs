//! The [`Store`] contract for [`FileStore`]: reads, scans, `apply` (validation, preconditions,
//! the append and the wait for durability), partition listing, limits and stats.
//!
//! May call: `Inner`'s read and commit paths, the format and partition modules, and the
//! journal.

use std::sync::atomic::Ordering;

use super::format::{self, MAX_BODY_LEN, RecordKind, ValueLoc};
use super::partition::{self, Pending, PendingOp};
use super::read::PageBuf;
use super::{
    Batch, Cursor, FileStore, KeyRange, Op, Outcome, Partition, ScanPage, Store, StoreLimits,
    StoreStats, check_guards, check_key, check_limit,
};
use crate::error::{Error, Result};

impl Store for FileStore {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let inner = &self.inner;
        inner.check_open()?;
        check_key(key)?;
        let Some(state) = inner.readable(p)? else {
            return Ok(None);
        };
        // Pinned from taking the location until the value is read (see `Journal::pin`).
        let _pin = inner.journal.pin();
        let found = state.view.read().index.get(key).copied();
        found.map(|v| inner.read_value(&state, &v)).transpose()
    }

    fn get_for_update(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let inner = &self.inner;
        inner.check_open()?;
        check_key(key)?;
        let Some(state) = inner.part(p, false)? else {
            inner.check_absent(p)?;
            return Ok(None);
        };
        let mut commit = state.commit.lock();
        inner.load_locked(&state, &mut commit)?;
        // The same answer a batch's precondition would get.
        inner.latest_value(&state, &commit, key)
    }

    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let inner = &self.inner;
        inner.check_open()?;
        for key in keys {
            check_key(key)?;
        }
        let Some(state) = inner.readable(p)? else {
            return Ok(vec![None; keys.len()]);
        };
        // Locations are taken under one lock, so the answers are one consistent view; values
        // at a location never change.
        let _pin = inner.journal.pin();
        let locs: Vec<Option<ValueLoc>> = {
            let view = state.view.read();
            keys.iter().map(|k| view.index.get(k).copied()).collect()
        };
        let mut values = inner
            .read_values(&state, &locs.iter().flatten().copied().collect::<Vec<_>>())?
            .into_iter();
        Ok(locs.iter().map(|v| v.and_then(|_| values.next())).collect())
    }

    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        let Some(page) = self.scan_page(p, range, cursor, limit)? else {
            return Ok(ScanPage::default());
        };
        let entries = (0..page.len())
            .map(|i| {
                let (k, v) = page.entry(i);
                (k.to_vec(), v.to_vec())
            })
            .collect();
        let next = page.next();
        self.inner.page_done(page);
        Ok(ScanPage { entries, next })
    }

    /// Lends each entry from one buffer per page (see `read::PageBuf`): no allocation per
    /// entry, and each value is checksummed once, when it is read.
    #[allow(clippy::type_complexity)]
    fn scan_visit(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<Option<Cursor>> {
        let Some(page) = self.scan_page(p, range, cursor, limit)? else {
            return Ok(None);
        };
        for i in 0..page.len() {
            let (k, v) = page.entry(i);
            visit(k, v)?;
        }
        let next = page.next();
        // A page whose visit failed is dropped instead: a failure is rare, and reuse only saves
        // work.
        self.inner.page_done(page);
        Ok(next)
    }

    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        let inner = &self.inner;
        inner.check_open()?;
        batch.validate_within(&self.limits())?;
        // The contract counts keys and values; the journal record also frames every operation
        // (a `DeleteRange` included). A record over the frame limit would be acknowledged and
        // then refused by every later read of the journal, so it is refused here (SPEC S11).
        let record_len = format::batch_body_len(p.as_bytes(), batch.ops());
        if record_len > MAX_BODY_LEN {
            return Err(Error::TooLarge {
                what: "journal record of the batch (keys, values and framing of every operation)",
                size: record_len,
                limit: MAX_BODY_LEN,
            });
        }
        if let Some(reason) = inner.journal.failed() {
            return Err(Error::SyncFailed(reason));
        }
        if inner.refuses_unknown.load(Ordering::Acquire) && inner.part(p, false)?.is_none() {
            inner.check_absent(p)?;
        }
        let state = inner.part(p, true)?.expect("created on demand");
        let mut intent = inner.journal.announce();
        let (lsn, segment) = {
            let mut commit = state.commit.lock();
            inner.load_locked(&state, &mut commit)?;
            let refused = {
                let _pin = inner.journal.pin();
                let view = state.view.read();
                check_guards(
                    batch.guards(),
                    || inner.config.clock.now_ms(),
                    |key| inner.latest_value_in(&state, &commit, &view, key),
                )?
            };
            if let Some(outcome) = refused {
                return Ok(outcome);
            }
            if batch.ops().is_empty() {
                return Ok(Outcome::Committed);
            }
            let (body, value_offsets) =
                format::encode_batch_body(p.as_bytes(), partition::head_of(&state), batch.ops());
            let (lsn, at) = intent.append(RecordKind::Batch, state.hash, &body, |lsn, at| {
                state.place_head(lsn, at)
            })?;
            let record_len = (format::FRAME_LEN + body.len()) as u64;
            let prev_end = state.last_end.swap(at + record_len, Ordering::Relaxed);
            inner.scatter.note_commit(prev_end, at, record_len);
            let body_at = at + format::FRAME_LEN as u64;
            let mut offsets = value_offsets.into_iter();
            let ops = batch
                .ops()
                .iter()
                .map(|op| match op {
                    Op::Put(k, v) => {
                        let offset = offsets.next().expect("one offset per put");
                        let loc = ValueLoc {
                            at: body_at + offset as u64,
                            len: v.len() as u32,
                            crc: crc32c::crc32c(v),
                        };
                        PendingOp::Put(k.clone().into_boxed_slice(), loc, v.clone())
                    }
                    Op::Delete(k) => PendingOp::Delete(k.clone()),
                    Op::DeleteRange(r) => PendingOp::DeleteRange(r.clone()),
                })
                .collect();
            commit.pending.push_back(Pending { lsn, ops });
            state.appended_lsn.store(lsn, Ordering::Release);
            commit.chain_len += 1;
            (lsn, format::loc_segment(at))
        };
        #[cfg(feature = "fault-injection")]
        if let Some(observe) = &inner.config.append_observer {
            (observe.0)(p, lsn);
        }
        // Wait outside the partition's lock, so its next writer can queue behind us and share
        // our sync (SPEC S3).
        let durable = inner.journal.wait_durable(lsn);
        {
            let mut commit = state.commit.lock();
            inner.fold(&state, &mut commit);
            if durable.is_ok() {
                // A base only shortens future loads; failing to write one (say, the store is
                // closing) must not turn a committed batch into an error.
                if let Err(e) = inner.maybe_write_base(&state, &mut commit) {
                    log::debug!("skipped a base record for {}: {e}", state.name);
                }
            }
        }
        durable?;
        inner.batches.fetch_add(1, Ordering::Relaxed);
        inner.after_commit(segment);
        inner.unload_idle();
        Ok(Outcome::Committed)
    }

    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        self.inner.check_open()?;
        // A partition exists once a batch of it has been written; a refused first batch
        // leaves no trace.
        self.inner.list_partitions(prefix)
    }

    fn contains_partition(&self, p: &Partition) -> Result<bool> {
        self.inner.check_open()?;
        self.inner.contains(p)
    }

    fn now_ms(&self) -> u64 {
        self.inner.config.clock.now_ms()
    }

    /// SPEC S1's limits, with no limit on the number of operations (SPEC S11).
    fn limits(&self) -> StoreLimits {
        StoreLimits::DEFAULT
    }

    /// `NotAfter` is checked against the store's clock inside the commit step (SPEC S2).
    fn evaluates_deadlines(&self) -> bool {
        true
    }

    fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        StoreStats {
            batches: inner.batches.load(Ordering::Relaxed),
            syncs: inner.journal.counters.syncs.load(Ordering::Relaxed),
            bytes_written: inner
                .journal
                .counters
                .bytes_appended
                .load(Ordering::Relaxed),
            partitions: inner.table.read().partitions(),
            partitions_loaded: inner.loaded.load(Ordering::Relaxed),
            segments: inner.journal.live_segments().len() as u64,
            compactions: inner.compactions.load(Ordering::Relaxed),
            garbage_bytes: inner.garbage_bytes.load(Ordering::Relaxed),
            indexes_dropped: inner.index_budget.unloaded.load(Ordering::Relaxed),
        }
    }

    fn close(&self) -> Result<()> {
        self.inner.close()
    }
}

impl FileStore {
    /// The page a scan (owned or lent) resumed from `cursor` answers; `None` for a partition
    /// that holds nothing.
    fn scan_page(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Option<PageBuf>> {
        self.inner.check_open()?;
        check_limit(limit)?;
        self.inner.read_page(p, &range.resuming(cursor), limit)
    }
}
