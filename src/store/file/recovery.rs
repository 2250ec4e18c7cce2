//! Opening a journal after a clean close or a crash (SPEC S4, S5).
//!
//! Open reads the manifest, the heads snapshot it names, and only the journal written after
//! that snapshot, updating partition heads. Recovery then tells a torn tail from damage:
//!
//! - a bad record in the last segment with nothing valid after it, or with only records framed
//!   before it was known durable, is a torn tail: it and everything after it were never
//!   acknowledged; they are truncated and logged;
//! - anything else that breaks the journal after the snapshot (a bad record in a sealed
//!   segment, a segment whose header is damaged, a missing segment, a gap in sequence numbers)
//!   is a *damaged range*. Compaction never deletes a segment at or after the snapshot's
//!   position (it writes a snapshot past its victims before deleting them), so every gap there
//!   is a loss. A range that provably held exactly one record of a known partition refuses that
//!   partition. Any other range is unattributed: every partition that may have had a record in
//!   it is refused (it has no later record whose chain link or base proves otherwise), and so
//!   is every partition the store does not know, until an operator accepts the damage. Nothing
//!   is ever rolled back silently.
//!
//! Each segment is read through a bounded [`Window`], so open holds about a megabyte whatever
//! the size of a segment or a record.
//!
//! What recovery finds is returned as a [`Damage`], which the store persists with every heads
//! snapshot and manifest so that a refusal survives close and reopen.
//!
//! This module owns the scan and its verdicts; `segment_files` lists and opens the segments
//! and checks their headers, `probe` asks the bytes of one segment what they hold.

mod probe;
mod segment_files;

use std::collections::{HashMap, VecDeque};
use std::path::Path;

pub use super::damage::Damage;
use super::damage::{Ranges, at_str, shown};
use super::format::{
    FRAME_LEN, Loc, SEGMENT_HEADER_LEN, loc, loc_offset, loc_segment, partition_hash,
};
use super::heads::Pages;
use super::journal::{JournalTail, create_segment, new_salt};
use super::vfs::Vfs;
use super::window::Window;
use crate::error::{Error, Result};
use probe::{Probe, attribute, find_valid, probe, written_end, zeros_to_end};
pub use segment_files::{Segments, list_segments, open_segments_with};

/// A damaged record or range found at open.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DamagedRecord {
    /// Segment number.
    pub segment: u32,
    /// Byte offset in the segment.
    pub offset: u64,
    /// The partition it belongs to, when that could be established.
    pub partition: Option<String>,
    /// What was found.
    pub detail: String,
}

/// A torn tail truncated at open.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TornTail {
    /// Segment number.
    pub segment: u32,
    /// Where the segment was cut.
    pub offset: u64,
    /// Bytes dropped (in that segment and any later ones).
    pub bytes_dropped: u64,
}

/// The partitions the store knows before the scan: damage the scan cannot attribute may
/// refuse any of them.
pub struct Known<'a> {
    /// Heads the scan updates (every head, for a whole-file snapshot).
    pub heads: HashMap<Box<[u8]>, Loc>,
    /// The pages of a paged heads snapshot, whose heads the scan does not load.
    pub pages: Option<&'a Pages>,
}

pub struct ScanOutcome {
    pub tail: JournalTail,
    pub heads: HashMap<Box<[u8]>, Loc>,
    /// Damage found by this scan.
    pub damage: Damage,
    pub records: Vec<DamagedRecord>,
    pub torn_tail: Option<TornTail>,
    pub bytes_scanned: u64,
    pub records_scanned: u64,
}

/// How many records not yet proven durable the scan marks one by one (16 bytes each); past
/// that it rewrites more than it must, never less.
const UNPROVEN_MARKS: usize = 4096;

/// Scans the journal from `start` (segment, offset) and LSN `start_lsn` (None: accept the
/// first valid record's LSN), updating the heads of `partitions`.
pub fn scan(
    vfs: &dyn Vfs,
    journal_dir: &Path,
    segments: Segments,
    start: Option<(u32, u64)>,
    start_lsn: Option<u64>,
    partitions: Known<'_>,
    known: &Damage,
) -> Result<ScanOutcome> {
    let Known { mut heads, pages } = partitions;
    let Segments {
        live: mut segments,
        damaged,
        unchecked,
        lens,
        zero_end_check,
        proof_slack,
    } = segments;
    let mut ranges = Ranges::default();
    let mut records = Vec::new();
    let mut torn_tail = None;
    let mut expected = start_lsn;
    let mut bytes_scanned = 0u64;
    let mut records_scanned = 0u64;
    let mut numbers: Vec<u32> = segments
        .keys()
        .chain(damaged.keys())
        .chain(&unchecked)
        .copied()
        .collect();
    numbers.sort_unstable();
    let last_live = segments.keys().next_back().copied();
    let first = numbers.first().copied().unwrap_or(1);
    let (start_segment, start_offset) = start.unwrap_or((first, SEGMENT_HEADER_LEN));
    let mut end_of_tail = SEGMENT_HEADER_LEN;
    // The newest LSN any scanned frame says was durable when it was framed: a process frames
    // that only after a sync through it succeeded, so those records are on disk.
    let mut claimed = 0u64;
    // Records of the segment being scanned that no frame proved durable when they were read,
    // as (LSN, offset): every one while there are fewer than `UNPROVEN_MARKS` (more only under
    // the weaker sync policies, which sync seldom), then only one after a proven mark. The
    // front is always at or before the first record not proven yet.
    let mut unproven: VecDeque<(u64, u64)> = VecDeque::new();
    let mut thinned = false;
    // How far the segment last scanned is known to hold its records or zeros (checked).
    let mut checked_end: Option<(u32, u64)> = None;
    // Where the last valid record ended: a damaged range starts there.
    let mut last_end = loc(start_segment, start_offset);
    let mut previous = start_segment.saturating_sub(1);
    // Where each segment's written data ends: its length, or where the zeros of its
    // preallocated, never written end begin.
    let mut data_ends: HashMap<u32, u64> = lens.clone();
    // A record ending at `end` ends exactly where `to` begins, or at the end of the journal.
    let ends_at = |data_ends: &HashMap<u32, u64>, end: Loc, to: Option<Loc>| {
        let seg = loc_segment(end);
        let at_data_end = data_ends.get(&seg) == Some(&loc_offset(end));
        match to {
            Some(to) => end == to || (at_data_end && to == loc(seg + 1, SEGMENT_HEADER_LEN)),
            None => at_data_end && numbers.last() == Some(&seg),
        }
    };

    let mut i = 0;
    'segments: while i < numbers.len() {
        let number = numbers[i];
        i += 1;
        if number < start_segment {
            // Snapshotted history, not opened at all (its headers are checked on first use):
            // loads and reads that need a damaged segment refuse; nothing else does.
            if let Some(d) = damaged.get(&number) {
                records.push(DamagedRecord {
                    segment: number,
                    offset: 0,
                    partition: None,
                    detail: format!("segment {number} has a damaged header: {}", d.reason),
                });
            }
            continue;
        }
        // After segments compaction deleted, LSNs may skip: the deleted ones took theirs.
        let mut lsn_may_skip = false;
        if number > previous + 1 && known.all_retired(previous + 1, number - 1) {
            lsn_may_skip = true;
        } else if number > previous + 1 {
            let cause = if previous + 1 == number - 1 {
                format!("segment {} is missing", previous + 1)
            } else {
                format!("segments {} to {} are missing", previous + 1, number - 1)
            };
            log::error!("journal: {cause}");
            records.push(DamagedRecord {
                segment: previous + 1,
                offset: 0,
                partition: None,
                detail: cause.clone(),
            });
            ranges.open(last_end, expected, cause);
        }
        previous = number;
        if let Some(d) = damaged.get(&number) {
            let cause = format!("segment {number} has a damaged header: {}", d.reason);
            records.push(DamagedRecord {
                segment: number,
                offset: 0,
                partition: None,
                detail: cause.clone(),
            });
            ranges.open(last_end, expected, cause);
            continue;
        }
        let segment = segments[&number].clone();
        if ranges.open.is_none() {
            last_end = loc(
                number,
                if number == start_segment {
                    start_offset
                } else {
                    SEGMENT_HEADER_LEN
                },
            );
        }
        // The scan starts at `base` and reads through a bounded window.
        let base = if number == start_segment {
            start_offset
        } else {
            SEGMENT_HEADER_LEN
        };
        let len = match lens.get(&number) {
            Some(&len) => len,
            None => segment
                .file
                .len()
                .map_err(|e| Error::io(format!("sizing segment {number}"), e))?,
        };
        if number == start_segment && len < start_offset {
            let cause = format!(
                "segment {number} is shorter than the heads snapshot's position {start_offset}"
            );
            log::error!("journal: {cause}");
            records.push(DamagedRecord {
                segment: number,
                offset: start_offset,
                partition: None,
                detail: cause,
            });
        }
        let read = |e| Error::io(format!("reading segment {number}"), e);
        let mut w = Window::new(&*segment.file, len);
        let mut at = base;
        // A later segment exists only once everything before it was synced.
        unproven.clear();
        thinned = false;
        // Every segment but the newest was synced before the next one was created.
        let is_last = Some(number) == numbers.last().copied();
        while at < len {
            let here = loc(number, at);
            let valid = match probe(&mut w, at, segment.seed).map_err(read)? {
                Probe::Valid(frame, name, prev, record_len)
                    if expected.is_none_or(|e| frame.lsn >= e && frame.lsn - e < (1 << 32)) =>
                {
                    Some((frame, name, prev, record_len))
                }
                _ => None,
            };
            if let Some((frame, name, prev, record_len)) = valid {
                if let Some(e) = expected
                    && frame.lsn > e
                    && !(lsn_may_skip && at == SEGMENT_HEADER_LEN && base == SEGMENT_HEADER_LEN)
                {
                    let cause = format!("records {e} to {} are missing", frame.lsn - 1);
                    if ranges.open(last_end, expected, cause.clone()) {
                        log::error!("journal {}: {cause}", at_str(here));
                        records.push(DamagedRecord {
                            segment: number,
                            offset: at,
                            partition: None,
                            detail: cause,
                        });
                    }
                }
                ranges.close(Some((here, frame.lsn)), |end| {
                    ends_at(&data_ends, end, Some(here))
                });
                ranges.judge(&name, frame.partition_hash, frame.kind, prev);
                claimed = claimed.max(frame.synced_lsn.saturating_add(proof_slack));
                if frame.lsn > claimed {
                    if unproven.len() < UNPROVEN_MARKS
                        || unproven.back().is_some_and(|&(l, _)| l <= claimed)
                    {
                        unproven.push_back((frame.lsn, at));
                    } else {
                        thinned = true;
                    }
                }
                while unproven.get(1).is_some_and(|&(l, _)| l <= claimed + 1) {
                    unproven.pop_front();
                }
                heads.insert(name.into_boxed_slice(), here);
                expected = Some(frame.lsn + 1);
                at += record_len;
                last_end = loc(number, at);
                bytes_scanned += record_len;
                records_scanned += 1;
                continue;
            }
            // Nothing but zeros from here to the end: preallocated space nothing was written
            // to, so the segment's records end here. Not a torn tail, not damage (a record
            // lost from the end of a sealed segment shows as a gap in LSNs at the next one).
            let ends_here = if zero_end_check {
                zeros_to_end(&mut w, at)
            } else {
                w.get(at, FRAME_LEN).map(|f| f.iter().all(|&b| b == 0))
            };
            if ends_here.map_err(read)? {
                data_ends.insert(number, at);
                if zero_end_check {
                    checked_end = Some((number, len));
                }
                break;
            }
            let after = expected.map(|e| e.saturating_sub(1));
            let next = find_valid(&mut w, at + 1, segment.seed, after).map_err(read)?;
            // In the last segment, damage is a torn write unless a later record was framed
            // after the damaged one had become durable.
            let durable_damage = match (&next, expected) {
                (Some((_, f)), Some(lsn)) => f.synced_lsn >= lsn,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if is_last && !durable_damage {
                // The preallocated zeros after the written bytes are not counted as dropped.
                let dropped = written_end(&mut w, at).map_err(read)? - at;
                log::warn!(
                    "journal segment {number}: torn tail at offset {at}, truncating {dropped} bytes of unacknowledged writes"
                );
                segment
                    .file
                    .set_len(at)
                    .and_then(|()| segment.file.sync_data())
                    .map_err(|e| Error::io(format!("truncating segment {number}"), e))?;
                torn_tail = Some(TornTail {
                    segment: number,
                    offset: at,
                    bytes_dropped: dropped,
                });
                end_of_tail = at;
                checked_end = Some((number, at));
                break 'segments;
            }
            let candidate = attribute(&mut w, at, segment.seed).map_err(read)?;
            let partition = candidate
                .as_ref()
                .and_then(|c| c.name.as_deref())
                .map(shown);
            log::error!(
                "journal segment {number} offset {at}: damaged record (partition {})",
                partition.as_deref().unwrap_or("unknown")
            );
            records.push(DamagedRecord {
                segment: number,
                offset: at,
                partition,
                detail: "damaged record".into(),
            });
            if ranges.open(
                last_end,
                expected,
                format!("damaged record at {}", at_str(here)),
            ) && here == last_end
                && let (Some(c), Some(open)) = (candidate, ranges.open.as_mut())
            {
                open.candidate = Some((c.hash, c.name, loc(number, c.end)));
            }
            match next {
                Some((next_at, _)) => at = next_at,
                // Nothing valid follows in this sealed segment: the range goes on into the
                // next one.
                None => continue 'segments,
            }
        }
        end_of_tail = at;
        if at == len {
            checked_end = Some((number, len));
        }
    }
    // The segment the heads snapshot points into, and everything after it, is gone.
    if start.is_some() && numbers.last().is_none_or(|&n| n < start_segment) {
        let cause =
            format!("segment {start_segment}, which the heads snapshot points into, is missing");
        log::error!("journal: {cause}");
        records.push(DamagedRecord {
            segment: start_segment,
            offset: start_offset,
            partition: None,
            detail: cause.clone(),
        });
        ranges.open(last_end, expected, cause);
    }
    let open_at_end = ranges.open.is_some();
    ranges.close(None, |end| ends_at(&data_ends, end, None));
    // Every partition not judged against every unattributed range may have lost records there.
    if let Some(&from) = ranges.starts.first() {
        let mut judge = |name: &[u8]| {
            let judged = ranges.judged.get(name).copied().unwrap_or(0);
            if judged < ranges.starts.len() {
                let from = ranges.starts.get(judged).copied().unwrap_or(from);
                ranges.damage.refuse(
                    partition_hash(name),
                    Some(name),
                    format!(
                        "it may have had records in the damaged journal from {}",
                        at_str(from)
                    ),
                );
            }
        };
        for name in heads.keys() {
            judge(name);
        }
        if let Some(pages) = pages {
            pages.for_each_readable(|name| {
                if !heads.contains_key(name) {
                    judge(name);
                }
            });
        }
    }

    // Appends go to a fresh segment after a damaged newest one, and skip past any LSN the
    // damage may have held, so no new record can be mistaken for a lost one.
    let newest = numbers.last().copied();
    let mut next_lsn = expected.unwrap_or(1);
    if open_at_end || newest != last_live {
        next_lsn += 1 << 20;
    }
    let (mut unproven_from, mut prepared_end) = (None, 0);
    let (tail_segment, tail_seed, tail_offset) = match (newest, segments.iter().next_back()) {
        (Some(n), Some((&l, s))) if n == l => {
            // A lone proven mark: every record after it was proven or marked, so none is
            // left to prove.
            let proven = |&(l, _): &(u64, u64)| l <= claimed;
            if !(unproven.len() == 1 && !thinned && unproven.front().is_some_and(proven)) {
                unproven_from = unproven.front().map(|&(_, at)| at);
            }
            if let Some((checked, end)) = checked_end
                && checked == l
            {
                prepared_end = end;
            }
            (l, s.seed, end_of_tail.max(SEGMENT_HEADER_LEN))
        }
        // Never a sealed segment older than the scan's start (when the segment the snapshot
        // points into is lost, the newest file left is one of those), and never the number of
        // a lost segment the snapshot's heads may point into.
        _ => {
            let number = match start {
                Some(_) => newest.map_or(1, |n| n + 1).max(start_segment + 1),
                None => newest.map_or(1, |n| n + 1),
            };
            // Sized by the journal's first write into it.
            let s = create_segment(vfs, journal_dir, number, new_salt(), 0)?;
            let seed = s.seed;
            segments.insert(number, s);
            (number, seed, SEGMENT_HEADER_LEN)
        }
    };
    Ok(ScanOutcome {
        tail: JournalTail {
            segments,
            unchecked,
            damaged: damaged.into_iter().map(|(n, d)| (n, d.reason)).collect(),
            tail_segment,
            tail_seed,
            tail_offset,
            next_lsn,
            unproven_from,
            prepared_end,
        },
        heads,
        damage: ranges.damage,
        records,
        torn_tail,
        bytes_scanned,
        records_scanned,
    })
}
