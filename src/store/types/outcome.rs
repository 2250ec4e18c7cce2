//! What a store reports (SPEC S2): the [`Outcome`] of a batch and the [`StoreStats`] counters.
//!
//! Plain data: owns these two types and calls nothing.

use crate::observe::{Degraded, LatencyStats};

/// What became of a batch (SPEC S2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// Every operation applied; under a syncing policy, durably.
    Committed,
    /// The precondition at `index` (in the order they were added) did not hold; nothing changed.
    PreconditionFailed {
        /// Index into [`Batch::guards`](super::Batch::guards).
        index: usize,
    },
    /// A `NotAfter` deadline had passed on the store's clock; nothing changed.
    DeadlinePassed {
        /// The store's clock when the batch was refused.
        now_ms: u64,
    },
}

impl Outcome {
    /// Whether the batch committed.
    pub fn is_committed(&self) -> bool {
        matches!(self, Outcome::Committed)
    }
}

/// Counters a store exposes so batching and laziness are visible.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Batches committed since open.
    pub batches: u64,
    /// Journal `fdatasync`s issued since open: those that make commits durable (group commit
    /// shows as `syncs < batches`), and those that make a new segment's header and each
    /// zero-filled step of the tail durable before records go there. Open's own syncs and
    /// directory syncs are not counted.
    pub syncs: u64,
    /// Bytes appended to the journal since open.
    pub bytes_written: u64,
    /// Partitions known to the store.
    pub partitions: u64,
    /// Partitions whose index is loaded in memory now.
    pub partitions_loaded: u64,
    /// Idle partition indexes dropped under a budget since open (they load again on their next
    /// touch).
    pub indexes_dropped: u64,
    /// Journal segments live on disk.
    pub segments: u64,
    /// Compactions completed since open.
    pub compactions: u64,
    /// Estimated bytes of journal nothing needs any more, which compaction could reclaim: values
    /// overwritten, deleted or copied elsewhere, and records a newer base superseded. The file
    /// store counts them per segment and keeps the counts across restarts; 0 for backends
    /// without compaction.
    pub garbage_bytes: u64,
    /// How long each journal `fdatasync` of a commit took (those of a new segment's header and
    /// of a zero-filled step are counted in `syncs` but not timed here); empty for backends
    /// without a journal (SPEC E8).
    pub sync_latency: LatencyStats,
    /// Commit stalls since open: journal syncs, or a group-commit leader's waits for the
    /// commits under way, that took longer than the store's stall threshold.
    pub stalls: u64,
    /// Compactions that failed since open (their segments stay due).
    pub compactions_failed: u64,
    /// Whether a compaction runs in the background now.
    pub compaction_running: bool,
    /// Bytes of live values compactions copied since open.
    pub compaction_bytes_copied: u64,
    /// Bytes of segment files compactions deleted since open.
    pub compaction_bytes_removed: u64,
    /// The budget `partitions_loaded` is held to, if one is set (SPEC S8).
    pub max_loaded_partitions: Option<u64>,
    /// Why the store is degraded, if it is (SPEC E8): a latched sync failure, a background
    /// thread that ended, snapshots stopped by a damaged page, a failed background snapshot
    /// or compaction. A store failing in the background never reports `None`.
    pub degraded: Option<Degraded>,
}
