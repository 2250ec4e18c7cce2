//! What the store knows of its own footprint (SPEC S7, S13): an estimate of the dead bytes of
//! each segment, so compaction reclaims the segments that are mostly dead instead of
//! rewriting every sealed one, and which record formats it writes.
//!
//! A byte of a segment is dead once nothing needs it: a value overwritten or deleted (counted
//! when the batch that did it is folded), a value compaction copied elsewhere (counted by
//! compaction), and everything else of a record once the partition's next base supersedes it
//! (its frame, name and chain link, keys and framing; a base's entries; counted when that base
//! is written, from the partition's [`Chain`](super::partition::Chain)). A sealed segment is
//! *due* once its dead bytes reach a third of the segment size ([`DUE_AT`]). The counts are kept with every heads snapshot, so they survive
//! a restart; what was counted after the newest snapshot is lost in a crash, and a full-scan
//! rebuild starts from nothing (an estimate: see docs/DESIGN.md, "Compaction").
//!
//! Also owns the switch, for tests only, that makes the store write the records of format
//! version 2 (bases with whole keys and locations, compaction's copies as batches), so the
//! tests can check that a store holding them is still read, compacted and rewritten.

use crate::sync::HashMap;
use crate::sync::Mutex;
#[cfg(feature = "test-hooks")]
use crate::sync::atomic::AtomicBool;
use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A sealed segment is due for reclaiming once this share of the segment size is dead
/// (numerator, denominator): reclaiming it copies at most twice the bytes it frees, and a
/// store whose sealed segments are none of them due holds at most half as much again as
/// what is live in them.
pub const DUE_AT: (u64, u64) = (1, 3);

pub struct Space {
    /// Segment number to its dead bytes.
    dead: Mutex<HashMap<u32, u64>>,
    /// The sum of `dead`: the store's garbage estimate.
    total: AtomicU64,
    /// The lowest segment whose count reached the threshold (`u32::MAX`: none), so a commit
    /// can tell without a lock whether a sealed segment may be due.
    lowest_due: AtomicU32,
    /// Dead bytes that make a segment due.
    threshold: u64,
    /// Test-only: write the records of format version 2.
    #[cfg(feature = "test-hooks")]
    legacy: AtomicBool,
    /// Test-only negative control: nothing is ever due.
    #[cfg(feature = "test-hooks")]
    off: AtomicBool,
    /// Test-only negative control: compaction leaves alone a partition with no value in its
    /// victims even when its chain passes through one.
    #[cfg(feature = "test-hooks")]
    chain_unchecked: AtomicBool,
}

impl Space {
    pub fn new(segment_bytes: u64) -> Self {
        Space {
            dead: Mutex::default(),
            total: AtomicU64::new(0),
            lowest_due: AtomicU32::new(u32::MAX),
            threshold: (segment_bytes * DUE_AT.0 / DUE_AT.1).max(1),
            #[cfg(feature = "test-hooks")]
            legacy: AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            off: AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            chain_unchecked: AtomicBool::new(false),
        }
    }

    /// Test-only negative controls set by the builder before anything runs: `reclaim_off`, no
    /// segment is ever due because of its dead bytes; `version_2`, bases and copies as format
    /// version 2 wrote them (without `test-hooks` the switches do not exist: nothing happens).
    #[cfg(feature = "fault-injection")]
    pub fn set_for_test(&self, reclaim_off: bool, version_2: bool) {
        #[cfg(feature = "test-hooks")]
        {
            self.off.store(reclaim_off, Ordering::Relaxed);
            self.legacy.store(version_2, Ordering::Relaxed);
        }
        #[cfg(not(feature = "test-hooks"))]
        let _ = (reclaim_off, version_2);
    }

    /// Whether compaction must look at a partition's chain, not only its values, before it
    /// leaves the partition alone (always, but in a negative control).
    pub fn checks_chains(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        if self.chain_unchecked.load(Ordering::Relaxed) {
            return false;
        }
        true
    }

    /// Whether bases are packed and copies are values records (format version 3).
    pub fn packed(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        if self.legacy.load(Ordering::Relaxed) {
            return false;
        }
        true
    }

    /// `bytes` of `segment` are dead.
    pub fn add(&self, segment: u32, bytes: u64) {
        self.add_all([(segment, bytes)]);
    }

    /// Each `(segment, bytes)`: those bytes of that segment are dead.
    pub fn add_all(&self, counts: impl IntoIterator<Item = (u32, u64)>) {
        let mut dead = self.dead.lock();
        let mut added = 0;
        for (segment, bytes) in counts {
            if bytes == 0 {
                continue;
            }
            let count = dead.entry(segment).or_default();
            *count += bytes;
            added += bytes;
            if *count >= self.threshold {
                self.lowest_due.fetch_min(segment, Ordering::Relaxed);
            }
        }
        self.total.fetch_add(added, Ordering::Relaxed);
    }

    /// The estimated dead bytes of the whole journal.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Whether a segment below `tail` may be due (no lock; exact answers come from
    /// [`Space::due`]).
    pub fn maybe_due(&self, tail: u32) -> bool {
        #[cfg(feature = "test-hooks")]
        if self.off.load(Ordering::Relaxed) {
            return false;
        }
        self.lowest_due.load(Ordering::Relaxed) < tail
    }

    /// The segments below `tail` that are due, oldest first.
    pub fn due(&self, tail: u32) -> Vec<u32> {
        #[cfg(feature = "test-hooks")]
        if self.off.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let mut due: Vec<u32> = self
            .dead
            .lock()
            .iter()
            .filter(|&(&n, &bytes)| n < tail && bytes >= self.threshold)
            .map(|(&n, _)| n)
            .collect();
        due.sort_unstable();
        due
    }

    /// Stops counting `segments` (compaction deleted them or kept them as evidence).
    pub fn forget(&self, segments: impl IntoIterator<Item = u32>) {
        let mut dead = self.dead.lock();
        for n in segments {
            if let Some(bytes) = dead.remove(&n) {
                self.total.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
        let lowest = dead
            .iter()
            .filter(|&(_, &bytes)| bytes >= self.threshold)
            .map(|(&n, _)| n)
            .min();
        self.lowest_due
            .store(lowest.unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    /// Every segment's count, by segment number (what a heads snapshot keeps).
    pub fn counts(&self) -> Vec<(u32, u64)> {
        let mut counts: Vec<(u32, u64)> = self.dead.lock().iter().map(|(&n, &b)| (n, b)).collect();
        counts.sort_unstable();
        counts
    }
}

impl super::FileStore {
    /// Test-only: from now on, write bases and compaction's copies as format version 2 did
    /// (`true`), or as this build does (`false`).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_version_2_records_for_test(&self, on: bool) {
        self.inner.space.legacy.store(on, Ordering::Relaxed);
    }

    /// Test-only negative control: no segment is ever due because of its dead bytes, so
    /// compaction starts by itself only because of scatter.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_reclaim_off_for_test(&self, off: bool) {
        self.inner.space.off.store(off, Ordering::Relaxed);
    }

    /// Test-only negative control: compaction leaves alone every partition with no value in
    /// its victims, even one whose chain since its newest base passes through a victim.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_compaction_chain_check_off_for_test(&self, off: bool) {
        self.inner
            .space
            .chain_unchecked
            .store(off, Ordering::Relaxed);
    }

    /// Test-only: each live segment's estimated dead bytes, by segment number.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn dead_bytes_by_segment(&self) -> Vec<(u32, u64)> {
        self.inner.space.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_due_once_its_share_is_dead_and_forgotten_once_taken() {
        let s = Space::new(12_288);
        let due = 12_288 * DUE_AT.0 / DUE_AT.1;
        s.add_all([(1, due / 2), (2, due - 1)]);
        assert!(s.due(5).is_empty() && !s.maybe_due(5));
        s.add(1, due - due / 2);
        assert_eq!(s.due(5), vec![1]);
        assert!(s.maybe_due(2) && !s.maybe_due(1), "the tail is never due");
        s.add(2, 1);
        assert_eq!(s.due(5), vec![1, 2]);
        assert_eq!(s.total(), 2 * due);
        s.forget([1]);
        assert_eq!(s.due(5), vec![2]);
        assert_eq!(s.total(), due);
        assert!(!s.maybe_due(2) && s.maybe_due(3));
        assert_eq!(s.counts(), vec![(2, due)]);
    }
}
