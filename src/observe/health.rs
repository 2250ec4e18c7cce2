//! The degraded flag (SPEC E8): a store or an engine that fails in the background says so in
//! its stats, with the reason, instead of looking healthy.
//!
//! Owns [`Degraded`], [`DegradedCause`] and `Health`, the standing conditions a store or an
//! engine records as they arise and clears when they end. `Health`'s mutex is a leaf.

use crate::sync::Mutex;

/// Why a store or an engine is degraded. Variants may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DegradedCause {
    /// A journal write or sync failed and is latched: every commit is refused until the store
    /// is reopened.
    SyncFailed,
    /// A background thread ended without being asked to (the store's periodic sync; the
    /// engine's background thread, which renews the owner lease, sweeps expired leases and
    /// runs the background warm, until the engine's next call starts it again): its work is
    /// not done meanwhile.
    BackgroundThreadEnded,
    /// A page of the heads snapshot is damaged, so no snapshot is written any more: the next
    /// open rebuilds the heads by scanning the whole journal, and until then compaction
    /// cannot delete what its snapshots would have made safe.
    SnapshotsStopped,
    /// The most recent background heads snapshot failed.
    SnapshotFailed,
    /// The most recent compaction failed: space is not reclaimed.
    CompactionFailed,
    /// The most recent renewal of the engine's owner lease failed (or the engine was
    /// superseded): it stops serving once the lease lapses.
    OwnerLeaseNotRenewed,
}

impl DegradedCause {
    /// A stable number for the cause (the C ABI's `PC_DEGRADED_*`).
    pub fn code(self) -> u32 {
        0x0A00
            + match self {
                DegradedCause::SyncFailed => 1,
                DegradedCause::BackgroundThreadEnded => 2,
                DegradedCause::SnapshotsStopped => 3,
                DegradedCause::SnapshotFailed => 4,
                DegradedCause::CompactionFailed => 5,
                DegradedCause::OwnerLeaseNotRenewed => 6,
            }
    }
}

/// What is wrong with a store or an engine that still runs (SPEC E8): the cause and the
/// reason in words. A stats snapshot carries the gravest standing one (causes in the order of
/// [`DegradedCause`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Degraded {
    /// The cause.
    pub cause: DegradedCause,
    /// What happened and what to do, in words.
    pub reason: String,
}

impl Degraded {
    /// A degraded condition.
    pub(crate) fn new(cause: DegradedCause, reason: impl Into<String>) -> Degraded {
        Degraded {
            cause,
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for Degraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.cause, self.reason)
    }
}

/// The conditions standing now, one per cause (the first reason of each is kept).
#[derive(Debug, Default)]
pub(crate) struct Health {
    standing: Mutex<Vec<Degraded>>,
    /// The negative control (feature `test-hooks`): nothing is ever reported.
    #[cfg(feature = "test-hooks")]
    off: crate::sync::atomic::AtomicBool,
}

impl Health {
    /// Records a condition (kept until cleared; a second one of the same cause keeps the
    /// first reason).
    pub(crate) fn set(&self, cause: DegradedCause, reason: impl Into<String>) {
        let mut standing = self.standing.lock();
        if !standing.iter().any(|d| d.cause == cause) {
            standing.push(Degraded::new(cause, reason));
        }
    }

    /// Ends a condition (a later snapshot or compaction succeeded).
    pub(crate) fn clear(&self, cause: DegradedCause) {
        let mut standing = self.standing.lock();
        if !standing.is_empty() {
            standing.retain(|d| d.cause != cause);
        }
    }

    /// The gravest standing condition, among these and `more` (conditions read elsewhere).
    pub(crate) fn worst(&self, more: impl IntoIterator<Item = Degraded>) -> Option<Degraded> {
        #[cfg(feature = "test-hooks")]
        if self.off.load(crate::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let standing = self.standing.lock();
        standing.iter().cloned().chain(more).min_by_key(|d| d.cause)
    }

    /// Test-only negative control: report no condition at all.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_off(&self, off: bool) {
        self.off.store(off, crate::sync::atomic::Ordering::Relaxed);
    }
}
