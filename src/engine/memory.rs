//! The memory budget's calls on the engine (SPEC R10): passivating an entity on request, and
//! the test-only switch of passivation's guard. The budget itself is configured on the builder
//! ([`EngineBuilder::max_resident_entities`](super::EngineBuilder::max_resident_entities)) and
//! kept by the restore registry (`src/restore/passivate.rs`).

use super::Engine;
use crate::entity::EntityId;
use crate::error::Result;
use crate::restore::StateMachine;

impl<M: StateMachine> Engine<M> {
    /// Passivates an entity now (SPEC R10): drops its restored state from memory. Nothing is
    /// written (its history is durable already); its next touch restores it again from its
    /// newest checkpoint plus the log tail, exactly once, behind the same gate, and work
    /// deferred to it meanwhile is queued durably and applied then, as for any pending entity.
    /// An unclean-restart repair it had is not run again. Its slot then leaves the registry
    /// unless something still uses it, so a passivated entity costs no more memory than one
    /// never touched.
    ///
    /// Answers `true` if it was passivated, `false` if it was not restored (pending, or
    /// contained: a containment stays visible), and [`Error::Unavailable`](crate::Error::Unavailable) while a call uses
    /// it, a unit restores it, or a write to it whose answer was lost is not settled yet.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::typed::{Typed, TypedMachine};
    /// use portcullis::{Engine, EntityId, Rejection};
    /// struct Count;
    /// impl TypedMachine for Count {
    ///     type Record = (); type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, s: &mut u64, _: &portcullis::ApplyContext<'_>, _: ()) -> Result<(), Rejection> { *s += 1; Ok(()) }
    /// }
    /// let engine = Engine::builder(Typed(Count))
    ///     .store(std::sync::Arc::new(portcullis::store::MemoryStore::new()))
    ///     .register_on_first_write(true)
    ///     // No background warm: it restores the namespace's pending entities, and could
    ///     // restore the counter again between the passivation and the checks below.
    ///     .background_warm(false)
    ///     .open()?;
    /// let counter = EntityId::new("counters", "c1")?;
    /// engine.append_typed(&counter, &[(), ()])?;
    /// assert!(engine.passivate(&counter)?);
    /// assert_eq!(engine.stats().passivation.slots, 0); // nothing of it is left in memory
    /// assert!(!engine.passivate(&counter)?); // already pending
    /// assert_eq!(engine.read(&counter, |n| *n)?, 2); // restored again
    /// assert_eq!(engine.stats().passivation.passivations, 1);
    /// # Ok::<(), portcullis::Error>(())
    /// ```
    pub fn passivate(&self, entity: &EntityId) -> Result<bool> {
        let _open = self.enter()?;
        self.inner.restorer.passivate(entity)
    }

    /// Test-only negative control: passivation drops entities in any phase, contained ones
    /// too, so tests can show they catch a containment that passivation erased (SPEC R4, R10).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_passivate_unguarded_for_test(&self, unguarded: bool) {
        self.inner.restorer.set_passivate_unguarded(unguarded);
    }

    /// Test-only negative control: slots leave the registry whenever asked, even while in use
    /// (a touch holds one, a thread waits on its gate, a deferral is being written) or
    /// contained, so tests can show they catch two restores of one activation, lost deferred
    /// work or an erased containment (SPEC R2, R4, R8, R10).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_retire_unguarded_for_test(&self, unguarded: bool) {
        self.inner.restorer.set_retire_unguarded(unguarded);
    }

    /// Test-only: an explicit passivation, a release and a namespace adopted anew leave the
    /// entity's entry in the budget's ring (as before entries were taken out at once), so the
    /// slot stays in the registry until a walk of the ring reaches it; tests show they catch
    /// the slot kept (SPEC R4, R10).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_unlist_skipped_for_test(&self, skipped: bool) {
        self.inner.restorer.set_unlist_skipped(skipped);
    }

    /// Test-only negative control: releasing a namespace counts its entities without a slot
    /// as repaired without reading their `\0repair` rows, so tests can show they catch an owed
    /// repair dropped before every entity had it (SPEC R3, F11).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_repairs_assumed_for_test(&self, assumed: bool) {
        self.inner.restorer.set_repairs_assumed(assumed);
    }
}
