//! Ownership and epoch fencing through the engine (SPEC E2, F11: own, release, bump, revoke,
//! mark recovered). Every engine write commits through the same [`Fence`] under the grant of
//! the namespace's holding; see `owner` and `owned_store`.

use super::Engine;
use super::owner::Mode;
use crate::entity::Namespace;
use crate::error::Result;
use crate::fence::{Fence, RevokeBudget, RevokeProgress, SweeperHandle};
use crate::restore::StateMachine;

impl<M: StateMachine> Engine<M> {
    /// Adopts a namespace: from now on this engine serves it under the namespace's current
    /// epoch, the grant every write it makes to an entity of the namespace commits under
    /// (SPEC F11). Returns the grant.
    ///
    /// Adopting a namespace this engine already serves returns its grant while that is still
    /// the current epoch (one store read). If the epoch was bumped since (by this engine or
    /// another) and nothing has learned it yet, that holding is stale: it is deposed, as a
    /// write meeting [`Fenced`](crate::Error::Fenced) would, and the namespace adopted again
    /// as below. Adopting one this engine was fenced out of (or released) takes it again at
    /// the current epoch and restores its entities afresh; do that only once this engine should
    /// own it again.
    ///
    /// Adopting a namespace another owner holds, or at an epoch above the one its holder
    /// adopted it at (this engine's own too), needs proof that revocation completed at the
    /// current epoch (SPEC F12): bump the epoch ([`Engine::bump_epoch`]) and run
    /// [`Engine::revoke_step`] until it answers `Complete` first, so no write of the old owner
    /// can commit any more, or use [`Engine::take_over`], which does all three. Until then it
    /// is refused with [`NotServed`](crate::Error::NotServed), naming the holder and what is
    /// missing. A take-over from an owner that did not release the namespace (it died, or was
    /// deposed) runs the unclean-restart repair once per entity (SPEC R3).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let a = Engine::builder(Typed(Total)).store(store.clone()).owner("a").adopt_on_first_use(false).open()?;
    /// let b = Engine::builder(Typed(Total)).store(store).owner("b").adopt_on_first_use(false).open()?;
    /// assert_eq!(a.own(&ns)?, 0);
    /// assert!(b.own(&ns).is_err(), "a holds it");
    /// // b takes it over: bump, revoke to Complete, adopt.
    /// b.bump_epoch(&ns, 1)?;
    /// while b.revoke_step(&ns, Default::default())? != portcullis::fence::RevokeProgress::Complete {}
    /// assert_eq!(b.own(&ns)?, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn own(&self, ns: &Namespace) -> Result<u64> {
        let _open = self.enter()?;
        self.inner.owners.adopt(ns, Mode::Fenced, false)
    }

    /// Adopts a namespace unfenced (SPEC F11; for applications that never hand it over): writes
    /// carry no lease guard and leave no leased-shard rows, so they cost no fencing store
    /// calls.
    ///
    /// The namespace is declared unfenced in the store ([`Fence::declare_unfenced`]), and that
    /// is permanent: a bump of its epoch through any engine or [`Fence`] handle over the store
    /// is refused with [`InvalidArgument`](crate::Error::InvalidArgument), an explicit
    /// [`Engine::own`] of it is refused, and adoption on first use serves it unfenced. Refused
    /// for a namespace that has ever been bumped, and with
    /// [`NotServed`](crate::Error::NotServed) while another owner holds it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let a = Engine::builder(Typed(Total)).store(store.clone()).owner("a").open()?;
    /// let b = Engine::builder(Typed(Total)).store(store).owner("b").open()?;
    /// a.own_unfenced(&ns)?; // a alone ever serves it
    /// assert!(b.bump_epoch(&ns, 1).is_err(), "no engine can bump it");
    /// # Ok(())
    /// # }
    /// ```
    pub fn own_unfenced(&self, ns: &Namespace) -> Result<()> {
        let _open = self.enter()?;
        self.inner
            .owners
            .adopt(ns, Mode::Unfenced, false)
            .map(|_| ())
    }

    /// Stops serving a namespace and records that in its owner row, so the next owner takes it
    /// over cleanly (no repair for this engine's term). Repairs this engine owed the namespace
    /// stay owed unless every entity of it had them (restored here, or its repair row names the
    /// newest owed term). Later calls for the namespace answer
    /// [`NotServed`](crate::Error::NotServed) until [`Engine::own`]. Releasing a namespace this
    /// engine does not serve does nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let a = Engine::builder(Typed(Total)).store(store.clone()).owner("a").adopt_on_first_use(false).open()?;
    /// let b = Engine::builder(Typed(Total)).store(store).owner("b").adopt_on_first_use(false).open()?;
    /// a.own(&ns)?;
    /// a.release_namespace(&ns)?; // a clean hand-over: b needs no bump and runs no repair
    /// assert_eq!(b.own(&ns)?, 0);
    /// assert!(a.grant(&ns).is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_namespace(&self, ns: &Namespace) -> Result<()> {
        let _open = self.enter()?;
        let all_repaired = self.inner.restorer.all_repaired_in(ns, None);
        self.inner.owners.release(ns, all_repaired)
    }

    /// The grant this engine serves a namespace under, if it serves it now (not deposed,
    /// released or never adopted). Answers from memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let engine = Engine::builder(Typed(Total)).store(store).adopt_on_first_use(false).open()?;
    /// assert_eq!(engine.grant(&ns), None); // not adopted yet
    /// engine.own(&ns)?;
    /// assert_eq!(engine.grant(&ns), Some(0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn grant(&self, ns: &Namespace) -> Option<u64> {
        self.inner.owners.held(ns).map(|h| h.grant)
    }

    /// The terms of the namespace whose unclean-restart repairs this engine runs as it restores
    /// entities (one per holder that ended without releasing the namespace, SPEC R3), adopting
    /// the namespace first if adoption on first use is on.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let engine = Engine::builder(Typed(Total)).store(store).adopt_on_first_use(false).open()?;
    /// engine.own(&ns)?;
    /// assert!(engine.owed_repairs(&ns)?.is_empty()); // nobody ended without releasing it
    /// # Ok(())
    /// # }
    /// ```
    pub fn owed_repairs(&self, ns: &Namespace) -> Result<Vec<u64>> {
        let _open = self.enter()?;
        Ok(self.inner.owners.serving(ns)?.owed.to_vec())
    }

    /// The epoch fence the engine's writes commit through, for everything else it offers
    /// (background revocation, the sweeper, statistics).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let engine = Engine::builder(Typed(Total)).store(store).adopt_on_first_use(false).open()?;
    /// let stats = engine.fence().stats();
    /// println!("{} fencing store calls so far", stats.store_calls);
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence(&self) -> &Fence {
        &self.inner.fence
    }

    /// The background sweeper of expired leased-shard rows (SPEC F9). It starts when this
    /// engine first serves a fenced namespace (so `None` before that, and for an engine that
    /// serves only unfenced ones), unless it was turned off with
    /// [`EngineBuilder::sweep_expired_leases`](super::EngineBuilder::sweep_expired_leases). It
    /// sweeps every namespace this engine serves, every
    /// [`sweep_interval`](super::EngineBuilder::sweep_interval); `close` stops it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let engine = Engine::builder(Typed(Total)).store(store).adopt_on_first_use(false).open()?;
    /// assert!(engine.sweeper().is_none(), "it starts with the first fenced namespace");
    /// engine.own(&ns)?;
    /// let sweeper = engine.sweeper().expect("on by default");
    /// println!("{} sweeps so far, every {:?}", sweeper.passes(), sweeper.interval());
    /// # Ok(())
    /// # }
    /// ```
    pub fn sweeper(&self) -> Option<&SweeperHandle> {
        self.inner.sweeper.get().and_then(Option::as_ref)
    }

    /// A namespace's current epoch (0 before the first bump).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let engine = Engine::builder(Typed(Total)).store(store).adopt_on_first_use(false).open()?;
    /// assert_eq!(engine.current_epoch(&ns)?, 0);
    /// engine.bump_epoch(&ns, 2)?;
    /// assert_eq!(engine.current_epoch(&ns)?, 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn current_epoch(&self, ns: &Namespace) -> Result<u64> {
        let _open = self.enter()?;
        self.inner.fence.current_epoch(ns)
    }

    /// Advances a namespace's epoch to `new` (SPEC F1): the first step of a take-over. Refused
    /// with [`InvalidArgument`](crate::Error::InvalidArgument) for a namespace declared
    /// unfenced (by any engine, [`Engine::own_unfenced`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let a = Engine::builder(Typed(Total)).store(store.clone()).owner("a").adopt_on_first_use(false).open()?;
    /// let b = Engine::builder(Typed(Total)).store(store).owner("b").adopt_on_first_use(false).open()?;
    /// a.own(&ns)?;
    /// b.bump_epoch(&ns, 1)?; // the first step of b's take-over
    /// while b.revoke_step(&ns, Default::default())? != portcullis::fence::RevokeProgress::Complete {}
    /// b.own(&ns)?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// assert!(matches!(a.register(&job), Err(portcullis::Error::Fenced { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn bump_epoch(&self, ns: &Namespace, new: u64) -> Result<()> {
        let _open = self.enter()?;
        self.inner.fence.bump_epoch(ns, new)
    }

    /// Runs one bounded revocation slice for a namespace (SPEC F4, F5).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    /// use portcullis::fence::{RevokeBudget, RevokeProgress};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let engine = Engine::builder(Typed(Total)).store(store).adopt_on_first_use(false).open()?;
    /// engine.bump_epoch(&ns, 1)?;
    /// // Each slice is bounded; run the next when convenient.
    /// while engine.revoke_step(&ns, RevokeBudget::default().with_max_pages(4))? != RevokeProgress::Complete {}
    /// # Ok(())
    /// # }
    /// ```
    pub fn revoke_step(&self, ns: &Namespace, budget: RevokeBudget) -> Result<RevokeProgress> {
        let _open = self.enter()?;
        self.inner.fence.revoke_step(ns, budget)
    }

    /// Test-only negative control (feature `test-hooks`): [`Engine::own_unfenced`] serves the
    /// namespace unfenced without declaring it so in the store, as it did before, so tests can
    /// show they catch the bump that then gets through.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_skip_unfenced_declaration_for_test(&self, skip: bool) {
        self.inner.owners.set_skip_declaration(skip);
    }

    /// Declares a namespace's lease table recovered (SPEC F6).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection, Typed, TypedMachine};
    /// use portcullis::fence::{RevokeBudget, RevokeProgress};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    /// let ns = Namespace::new("jobs")?;
    /// let engine = Engine::builder(Typed(Total)).store(store).adopt_on_first_use(false).open()?;
    /// // The lease rows were restored from a backup: no revocation completes for a lease's time.
    /// engine.mark_lease_table_recovered(&ns)?;
    /// let progress = engine.revoke_step(&ns, RevokeBudget::default())?;
    /// assert!(matches!(progress, RevokeProgress::Pending { .. }));
    /// # Ok(())
    /// # }
    /// ```
    pub fn mark_lease_table_recovered(&self, ns: &Namespace) -> Result<()> {
        let _open = self.enter()?;
        self.inner.fence.mark_lease_table_recovered(ns)
    }
}
