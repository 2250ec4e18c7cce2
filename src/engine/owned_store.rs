//! The store as the engine's own code sees it (SPEC F11): reads go straight to the store, and
//! every batch on an entity partition commits through the fence under the grant of the
//! namespace's holding. The restore layer (registration markers, deferred rows and their drain,
//! repair records, owed checkpoints), the write path, `checkpoint` and truncation all write
//! through this one type, so no engine write to an entity can bypass the fence.
//!
//! A fenced write (`Error::Fenced`) deposes the holding (see `owner`), so later calls for the
//! namespace answer `Fenced` from memory. Batches on other partitions (the engine's system
//! partition, coordinators) pass through unchanged. Closing this view closes nothing: the
//! store's lifetime belongs to whoever opened it.

use crate::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::owner::{Mode, Owners};
use crate::entity::EntityId;
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
        if holding.mode == Mode::Unfenced {
            return self.raw.apply(p, batch);
        }
        if self.bypass_fence.load(Ordering::Relaxed) {
            return self.raw.apply(p, batch);
        }
        match self
            .fence
            .write_engine_rows_with(entity, holding.grant, |_| Some(batch.clone()))
        {
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
