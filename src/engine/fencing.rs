//! Epoch fencing through the engine (SPEC E2: bump, revoke, mark recovered). Writes commit
//! through the same [`Fence`]; see [`Engine::write`].

use super::Engine;
use crate::entity::Namespace;
use crate::error::Result;
use crate::fence::{Fence, RevokeBudget, RevokeProgress};
use crate::restore::StateMachine;

impl<M: StateMachine> Engine<M> {
    /// The epoch fence the engine's writes commit through, for everything else it offers
    /// (background revocation, the sweeper, statistics).
    pub fn fence(&self) -> &Fence {
        &self.inner.fence
    }

    /// A namespace's current epoch (0 before the first bump).
    pub fn current_epoch(&self, ns: &Namespace) -> Result<u64> {
        let _open = self.enter()?;
        self.inner.fence.current_epoch(ns)
    }

    /// Advances a namespace's epoch to `new` (SPEC F1).
    pub fn bump_epoch(&self, ns: &Namespace, new: u64) -> Result<()> {
        let _open = self.enter()?;
        self.inner.fence.bump_epoch(ns, new)
    }

    /// Runs one bounded revocation slice for a namespace (SPEC F4, F5).
    pub fn revoke_step(&self, ns: &Namespace, budget: RevokeBudget) -> Result<RevokeProgress> {
        let _open = self.enter()?;
        self.inner.fence.revoke_step(ns, budget)
    }

    /// Declares a namespace's lease table recovered (SPEC F6).
    pub fn mark_lease_table_recovered(&self, ns: &Namespace) -> Result<()> {
        let _open = self.enter()?;
        self.inner.fence.mark_lease_table_recovered(ns)
    }
}
