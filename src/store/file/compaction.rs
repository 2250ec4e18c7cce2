//! Compaction: reclaims overwritten, deleted and truncated data, and lays scattered histories
//! out together (SPEC S7).
//!
//! A sealed segment (one the group-commit leader has finished with: every record in it written,
//! the segment trimmed and synced; see `Journal::sealed_through`) can be deleted once no
//! partition needs it: no live value lives in it and no chain since a partition's newest base
//! passes through it. The victims are every sealed segment (on demand) or only those that are
//! due: scattered (see `scatter`) or a third dead (see `space`). For every partition with a
//! record in the victims whose values or chain need them (a partition that needs nothing there
//! is left alone: see [`rewrite_partition`]), compaction copies the values that still live
//! there to the journal's tail, in key order and end to end, in values records (with the
//! partition's other runs, smallest first, while each is no larger than what is gathered so
//! far, so its history is a few runs of the journal: see `movers`), and writes a fresh base
//! record; then it syncs, writes a heads snapshot past all of that, and only then deletes the
//! victims. A crash between any
//! two steps leaves extra data, never missing data. Writers of a partition wait only while that
//! one partition is rewritten; readers wait only while compaction waits, before deleting, for
//! the readers that took a location into a victim before it was moved (`Journal::pin`).
//! Segments are read through a bounded window and values copied in bounded records, so memory
//! does not grow with segment or partition size. See docs/DESIGN.md, "Compaction", for what is
//! guaranteed and what is not.

use crate::sync::atomic::Ordering;
use crate::sync::{HashMap, HashSet};
use std::sync::Arc;

use super::Inner;
use super::format::{self, FRAME_LEN, Loc, RecordKind, SEGMENT_HEADER_LEN, ValueLoc, loc_segment};
use super::journal::segment_file_name;
use super::partition::{self, PartState};
use super::values::MERGE_GAP;
use super::window::Window;
use crate::error::{Error, Result};
use crate::observe::CompactionTrigger;
use crate::store::{Op, Partition};

/// Values copied per rewrite record, so no record approaches the batch limit.
const COPY_RECORD_BYTES: usize = 8 << 20;

/// What one compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactionReport {
    /// Segment files deleted.
    pub segments_removed: u32,
    /// Segments kept because they hold damaged records or records of a corrupt partition.
    pub segments_kept: u32,
    /// Segments left for a later compaction because reading them failed (an I/O error, not
    /// damage); they stay due.
    pub segments_skipped: u32,
    /// Partitions whose live data was copied forward.
    pub partitions_rewritten: u64,
    /// Bytes of live values copied.
    pub bytes_copied: u64,
    /// Bytes of segment files deleted.
    pub bytes_removed: u64,
}

/// Whether a segment below `tail` may be due, scattered or mostly dead (no lock: a commit
/// asks after every append).
pub(super) fn maybe_due(inner: &Inner, tail: u32) -> bool {
    inner.scatter.maybe_due(tail) || inner.space.maybe_due(tail)
}

/// Counts the compactions started by themselves (on the rayon pool) and those finished.
#[derive(Default)]
pub(super) struct Background {
    counts: crate::sync::Mutex<(u64, u64)>,
    finished: crate::sync::Condvar,
}

impl Background {
    /// Background compactions started since open.
    #[cfg(feature = "test-hooks")]
    pub(super) fn started(&self) -> u64 {
        self.counts.lock().0
    }

    /// Waits until every background compaction started so far has finished.
    pub(super) fn wait_idle(&self) {
        let mut counts = self.counts.lock();
        while counts.1 < counts.0 {
            self.finished.wait(&mut counts);
        }
    }
}

/// Which sealed segments a compaction takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    /// Every sealed segment (on demand).
    All,
    /// Only the sealed segments that are due: scattered or half moved out (see `scatter`),
    /// or half dead (see `space`).
    Due,
}

/// The sealed segments that are due, oldest first.
fn due(inner: &Inner, sealed: u32) -> Vec<u32> {
    let mut due = inner.scatter.due(sealed + 1);
    due.extend(inner.space.due(sealed + 1));
    due.sort_unstable();
    due.dedup();
    due
}

/// Whether a sealed segment is due.
fn any_due(inner: &Inner) -> bool {
    !due(inner, sealed_through(inner)).is_empty()
}

/// The newest segment compaction may take: the newest the journal has sealed (every record
/// written, trimmed and synced; SPEC S14). An appender moves the tail on before the records
/// queued for the old one are written, so "below the tail" is not enough.
fn sealed_through(inner: &Inner) -> u32 {
    #[cfg(feature = "fault-injection")]
    if inner
        .config
        .skip_syncs
        .contains(&super::SkipSync::SealedVictims)
    {
        return inner.journal.tail_segment().saturating_sub(1);
    }
    inner.journal.sealed_through()
}

/// Runs compactions of the due segments on the rayon pool unless one is already running, for
/// as long as any are due and each one takes some. One that fails, or takes nothing (every
/// victim's read failed), ends the run: its victims stay due, and the next commit asks again
/// (starting again at once would fail again, for as long as the store lives).
pub(super) fn spawn(inner: &Arc<Inner>) {
    if inner.compaction_running.swap(true, Ordering::AcqRel) {
        return;
    }
    inner.background.counts.lock().0 += 1;
    let inner = inner.clone();
    let spawner = inner.config.spawner.clone();
    spawner.spawn(move || {
        let mut next = any_due(&inner);
        let mut stuck = false;
        while next {
            // A panic must not unwind out of a rayon task (it would abort the process).
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                compact(&inner, Pick::Due)
            }));
            match outcome {
                Ok(Ok(report)) => {
                    log::info!("background compaction: {report:?}");
                    if report.segments_removed + report.segments_kept == 0 {
                        stuck = true;
                        break;
                    }
                }
                Ok(Err(Error::Closed)) => break,
                Ok(Err(e)) => {
                    log::warn!("background compaction failed: {e}");
                    stuck = true;
                    break;
                }
                Err(_) => {
                    log::error!("background compaction panicked; it will be retried later");
                    stuck = true;
                    break;
                }
            }
            next = any_due(&inner);
        }
        inner.compaction_running.store(false, Ordering::Release);
        // A segment may have become due after the last look and before the flag was cleared,
        // when no commit came to start another run: look once more (counted before this run
        // counts as finished, so waiting for background compactions waits for it too). Not
        // after a failure: that is for the next commit to retry.
        if !stuck && inner.config.auto_compact && inner.check_open().is_ok() && any_due(&inner) {
            spawn(&inner);
        }
        inner.background.counts.lock().1 += 1;
        inner.background.finished.notify_all();
        // Counted as finished first: a listener may wait for background compactions.
        inner.deliver_in_background();
    });
}

/// Runs one compaction (see [`compact_victims`]) and tells the listener what became of it once
/// it has taken victims (SPEC E8).
pub(super) fn compact(inner: &Inner, what: Pick) -> Result<CompactionReport> {
    let trigger = match what {
        Pick::All => CompactionTrigger::OnDemand,
        Pick::Due => CompactionTrigger::Background,
    };
    let _span = crate::observe::span!("portcullis.compaction", trigger = format!("{trigger:?}"));
    let mut took = None;
    let outcome = compact_victims(inner, what, trigger, &mut took);
    if let Some(started) = took {
        inner.compaction_ended(
            trigger,
            &outcome,
            inner
                .config
                .clock
                .instant()
                .saturating_duration_since(started),
        );
    }
    outcome
}

/// Compacts the sealed segments `what` picks; sets `took` once it has taken victims.
fn compact_victims(
    inner: &Inner,
    what: Pick,
    trigger: CompactionTrigger,
    took: &mut Option<std::time::Instant>,
) -> Result<CompactionReport> {
    #[cfg(feature = "fault-injection")]
    let _one_at_a_time = match inner.compaction_lock.try_lock() {
        Some(held) => held,
        None => {
            if let Some(observe) = &inner.config.compaction_wait_observer {
                (observe.0)();
            }
            inner.compaction_lock.lock()
        }
    };
    #[cfg(not(feature = "fault-injection"))]
    let _one_at_a_time = inner.compaction_lock.lock();
    // Close waits for this lock; a compaction must not start on a closed store.
    inner.check_open()?;
    let sealed = sealed_through(inner);
    let live = inner.journal.live_segments();
    let due: HashSet<u32> = match what {
        Pick::All => HashSet::default(),
        Pick::Due => due(inner, sealed).into_iter().collect(),
    };
    // Due segments that are gone (deleted, or found damaged) are due no more.
    let gone: Vec<u32> = due.iter().copied().filter(|n| !live.contains(n)).collect();
    inner.scatter.forget(gone.iter().copied());
    inner.space.forget(gone);
    let mut victims: Vec<u32> = live
        .into_iter()
        .filter(|&n| n <= sealed && (what == Pick::All || due.contains(&n)))
        .collect();
    let mut report = CompactionReport::default();
    // Segments that hold damage or a corrupt partition's records: kept as evidence.
    let mut keep: HashSet<u32> = HashSet::default();

    let mut found: Vec<(u32, HashSet<Vec<u8>>)> = Vec::new();
    let mut retry: Vec<u32> = Vec::new();
    for &number in &victims {
        match partitions_in_segment(inner, number) {
            Ok(names) => found.push((number, names)),
            Err(e @ (Error::Corrupt { .. } | Error::UnsupportedVersion { .. })) => {
                log::warn!("compaction keeps segment {number}: {e}");
                keep.insert(number);
            }
            Err(e) => {
                // Not damage (a failed read): the segment stays, and stays due, for the next
                // compaction to read again.
                log::warn!("compaction leaves segment {number} for later: {e}");
                retry.push(number);
            }
        }
    }
    victims.retain(|n| !retry.contains(n));
    report.segments_skipped = retry.len() as u32;
    let victim_set: HashSet<u32> = victims.iter().copied().collect();
    #[cfg(feature = "fault-injection")]
    if let Some(observe) = &inner.config.compaction_observer {
        (observe.0)(&victims);
    }
    if victims.is_empty() {
        return Ok(report);
    }
    *took = Some(inner.config.clock.instant());
    inner.compaction_started(trigger, victims.len());
    let mut names: Vec<&Vec<u8>> = found.iter().flat_map(|(_, names)| names).collect();
    names.sort();
    names.dedup();

    for name in names {
        let Ok(p) = Partition::new(name) else {
            continue;
        };
        // Rewriting loads each partition: keep the loaded indexes within their budget.
        inner.unload_idle();
        // A partition a damaged heads snapshot page refuses keeps its segments, like any other
        // that cannot be loaded.
        let rewritten = match inner.part(&p, false) {
            Ok(None) => continue,
            Ok(Some(state)) => rewrite_partition(inner, &state, &victim_set),
            Err(e) => Err(e),
        };
        match rewritten {
            // Nothing of it in the victims: its chain and values lie elsewhere.
            Ok(None) => {}
            Ok(Some(copied)) => {
                report.partitions_rewritten += 1;
                report.bytes_copied += copied;
            }
            Err(Error::Corrupt { .. }) => {
                // Keep the evidence: the segments holding a corrupt partition's records stay.
                for (number, names) in &found {
                    if names.contains(name) {
                        keep.insert(*number);
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }

    let mut doomed = Vec::new();
    for &number in victims.iter().filter(|n| !keep.contains(n)) {
        let size = inner.journal.segment(number)?.file.len().unwrap_or(0);
        doomed.push((number, size));
    }

    // Everything copied must be durable, and the snapshot must point past it, before any
    // victim disappears. The manifest written with it records which segments go, so a rebuild
    // can tell these gaps from a loss (SPEC S4).
    inner
        .damage
        .lock()
        .retire(victims.iter().copied().filter(|n| !keep.contains(n)));
    inner.journal.sync_all()?;
    inner.write_snapshot()?;

    // Every index now points away from the victims; wait for readers that took a location
    // before that, so none reads a deleted segment.
    inner.journal.wait_for_readers();
    let journal_dir = inner.config.dir.join(super::JOURNAL_DIR);
    let vfs = &*inner.config.vfs;
    report.segments_kept = (victims.len() - doomed.len()) as u32;
    for (number, size) in doomed {
        let path = journal_dir.join(segment_file_name(number));
        vfs.remove(&path)
            .map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
        inner.journal.retire_segment(number);
        report.segments_removed += 1;
        report.bytes_removed += size;
    }
    vfs.sync_dir(&journal_dir)
        .map_err(|e| Error::io(format!("syncing {}", journal_dir.display()), e))?;
    // Taken: deleted, or kept as evidence; either way not due again. A compaction that failed
    // before this point leaves every victim due, for the next one to take. (The snapshot
    // above still counts the victims; the next open counts only segments that are there.)
    inner.scatter.forget(victims.iter().copied());
    inner.space.forget(victims.iter().copied());
    inner.compactions.fetch_add(1, Ordering::Relaxed);
    log::debug!("compaction: {report:?}");
    Ok(report)
}

/// The names of the partitions with a record in a segment, read through a bounded window, up
/// to the end of its records. Fails on any damage.
fn partitions_in_segment(inner: &Inner, number: u32) -> Result<HashSet<Vec<u8>>> {
    let segment = inner.journal.segment(number)?;
    let io = |e| Error::io(format!("reading segment {number}"), e);
    let len = segment.file.len().map_err(io)?;
    let mut window = Window::new(&*segment.file, len);
    let mut names = HashSet::default();
    let mut at = SEGMENT_HEADER_LEN;
    while at < len {
        let damaged = || {
            Error::corrupt(
                format!("journal segment {number}"),
                format!("damaged record at offset {at}"),
            )
        };
        let Some(frame) =
            format::decode_frame(segment.seed, window.get(at, FRAME_LEN).map_err(io)?)
        else {
            // A sealed segment is trimmed to its records when the next one starts; should one
            // still carry its preallocated zeros, its records end where they begin.
            if at + window.zeros_from(at).map_err(io)? >= len {
                break;
            }
            return Err(damaged());
        };
        let body_at = at + FRAME_LEN as u64;
        let body_len = frame.body_len as u64;
        if body_at + body_len > len {
            return Err(damaged());
        }
        // The name comes first in the body: 1 byte of length, at most 255 bytes, a location.
        let head = window
            .get(body_at, body_len.min(format::BODY_HEAD_MAX as u64) as usize)
            .map_err(io)?;
        let (name, _) = format::decode_body_head(head).ok_or_else(damaged)?;
        names.insert(name.to_vec());
        let crc = window.crc(body_at, body_len).map_err(io)?;
        if crc != Some(frame.body_crc) {
            return Err(damaged());
        }
        at = body_at + body_len;
    }
    Ok(names)
}

/// Copies a partition's values that live in `victims` to the tail and writes a base record, so
/// nothing of the partition needs the victims any more. Returns the bytes copied, or `None`
/// when nothing of the partition needs a victim (no value lives there and its chain since its
/// newest base does not pass through one: its records there are garbage already), which it
/// then leaves alone.
fn rewrite_partition(
    inner: &Inner,
    state: &PartState,
    victims: &HashSet<u32>,
) -> Result<Option<u64>> {
    // Hold the partition's commit lock with no batch in flight, so the index is complete.
    let mut commit = loop {
        let mut commit = state.commit.lock();
        inner.load_locked(state, &mut commit)?;
        match commit.pending.back().map(|p| p.lsn) {
            None => break commit,
            Some(lsn) => {
                drop(commit);
                inner.journal.wait_durable(lsn)?;
                inner.fold(state, &mut state.commit.lock());
            }
        }
    };
    let (movers, gathered) = movers(&state.view.read().index, victims);
    let needs_chain = inner.space.checks_chains() && commit.chain.passes_through(victims);
    if movers.is_empty() && !needs_chain {
        return Ok(None);
    }
    // Where the gathered values come from: their old copies are dead, which may make that
    // segment due (see `scatter`).
    let mut moved_out: HashMap<u32, u64> = HashMap::default();
    for (_, v) in movers
        .iter()
        .filter(|(_, v)| !victims.contains(&loc_segment(v.at)))
    {
        *moved_out.entry(loc_segment(v.at)).or_default() += v.len as u64;
    }
    let mut copied = 0u64;
    let mut moved: Vec<Mover> = Vec::with_capacity(movers.len());
    for chunk in chunk_by_bytes(&movers) {
        let locs: Vec<ValueLoc> = chunk.iter().map(|(_, v)| *v).collect();
        let values = inner.read_values(state, &locs)?;
        let (kind, body, offsets) = copy_record(inner, state, chunk, values);
        let (lsn, at) = inner
            .journal
            .append(kind, state.hash, &body, |lsn, at| state.place_head(lsn, at))?;
        let values: u64 = chunk.iter().map(|(_, v)| v.len as u64).sum();
        commit
            .chain
            .push(at, (FRAME_LEN + body.len()) as u64 - values);
        drop(body);
        // Each copy is written before the next is read, so the journal's queue holds one
        // copy record at a time, not a partition's worth (the sync it may cost is one per
        // COPY_RECORD_BYTES copied).
        inner.journal.wait_durable(lsn)?;
        for ((k, v), offset) in chunk.iter().zip(offsets) {
            copied += v.len as u64;
            let at = at + FRAME_LEN as u64 + offset as u64;
            moved.push((k.clone(), ValueLoc { at, ..*v }));
        }
    }
    let mut view = state.view.write();
    for (k, v) in moved {
        view.index.insert(k, v);
    }
    // The old copies of values gathered from outside the victims are garbage now.
    debug_assert_eq!(moved_out.values().sum::<u64>(), gathered);
    for (&segment, &bytes) in &moved_out {
        inner.scatter.note_moved(segment, bytes);
    }
    inner.space.add_all(moved_out);
    let view = crate::sync::RwLockWriteGuard::downgrade(view);
    inner.write_base(state, &mut commit, &view.index)?;
    Ok(Some(copied))
}

type Mover = (Box<[u8]>, ValueLoc);

/// The record that carries one chunk of a partition's copied values, and each value's offset
/// in its body: a values record (no keys: the base written after it names every value), or,
/// when the store writes format version 2 records (tests only), a batch of puts.
fn copy_record(
    inner: &Inner,
    state: &PartState,
    chunk: &[Mover],
    values: Vec<Vec<u8>>,
) -> (RecordKind, Vec<u8>, Vec<u32>) {
    let (name, prev) = (state.name.as_bytes(), partition::head_of(state));
    if !inner.space.packed() {
        let ops: Vec<Op> = chunk
            .iter()
            .zip(values)
            .map(|((k, _), value)| Op::Put(k.to_vec(), value))
            .collect();
        let (body, offsets) = format::encode_batch_body(name, prev, &ops);
        return (RecordKind::Batch, body, offsets);
    }
    let mut offsets = Vec::with_capacity(values.len());
    let mut end = format::values_head_len(name);
    for v in &values {
        offsets.push(end as u32);
        end += v.len();
    }
    let len = end - format::values_head_len(name);
    let body = format::encode_values_body(name, prev, values.iter().map(Vec::as_slice), len);
    (RecordKind::Values, body, offsets)
}

/// The values of a partition to copy, in key order: those in the victims, and with them its
/// other *runs* (values one read takes together: one segment, at most [`MERGE_GAP`] apart),
/// smallest first, for as long as each is no more bytes than everything gathered so far.
/// Every gathered run thus lands in one at least twice its size, so a value is copied by
/// gathering at most log2(partition bytes / its first run) times, and the runs left are
/// larger than all that was gathered: a history read is a few large reads. Returns them and
/// the bytes of the values gathered from outside.
fn movers(index: &partition::Index, victims: &HashSet<u32>) -> (Vec<Mover>, u64) {
    let mut inside = 0u64;
    let mut outside: Vec<&ValueLoc> = Vec::new();
    for v in index.values() {
        if victims.contains(&loc_segment(v.at)) {
            inside += v.len as u64;
        } else {
            outside.push(v);
        }
    }
    let mut gathered: HashSet<Loc> = HashSet::default();
    let mut total = inside;
    if inside > 0 {
        outside.sort_unstable_by_key(|v| v.at);
        // Runs as (bytes, first, last) indexes into `outside`.
        let mut runs: Vec<(u64, usize, usize)> = Vec::new();
        for (i, v) in outside.iter().enumerate() {
            match runs.last_mut() {
                Some((bytes, _, last))
                    if {
                        let prev = outside[*last];
                        loc_segment(prev.at) == loc_segment(v.at)
                            && v.at <= prev.at + prev.len as u64 + MERGE_GAP
                    } =>
                {
                    *bytes += v.len as u64;
                    *last = i;
                }
                _ => runs.push((v.len as u64, i, i)),
            }
        }
        runs.sort_unstable_by_key(|&(bytes, first, _)| (bytes, first));
        for (bytes, first, last) in runs {
            if bytes > total {
                break;
            }
            total += bytes;
            gathered.extend(outside[first..=last].iter().map(|v| v.at));
        }
    }
    let movers = index
        .iter()
        .filter(|(_, v)| victims.contains(&loc_segment(v.at)) || gathered.contains(&v.at))
        .map(|(k, v)| (Box::from(k), *v))
        .collect();
    (movers, total - inside)
}

fn chunk_by_bytes(entries: &[Mover]) -> Vec<&[Mover]> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut bytes = 0usize;
    for (i, (k, v)) in entries.iter().enumerate() {
        let size = k.len() + v.len as usize;
        if i > start && bytes + size > COPY_RECORD_BYTES {
            chunks.push(&entries[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < entries.len() {
        chunks.push(&entries[start..]);
    }
    chunks
}

#[cfg(test)]
mod tests;
