//! FENCE SEAM (SPEC F2, F3): where a write's grant epoch goes through epoch fencing.
//!
//! Every engine write asks a [`WriteFence`] for the guards and rows its batch must carry under
//! the caller's grant epoch (the entity's lease as read, a `NotAfter` deadline, a renewed
//! lease), and re-plans a bounded number of times when those guards fail. The fencing
//! subsystem implements this trait; until it is wired in, the engine uses [`Unfenced`], which
//! adds nothing, so writes are not yet fenced.

use crate::entity::EntityId;
use crate::error::Result;
use crate::store::{Batch, Store};

/// Plans the fencing part of one write.
pub(crate) trait WriteFence: Send + Sync {
    /// The guards and operations a write planned under `grant_epoch` must carry in its batch.
    /// An error (for example `Fenced`) refuses the write before anything is written.
    fn plan(&self, store: &dyn Store, entity: &EntityId, grant_epoch: u64) -> Result<Batch>;
}

/// No fencing: adds nothing to the batch. Used until the fencing subsystem is wired in.
pub(crate) struct Unfenced;

impl WriteFence for Unfenced {
    fn plan(&self, _store: &dyn Store, _entity: &EntityId, _grant_epoch: u64) -> Result<Batch> {
        Ok(Batch::new())
    }
}

/// How many times a write re-plans after its fencing guards failed (SPEC F3).
pub(crate) const MAX_REPLANS: usize = 4;
