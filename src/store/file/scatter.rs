//! How scattered the journal's sealed segments are, so that compaction also starts when reading
//! histories would take many reads, not only when garbage piles up (SPEC S7).
//!
//! Owns one count per segment, kept in memory since open: bytes of records that commits
//! appended *apart* from their partition's previous record (in another segment, or more than
//! [`MERGE_GAP`] after its end, so that reading the partition's history needs another read for
//! them), and bytes of live values compaction has since moved out of the segment (its old
//! copies are dead). A sealed segment is *due* once those two together reach half of the
//! segment size: a journal appended round-robin over many partitions is due segment by
//! segment, while one whose partitions append in runs (or that compaction wrote) is never due,
//! so an already clustered store is left alone. The counts are kept with every heads
//! snapshot, so a load cut by a restart is still compacted after it; what was counted after
//! the newest snapshot is lost in a crash (see docs/DESIGN.md, "Compaction").

use crate::sync::HashMap;
use crate::sync::atomic::{AtomicU32, Ordering};

use crate::sync::Mutex;

use super::format::{Loc, loc_segment};
use super::values::MERGE_GAP;

pub struct Scatter {
    /// Segment number to its bytes counted (apart or moved out).
    segments: Mutex<HashMap<u32, u64>>,
    /// The lowest segment whose count has reached half of `segment_bytes` (`u32::MAX`: none),
    /// so a commit can tell without a lock whether a sealed segment may be due.
    lowest_due: AtomicU32,
    segment_bytes: u64,
    /// Test-only negative control: nothing is ever due.
    #[cfg(feature = "fault-injection")]
    off: bool,
}

/// Whether a record at `at` lies close after its partition's previous record, which ended at
/// `prev_end` (0: not known), so that one read takes both.
pub fn follows(prev_end: Loc, at: Loc) -> bool {
    prev_end != 0
        && loc_segment(prev_end) == loc_segment(at)
        && at >= prev_end
        && at - prev_end <= MERGE_GAP
}

impl Scatter {
    /// `off` (tests only) turns the trigger off.
    pub fn new(segment_bytes: u64, off: bool) -> Self {
        #[cfg(not(feature = "fault-injection"))]
        let _ = off;
        Scatter {
            segments: Mutex::default(),
            lowest_due: AtomicU32::new(u32::MAX),
            segment_bytes,
            #[cfg(feature = "fault-injection")]
            off,
        }
    }

    fn add(&self, segment: u32, bytes: u64) {
        let mut counts = self.segments.lock();
        let count = counts.entry(segment).or_default();
        *count += bytes;
        if *count * 2 >= self.segment_bytes {
            self.lowest_due.fetch_min(segment, Ordering::Relaxed);
        }
    }

    /// Whether a segment below `tail` may be due (no lock; exact answers come from
    /// [`Scatter::due`]).
    pub fn maybe_due(&self, tail: u32) -> bool {
        #[cfg(feature = "fault-injection")]
        if self.off {
            return false;
        }
        self.lowest_due.load(Ordering::Relaxed) < tail
    }

    /// A commit appended `len` bytes of record at `at`; its partition's previous record ended
    /// at `prev_end` (0: not known).
    pub fn note_commit(&self, prev_end: Loc, at: Loc, len: u64) {
        if !follows(prev_end, at) {
            self.add(loc_segment(at), len);
        }
    }

    /// A count a heads snapshot kept for `segment`.
    pub fn restore(&self, segment: u32, bytes: u64) {
        if bytes > 0 {
            self.add(segment, bytes);
        }
    }

    /// Compaction moved `bytes` of live values out of `segment` (their old copies are dead).
    pub fn note_moved(&self, segment: u32, bytes: u64) {
        self.add(segment, bytes);
    }

    /// The sealed segments (below `tail`) that are due, oldest first.
    pub fn due(&self, tail: u32) -> Vec<u32> {
        #[cfg(feature = "fault-injection")]
        if self.off {
            return Vec::new();
        }
        let mut due: Vec<u32> = self
            .segments
            .lock()
            .iter()
            .filter(|&(&n, &bytes)| n < tail && bytes * 2 >= self.segment_bytes)
            .map(|(&n, _)| n)
            .collect();
        due.sort_unstable();
        due
    }

    /// Every segment's count, by segment number (what a heads snapshot keeps).
    pub fn counts(&self) -> Vec<(u32, u64)> {
        let mut counts: Vec<(u32, u64)> =
            self.segments.lock().iter().map(|(&n, &b)| (n, b)).collect();
        counts.sort_unstable();
        counts
    }

    /// Stops counting `segments` (compaction took them: deleted, or kept as evidence).
    pub fn forget(&self, segments: impl IntoIterator<Item = u32>) {
        let mut counts = self.segments.lock();
        for n in segments {
            counts.remove(&n);
        }
        let lowest = counts
            .iter()
            .filter(|&(_, &bytes)| bytes * 2 >= self.segment_bytes)
            .map(|(&n, _)| n)
            .min();
        self.lowest_due
            .store(lowest.unwrap_or(u32::MAX), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::file::format::loc;

    #[test]
    fn records_apart_count_and_a_segment_is_due_at_half() {
        let s = Scatter::new(4096, false);
        // Close after the previous record: not counted.
        s.note_commit(loc(1, 100), loc(1, 100 + MERGE_GAP), 3000);
        assert!(s.due(5).is_empty());
        // Unknown previous end, another segment, too far: counted.
        s.note_commit(0, loc(1, 200), 1000);
        s.note_commit(loc(0, 100), loc(1, 300), 500);
        assert!(s.due(5).is_empty());
        s.note_commit(loc(1, 100), loc(1, 101 + MERGE_GAP), 548);
        assert_eq!(s.due(5), vec![1]);
        assert!(s.maybe_due(2) && !s.maybe_due(1));
        // The tail is never due.
        assert!(s.due(1).is_empty());
        s.note_moved(3, 2048);
        assert_eq!(s.due(5), vec![1, 3]);
        s.forget([1]);
        assert_eq!(s.due(5), vec![3]);
        assert!(!s.maybe_due(3) && s.maybe_due(4));
    }
}
