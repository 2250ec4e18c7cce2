//! The shared journal: appends framed records to segment files and makes them durable with
//! group commit (SPEC S3).
//!
//! Appenders copy their framed record into an in-memory queue under a short mutex and get an
//! LSN and a location back. Whoever then waits for durability and finds no sync running becomes
//! the leader: it takes the whole queue, releases the mutex, writes and syncs it, and publishes
//! the durable watermark to every waiter at once. Appends never wait for a sync; a sync never
//! runs under the append mutex. A failed write or sync is latched: every later commit is
//! refused with `SyncFailed` until the store is reopened (the kernel may have dropped the dirty
//! pages, so a retry that "succeeds" could still have lost data).

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};

use super::format::{
    self, FRAME_LEN, Frame, Loc, RecordKind, SEGMENT_HEADER_LEN, ValueLoc, loc, loc_offset,
    loc_segment,
};
use super::segments::{Header, SegmentFiles, SegmentSet};
use super::vfs::{OpenMode, Vfs, VfsFile};
use crate::error::{Error, Result};

/// How commits reach stable storage. The names of the weaker policies say what they risk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// `apply` returns `Committed` only once the batch is synced (the default; SPEC S3).
    /// Concurrent committers share syncs.
    #[default]
    SyncEveryCommit,
    /// Commits are written at once and synced by a background timer every `interval_ms`;
    /// a crash may lose up to that much acknowledged work (never a partial batch).
    PeriodicMayLoseRecent {
        /// Milliseconds between background syncs.
        interval_ms: u64,
    },
    /// Commits are written but never synced except at close and snapshots; a machine crash
    /// may lose any acknowledged work since (never a partial batch). For tests and caches.
    NeverSyncMayLoseRecent,
}

/// An open segment file and the salt its checksums are seeded with.
#[derive(Clone, Debug)]
pub struct Segment {
    pub file: Arc<dyn VfsFile>,
    pub seed: u32,
}

enum Chunk {
    /// Seals segment `number - 1`, whose records end at `sealed_end`, and starts `number`.
    NewSegment {
        number: u32,
        salt: u64,
        sealed_end: u64,
    },
    Bytes {
        segment: u32,
        offset: u64,
        bytes: Vec<u8>,
    },
}

struct State {
    next_lsn: u64,
    tail_segment: u32,
    tail_seed: u32,
    tail_offset: u64,
    queue: Vec<Chunk>,
    /// Newest LSN written to its segment file (visible to reads, maybe not durable).
    written_lsn: u64,
    /// Newest LSN known durable.
    synced_lsn: u64,
    /// Segments written since their last sync.
    dirty: Vec<u32>,
    leader_active: bool,
    failed: Option<String>,
    /// Set at close: no record may be appended after the final snapshot.
    sealed: bool,
    /// Commits appended since a leader last took the queue.
    queued_records: usize,
    /// A leader is waiting for the commits under way to append.
    gathering: bool,
    /// Counts finished leader rounds; picks the condvar of the running round's waiters.
    generation: u64,
    /// The newest LSN the running leader covers (`u64::MAX` until it takes the queue).
    leader_target: u64,
}

/// Counters of the journal.
#[derive(Debug, Default)]
pub struct JournalCounters {
    pub syncs: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub records: AtomicU64,
}

pub struct Journal {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    policy: SyncPolicy,
    segment_bytes: u64,
    state: Mutex<State>,
    /// Waiters for durability, by sync generation: those a running sync covers wait on
    /// `durable[generation % 2]`, those that appended after it took the queue on the other, so
    /// a finished sync wakes only the committers it made durable, plus one of the rest to lead
    /// the next sync.
    durable: [Condvar; 2],
    /// Committers inside a commit right now (see [`AppendIntent`]).
    active: AtomicUsize,
    /// Signalled when an announced append is made or abandoned, for a gathering leader.
    gathered: Condvar,
    /// Mirrors `State::gathering` so a finishing commit takes the mutex only when a leader
    /// waits for it (SeqCst with `active`: either the leader sees the commit's withdrawal, or
    /// the commit sees the leader and wakes it).
    gathering: AtomicBool,
    /// Recent sync duration in nanoseconds (an exponentially weighted average).
    sync_nanos: AtomicU64,
    /// Every segment by number, each checked on first use (see [`SegmentSet`]).
    segments: SegmentSet,
    /// How far the tail segment's file is known to hold written and synced zeros (or records):
    /// a write that would end past it first zero-fills the file a step further
    /// ([`preallocation_target`], [`prepare_step`]). 0 after open, so the first write prepares
    /// the tail; a rollover sets it to the new segment's first step. Only the leader touches it.
    tail_sized: AtomicU64,
    /// The negative control of the zero fill (settable in tests only): steps are sized with
    /// `set_len` (sparse), so a sync after a write into a fresh block commits its allocation.
    sparse_steps: bool,
    /// Whether this handle wrote to the journal (a close then trims the tail it sized).
    wrote: AtomicBool,
    /// The bounded table of open segment files every [`Segment`] reads and writes through.
    files: Arc<SegmentFiles>,
    /// Held (shared) by a reader from taking a value's location out of an index until its read
    /// is done; compaction takes it exclusively once, after moving values and before deleting
    /// segments, so no reader can still hold a location into a deleted segment.
    readers: RwLock<()>,
    pub counters: JournalCounters,
    /// The negative control of the pin (tests only): when off, readers pin this lock instead,
    /// which compaction never takes.
    #[cfg(feature = "fault-injection")]
    pin_switch: (super::fault::skip::PinSwitch, RwLock<()>),
}

/// Where recovery left the journal.
pub struct JournalTail {
    /// The segments recovery read (from the heads snapshot's position on).
    pub segments: BTreeMap<u32, Segment>,
    /// Older segments, listed but not read: their headers are checked on first use.
    pub unchecked: Vec<u32>,
    /// Segments recovery found with a damaged header, and why.
    pub damaged: BTreeMap<u32, String>,
    pub tail_segment: u32,
    pub tail_seed: u32,
    pub tail_offset: u64,
    pub next_lsn: u64,
}

pub fn segment_file_name(number: u32) -> String {
    format!("{number:010}.seg")
}

pub fn parse_segment_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A fresh random salt for a new segment.
pub fn new_salt() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

/// Creates a segment file of `size` bytes with its header, synced together with the size, and
/// its directory entry synced; then prepares the bytes after the header for records
/// ([`prepare_step`]: zeros written and synced).
pub fn create_segment(
    vfs: &dyn Vfs,
    dir: &Path,
    number: u32,
    salt: u64,
    size: u64,
) -> Result<Segment> {
    create_segment_with(vfs, dir, number, salt, size, false)
}

fn create_segment_with(
    vfs: &dyn Vfs,
    dir: &Path,
    number: u32,
    salt: u64,
    size: u64,
    sparse: bool,
) -> Result<Segment> {
    let path = dir.join(segment_file_name(number));
    let file = vfs
        .open(&path, OpenMode::CreateNew)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    let header = format::encode_segment_header(number, salt);
    // The header is durable before any zeros are written: a power cut during the zero fill
    // then leaves a valid header followed by the unacknowledged writes of a torn tail, never
    // a new segment without its header (which open could not tell from damage).
    size_step(&*file, SEGMENT_HEADER_LEN, size, true)
        .and_then(|()| file.write_all_at(&header, 0))
        .and_then(|()| file.sync_data())
        .and_then(|()| vfs.sync_dir(dir))
        .and_then(|()| match sparse {
            true => Ok(()),
            false => prepare_step(&*file, SEGMENT_HEADER_LEN, size, true),
        })
        .map_err(|e| Error::io(format!("initialising {}", path.display()), e))?;
    Ok(Segment {
        file,
        seed: format::salt_seed(salt),
    })
}

/// How far ahead of its records the tail segment is prepared: far enough that a lone commit
/// almost never prepares a step (once in about 6,000 commits of 174 bytes), near enough that
/// open after a crash reads at most about this much unwritten space to be sure no record
/// follows the last one, and that preparing a step (writing and syncing its zeros) stays a
/// short pause (about 1-2 ms) for the one commit that does it.
pub const PREALLOCATION_STEP: u64 = 1 << 20;

/// The size to give a segment whose records will end at `end`: the next whole step past it,
/// never past `segment_bytes` (a first record larger than a segment is written as it is).
pub fn preallocation_target(end: u64, segment_bytes: u64) -> u64 {
    ((end / PREALLOCATION_STEP + 1) * PREALLOCATION_STEP)
        .min(segment_bytes)
        .max(end)
}

/// Prepares bytes `from..to` of a segment for records: writes zeros over them and syncs them,
/// so that a later write there overwrites blocks the file system has already allocated, and
/// the `fdatasync` of a commit has only data to flush: no new file size and no block
/// allocation, either of which would make the sync also commit the file system's journal
/// (measured on ext4: a sync after a write into a hole or past the end took about twice as long
/// as one after an overwrite). `set_len` alone would leave a hole, allocated block by block as
/// records fill it. An all-zero frame is invalid, so recovery reads the zeros as the end of the
/// segment's records. `sync` is off under the weaker sync policies, whose commits do not sync.
pub fn prepare_step(file: &dyn VfsFile, from: u64, to: u64, sync: bool) -> std::io::Result<()> {
    size_step(file, from, to, false)?;
    if sync && to > from {
        file.sync_data()?;
    }
    Ok(())
}

/// Writes zeros over `from..to` a bounded buffer at a time (or, `sparse`, only extends the
/// file to `to` with `set_len`, never shrinking it).
fn size_step(file: &dyn VfsFile, from: u64, to: u64, sparse: bool) -> std::io::Result<()> {
    if sparse {
        if file.len()? < to {
            file.set_len(to)?;
        }
        return Ok(());
    }
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

impl Journal {
    pub fn new(
        dir: PathBuf,
        vfs: Arc<dyn Vfs>,
        policy: SyncPolicy,
        segment_bytes: u64,
        tail: JournalTail,
        files: Arc<SegmentFiles>,
    ) -> Self {
        let next_lsn = tail.next_lsn;
        // Every segment is reached through the table, whatever handle recovery used.
        let mut headers: BTreeMap<u32, Header> = tail
            .segments
            .into_iter()
            .map(|(n, s)| (n, Header::Good(s.seed)))
            .collect();
        headers.extend(tail.unchecked.into_iter().map(|n| (n, Header::Unchecked)));
        headers.extend(
            tail.damaged
                .into_iter()
                .map(|(n, r)| (n, Header::Damaged(r))),
        );
        let segments = SegmentSet::new(files.clone(), headers);
        Journal {
            dir,
            vfs,
            policy,
            segment_bytes,
            state: Mutex::new(State {
                next_lsn,
                tail_segment: tail.tail_segment,
                tail_seed: tail.tail_seed,
                tail_offset: tail.tail_offset,
                queue: Vec::new(),
                written_lsn: next_lsn - 1,
                synced_lsn: next_lsn - 1,
                dirty: Vec::new(),
                leader_active: false,
                failed: None,
                sealed: false,
                queued_records: 0,
                gathering: false,
                generation: 0,
                leader_target: 0,
            }),
            durable: [Condvar::new(), Condvar::new()],
            active: AtomicUsize::new(0),
            gathered: Condvar::new(),
            gathering: AtomicBool::new(false),
            sync_nanos: AtomicU64::new(0),
            segments,
            // Unknown until the first write, which sizes the tail a step past its end whatever
            // open found (a tail trimmed at close, cut at a torn tail or created by open).
            tail_sized: AtomicU64::new(0),
            sparse_steps: false,
            wrote: AtomicBool::new(false),
            files,
            readers: RwLock::new(()),
            counters: JournalCounters::default(),
            #[cfg(feature = "fault-injection")]
            pin_switch: Default::default(),
        }
    }

    /// Test only: the reader pin's negative control and observer.
    #[cfg(feature = "fault-injection")]
    pub fn with_pin_switch(mut self, switch: super::fault::skip::PinSwitch) -> Self {
        self.pin_switch.0 = switch;
        self
    }

    /// Test only: the zero fill's negative control (steps sized with `set_len`, sparse).
    #[cfg(feature = "fault-injection")]
    pub fn with_sparse_steps(mut self, sparse: bool) -> Self {
        self.sparse_steps = sparse;
        self
    }

    /// Announces a commit: the caller will append one record and wait for it to be durable.
    /// A leader about to sync may wait a moment for it (see [`Journal::lead`]).
    pub fn announce(&self) -> AppendIntent<'_> {
        self.active.fetch_add(1, Ordering::AcqRel);
        AppendIntent { journal: self }
    }

    /// Frames and queues one record; returns its LSN and location. `on_placed` runs under the
    /// append mutex, so anything it publishes is consistent with journal order (the heads
    /// snapshot relies on this).
    pub fn append(
        &self,
        kind: RecordKind,
        partition_hash: u64,
        body: &[u8],
        on_placed: impl FnOnce(u64, Loc),
    ) -> Result<(u64, Loc)> {
        self.append_inner(kind, partition_hash, body, on_placed, false)
    }

    fn append_inner(
        &self,
        kind: RecordKind,
        partition_hash: u64,
        body: &[u8],
        on_placed: impl FnOnce(u64, Loc),
        fulfils_intent: bool,
    ) -> Result<(u64, Loc)> {
        let body_crc = format::body_crc(body);
        let record_len = (FRAME_LEN + body.len()) as u64;
        let mut st = self.state.lock();
        if fulfils_intent {
            st.queued_records += 1;
            // Under the mutex, so a gathering leader cannot miss it; and only once the leader's
            // wait is over, so it is not woken for every record.
            if st.gathering && st.queued_records >= self.active.load(Ordering::Acquire) {
                self.gathered.notify_all();
            }
        }
        if let Some(reason) = &st.failed {
            return Err(Error::SyncFailed(reason.clone()));
        }
        if st.sealed {
            return Err(Error::Closed);
        }
        if st.tail_offset + record_len > self.segment_bytes && st.tail_offset > SEGMENT_HEADER_LEN {
            let sealed_end = st.tail_offset;
            st.tail_segment += 1;
            let salt = new_salt();
            st.tail_seed = format::salt_seed(salt);
            st.tail_offset = SEGMENT_HEADER_LEN;
            let number = st.tail_segment;
            st.queue.push(Chunk::NewSegment {
                number,
                salt,
                sealed_end,
            });
        }
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        let frame = Frame {
            body_len: body.len() as u32,
            kind,
            lsn,
            partition_hash,
            synced_lsn: st.synced_lsn,
            body_crc,
        };
        let header = format::encode_frame(st.tail_seed, &frame);
        let (segment, offset) = (st.tail_segment, st.tail_offset);
        st.tail_offset += record_len;
        match st.queue.last_mut() {
            Some(Chunk::Bytes {
                segment: s,
                offset: o,
                bytes,
            }) if *s == segment && *o + bytes.len() as u64 == offset => {
                bytes.extend_from_slice(&header);
                bytes.extend_from_slice(body);
            }
            _ => {
                let mut bytes = Vec::with_capacity(record_len as usize);
                bytes.extend_from_slice(&header);
                bytes.extend_from_slice(body);
                st.queue.push(Chunk::Bytes {
                    segment,
                    offset,
                    bytes,
                });
            }
        }
        let at = loc(segment, offset);
        on_placed(lsn, at);
        self.counters
            .bytes_appended
            .fetch_add(record_len, Ordering::Relaxed);
        self.counters.records.fetch_add(1, Ordering::Relaxed);
        Ok((lsn, at))
    }

    /// Waits until `lsn` is durable under the sync policy (for the weaker policies: written).
    pub fn wait_durable(&self, lsn: u64) -> Result<()> {
        self.wait_for(lsn, self.policy == SyncPolicy::SyncEveryCommit)
    }

    /// Writes and syncs everything appended so far, whatever the policy; returns the LSN
    /// that is now durable.
    pub fn sync_all(&self) -> Result<u64> {
        let target = self.state.lock().next_lsn - 1;
        self.wait_for(target, true)?;
        Ok(target)
    }

    fn wait_for(&self, lsn: u64, synced: bool) -> Result<()> {
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
        if sync && st.queued_records < self.active.load(Ordering::Acquire) {
            let budget = Duration::from_nanos(self.sync_nanos.load(Ordering::Relaxed) / 2)
                .min(Duration::from_millis(1));
            let deadline = Instant::now() + budget;
            st.gathering = true;
            self.gathering.store(true, Ordering::SeqCst);
            while st.queued_records < self.active.load(Ordering::SeqCst) {
                if self.gathered.wait_until(st, deadline).timed_out() {
                    break;
                }
            }
            st.gathering = false;
            self.gathering.store(false, Ordering::SeqCst);
        }
        st.queued_records = 0;
        let queue = std::mem::take(&mut st.queue);
        // Only the leader touches `dirty`, so it can be taken and handed back.
        let dirty = std::mem::take(&mut st.dirty);
        let target = st.next_lsn - 1;
        st.leader_target = target;
        let result = MutexGuard::unlocked(st, || self.write_queue(queue, dirty, sync));
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
                st.failed = Some(e.to_string());
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
    fn write_queue(&self, queue: Vec<Chunk>, mut dirty: Vec<u32>, sync: bool) -> Result<Vec<u32>> {
        for chunk in queue {
            match chunk {
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
                        self.sync_segment(n)?;
                    }
                    let size = preallocation_target(SEGMENT_HEADER_LEN, self.segment_bytes);
                    let segment = create_segment_with(
                        &*self.vfs,
                        &self.dir,
                        number,
                        salt,
                        size,
                        self.sparse_steps,
                    )?;
                    self.tail_sized.store(size, Ordering::Relaxed);
                    self.files.adopt(number, segment.file);
                    self.segments.insert(number, segment.seed);
                }
                Chunk::Bytes {
                    segment,
                    offset,
                    bytes,
                } => {
                    let file = self.segment(segment)?.file;
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
                            size_step(&*file, from, size, true)
                        } else {
                            prepare_step(&*file, from, size, sync)
                        };
                        prepare.map_err(|e| {
                            Error::io(format!("preparing journal segment {segment}"), e)
                        })?;
                        self.tail_sized.store(size, Ordering::Relaxed);
                    }
                    self.wrote.store(true, Ordering::Relaxed);
                    file.write_all_at(&bytes, offset)
                        .map_err(|e| Error::io(format!("writing journal segment {segment}"), e))?;
                    if !dirty.contains(&segment) {
                        dirty.push(segment);
                    }
                }
            }
        }
        if sync {
            for n in dirty.drain(..) {
                self.sync_segment(n)?;
            }
        }
        Ok(dirty)
    }

    fn sync_segment(&self, number: u32) -> Result<()> {
        let file = self.segment(number)?.file;
        let started = Instant::now();
        file.sync_data()
            .map_err(|e| Error::io(format!("syncing journal segment {number}"), e))?;
        let took = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let average = self.sync_nanos.load(Ordering::Relaxed);
        let updated = if average == 0 {
            took
        } else {
            (average * 7 + took) / 8
        };
        self.sync_nanos.store(updated, Ordering::Relaxed);
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Segment `number`; its header is read on first use. `Corrupt` if the segment is missing
    /// or its header is damaged (remembered: see [`SegmentSet::get`]).
    pub fn segment(&self, number: u32) -> Result<Segment> {
        self.segments.get(number)
    }

    /// Pins the segments readers may hold locations into: hold the guard from taking a value's
    /// location out of an index until the value is read. Never take it twice in one thread.
    pub fn pin(&self) -> RwLockReadGuard<'_, ()> {
        #[cfg(feature = "fault-injection")]
        if self.pin_switch.0.off {
            return self.pin_switch.1.read();
        }
        self.readers.read()
    }

    /// Waits until every reader pinned now has finished. Called after every index points away
    /// from the segments about to be deleted: later readers cannot find locations into them.
    pub fn wait_for_readers(&self) {
        #[cfg(feature = "fault-injection")]
        if let Some(on_wait) = &self.pin_switch.0.on_wait
            && self.readers.try_write().is_none()
        {
            on_wait();
        }
        drop(self.readers.write());
    }

    /// Reads `buf.len()` bytes at a location.
    pub fn read_at(&self, at: Loc, buf: &mut [u8]) -> Result<()> {
        let segment = loc_segment(at);
        self.segment(segment)?
            .file
            .read_exact_at(buf, loc_offset(at))
            .map_err(|e| Error::io(format!("reading journal segment {segment}"), e))
    }

    /// Reads a value and verifies its checksum.
    /// Damage answers `Corrupt` naming the segment and the partition, never a retryable `Io`
    /// (SPEC S4): a value past the end of a truncated segment, in a missing segment or one
    /// whose header is damaged, or failing its checksum.
    pub fn read_value(&self, v: &ValueLoc, partition: &dyn std::fmt::Display) -> Result<Vec<u8>> {
        let damaged = |detail: &str| value_damage(v, partition, detail);
        let mut buf = vec![0u8; v.len as usize];
        match self.read_at(v.at, &mut buf) {
            Ok(()) => {}
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(damaged("the segment ends before it (truncated)"));
            }
            Err(Error::Corrupt { detail, .. }) => return Err(damaged(&detail)),
            Err(e) => return Err(e),
        }
        if crc32c::crc32c(&buf) != v.crc {
            return Err(damaged("failed its checksum"));
        }
        Ok(buf)
    }

    /// Reads and verifies the record at `at`; returns its frame and body.
    pub fn read_record(&self, at: Loc) -> Result<(Frame, Vec<u8>)> {
        match self.read_record_start(at)? {
            RecordStart::Whole(frame, body) => Ok((frame, body)),
            RecordStart::Partial(frame, start) => self.finish_record(at, frame, start),
        }
    }

    /// Reads the rest of the record at `at` whose frame and body start
    /// [`Journal::read_record_start`] answered `Partial`, and verifies the whole body; returns
    /// the frame and body like [`Journal::read_record`], without reading the start again.
    pub fn finish_record(
        &self,
        at: Loc,
        frame: Frame,
        mut body: Vec<u8>,
    ) -> Result<(Frame, Vec<u8>)> {
        let segment = self.segment(loc_segment(at))?;
        let got = body.len();
        body.resize(frame.body_len as usize, 0);
        segment
            .file
            .read_exact_at(&mut body[got..], loc_offset(at) + (FRAME_LEN + got) as u64)
            .map_err(|e| record_read_error(at, e, "the segment ends inside the record"))?;
        if format::body_crc(&body) != frame.body_crc {
            return Err(record_damage(at, "record body failed its checksum"));
        }
        Ok((frame, body))
    }

    /// Reads the record at `at` with one read of a few KiB: the whole record, verified, when it
    /// is that small; otherwise its verified frame and the start of its body (unverified).
    /// Chain walks use it to follow a partition's links without holding large bodies.
    pub fn read_record_start(&self, at: Loc) -> Result<RecordStart> {
        let segment = self.segment(loc_segment(at))?;
        let mut buf = vec![0u8; SPECULATIVE_READ];
        let got = read_up_to(&*segment.file, &mut buf, loc_offset(at))
            .map_err(|e| record_read_error(at, e, "record unreadable"))?;
        if got < FRAME_LEN {
            return Err(record_damage(at, "record header unreadable"));
        }
        let frame = format::decode_frame(segment.seed, &buf[..FRAME_LEN])
            .ok_or_else(|| record_damage(at, "record header failed its checksum"))?;
        let end = FRAME_LEN + frame.body_len as usize;
        if end <= got {
            buf.truncate(end);
            buf.drain(..FRAME_LEN);
            if format::body_crc(&buf) != frame.body_crc {
                return Err(record_damage(at, "record body failed its checksum"));
            }
            Ok(RecordStart::Whole(frame, buf))
        } else {
            buf.truncate(got);
            buf.drain(..FRAME_LEN);
            Ok(RecordStart::Partial(frame, buf))
        }
    }

    /// Refuses every later append with `Closed`; what was appended before can still be synced.
    pub fn seal(&self) {
        self.state.lock().sealed = true;
    }

    /// At close, after [`Journal::seal`]: syncs everything, then trims the tail segment this
    /// handle wrote to its records (the next open then has no preallocated zeros to read, and
    /// its first write sizes the segment again). A failure leaves a longer file, nothing worse.
    pub fn trim_tail(&self) -> Result<()> {
        if !self.wrote.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.sync_all()?;
        let (segment, end) = {
            let st = self.state.lock();
            (st.tail_segment, st.tail_offset)
        };
        let file = self.segment(segment)?.file;
        let io = |e| Error::io(format!("trimming journal segment {segment}"), e);
        if file.len().map_err(io)? > end {
            file.set_len(end)
                .and_then(|()| file.sync_data())
                .map_err(io)?;
        }
        Ok(())
    }

    /// The segment appends currently go to.
    pub fn tail_segment(&self) -> u32 {
        self.state.lock().tail_segment
    }

    /// Runs `f` under the append mutex: nothing is appended meanwhile. Returns the position
    /// (segment, offset, next LSN) that `f` saw.
    pub fn with_appends_paused<T>(&self, f: impl FnOnce() -> T) -> (u32, u64, u64, T) {
        let st = self.state.lock();
        let out = f();
        (st.tail_segment, st.tail_offset, st.next_lsn, out)
    }

    /// Every segment that may hold records (not found damaged), checked or not.
    pub fn live_segments(&self) -> Vec<u32> {
        self.segments.live()
    }

    /// Removes a deleted segment from the live set and closes its file.
    pub fn retire_segment(&self, number: u32) {
        self.segments.remove(number);
    }

    pub fn failed(&self) -> Option<String> {
        self.state.lock().failed.clone()
    }

    /// The newest LSN readers may see: durable under `SyncEveryCommit`, written otherwise.
    pub fn visible_lsn(&self) -> u64 {
        let st = self.state.lock();
        if self.policy == SyncPolicy::SyncEveryCommit {
            st.synced_lsn
        } else {
            st.written_lsn
        }
    }
}

/// Bytes read at once when a record is fetched by location (frame plus a typical body).
const SPECULATIVE_READ: usize = 4096;

/// What one read at a record's location found (see [`Journal::read_record_start`]).
pub enum RecordStart {
    /// The whole record; its body passed its checksum.
    Whole(Frame, Vec<u8>),
    /// The frame (verified) and the first bytes of a longer body (not yet verified).
    Partial(Frame, Vec<u8>),
}

/// Damage to a value: `Corrupt` naming the partition, the segment and the value's offset.
pub fn value_damage(v: &ValueLoc, partition: &dyn std::fmt::Display, detail: &str) -> Error {
    Error::corrupt(
        format!("partition {partition}"),
        format!(
            "value at journal segment {} offset {}: {detail}",
            loc_segment(v.at),
            loc_offset(v.at)
        ),
    )
}

fn record_damage(at: Loc, detail: &str) -> Error {
    Error::corrupt(
        format!(
            "journal segment {} offset {}",
            loc_segment(at),
            loc_offset(at)
        ),
        detail.to_owned(),
    )
}

/// A failed read of a record: a segment that ends too soon is damage (`Corrupt`, never a
/// retryable `Io`: SPEC S4); any other I/O error stays `Io`, so a transient failure is not
/// remembered as damage.
fn record_read_error(at: Loc, e: std::io::Error, detail: &str) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        record_damage(at, detail)
    } else {
        Error::io(
            format!(
                "reading journal segment {} offset {}",
                loc_segment(at),
                loc_offset(at)
            ),
            e,
        )
    }
}

/// Reads as much of `buf` as the file holds at `offset`; returns how many bytes were read.
fn read_up_to(file: &dyn VfsFile, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A commit in progress (see [`Journal::announce`]): held from before the committer takes its
/// partition's lock until its commit returns, so a gathering leader knows how many commits
/// are under way.
pub struct AppendIntent<'a> {
    journal: &'a Journal,
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
        if st.gathering && st.queued_records >= self.journal.active.load(Ordering::SeqCst) {
            self.journal.gathered.notify_all();
        }
    }
}
