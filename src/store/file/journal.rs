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
//!
//! This module owns the journal's state and appends; `group` the leader that writes and syncs
//! the queue, `steps` segment files and their zero-filled steps, `reads` reads by location.

mod group;
mod reads;
mod steps;

use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::sync::{Condvar, Mutex, RwLock, RwLockReadGuard};

use super::format::{self, FRAME_LEN, Frame, Loc, RecordKind, SEGMENT_HEADER_LEN, loc};
use super::segments::{Header, SegmentFiles, SegmentSet};
use super::vfs::{Vfs, VfsFile};
use crate::clock::SharedClock;
use crate::error::{Error, Result};

pub use group::AppendIntent;
pub use reads::{RecordStart, Window, value_damage};
pub use steps::{
    create_segment, new_salt, parse_segment_file_name, preallocation_target, prepare_step,
    segment_file_name,
};
use steps::{create_segment_with, size_step};

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
    /// The next `len` bytes of the queue's buffer, to be written at `offset` of `segment`.
    Bytes {
        segment: u32,
        offset: u64,
        len: usize,
    },
}

/// What appenders queue for the next leader: the chunks in order and the bytes of every
/// [`Chunk::Bytes`] one after the other. A leader swaps it for the spare and hands it back
/// emptied, so a steady stream of commits allocates no queue memory.
#[derive(Default)]
struct Queue {
    chunks: Vec<Chunk>,
    bytes: Vec<u8>,
    /// Records appended since a leader last took the queue.
    records: usize,
}

/// A queue's buffer is kept as the spare only up to this capacity: one large record (a base,
/// a big batch) must not keep its memory for the journal's lifetime.
const SPARE_QUEUE_BYTES: usize = 1 << 20;

impl Queue {
    /// Appends one record's frame and body, extending the last chunk when the record follows
    /// it in the same segment (one write for a run of records).
    fn push(&mut self, segment: u32, offset: u64, header: &[u8], body: &[u8]) {
        let len = header.len() + body.len();
        match self.chunks.last_mut() {
            Some(Chunk::Bytes {
                segment: s,
                offset: o,
                len: l,
            }) if *s == segment && *o + *l as u64 == offset => *l += len,
            _ => self.chunks.push(Chunk::Bytes {
                segment,
                offset,
                len,
            }),
        }
        self.bytes.extend_from_slice(header);
        self.bytes.extend_from_slice(body);
    }

    /// Empties a queue a leader wrote, for reuse as the spare; `None` if it grew too large to
    /// keep.
    fn recycle(mut self) -> Option<Queue> {
        if self.bytes.capacity() > SPARE_QUEUE_BYTES {
            return None;
        }
        self.chunks.clear();
        self.bytes.clear();
        self.records = 0;
        Some(self)
    }
}

struct State {
    next_lsn: u64,
    tail_segment: u32,
    tail_seed: u32,
    tail_offset: u64,
    queue: Queue,
    /// An emptied queue for the next leader to swap in (see [`Queue`]).
    spare: Queue,
    /// Newest LSN written to its segment file (visible to reads, maybe not durable).
    written_lsn: u64,
    /// Newest LSN known durable.
    synced_lsn: u64,
    /// Segments written since their last sync.
    dirty: Vec<u32>,
    /// The file the last leader wrote or synced, by segment number: the next one starts from
    /// it instead of looking the tail up again. Only the leader uses it.
    last_file: Option<(u32, Arc<dyn VfsFile>)>,
    leader_active: bool,
    failed: Option<String>,
    /// Set at close: no record may be appended after the final snapshot.
    sealed: bool,
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
    /// Leader rounds that waited for announced commits to append before syncing (a lone
    /// committer's never do).
    pub gathers: AtomicU64,
}

/// Sync latencies and commit stalls (SPEC E8).
#[derive(Debug)]
pub struct JournalWatch {
    /// Every journal segment's `fdatasync` (not a new segment's nor a zero-filled step's).
    pub latency: crate::observe::Latency,
    /// Syncs and gathers slower than the threshold.
    pub stalls: AtomicU64,
    stall_nanos: u64,
    events: crate::observe::Events,
}

impl Default for JournalWatch {
    fn default() -> Self {
        JournalWatch {
            latency: Default::default(),
            stalls: AtomicU64::new(0),
            stall_nanos: crate::store::file::watch::DEFAULT_STALL_THRESHOLD.as_nanos() as u64,
            events: Default::default(),
        }
    }
}

impl JournalWatch {
    /// Counts a sync or gather that took `nanos`; a stall if over the threshold.
    #[inline]
    fn timed(&self, phase: crate::observe::StallPhase, nanos: u64) {
        if phase == crate::observe::StallPhase::Sync {
            self.latency.record(nanos);
            #[cfg(feature = "metrics")]
            crate::observe::metrics::sync_took(nanos);
        }
        if nanos > self.stall_nanos {
            self.stalls.fetch_add(1, Ordering::Relaxed);
            let threshold = std::time::Duration::from_nanos(self.stall_nanos);
            self.events.emit(|| crate::observe::Event::CommitStall {
                phase,
                elapsed: std::time::Duration::from_nanos(nanos),
                threshold,
            });
        }
    }

    /// A write or sync failed and is latched.
    fn failed(&self, reason: &str) {
        self.events.emit(|| crate::observe::Event::SyncFailed {
            reason: reason.to_owned(),
        });
    }
}

pub struct Journal {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    /// The store's clock: the gathering wait and the sync timing read it (SPEC E9).
    clock: SharedClock,
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
    /// The newest segment that is *sealed*: it and every segment before it hold all the
    /// records they will ever hold, written, trimmed to their end and synced. Appenders move the
    /// tail on before any of that happens (records for the old tail may still be queued); the
    /// leader raises this mark once it has written, trimmed and synced the old tail and created
    /// the next segment. Compaction takes victims only up to it (SPEC S14).
    sealed_through: AtomicU32,
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
    /// Every sync's time, commit stalls, and where they are told (SPEC E8).
    pub watch: JournalWatch,
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
    /// Where the tail segment's records that no later frame proves durable begin (a bound at
    /// or before the first of them): only these can be in the page cache and not on disk after
    /// a killed process, so open rewrites and syncs the tail from here (SPEC S4; see
    /// `durability::sync_what_open_found`). `None`: the tail holds no scanned record.
    pub unproven_from: Option<u64>,
    /// How far the tail segment's file is known to hold zeros past its records (checked by the
    /// scan, to the end of the file; the tail offset when it ends at its records, 0 when not
    /// known). Trusted as prepared space only once open has synced the tail (see
    /// [`Journal::new`]): the first write then prepares no step it already has.
    pub prepared_end: u64,
}

/// `prepared` if it ends a whole step as the journal prepares them (see
/// [`preallocation_target`]), else 0: a tail cut elsewhere (a crash before its size was durable,
/// an earlier version) is sized again by its first write, as one with no zeros is.
fn whole_step(prepared: u64, segment_bytes: u64) -> u64 {
    match prepared.is_multiple_of(steps::PREALLOCATION_STEP) || prepared == segment_bytes {
        true => prepared,
        false => 0,
    }
}

impl Journal {
    pub fn new(
        dir: PathBuf,
        vfs: Arc<dyn Vfs>,
        clock: SharedClock,
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
            clock,
            policy,
            segment_bytes,
            state: Mutex::new(State {
                next_lsn,
                tail_segment: tail.tail_segment,
                tail_seed: tail.tail_seed,
                tail_offset: tail.tail_offset,
                queue: Queue::default(),
                spare: Queue::default(),
                written_lsn: next_lsn - 1,
                synced_lsn: next_lsn - 1,
                dirty: Vec::new(),
                last_file: None,
                leader_active: false,
                failed: None,
                sealed: false,
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
            // Recovery leaves every segment before the tail whole and synced.
            sealed_through: AtomicU32::new(tail.tail_segment.saturating_sub(1)),
            // Zeros open found after the tail's records and made durable; otherwise unknown
            // until the first write, which sizes the tail a step past its end (a tail trimmed
            // at close, cut at a torn tail or created by open).
            tail_sized: AtomicU64::new(whole_step(tail.prepared_end, segment_bytes)),
            sparse_steps: false,
            wrote: AtomicBool::new(false),
            files,
            readers: RwLock::new(()),
            counters: JournalCounters::default(),
            watch: JournalWatch::default(),
            #[cfg(feature = "fault-injection")]
            pin_switch: Default::default(),
        }
    }

    /// Tells `events` of stalls (a sync or gather slower than `stall_threshold`) and of a
    /// failed sync.
    pub fn with_events(
        mut self,
        events: crate::observe::Events,
        stall_threshold: std::time::Duration,
    ) -> Self {
        self.watch.events = events;
        self.watch.stall_nanos = stall_threshold.as_nanos().min(u64::MAX as u128) as u64;
        self
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
            st.queue.records += 1;
            // Under the mutex, so a gathering leader cannot miss it; and only once the leader's
            // wait is over, so it is not woken for every record.
            if st.gathering && st.queue.records >= self.active.load(Ordering::Acquire) {
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
            // Refused before anything changes: never a number a location cannot hold.
            st.tail_segment = format::next_segment(st.tail_segment)?;
            let salt = new_salt();
            st.tail_seed = format::salt_seed(salt);
            st.tail_offset = SEGMENT_HEADER_LEN;
            let number = st.tail_segment;
            st.queue.chunks.push(Chunk::NewSegment {
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
        st.queue.push(segment, offset, &header, body);
        let at = loc(segment, offset);
        on_placed(lsn, at);
        self.counters
            .bytes_appended
            .fetch_add(record_len, Ordering::Relaxed);
        self.counters.records.fetch_add(1, Ordering::Relaxed);
        Ok((lsn, at))
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

    /// The segment appends currently go to (only compaction's negative control asks).
    #[cfg(feature = "fault-injection")]
    pub fn tail_segment(&self) -> u32 {
        self.state.lock().tail_segment
    }

    /// The newest sealed segment (0: none): it and every segment before it hold every record
    /// they will hold, written, trimmed to their end and synced, so none has a record still
    /// queued or a write still to come. Only these may be compacted away.
    pub fn sealed_through(&self) -> u32 {
        self.sealed_through.load(Ordering::Acquire)
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
