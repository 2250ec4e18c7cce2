//! Group commit: the leader that takes the queue, writes it (preparing steps and rolling over
//! segments on the way) and syncs it, and the waiters it wakes (SPEC S3).

use crate::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::clock;
use crate::sync::MutexGuard;

use super::super::format::{Loc, RecordKind, SEGMENT_HEADER_LEN};
use super::super::vfs::VfsFile;
use super::{
    Chunk, Journal, Queue, State, SyncPolicy, create_segment_with, preallocation_target,
    prepare_step, size_step,
};
use crate::error::{Error, Result};

impl Journal {
    /// Waits until `lsn` is durable under the sync policy (for the weaker policies: written).
    pub fn wait_durable(&self, lsn: u64) -> Result<()> {
        self.wait_lsn(lsn, self.policy == SyncPolicy::SyncEveryCommit)
    }

    /// Writes and syncs everything appended so far, whatever the policy; returns the LSN
    /// that is now durable.
    pub fn sync_all(&self) -> Result<u64> {
        let target = self.state.lock().next_lsn - 1;
        self.wait_lsn(target, true)?;
        Ok(target)
    }

    pub(super) fn wait_lsn(&self, lsn: u64, synced: bool) -> Result<()> {
        let mut st = self.state.lock();
        loop {
            if let Some(reason) = &st.failed {
                return Err(Error::SyncFailed(reason.clone()));
            }
            let reached = if synced {
                st.synced_lsn
            } else {
                st.written_lsn
            };
            if reached >= lsn {
                return Ok(());
            }
            if st.leader_active {
                let round = if lsn <= st.leader_target {
                    st.generation
                } else {
                    st.generation + 1
                };
                self.durable[(round % 2) as usize].wait(&mut st);
                continue;
            }
            self.lead(&mut st, synced);
        }
    }

    /// Becomes the leader: writes (and, if asked, syncs) the whole queue outside the mutex, so
    /// appenders keep queueing while the device works.
    ///
    /// Before a sync, while fewer records are queued than commits are under way, the leader
    /// waits for the rest, at most half the recent sync time (and never more than 1 ms): their
    /// records then share this sync instead of each paying for the next one. Without this, the
    /// committers released by one sync (still on their way back to commit again) miss the next
    /// one, and the writers split into two groups that sync in turn. A lone committer never
    /// waits.
    fn lead(&self, st: &mut MutexGuard<'_, State>, sync: bool) {
        st.leader_active = true;
        // Everything appended until the queue is taken below is covered by this round.
        st.leader_target = u64::MAX;
        if sync && st.queue.records < self.active.load(Ordering::Acquire) {
            self.counters.gathers.fetch_add(1, Ordering::Relaxed);
            let budget = Duration::from_nanos(self.sync_nanos.load(Ordering::Relaxed) / 2)
                .min(Duration::from_millis(1));
            let started = self.clock.instant();
            let deadline = started + budget;
            st.gathering = true;
            self.gathering.store(true, Ordering::SeqCst);
            while st.queue.records < self.active.load(Ordering::SeqCst) {
                if clock::wait_until(&*self.clock, &self.gathered, st, deadline) {
                    break;
                }
            }
            st.gathering = false;
            self.gathering.store(false, Ordering::SeqCst);
            // Bounded by the budget, unless the leader was not scheduled in time.
            let took = self
                .clock
                .instant()
                .saturating_duration_since(started)
                .as_nanos()
                .min(u64::MAX as u128) as u64;
            self.watch.timed(crate::observe::StallPhase::Gather, took);
        }
        let spare = std::mem::take(&mut st.spare);
        let queue = std::mem::replace(&mut st.queue, spare);
        // Only the leader touches `dirty`, so it can be taken and handed back.
        let dirty = std::mem::take(&mut st.dirty);
        let mut last = st.last_file.take();
        let target = st.next_lsn - 1;
        st.leader_target = target;
        let (result, queue) = MutexGuard::unlocked(st, || {
            let result = self.write_queue(&queue, dirty, &mut last, sync);
            (result, queue.recycle())
        });
        st.spare = queue.unwrap_or_default();
        st.last_file = last;
        st.leader_active = false;
        match result {
            Ok(still_dirty) => {
                st.written_lsn = target;
                if sync {
                    st.synced_lsn = target;
                }
                st.dirty = still_dirty;
            }
            Err(e) => {
                log::error!("journal write or sync failed; refusing writes until reopened: {e}");
                let reason = e.to_string();
                self.watch.failed(&reason);
                st.failed = Some(reason);
            }
        }
        let covered = (st.generation % 2) as usize;
        st.generation += 1;
        self.durable[covered].notify_all();
        let next = 1 - covered;
        if st.failed.is_some() {
            self.durable[next].notify_all();
        } else {
            // One of those that appended during this round leads the next.
            self.durable[next].notify_one();
        }
    }

    /// Writes the queued chunks in order. Before a new segment starts, the segment it seals is
    /// trimmed to its records (its unused preallocated end dropped) and every segment written
    /// but not yet synced is synced, whatever the policy, so a sealed segment is always whole on
    /// disk and ends where its records end. With `sync`, everything is synced at the end.
    /// Returns the segments left unsynced.
    ///
    /// `last` is the file last written or synced, kept from round to round: a round that writes
    /// and syncs the tail (every round of a lone committer) does not look it up.
    fn write_queue(
        &self,
        queue: &Queue,
        mut dirty: Vec<u32>,
        last: &mut Option<(u32, Arc<dyn VfsFile>)>,
        sync: bool,
    ) -> Result<Vec<u32>> {
        let mut at = 0;
        for chunk in &queue.chunks {
            match *chunk {
                Chunk::NewSegment {
                    number,
                    salt,
                    sealed_end,
                } => {
                    let sealed = number - 1;
                    let file = self.segment(sealed)?.file;
                    let trim = |e| Error::io(format!("trimming journal segment {sealed}"), e);
                    if file.len().map_err(trim)? > sealed_end {
                        file.set_len(sealed_end).map_err(trim)?;
                        if !dirty.contains(&sealed) {
                            dirty.push(sealed);
                        }
                    }
                    for n in dirty.drain(..) {
                        self.sync_segment(n, last)?;
                    }
                    let size = preallocation_target(SEGMENT_HEADER_LEN, self.segment_bytes);
                    let (segment, syncs) = create_segment_with(
                        &*self.vfs,
                        &self.dir,
                        number,
                        salt,
                        size,
                        self.sparse_steps,
                    )?;
                    self.counters.syncs.fetch_add(syncs, Ordering::Relaxed);
                    self.tail_sized.store(size, Ordering::Relaxed);
                    self.files.adopt(number, segment.file);
                    self.segments.insert(number, segment.seed);
                    // Every chunk for the old tail came before this one and is written; it is
                    // trimmed and synced above. Only now may compaction take it.
                    self.sealed_through.store(sealed, Ordering::Release);
                }
                Chunk::Bytes {
                    segment,
                    offset,
                    len,
                } => {
                    let bytes = &queue.bytes[at..at + len];
                    at += len;
                    let file = self.file_of(segment, last)?;
                    // Only the tail is written to: chunks for a sealed segment come before the
                    // rollover that starts the next one.
                    let end = offset + bytes.len() as u64;
                    let prepared = self.tail_sized.load(Ordering::Relaxed);
                    if end > prepared {
                        // Everything from `offset` on is past the records written so far.
                        let from = prepared.max(offset);
                        let size = preallocation_target(end, self.segment_bytes);
                        let sync = self.policy == SyncPolicy::SyncEveryCommit;
                        let prepare = if self.sparse_steps {
                            size_step(&*file, from, size, true).map(|()| 0)
                        } else {
                            prepare_step(&*file, from, size, sync)
                        };
                        let syncs = prepare.map_err(|e| {
                            Error::io(format!("preparing journal segment {segment}"), e)
                        })?;
                        // Not in the recent sync time: a step's sync flushes far more than a
                        // commit's, and that time sizes how long a leader gathers commits.
                        self.counters.syncs.fetch_add(syncs, Ordering::Relaxed);
                        self.tail_sized.store(size, Ordering::Relaxed);
                    }
                    self.wrote.store(true, Ordering::Relaxed);
                    file.write_all_at(bytes, offset)
                        .map_err(|e| Error::io(format!("writing journal segment {segment}"), e))?;
                    if !dirty.contains(&segment) {
                        dirty.push(segment);
                    }
                }
            }
        }
        if sync {
            for n in dirty.drain(..) {
                self.sync_segment(n, last)?;
            }
        }
        Ok(dirty)
    }

    /// The file of segment `number`, from `last` when it is that segment's.
    fn file_of(
        &self,
        number: u32,
        last: &mut Option<(u32, Arc<dyn VfsFile>)>,
    ) -> Result<Arc<dyn VfsFile>> {
        match last {
            Some((n, file)) if *n == number => Ok(file.clone()),
            _ => {
                let file = self.segment(number)?.file;
                *last = Some((number, file.clone()));
                Ok(file)
            }
        }
    }

    fn sync_segment(&self, number: u32, last: &mut Option<(u32, Arc<dyn VfsFile>)>) -> Result<()> {
        let file = self.file_of(number, last)?;
        let started = self.clock.instant();
        file.sync_data()
            .map_err(|e| Error::io(format!("syncing journal segment {number}"), e))?;
        let took = (self.clock.instant().saturating_duration_since(started))
            .as_nanos()
            .min(u64::MAX as u128) as u64;
        let average = self.sync_nanos.load(Ordering::Relaxed);
        let updated = if average == 0 {
            took
        } else {
            (average * 7 + took) / 8
        };
        self.sync_nanos.store(updated, Ordering::Relaxed);
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        self.watch.timed(crate::observe::StallPhase::Sync, took);
        Ok(())
    }
}

/// A commit in progress (see [`Journal::announce`]): held from before the committer takes its
/// partition's lock until its commit returns, so a gathering leader knows how many commits
/// are under way.
pub struct AppendIntent<'a> {
    pub(super) journal: &'a Journal,
}

impl AppendIntent<'_> {
    /// Appends this commit's record (see [`Journal::append`]).
    pub fn append(
        &mut self,
        kind: RecordKind,
        partition_hash: u64,
        body: &[u8],
        on_placed: impl FnOnce(u64, Loc),
    ) -> Result<(u64, Loc)> {
        self.journal
            .append_inner(kind, partition_hash, body, on_placed, true)
    }
}

impl Drop for AppendIntent<'_> {
    fn drop(&mut self) {
        self.journal.active.fetch_sub(1, Ordering::SeqCst);
        if !self.journal.gathering.load(Ordering::SeqCst) {
            return;
        }
        // Under the mutex, so a leader between its check and its wait cannot miss this.
        let st = self.journal.state.lock();
        if st.gathering && st.queue.records >= self.journal.active.load(Ordering::SeqCst) {
            self.journal.gathered.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::sync::atomic::Ordering;

    use crate::store::{Batch, FileStore, Partition, Store};

    fn put(store: &FileStore, p: &Partition, i: u32) {
        let b = Batch::new().put(format!("k{i}").into_bytes(), vec![7; 100]);
        assert!(store.apply(p, &b).unwrap().is_committed());
    }

    /// A lone committer leads every sync itself and never waits for a gather window: nobody
    /// else is under way, so waiting could only delay its own acknowledgement.
    #[test]
    fn a_lone_committer_never_waits_for_a_gather_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let journal = &store.inner.journal;
        let (a, b) = (Partition::new("a").unwrap(), Partition::new("b").unwrap());
        let before = store.stats();
        for i in 0..100 {
            put(&store, if i % 2 == 0 { &a } else { &b }, i);
        }
        let after = store.stats();
        assert_eq!(after.batches - before.batches, 100);
        // One sync per commit (plus at most a step's): each commit was durable on its own.
        assert!(after.syncs - before.syncs >= 100, "{after:?}");
        assert_eq!(journal.counters.gathers.load(Ordering::Relaxed), 0);
        store.close().unwrap();
    }

    /// While a commit is announced but not yet appended, the leader waits (a bounded time) for
    /// it before syncing; the commit it leads is still acknowledged, and once the other commit
    /// is withdrawn the leader no longer waits.
    #[test]
    fn a_leader_waits_for_an_announced_commit_only_while_one_is_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let journal = &store.inner.journal;
        let p = Partition::new("p").unwrap();
        put(&store, &p, 0);
        let on_its_way = journal.announce();
        put(&store, &p, 1);
        assert_eq!(journal.counters.gathers.load(Ordering::Relaxed), 1);
        drop(on_its_way);
        put(&store, &p, 2);
        assert_eq!(journal.counters.gathers.load(Ordering::Relaxed), 1);
        assert_eq!(store.get(&p, b"k1").unwrap(), Some(vec![7; 100]));
        store.close().unwrap();
    }
}
