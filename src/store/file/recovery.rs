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
//! Each segment is read through a bounded window ([`super::window::Window`]), so open holds about a megabyte whatever
//! the size of a segment or a record.
//!
//! What recovery finds is returned as a [`Damage`], which the store persists with every heads
//! snapshot and manifest so that a refusal survives close and reopen.
//!
//! This module owns the scan and its verdicts: [`scan`] runs its steps, which `walk` holds
//! (the segments before the start, gaps, damaged headers, a segment's records, the end of the
//! journal, the refusals of unattributed damage, where appends go); `segment_files` lists and
//! opens the segments and checks their headers, `probe` asks the bytes of one segment what
//! they hold.

mod probe;
mod segment_files;
mod walk;

use crate::sync::HashMap;
use std::path::Path;

pub use super::damage::Damage;
use super::format::Loc;
use super::heads::Pages;
use super::journal::JournalTail;
use super::vfs::Vfs;
use crate::error::Result;
pub use segment_files::{Segments, list_segments, open_segments_with};
use walk::{Next, Walk};

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
/// first valid record's LSN), updating the heads of `partitions`. The steps are in [`walk`].
pub fn scan(
    vfs: &dyn Vfs,
    journal_dir: &Path,
    segments: Segments,
    start: Option<(u32, u64)>,
    start_lsn: Option<u64>,
    partitions: Known<'_>,
    known: &Damage,
) -> Result<ScanOutcome> {
    let Known { heads, pages } = partitions;
    let Segments {
        live,
        damaged,
        unchecked,
        lens,
        zero_end_check,
        proof_slack,
    } = segments;
    let mut numbers: Vec<u32> = live
        .keys()
        .chain(damaged.keys())
        .chain(&unchecked)
        .copied()
        .collect();
    numbers.sort_unstable();
    let mut walk = Walk::new(
        numbers,
        start,
        start_lsn,
        heads,
        lens,
        zero_end_check,
        proof_slack,
    );
    // Every segment from the start on, in order, until a torn tail.
    for i in 0..walk.numbers.len() {
        let number = walk.numbers[i];
        if walk.before_start(number, damaged.get(&number)) {
            continue;
        }
        let lsn_may_skip = walk.gap_before(number, known);
        if let Some(d) = damaged.get(&number) {
            walk.damaged_header(number, &d.reason);
            continue;
        }
        if let Next::Stop = walk.segment(number, &live[&number], lsn_may_skip)? {
            break;
        }
    }
    let open_at_end = walk.end();
    walk.refuse_unjudged(pages)?;
    walk.outcome(vfs, journal_dir, live, unchecked, damaged, open_at_end)
}
