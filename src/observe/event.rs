//! What a [`Listener`](super::Listener) is told (SPEC E8): one [`Event`] per thing worth an
//! operator's attention, from every subsystem. Plain data; owns these types and calls nothing.

use std::time::Duration;

use crate::entity::{EntityId, Namespace};
use crate::fence::SweepPass;
use crate::restore::{Containment, RefusedDeferral, WarmProgress};
use crate::store::{CompactionReport, DamagedRecord, TornTail};

/// Which part of a commit took longer than the store's stall threshold
/// ([`FileStoreBuilder::stall_threshold`](crate::store::FileStoreBuilder::stall_threshold)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StallPhase {
    /// One `fdatasync` of a journal segment.
    Sync,
    /// The group-commit leader's wait for the commits under way before its sync.
    Gather,
}

/// Why a compaction ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompactionTrigger {
    /// Started by the store itself: segments were due (scattered, or a third dead).
    Background,
    /// Asked for ([`FileStore::compact`](crate::store::FileStore::compact)).
    OnDemand,
}

/// Something a store or an engine did or found that an operator should know of (SPEC E8).
/// Each variant has a stable [`code`](Event::code) and [`name`](Event::name); variants and
/// fields may be added.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Event {
    /// A commit's sync or gather took longer than the stall threshold. The commits waiting on
    /// it waited at least that long.
    #[non_exhaustive]
    CommitStall {
        /// Which part.
        phase: StallPhase,
        /// How long it took.
        elapsed: Duration,
        /// The store's threshold.
        threshold: Duration,
    },
    /// A journal write or sync failed. The failure is latched: every later commit answers
    /// [`Error::SyncFailed`](crate::Error::SyncFailed) until the store is reopened, and the
    /// stats say the store is degraded.
    #[non_exhaustive]
    SyncFailed {
        /// The error, in words.
        reason: String,
    },
    /// A compaction took its victims and starts copying (SPEC S7).
    #[non_exhaustive]
    CompactionStarted {
        /// Why it runs.
        trigger: CompactionTrigger,
        /// Sealed segments it takes.
        victims: u32,
    },
    /// A compaction finished.
    #[non_exhaustive]
    CompactionFinished {
        /// Why it ran.
        trigger: CompactionTrigger,
        /// What it did.
        report: CompactionReport,
        /// How long it took.
        elapsed: Duration,
    },
    /// A compaction failed before deleting anything it had not made safe; its victims stay
    /// due. A background one is tried again after a later commit.
    #[non_exhaustive]
    CompactionFailed {
        /// Why it ran.
        trigger: CompactionTrigger,
        /// The error, in words.
        error: String,
    },
    /// Open truncated a torn tail: records never acknowledged (SPEC S4).
    #[non_exhaustive]
    TornTail {
        /// Where and how much.
        tail: TornTail,
    },
    /// Open found a damaged record or range; what it could hold is refused (SPEC S4).
    #[non_exhaustive]
    Damaged {
        /// Where and what.
        record: DamagedRecord,
    },
    /// Open rebuilt every head by scanning the whole journal (a missing or damaged snapshot
    /// or manifest).
    #[non_exhaustive]
    Rebuilt {
        /// Which file, and how.
        reason: String,
    },
    /// A heads snapshot written in the background failed (the next commit that finds one due
    /// starts another; the store is degraded until one succeeds).
    #[non_exhaustive]
    SnapshotFailed {
        /// The error, in words.
        error: String,
    },
    /// A page of the heads snapshot open read is damaged: no snapshot is written any more
    /// and the next open rebuilds the heads (SPEC S4). The store is degraded until reopened.
    #[non_exhaustive]
    SnapshotsStopped {
        /// Why, in words.
        reason: String,
    },
    /// A background thread of the store or the engine ended without being asked to (it
    /// panicked): what it did is no longer done. The store or engine is degraded.
    #[non_exhaustive]
    BackgroundThreadEnded {
        /// The thread's name.
        thread: String,
        /// Why it ended.
        reason: String,
    },
    /// The state machine refused a write ([`Error::Refused`](crate::Error::Refused), SPEC
    /// R12): nothing was written.
    #[non_exhaustive]
    Refused {
        /// The entity.
        entity: EntityId,
        /// The machine's reason.
        reason: String,
    },
    /// A deferred record was refused by its entity's state when its restore unit drained it,
    /// and set aside (SPEC R8, R12).
    #[non_exhaustive]
    DeferralRefused {
        /// The entity.
        entity: EntityId,
        /// The record set aside, and why.
        refused: RefusedDeferral,
    },
    /// An entity was contained (SPEC R4): it answers
    /// [`Error::Contained`](crate::Error::Contained) until released.
    #[non_exhaustive]
    Contained {
        /// The entity.
        entity: EntityId,
        /// Why.
        reason: Containment,
    },
    /// A warm finished or was stopped; `progress.refused` entities failed to restore.
    #[non_exhaustive]
    WarmFinished {
        /// The warm's summary.
        progress: WarmProgress,
    },
    /// The warm could not restore an entity: its restore unit failed. A unit that met damage,
    /// a refusal or an I/O error contained the entity (SPEC R4: told first as
    /// [`Event::Contained`]; it answers that until [`Engine::release`](crate::Engine::release));
    /// one that met a fencing answer or a passing one (unavailable, exhausted, an answer lost)
    /// left it pending, to restore on its next touch.
    #[non_exhaustive]
    WarmFailed {
        /// The entity.
        entity: EntityId,
        /// The error, in words.
        error: String,
    },
    /// This engine bumped a namespace's epoch: revocation of the older grants begins (SPEC
    /// F4).
    #[non_exhaustive]
    RevocationStarted {
        /// The namespace.
        namespace: Namespace,
        /// The new epoch.
        epoch: u64,
    },
    /// Revocation of a namespace completed at an epoch (SPEC F5): no write planned under an
    /// older one commits. Told once per namespace and epoch.
    #[non_exhaustive]
    RevocationCompleted {
        /// The namespace.
        namespace: Namespace,
        /// The epoch.
        epoch: u64,
    },
    /// This engine took a namespace over from another owner ([`Engine::take_over`](
    /// crate::Engine::take_over), SPEC F12).
    #[non_exhaustive]
    TookOver {
        /// The namespace.
        namespace: Namespace,
        /// The previous holder's owner id.
        from: String,
        /// Whether the previous holder's lease was still live (a forced take-over).
        forced: bool,
        /// The grant this engine serves it under now.
        epoch: u64,
    },
    /// This engine learned it no longer holds a namespace (another owner took it over, SPEC
    /// F11): it stops serving it.
    #[non_exhaustive]
    Deposed {
        /// The namespace.
        namespace: Namespace,
        /// The grant it held.
        grant: u64,
        /// The namespace's epoch now.
        epoch: u64,
    },
    /// A pass of the engine's expired-lease sweeper ended (SPEC F9).
    #[non_exhaustive]
    Swept {
        /// What it did.
        pass: SweepPass,
    },
    /// A renewal of this engine's owner lease failed (SPEC F12); the engine is degraded until
    /// one succeeds, and stops serving once the lease lapses.
    #[non_exhaustive]
    RenewalFailed {
        /// The error, in words.
        error: String,
    },
}

impl Event {
    /// A stable number for the event's kind (the C ABI's `PC_EVENT_*`).
    pub fn code(&self) -> u32 {
        0x0900
            + match self {
                Event::CommitStall { .. } => 1,
                Event::SyncFailed { .. } => 2,
                Event::CompactionStarted { .. } => 3,
                Event::CompactionFinished { .. } => 4,
                Event::CompactionFailed { .. } => 5,
                Event::TornTail { .. } => 6,
                Event::Damaged { .. } => 7,
                Event::Rebuilt { .. } => 8,
                Event::SnapshotFailed { .. } => 9,
                Event::SnapshotsStopped { .. } => 10,
                Event::BackgroundThreadEnded { .. } => 11,
                Event::Refused { .. } => 12,
                Event::DeferralRefused { .. } => 13,
                Event::Contained { .. } => 14,
                Event::WarmFinished { .. } => 15,
                Event::WarmFailed { .. } => 16,
                Event::RevocationStarted { .. } => 17,
                Event::RevocationCompleted { .. } => 18,
                Event::TookOver { .. } => 19,
                Event::Deposed { .. } => 20,
                Event::Swept { .. } => 21,
                Event::RenewalFailed { .. } => 22,
            }
    }

    /// A stable name for the event's kind, in `snake_case` (metric labels, logs).
    pub fn name(&self) -> &'static str {
        match self {
            Event::CommitStall { .. } => "commit_stall",
            Event::SyncFailed { .. } => "sync_failed",
            Event::CompactionStarted { .. } => "compaction_started",
            Event::CompactionFinished { .. } => "compaction_finished",
            Event::CompactionFailed { .. } => "compaction_failed",
            Event::TornTail { .. } => "torn_tail",
            Event::Damaged { .. } => "damaged",
            Event::Rebuilt { .. } => "rebuilt",
            Event::SnapshotFailed { .. } => "snapshot_failed",
            Event::SnapshotsStopped { .. } => "snapshots_stopped",
            Event::BackgroundThreadEnded { .. } => "background_thread_ended",
            Event::Refused { .. } => "refused",
            Event::DeferralRefused { .. } => "deferral_refused",
            Event::Contained { .. } => "contained",
            Event::WarmFinished { .. } => "warm_finished",
            Event::WarmFailed { .. } => "warm_failed",
            Event::RevocationStarted { .. } => "revocation_started",
            Event::RevocationCompleted { .. } => "revocation_completed",
            Event::TookOver { .. } => "took_over",
            Event::Deposed { .. } => "deposed",
            Event::Swept { .. } => "swept",
            Event::RenewalFailed { .. } => "renewal_failed",
        }
    }

    /// What the event is about, if it names one thing: an entity, a namespace, a segment or
    /// a thread (for the C ABI and logs).
    pub fn subject(&self) -> Option<String> {
        match self {
            Event::Refused { entity, .. }
            | Event::DeferralRefused { entity, .. }
            | Event::Contained { entity, .. }
            | Event::WarmFailed { entity, .. } => Some(entity.to_string()),
            Event::RevocationStarted { namespace, .. }
            | Event::RevocationCompleted { namespace, .. }
            | Event::TookOver { namespace, .. }
            | Event::Deposed { namespace, .. } => Some(namespace.to_string()),
            Event::BackgroundThreadEnded { thread, .. } => Some(thread.clone()),
            Event::TornTail { tail } => Some(format!("segment {}", tail.segment)),
            Event::Damaged { record } => Some(match &record.partition {
                Some(p) => p.clone(),
                None => format!("segment {}", record.segment),
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Event {
    /// One line for a log or an alert.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::CommitStall {
                phase,
                elapsed,
                threshold,
            } => write!(
                f,
                "commit stall: a {phase:?} took {elapsed:?} (threshold {threshold:?})"
            ),
            Event::SyncFailed { reason } => write!(
                f,
                "journal sync failed, commits are refused until the store is reopened: {reason}"
            ),
            Event::CompactionStarted { trigger, victims } => {
                write!(f, "compaction started ({trigger:?}): {victims} segments")
            }
            Event::CompactionFinished {
                trigger,
                report,
                elapsed,
            } => write!(
                f,
                "compaction finished ({trigger:?}) in {elapsed:?}: {} segments removed, {} kept, {} skipped, {} bytes copied, {} bytes freed",
                report.segments_removed,
                report.segments_kept,
                report.segments_skipped,
                report.bytes_copied,
                report.bytes_removed
            ),
            Event::CompactionFailed { trigger, error } => {
                write!(f, "compaction failed ({trigger:?}): {error}")
            }
            Event::TornTail { tail } => write!(
                f,
                "open truncated a torn tail: segment {} at offset {}, {} bytes dropped",
                tail.segment, tail.offset, tail.bytes_dropped
            ),
            Event::Damaged { record } => write!(
                f,
                "open found damage in segment {} at offset {}: {}",
                record.segment, record.offset, record.detail
            ),
            Event::Rebuilt { reason } => write!(f, "open rebuilt the heads: {reason}"),
            Event::SnapshotFailed { error } => {
                write!(f, "a background heads snapshot failed: {error}")
            }
            Event::SnapshotsStopped { reason } => write!(f, "heads snapshots stopped: {reason}"),
            Event::BackgroundThreadEnded { thread, reason } => {
                write!(f, "background thread {thread} ended: {reason}")
            }
            Event::Refused { entity, reason } => write!(f, "{entity}: refused: {reason}"),
            Event::DeferralRefused { entity, refused } => {
                write!(f, "{entity}: deferred record refused: {}", refused.reason)
            }
            Event::Contained { entity, reason } => write!(f, "{entity}: contained: {reason}"),
            Event::WarmFinished { progress } => write!(
                f,
                "warm {}: {} of {} entities, {} refused",
                if progress.stopped {
                    "stopped"
                } else {
                    "finished"
                },
                progress.done,
                progress.total,
                progress.refused
            ),
            Event::WarmFailed { entity, error } => {
                write!(f, "warm: {entity} failed to restore: {error}")
            }
            Event::RevocationStarted { namespace, epoch } => {
                write!(f, "revocation of {namespace} to epoch {epoch} started")
            }
            Event::RevocationCompleted { namespace, epoch } => {
                write!(f, "revocation of {namespace} to epoch {epoch} completed")
            }
            Event::TookOver {
                namespace,
                from,
                forced,
                epoch,
            } => write!(
                f,
                "took {namespace} over from {from:?} at epoch {epoch}{}",
                if *forced { " (forced)" } else { "" }
            ),
            Event::Deposed {
                namespace,
                grant,
                epoch,
            } => write!(
                f,
                "deposed from {namespace} (grant {grant}, epoch now {epoch})"
            ),
            Event::Swept { pass } => write!(
                f,
                "lease sweep: {} namespaces, {} rows deleted, {} failed",
                pass.namespaces, pass.deleted, pass.failed
            ),
            Event::RenewalFailed { error } => {
                write!(f, "the owner lease was not renewed: {error}")
            }
        }
    }
}
