//! Compaction: reclaims overwritten, deleted and truncated data, and lays scattered histories
//! out together (SPEC S7).
//!
//! A sealed segment (any but the one being appended to) can be deleted once no partition needs
//! it: no live value lives in it and no chain since a partition's newest base passes through
//! it. The victims are every sealed segment (on demand, or when garbage outweighs live data)
//! or only those `scatter` finds due. For every partition with a record in the victims,
//! compaction copies the values that still live there to the journal's tail, in key order and
//! adjacent (with the partition's other runs, smallest first, while each is no larger than
//! what is gathered so far, so its history is a few runs of the journal: see `movers`), and
//! writes a fresh base record; then it syncs, writes a heads snapshot past all of that, and
//! only then deletes the victims. A crash between any
//! two steps leaves extra data, never missing data. Writers of a partition wait only while that
//! one partition is rewritten; readers wait only while compaction waits, before deleting, for
//! the readers that took a location into a victim before it was moved (`Journal::pin`).
//! Segments are read through a bounded window and values copied in bounded records, so memory
//! does not grow with segment or partition size. See docs/DESIGN.md, "Compaction", for what is
//! guaranteed and what is not.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Inner;
use super::format::{self, FRAME_LEN, Loc, RecordKind, SEGMENT_HEADER_LEN, ValueLoc, loc_segment};
use super::journal::segment_file_name;
use super::partition::{self, PartState};
use super::values::MERGE_GAP;
use super::window::Window;
use crate::error::{Error, Result};
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
    /// Partitions whose live data was copied forward.
    pub partitions_rewritten: u64,
    /// Bytes of live values copied.
    pub bytes_copied: u64,
    /// Bytes of segment files deleted.
    pub bytes_removed: u64,
}

/// Whether enough garbage has piled up to be worth a background compaction.
pub(super) fn worth_compacting(inner: &Inner) -> bool {
    let garbage = inner.garbage_bytes.load(Ordering::Relaxed);
    if garbage < 2 * inner.config.segment_bytes {
        return false;
    }
    let segments = inner.journal.live_segments().len() as u64;
    if segments < 3 {
        return false;
    }
    garbage * 2 > segments * inner.config.segment_bytes
}

/// Counts the compactions started by themselves (on the rayon pool) and those finished.
#[derive(Default)]
pub(super) struct Background {
    counts: parking_lot::Mutex<(u64, u64)>,
    finished: parking_lot::Condvar,
}

impl Background {
    /// Background compactions started since open.
    #[cfg(feature = "test-hooks")]
    pub(super) fn started(&self) -> u64 {
        self.counts.lock().0
    }

    /// Waits until every background compaction started so far has finished.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
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
    /// Every sealed segment (on demand, or when garbage outweighs live data).
    All,
    /// Only the sealed segments that are scattered or half moved out (see `scatter`).
    Scattered,
}

/// What a background compaction should take now, if anything.
fn pick(inner: &Inner) -> Option<Pick> {
    if worth_compacting(inner) {
        return Some(Pick::All);
    }
    scattered_due(inner).then_some(Pick::Scattered)
}

/// Whether a sealed segment is due because it is scattered (see `scatter`).
fn scattered_due(inner: &Inner) -> bool {
    let tail = inner.journal.tail_segment();
    !inner.scatter.due(tail).is_empty()
}

/// Runs compactions on the rayon pool unless one is already running: what [`pick`] chooses,
/// then the scattered segments for as long as any are due. (A compaction started by garbage
/// is not repeated here: the estimate may stay high when the garbage is in segments no
/// compaction takes, and the next commit asks again anyway.)
pub(super) fn spawn(inner: &Arc<Inner>) {
    if inner.compaction_running.swap(true, Ordering::AcqRel) {
        return;
    }
    inner.background.counts.lock().0 += 1;
    let inner = inner.clone();
    rayon::spawn(move || {
        let mut next = pick(&inner);
        while let Some(what) = next {
            // A panic must not unwind out of a rayon task (it would abort the process).
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compact(&inner, what)));
            match outcome {
                Ok(Ok(report)) => log::info!("background compaction ({what:?}): {report:?}"),
                Ok(Err(Error::Closed)) => break,
                Ok(Err(e)) => {
                    log::warn!("background compaction failed: {e}");
                    break;
                }
                Err(_) => {
                    log::error!("background compaction panicked; it will be retried later");
                    break;
                }
            }
            next = scattered_due(&inner).then_some(Pick::Scattered);
        }
        inner.compaction_running.store(false, Ordering::Release);
        // A segment may have become due after the last look and before the flag was cleared,
        // when no commit came to start another run: look once more (counted before this run
        // counts as finished, so waiting for background compactions waits for it too).
        if inner.config.auto_compact && inner.check_open().is_ok() && scattered_due(&inner) {
            spawn(&inner);
        }
        inner.background.counts.lock().1 += 1;
        inner.background.finished.notify_all();
    });
}

pub(super) fn compact(inner: &Inner, what: Pick) -> Result<CompactionReport> {
    let _one_at_a_time = inner.compaction_lock.lock();
    // Close waits for this lock; a compaction must not start on a closed store.
    inner.check_open()?;
    let tail = inner.journal.tail_segment();
    let due: HashSet<u32> = match what {
        Pick::All => HashSet::new(),
        Pick::Scattered => inner.scatter.due(tail).into_iter().collect(),
    };
    let victims: Vec<u32> = inner
        .journal
        .live_segments()
        .into_iter()
        .filter(|&n| n < tail && (what == Pick::All || due.contains(&n)))
        .collect();
    // Taken: deleted below, or kept as evidence; either way not due again.
    inner
        .scatter
        .forget(victims.iter().chain(due.iter()).copied());
    let mut report = CompactionReport::default();
    if victims.is_empty() {
        return Ok(report);
    }
    let victim_set: HashSet<u32> = victims.iter().copied().collect();
    let mut keep: HashSet<u32> = HashSet::new();

    let mut found: Vec<(u32, HashSet<Vec<u8>>)> = Vec::new();
    for &number in &victims {
        match partitions_in_segment(inner, number) {
            Ok(names) => found.push((number, names)),
            Err(e) => {
                log::warn!("compaction keeps segment {number}: {e}");
                keep.insert(number);
            }
        }
    }
    // Bytes of values copied from outside the victims (their old copies are garbage now).
    let mut gathered = 0u64;
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
            Ok((copied, from_outside)) => {
                report.partitions_rewritten += 1;
                report.bytes_copied += copied;
                gathered += from_outside;
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

    // The estimate drops by what the deletions below reclaim before the snapshot records it,
    // so a restart does not find the garbage of deleted segments still counted.
    let mut doomed = Vec::new();
    for &number in victims.iter().filter(|n| !keep.contains(n)) {
        let size = inner.journal.segment(number)?.file.len().unwrap_or(0);
        doomed.push((number, size));
    }
    let reclaimed = doomed
        .iter()
        .map(|(_, size)| size)
        .sum::<u64>()
        .saturating_sub(report.bytes_copied - gathered);
    let _ = inner
        .garbage_bytes
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |g| {
            Some(g.saturating_sub(reclaimed))
        });

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
    let mut names = HashSet::new();
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
/// nothing of the partition needs the victims any more. Returns the bytes copied, and how many
/// of them were gathered from outside the victims (see [`movers`]).
fn rewrite_partition(
    inner: &Inner,
    state: &PartState,
    victims: &HashSet<u32>,
) -> Result<(u64, u64)> {
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
    // Where the gathered values come from: their old copies are dead, which may make that
    // segment due (see `scatter`).
    let mut moved_out: HashMap<u32, u64> = HashMap::new();
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
        let ops: Vec<Op> = chunk
            .iter()
            .zip(values)
            .map(|((k, _), value)| Op::Put(k.to_vec(), value))
            .collect();
        let (body, offsets) =
            format::encode_batch_body(state.name.as_bytes(), partition::head_of(state), &ops);
        let (lsn, at) = inner
            .journal
            .append(RecordKind::Batch, state.hash, &body, |lsn, at| {
                state.place_head(lsn, at)
            })?;
        drop((ops, body));
        // Each copy is written before the next is read, so the journal's queue holds one
        // copy record at a time, not a partition's worth (the sync it may cost is one per
        // COPY_RECORD_BYTES copied).
        inner.journal.wait_durable(lsn)?;
        commit.chain_len += 1;
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
    inner.garbage_bytes.fetch_add(gathered, Ordering::Relaxed);
    for (segment, bytes) in moved_out {
        inner.scatter.note_moved(segment, bytes);
    }
    let view = parking_lot::RwLockWriteGuard::downgrade(view);
    inner.write_base(state, &mut commit, &view.index)?;
    Ok((copied, gathered))
}

type Mover = (Box<[u8]>, ValueLoc);

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
    let mut gathered: HashSet<Loc> = HashSet::new();
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
mod tests {
    use super::*;
    use crate::store::file::format::loc;

    fn index(values: &[(&str, u32, u64, u32)]) -> partition::Index {
        values
            .iter()
            .map(|&(k, segment, offset, len)| {
                let v = ValueLoc {
                    at: loc(segment, offset),
                    len,
                    crc: 0,
                };
                (Box::from(k.as_bytes()), v)
            })
            .collect()
    }

    fn keys(movers: &[Mover]) -> Vec<&str> {
        movers
            .iter()
            .map(|(k, _)| std::str::from_utf8(k).unwrap())
            .collect()
    }

    /// Runs are gathered smallest first while each is no larger than what is gathered so far;
    /// a larger run stays where it is.
    #[test]
    fn runs_are_gathered_smallest_first_while_no_larger_than_the_total() {
        let victims: HashSet<u32> = [5].into_iter().collect();
        let index = index(&[
            // An old run of 400 bytes in segment 2, a lone value far from it, one of 100 in
            // segment 3.
            ("a", 2, 1000, 200),
            ("b", 2, 1200, 200),
            ("g", 2, 900_000, 60),
            ("c", 3, 500, 100),
            // 150 bytes in the victim.
            ("d", 5, 100, 150),
            // Two lone values in segment 7, far apart: two runs of 50.
            ("e", 7, 100, 50),
            ("f", 7, 900_000, 50),
        ]);
        let (movers, gathered) = movers(&index, &victims);
        // 150, then 50, 50, 60 and 100 join (each no more than the total so far: 410); the
        // run of 400 does too; nothing is left.
        assert_eq!(keys(&movers), vec!["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!(gathered, 660);
        // With less in the victims the large run stays: 60, then 50, 50, 60, 100 (total 320).
        let mut small = index.clone();
        small.get_mut(&b"d"[..]).unwrap().len = 60;
        let (moved, gathered) = super::movers(&small, &victims);
        assert_eq!(keys(&moved), vec!["c", "d", "e", "f", "g"]);
        assert_eq!(gathered, 260);
        // Nothing in the victims: nothing moves.
        let (movers, gathered) = movers_of_none(&index);
        assert!(movers.is_empty() && gathered == 0);
    }

    fn movers_of_none(index: &partition::Index) -> (Vec<Mover>, u64) {
        movers(index, &[9].into_iter().collect())
    }
}
