//! The [`Store`] contract for [`FileStore`]: reads, scans, `apply` (validation, preconditions,
//! the append and the wait for durability), partition listing, limits and stats.
//!
//! May call: `Inner`'s read and commit paths, the format and partition modules, and the
//! journal.

use crate::sync::atomic::Ordering;

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
        let _events = inner.deliver_after_call();
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
        let _events = inner.deliver_after_call();
        check_key(key)?;
        let _budget = inner.budget_after_call();
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
        let _events = inner.deliver_after_call();
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
        let _events = self.inner.deliver_after_call();
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
        let _events = self.inner.deliver_after_call();
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
        let _events = inner.deliver_after_call();
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
        // Every way out, committed or not, checks the budget once the state is let go.
        let _budget = inner.budget_after_call();
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
            if batch.ops().is_empty() {
                // Nothing to append, so nothing of its own to wait for; but its guards may have
                // been decided by batches still waiting for their sync (SPEC S3).
                let decided_by = commit.pending.back().map(|b| b.lsn);
                drop(commit);
                // Not a commit under way any more: a leader must not wait for its record.
                drop(intent);
                return inner.answer_guard_only(decided_by, refused.unwrap_or(Outcome::Committed));
            }
            if let Some(outcome) = refused {
                return Ok(outcome);
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
            // The chain holds the record; its values count as garbage when they are freed.
            let values: usize = batch
                .ops()
                .iter()
                .map(|op| match op {
                    Op::Put(_, v) => v.len(),
                    _ => 0,
                })
                .sum();
            commit.chain.push(at, record_len - values as u64);
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

    /// The directory's lock keeps every other handle out while this one is open (SPEC S6); the
    /// number was drawn at open.
    fn exclusive_handle(&self) -> Option<u64> {
        Some(self.inner.handle)
    }

    fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        let watch = &inner.watch;
        StoreStats {
            sync_latency: inner.journal.watch.latency.snapshot(),
            stalls: inner.journal.watch.stalls.load(Ordering::Relaxed),
            compactions_failed: watch.compactions_failed(),
            compaction_running: inner.compaction_running.load(Ordering::Relaxed),
            compaction_bytes_copied: watch.bytes_copied(),
            compaction_bytes_removed: watch.bytes_removed(),
            max_loaded_partitions: inner.config.max_loaded_partitions.map(|n| n as u64),
            degraded: inner.degraded(),
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
            garbage_bytes: inner.space.total(),
            indexes_dropped: inner.index_budget.unloaded.load(Ordering::Relaxed),
        }
    }

    fn close(&self) -> Result<()> {
        self.inner.close()
    }

    fn backup(&self, dest: &std::path::Path) -> Result<super::BackupReport> {
        FileStore::backup(self, dest)
    }
}

impl super::Inner {
    /// Answers a batch with guards and no operations once the batches of its partition its
    /// guards were checked against (the newest, `decided_by`, and every one before it) are
    /// durable under the sync policy: an application checks a lease or a version this way
    /// before an external side effect, and must not act on state a power cut could still take
    /// away. If that sync fails the check is answered with its error, whatever its outcome.
    fn answer_guard_only(&self, decided_by: Option<u64>, outcome: Outcome) -> Result<Outcome> {
        #[cfg(feature = "fault-injection")]
        if self
            .config
            .skip_syncs
            .contains(&super::SkipSync::GuardOnlyWait)
        {
            return Ok(outcome);
        }
        if let Some(lsn) = decided_by {
            self.journal.wait_durable(lsn)?;
        }
        Ok(outcome)
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

/// A number for a handle opened now: distinct for every handle this process opens (a counter),
/// and, through a random number drawn once per process, practically never equal to one of
/// another process. Never 0.
pub(super) fn handle_number() -> u64 {
    if let Some(n) = crate::sync::simulated_unique() {
        return n;
    }
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::AtomicU64; // seams: not shared (a process-wide counter)
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = OPENED.fetch_add(1, Ordering::Relaxed);
    // An odd multiplier is a bijection on u64: distinct counts give distinct numbers.
    (seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).max(1)
}
