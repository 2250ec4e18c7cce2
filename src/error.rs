//! The one error type of Portcullis (SPEC E1).
//!
//! Every variant has a stable numeric [`Error::code`] that the C ABI returns, and a message that
//! says what failed and what to do about it. Codes are never reused or renumbered.

use std::io;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in Portcullis.
///
/// Match on the variant, or use [`Error::code`] for a stable number.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was malformed or out of range; nothing was changed.
    #[error("invalid argument: {0}; fix the call, nothing was changed")]
    InvalidArgument(String),

    /// A key, value, batch or record exceeds a documented limit; nothing was changed.
    ///
    /// Sizes are in bytes, except when `what` counts something ("operations in a batch",
    /// "preconditions in a batch"), which the message then says.
    #[error("{}", too_large_message(what, *size, *limit))]
    TooLarge {
        /// What was too large ("key", "value", "batch", "operations in a batch", ...).
        what: &'static str,
        /// Its size in bytes, or its count when `what` names a count.
        size: usize,
        /// The limit, in the same unit.
        limit: usize,
    },

    /// Another process (or another handle in this process) holds the directory (SPEC S6).
    #[error("the store directory {path} is locked by another open store; close it first")]
    Locked {
        /// The directory.
        path: String,
    },

    /// A file carries a format version this build does not understand (SPEC S10).
    #[error(
        "{file} has format version {found}, this build reads up to {supported}; upgrade Portcullis"
    )]
    UnsupportedVersion {
        /// The file.
        file: String,
        /// The version found.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },

    /// Stored data failed verification (SPEC S4). The named partition (or file) cannot be
    /// loaded; other partitions keep working.
    #[error("corrupt data in {what}: {detail}; restore it from a backup or release it")]
    Corrupt {
        /// The partition or file affected.
        what: String,
        /// What was found.
        detail: String,
    },

    /// An earlier sync failed, so durability of later writes cannot be promised. The store
    /// refuses writes until it is reopened (reopening re-reads what actually reached the disk).
    #[error("an earlier sync failed ({0}); writes are refused until the store is reopened")]
    SyncFailed(String),

    /// An operating-system I/O error.
    #[error("I/O error during {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The handle was closed; open it again.
    #[error("the store is closed; open it again")]
    Closed,

    /// A write planned under an epoch older than the current lease was refused (SPEC F3):
    /// the namespace has a new owner. The deposed owner must stop serving it (SPEC F11);
    /// re-planning under the current epoch would take it back from its new owner.
    #[error(
        "fenced: the write was planned under epoch {grant}, but the namespace is now at epoch {current} under a new owner; stop serving this namespace (do not retry under the new epoch, which would take it back from its new owner)"
    )]
    Fenced {
        /// The epoch the write was planned under.
        grant: u64,
        /// The epoch of the lease.
        current: u64,
    },

    /// The operation could not complete now; retry after the hinted delay.
    #[error("unavailable: {reason}; retry in about {retry_after_ms} ms")]
    Unavailable {
        /// Why.
        reason: String,
        /// A hint for when to retry.
        retry_after_ms: u64,
    },

    /// The entity could not be restored and is contained (SPEC R4).
    #[error("entity {entity} is contained: {reason}; fix the cause and release it")]
    Contained {
        /// The entity.
        entity: String,
        /// The named reason it was contained.
        reason: String,
    },

    /// The entity is not registered.
    #[error("unknown entity {0}; register it first")]
    UnknownEntity(String),

    /// The call was refused because waiting for it would never end (SPEC R11): application
    /// code called back into the engine for an entity this thread already holds (from a
    /// `read`/`write`/`fold_all` closure, from `apply` during a write, or from inside the
    /// entity's own restore unit), or restore units of different entities touched each other
    /// in a cycle, or `close` was called from inside an engine call. Nothing was changed.
    #[error(
        "refused to touch {entity}: {detail}; it would deadlock, so make the call outside the closure, hook or restore unit (see docs/restore.md, locking rules)"
    )]
    WouldDeadlock {
        /// The entity whose touch was refused (empty for `close`).
        entity: String,
        /// Which rule the call broke.
        detail: String,
    },

    /// A batch was sent to a remote store but its answer was lost (a timeout or a dropped
    /// connection after sending), and the store could not find out whether it committed
    /// (SPEC S11). It was applied at most once: either it committed, or it never will.
    #[error(
        "the outcome of a batch on {partition} is unknown: {detail}; it committed at most once, so read back what it wrote before deciding to retry it"
    )]
    OutcomeUnknown {
        /// The partition the batch was for.
        partition: String,
        /// What went wrong, and where.
        detail: String,
    },

    /// This engine does not serve the entity's namespace (SPEC F11): it never adopted it, it
    /// released it, or another owner holds it.
    #[error("this engine does not serve namespace {namespace}: {detail}")]
    NotServed {
        /// The namespace.
        namespace: String,
        /// Why, and what to do.
        detail: String,
    },

    /// The store has used up numbers its on-disk format bounds over the store's whole life:
    /// today only the journal's segment numbers (a location holds 24 bits of one), which never
    /// go back, even when compaction deletes segments. The write was refused and nothing was
    /// changed; reads keep working. `detail` says what to do.
    #[error("{what} are used up: {detail}; nothing was changed and reads still work")]
    Exhausted {
        /// What was used up.
        what: String,
        /// How far it went, and what to do.
        detail: String,
    },

    /// The state machine refused (SPEC R12): its [`check`](crate::StateMachine::check)
    /// refused a record of a write against the entity's current state, the decision of
    /// [`Engine::try_write`](crate::Engine::try_write) refused the command, or
    /// [`encode_checkpoint`](crate::StateMachine::encode_checkpoint) refused the state of a
    /// checkpoint (SPEC L3). Nothing was written, and the entity keeps serving: this is an
    /// answer to the call, not damage (compare [`Error::Contained`]).
    #[error(
        "{entity}: the state machine refused: {reason}; nothing was written and {entity} keeps serving (change the command, or the state machine; not the store)"
    )]
    Refused {
        /// The entity.
        entity: String,
        /// The state machine's reason, and which record it refused.
        reason: String,
    },

    /// Another incarnation of an owner is live (SPEC F12): it renews a lease on its owner row,
    /// so it must not be taken for a crash. Answered when an engine opens with the owner id of
    /// a live engine, when [`Engine::take_over`](crate::Engine::take_over) (without `force`)
    /// meets a live holder, and by an engine that another incarnation of its own owner id has
    /// replaced (its lease had lapsed). Nothing was changed.
    #[error(
        "owner {owner:?} incarnation {incarnation} is live (its lease runs for another {expires_in_ms} ms): {detail}"
    )]
    OwnerLive {
        /// The owner id.
        owner: String,
        /// The live incarnation.
        incarnation: u64,
        /// How long its lease runs from now, on the caller's clock (0 if not known).
        expires_in_ms: u64,
        /// What to do.
        detail: String,
    },
}

/// The message of [`Error::TooLarge`]: bytes, or a count for "operations ..." and
/// "preconditions ..." (SPEC S11: a backend may limit how many a batch carries).
fn too_large_message(what: &str, size: usize, limit: usize) -> String {
    if what.starts_with("operations") || what.starts_with("preconditions") {
        format!(
            "{size} {what}, above this store's limit of {limit}; split the work into several batches, nothing was changed"
        )
    } else {
        format!(
            "{what} is {size} bytes, above the limit of {limit} bytes; split it, nothing was changed"
        )
    }
}

impl Error {
    /// The stable numeric code of this error (SPEC E1). Zero is reserved for success.
    pub fn code(&self) -> u32 {
        match self {
            Error::InvalidArgument(_) => 1,
            Error::TooLarge { .. } => 2,
            Error::Locked { .. } => 3,
            Error::UnsupportedVersion { .. } => 4,
            Error::Corrupt { .. } => 5,
            Error::SyncFailed(_) => 6,
            Error::Io { .. } => 7,
            Error::Closed => 8,
            Error::Fenced { .. } => 9,
            Error::Unavailable { .. } => 10,
            Error::Contained { .. } => 11,
            Error::UnknownEntity(_) => 12,
            Error::WouldDeadlock { .. } => 13,
            Error::OutcomeUnknown { .. } => 14,
            Error::NotServed { .. } => 15,
            Error::Exhausted { .. } => 16,
            Error::Refused { .. } => 17,
            Error::OwnerLive { .. } => 18,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_nonzero() {
        let all = [
            Error::invalid("x"),
            Error::TooLarge {
                what: "key",
                size: 2,
                limit: 1,
            },
            Error::Locked { path: "p".into() },
            Error::UnsupportedVersion {
                file: "f".into(),
                found: 9,
                supported: 1,
            },
            Error::corrupt("p", "d"),
            Error::SyncFailed("e".into()),
            Error::io("x", io::Error::other("e")),
            Error::Closed,
            Error::Fenced {
                grant: 1,
                current: 2,
            },
            Error::Unavailable {
                reason: "r".into(),
                retry_after_ms: 1,
            },
            Error::Contained {
                entity: "e".into(),
                reason: "r".into(),
            },
            Error::UnknownEntity("e".into()),
            Error::WouldDeadlock {
                entity: "e".into(),
                detail: "d".into(),
            },
            Error::OutcomeUnknown {
                partition: "p".into(),
                detail: "d".into(),
            },
            Error::NotServed {
                namespace: "n".into(),
                detail: "d".into(),
            },
            Error::Exhausted {
                what: "w".into(),
                detail: "d".into(),
            },
            Error::Refused {
                entity: "e".into(),
                reason: "r".into(),
            },
            Error::OwnerLive {
                owner: "o".into(),
                incarnation: 1,
                expires_in_ms: 1,
                detail: "d".into(),
            },
        ];
        let mut codes: Vec<u32> = all.iter().map(Error::code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        assert!(!codes.contains(&0));
    }

    #[test]
    fn too_large_names_counts_and_bytes() {
        let count = Error::TooLarge {
            what: "operations in a batch",
            size: 64,
            limit: 63,
        };
        assert_eq!(
            count.to_string(),
            "64 operations in a batch, above this store's limit of 63; split the work into \
             several batches, nothing was changed"
        );
        let bytes = Error::TooLarge {
            what: "key",
            size: 2000,
            limit: 1024,
        };
        assert!(
            bytes
                .to_string()
                .starts_with("key is 2000 bytes, above the limit of 1024 bytes")
        );
    }
}
