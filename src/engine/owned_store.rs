//! The store as the engine's own code sees it (SPEC F11): reads go straight to the store, and
//! every batch on an entity partition commits through the fence under the grant of the
//! namespace's holding. The restore layer (registration markers, deferred rows and their drain,
//! repair records, owed checkpoints), the write path, `checkpoint` and truncation all write
//! through this one type, so no engine write to an entity can bypass the fence.
//!
//! A fenced write (`Error::Fenced`) deposes the holding (see `owner`), so later calls for the
//! namespace answer `Fenced` from memory. Every entity batch is also bounded by the engine's
//! owner lease (SPEC F12): it is planned only while the lease is valid and, on a store that
//! evaluates deadlines, commits only until the lease's validity ends, so a write of an engine
//! whose lease lapsed mid-call (a stall) cannot commit once a newer engine with its owner id
//! may have opened and taken its namespaces at the same epoch. Batches on other partitions (the engine's system
//! partition, coordinators) pass through unchanged. Closing this view closes nothing: the
//! store's lifetime belongs to whoever opened it.

use crate::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::owner::{Mode, Owners};
use crate::entity::{EntityId, Namespace};
use crate::error::{Error, Result};
use crate::fence::{Fence, WriteOutcome};
use crate::store::{
    Batch, Cursor, KeyRange, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
};

/// The term of the holding a write for an entity on this thread was planned under.
pub(crate) type PlannedTerm = Box<dyn Fn(&EntityId) -> Option<u64> + Send + Sync>;

/// See the module documentation.
pub(crate) struct OwnedStore {
    raw: Arc<dyn Store>,
    fence: Fence,
    owners: Arc<Owners>,
    /// The term of the holding a write on this thread was planned under, if any (the restore
    /// registry's thread marks); set once the registry exists.
    planned_term: std::sync::OnceLock<PlannedTerm>,
    /// Test-only negative control (feature `test-hooks`): commit entity batches without the
    /// fence, as the engine did before SPEC F11.
    bypass_fence: AtomicBool,
}

impl OwnedStore {
    pub(crate) fn new(raw: Arc<dyn Store>, fence: Fence, owners: Arc<Owners>) -> Self {
        OwnedStore {
            raw,
            fence,
            owners,
            planned_term: std::sync::OnceLock::new(),
            bypass_fence: AtomicBool::new(false),
        }
    }

    pub(crate) fn set_planned_term(&self, f: PlannedTerm) {
        let _ = self.planned_term.set(f);
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_bypass_fence(&self, bypass: bool) {
        self.bypass_fence.store(bypass, Ordering::Relaxed);
    }

    fn apply_to_entity(&self, entity: &EntityId, p: &Partition, batch: &Batch) -> Result<Outcome> {
        let ns = entity.namespace();
        let holding = self.owners.serving(ns)?;
        // A restore unit, or a call holding the entity's state, works on state of one holding:
        // its writes commit only under that holding, never under one adopted since (SPEC F11).
        if let Some(planned) = self.planned_term.get().and_then(|f| f(entity))
            && planned != holding.term
        {
            return Err(Error::NotServed {
                namespace: ns.to_string(),
                detail: format!(
                    "it was adopted again (term {}) while this call worked on state restored \
                     under term {planned}; nothing was written: retry the call",
                    holding.term
                ),
            });
        }
        if self.bypass_fence.load(Ordering::Relaxed) {
            return self.raw.apply(p, batch);
        }
        if holding.mode == Mode::Unfenced {
            // Planned just now, by `serving`'s check of the owner lease; unfenced writes carry
            // no deadline (SPEC F11: no leases, no fencing).
            return self.raw.apply(p, batch);
        }
        let mut refused = None;
        let written = self
            .fence
            .write_engine_rows_with(entity, holding.grant, |_| {
                // Asked on every attempt: a re-plan after a passed deadline renews the lease
                // first, or writes nothing if this engine was replaced.
                match self.within_owner_lease(ns, holding.term, batch) {
                    Ok(bounded) => Some(bounded),
                    Err(e) => {
                        refused = Some(e);
                        None
                    }
                }
            });
        if let Some(e) = refused {
            return Err(e);
        }
        match written {
            Ok(WriteOutcome::Committed { .. }) => Ok(Outcome::Committed),
            Ok(WriteOutcome::PreconditionFailed { index }) => {
                Ok(Outcome::PreconditionFailed { index })
            }
            Ok(WriteOutcome::Declined) => Err(Error::invalid("an engine write was declined")),
            Err(Error::Fenced { grant, current }) => {
                self.owners.depose(ns, grant, current);
                Err(Error::Fenced { grant, current })
            }
            Err(e) => Err(e),
        }
    }
}

impl OwnedStore {
    /// `batch` bounded by this engine's owner lease (SPEC F12), if the holding of term `term`
    /// still serves `ns`: the lease is renewed first if it is no longer valid (an error if that
    /// fails, `OwnerLive` if a newer engine with this owner id replaced this one and may have
    /// taken the namespace at the same epoch, which the fence does not tell apart), and a
    /// renewal that deposed the holding stops the write. On a store that evaluates deadlines
    /// the batch then commits only while the lease is valid, renewed first when at most half
    /// its validity is left; on one that does not (etcd), only its planning is bounded.
    fn within_owner_lease(&self, ns: &Namespace, term: u64, batch: &Batch) -> Result<Batch> {
        let owners = &self.owners;
        if owners.switches().ignore_lease_expiry {
            return Ok(batch.clone());
        }
        let deadlines = self.raw.evaluates_deadlines() && !self.fence.deadlines_dropped();
        let (left, renewal_due) = owners.liveness.validity_left();
        if left == 0 {
            owners.live()?;
        } else if deadlines
            && renewal_due
            && let Err(e @ Error::OwnerLive { .. }) = owners.renew()
        {
            // Still valid otherwise: a renewal that failed for a store error leaves what is left.
            return Err(e);
        }
        if !owners.serves_term(ns, term) {
            // A renewal found the namespace moved (deposed) or it was adopted again.
            return Err(owners
                .serving(ns)
                .err()
                .unwrap_or_else(|| Error::NotServed {
                    namespace: ns.to_string(),
                    detail: format!(
                        "it was adopted again while a write planned under term {term} was under \
                     way; nothing was written: retry the call"
                    ),
                }));
        }
        if !deadlines {
            return Ok(batch.clone());
        }
        // Read after the checks: a renewal only moves it later. Other engines take the lease
        // for expired only `lease_margin` later (their clocks run ahead by less than that).
        let valid_until = owners.liveness.valid_until_ms();
        Ok(batch.clone().not_after(valid_until))
    }
}

impl Store for OwnedStore {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.raw.get(p, key)
    }

    fn get_for_update(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.raw.get_for_update(p, key)
    }

    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.raw.get_many(p, keys)
    }

    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        self.raw.scan(p, range, cursor, limit)
    }

    #[allow(clippy::type_complexity)]
    fn scan_visit(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<Option<Cursor>> {
        self.raw.scan_visit(p, range, cursor, limit, visit)
    }

    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        match EntityId::from_partition(p) {
            Some(entity) => self.apply_to_entity(&entity, p, batch),
            None => self.raw.apply(p, batch),
        }
    }

    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        self.raw.list_partitions(prefix)
    }

    fn contains_partition(&self, p: &Partition) -> Result<bool> {
        self.raw.contains_partition(p)
    }

    fn now_ms(&self) -> u64 {
        self.raw.now_ms()
    }

    fn limits(&self) -> StoreLimits {
        self.raw.limits()
    }

    fn evaluates_deadlines(&self) -> bool {
        self.raw.evaluates_deadlines()
    }

    fn exclusive_handle(&self) -> Option<u64> {
        self.raw.exclusive_handle()
    }

    fn stats(&self) -> StoreStats {
        self.raw.stats()
    }

    fn close(&self) -> Result<()> {
        Ok(())
    }
}
