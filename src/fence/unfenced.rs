//! Unfenced namespaces (SPEC F11, issue "the engine as a fenced owner" item 3): a namespace
//! whose owner never hands it over can be served with no fencing at all. Its writes carry no
//! lease and leave no leased-shard row; its epoch stays 0 and cannot be bumped.
//!
//! The declaration is a durable coordinator row, `fence.<kind>/unfenced`. It is permanent:
//! an unfenced write carries no token the store could check at commit, so no revocation could
//! ever prove that every such writer has stopped; switching back would promise what nothing
//! enforces. To fence such entities later, move them to a new (fenced) namespace.
//!
//! Races are settled by the store, with no lock: the declaration commits only if the epoch is
//! still 0 as read and no declaration exists; a bump commits only if no declaration exists
//! (and the epoch is as read); a renewal's leased-shard row commits only if no declaration
//! exists. So a declaration and a bump never both succeed, and no row is created after a
//! declaration (a renewal that read the coordinator before it re-plans and finds it).

use serde::{Deserialize, Serialize};

use super::rows;
use super::{Fence, guard_as_read};
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::store::Batch;

/// How many compare-and-set races a declaration loses before answering `Unavailable` (F8).
const MAX_DECLARE_ATTEMPTS: usize = 8;

/// The declaration row: when the namespace was declared unfenced (planner's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UnfencedRow {
    pub(crate) declared_at_ms: u64,
}

impl Fence {
    /// Declares `ns` unfenced: from now on, writes to its entities need no lease and leave no
    /// leased-shard row (one store call each once this fence has seen the declaration), and
    /// [`Fence::bump_epoch`] on it is refused.
    ///
    /// Only a namespace whose epoch was never bumped can be declared (else `InvalidArgument`,
    /// nothing changed); declaring it again is harmless. The declaration is durable and
    /// permanent (see the module docs). Leases taken before it stay until they expire, and
    /// their rows are swept like any expired row.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// fence.declare_unfenced(&ns)?;
    /// let outcome = fence.write(&job, 0, Batch::new().put("state", "queued"))?; // no lease taken
    /// assert_eq!(outcome, WriteOutcome::Committed { epochs: vec![0] });
    /// assert!(fence.bump_epoch(&ns, 1).is_err()); // never taken over
    /// # Ok(())
    /// # }
    /// ```
    pub fn declare_unfenced(&self, ns: &Namespace) -> Result<()> {
        let coordinator = ns.coordinator_partition();
        let (current_key, unfenced_key) = (self.inner.keys.current(), self.inner.keys.unfenced());
        for _ in 0..MAX_DECLARE_ATTEMPTS {
            let read = self
                .inner
                .store
                .get_many(&coordinator, &[&current_key, &unfenced_key])?;
            let current = rows::decode_epoch(read[0].as_deref())?;
            if decode_unfenced(read[1].as_deref())?.is_some() {
                self.remember_unfenced(ns);
                return Ok(());
            }
            if current > 0 {
                return Err(Error::invalid(format!(
                    "{ns} cannot be declared unfenced: its {:?} was bumped to {current}, so \
                     fencing is in use; declare a namespace unfenced before its first bump, \
                     or move its entities to a new namespace",
                    self.inner.kind
                )));
            }
            let row = UnfencedRow {
                declared_at_ms: self.now(),
            };
            let batch = guard_as_read(Batch::new(), &current_key, read[0].as_deref())
                .absent(unfenced_key.clone())
                .put(unfenced_key.clone(), rows::encode(&row));
            if self.inner.store.apply(&coordinator, &batch)?.is_committed() {
                log::info!("{ns} declared unfenced ({:?} fence)", self.inner.kind);
                self.remember_unfenced(ns);
                return Ok(());
            }
        }
        Err(Error::Unavailable {
            reason: format!(
                "the coordinator of {ns} is contended; the declaration lost {MAX_DECLARE_ATTEMPTS} races"
            ),
            retry_after_ms: 10,
        })
    }

    /// Whether `ns` was declared unfenced. Answered from memory once this fence has seen the
    /// declaration (it is permanent), else with one store read.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// assert!(!fence.is_unfenced(&ns)?);
    /// fence.declare_unfenced(&ns)?;
    /// assert!(fence.is_unfenced(&ns)?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_unfenced(&self, ns: &Namespace) -> Result<bool> {
        if self.known_unfenced(ns) {
            return Ok(true);
        }
        let raw = self
            .inner
            .store
            .get(&ns.coordinator_partition(), &self.inner.keys.unfenced())?;
        let unfenced = decode_unfenced(raw.as_deref())?.is_some();
        if unfenced {
            self.remember_unfenced(ns);
        }
        Ok(unfenced)
    }

    /// Whether this fence has already seen `ns` declared unfenced (no store call).
    pub(crate) fn known_unfenced(&self, ns: &Namespace) -> bool {
        self.inner.unfenced.read().contains(ns)
    }

    /// Records that `ns` is unfenced; safe to keep for ever, since the declaration is permanent.
    pub(crate) fn remember_unfenced(&self, ns: &Namespace) {
        if !self.known_unfenced(ns) {
            self.inner.unfenced.write().insert(ns.clone());
        }
    }
}

/// Decodes the declaration row, if present.
pub(crate) fn decode_unfenced(bytes: Option<&[u8]>) -> Result<Option<UnfencedRow>> {
    rows::decode_opt("unfenced declaration", bytes)
}

/// The error a bump on an unfenced namespace answers.
pub(crate) fn bump_refused(fence: &Fence, ns: &Namespace) -> Error {
    Error::invalid(format!(
        "{ns} is unfenced: it has no {:?} to bump and no leases to revoke (an unfenced \
         namespace cannot be handed over under fencing; move its entities to a fenced \
         namespace to do that)",
        fence.inner.kind
    ))
}
