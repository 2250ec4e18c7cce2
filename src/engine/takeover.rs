//! Taking a namespace over in one call, and looking up who owns one (SPEC F12).
//!
//! Owns [`Engine::take_over`] (bump, revoke to `Complete`, adopt, refused while the holder's
//! owner lease is live unless forced), [`Engine::owner_of`] (the lookup routers use) and
//! [`Engine::renew_owner_lease`]. Calls the engine's owners (`owner.rs`, `liveness.rs`) and
//! the fence; runs no application code.

use super::Engine;
use super::owner::Mode;
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::fence::{RevokeBudget, RevokeProgress};
use crate::observe::Event;
use crate::restore::StateMachine;

/// How [`Engine::take_over`] takes a namespace over.
///
/// # Examples
///
/// ```
/// use portcullis::engine::TakeOver;
/// use portcullis::fence::RevokeBudget;
///
/// let careful = TakeOver::new(); // refused while the holder is live
/// assert!(!careful.is_forced());
/// let now = TakeOver::new().force(true).budget(RevokeBudget::default()).max_slices(64);
/// assert!(now.is_forced());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakeOver {
    force: bool,
    budget: RevokeBudget,
    max_slices: usize,
}

impl Default for TakeOver {
    fn default() -> Self {
        TakeOver::new()
    }
}

impl TakeOver {
    /// Not forced, default slices ([`RevokeBudget::default`]), at most 1,024 slices per call.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::engine::TakeOver;
    /// assert_eq!(TakeOver::new(), TakeOver::default());
    /// ```
    pub fn new() -> Self {
        TakeOver {
            force: false,
            budget: RevokeBudget::default(),
            max_slices: 1_024,
        }
    }

    /// Takes the namespace even from a holder whose owner lease is live (SPEC F12). Its writes
    /// are fenced once revocation completes (SPEC F7); it stops serving reads at its next
    /// renewal, at most `owner_lease - lease_margin_ms` after the bump (docs/fencing.md). Use
    /// it when the holder is known to be gone, or must go now. Default: false.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::engine::TakeOver;
    /// assert!(TakeOver::new().force(true).is_forced());
    /// ```
    pub fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    /// The budget of each revocation slice (SPEC F4).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::engine::TakeOver;
    /// use portcullis::fence::RevokeBudget;
    /// let gentle = TakeOver::new().budget(RevokeBudget::default().with_max_pushes(1));
    /// assert_ne!(gentle, TakeOver::new());
    /// ```
    pub fn budget(mut self, budget: RevokeBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The most revocation slices one call runs (at least 1): each pushes at most four leases,
    /// so the default 1,024 completes a namespace with up to about 4,000 live leases in one
    /// call. A call that runs out answers [`Error::Unavailable`]; calling again resumes.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::engine::TakeOver;
    /// let short = TakeOver::new().max_slices(0); // clamped to 1
    /// assert_eq!(short, TakeOver::new().max_slices(1));
    /// ```
    pub fn max_slices(mut self, slices: usize) -> Self {
        self.max_slices = slices.max(1);
        self
    }

    /// Whether [`force`](Self::force) is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::engine::TakeOver;
    /// assert!(!TakeOver::new().is_forced());
    /// ```
    pub fn is_forced(&self) -> bool {
        self.force
    }
}

/// Who owns a namespace, as its owner row and the holder's lease say now (SPEC F12): see
/// [`Engine::owner_of`].
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
/// let a = Engine::builder(Typed(Total)).store(store).owner("a").open()?;
/// a.own(&ns)?;
/// a.release_namespace(&ns)?;
/// let owner = a.owner_of(&ns)?.expect("a adopted it once");
/// assert!(owner.released && !owner.serves()); // anyone may adopt it now
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NamespaceOwner {
    /// The holder's owner id.
    pub owner: String,
    /// The holder's incarnation.
    pub incarnation: u64,
    /// The epoch it adopted the namespace at (its grant).
    pub epoch: u64,
    /// The namespace's current epoch: above `epoch` once a take-over bumped it.
    pub current_epoch: u64,
    /// Whether the holder's owner lease is live (on this engine's clock).
    pub live: bool,
    /// Whether the holder released the namespace (a clean hand-over: anyone may adopt it).
    pub released: bool,
    /// Whether it is served fenced (false: declared unfenced, SPEC F11).
    pub fenced: bool,
    /// When the holder's lease expires (this engine's clock), if it has one.
    pub lease_expires_at_ms: Option<u64>,
}

impl NamespaceOwner {
    /// Whether the holder serves the namespace now: live, not released, at the current epoch.
    /// A router sends the namespace's calls there.
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
    /// let a = Engine::builder(Typed(Total)).store(store).owner("a").open()?;
    /// a.own(&ns)?;
    /// assert!(a.owner_of(&ns)?.expect("owned").serves());
    /// # Ok(())
    /// # }
    /// ```
    pub fn serves(&self) -> bool {
        self.live && !self.released && self.epoch == self.current_epoch
    }
}

impl<M: StateMachine> Engine<M> {
    /// Takes a namespace over in one call (SPEC F12, F7): bumps its epoch (unless a bump past
    /// the holder's grant was made already), runs revocation slices until `Complete`, and
    /// adopts it on the proof of that completion. Returns the grant. Expired leases of a dead
    /// holder count as revoked (SPEC F5). A holder that did not release the namespace owes its
    /// term a repair, run once per entity as each restores (SPEC R3).
    ///
    /// Refused with [`Error::OwnerLive`] while the holder's owner lease is live, unless
    /// [`TakeOver::force`]: a live owner is not taken for a crash. A namespace nobody holds (or
    /// that was released, or that an earlier incarnation of this owner id held at the current
    /// epoch) is adopted as [`Engine::own`] would, with no bump. A namespace declared unfenced
    /// cannot be taken over (`InvalidArgument`: nothing can fence its holder). If revocation is
    /// still pending after [`TakeOver::max_slices`] slices, answers [`Error::Unavailable`];
    /// calling again resumes it without bumping again.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::engine::TakeOver;
    /// use portcullis::store::{MemoryStore, Store};
    /// use portcullis::{ApplyContext, Engine, EntityId, Error, ManualClock, Namespace, Rejection, Typed, TypedMachine};
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
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// a.register(&job)?;
    /// a.append_typed(&job, &[5])?;
    /// // a is live: a take-over must be forced.
    /// assert!(matches!(b.take_over(&ns, TakeOver::new()), Err(Error::OwnerLive { .. })));
    /// assert_eq!(b.take_over(&ns, TakeOver::new().force(true))?, 1);
    /// assert_eq!(b.read(&job, |t| *t)?, 5);
    /// assert!(matches!(a.append_typed(&job, &[1]), Err(Error::Fenced { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub fn take_over(&self, ns: &Namespace, how: TakeOver) -> Result<u64> {
        let _open = self.enter()?;
        let _span = crate::observe::span!("portcullis.take_over", namespace = ns);
        let owners = &self.inner.owners;
        let (view, row) = owners.lookup(ns)?;
        let Some(row) = row.filter(|r| !r.released) else {
            return owners.adopt(ns, Mode::Fenced, false);
        };
        let mine = row.owner == self.owner();
        if mine && row.epoch >= view.epoch {
            // This engine's own holding, or an earlier incarnation's at the current epoch (it
            // crashed: this engine opened once its lease had expired).
            return owners.adopt(ns, Mode::Fenced, false);
        }
        if view.unfenced {
            return Err(Error::invalid(format!(
                "namespace {ns} is served unfenced (permanently): it cannot be taken over, since \
                 nothing could fence its holder's writes; only its release moves it"
            )));
        }
        let holder = owners.liveness.holder(&row.owner, row.incarnation)?;
        let ours_now = mine && row.incarnation == self.incarnation();
        if holder.live && !ours_now && !how.force && !owners.switches().take_over_ignores_liveness {
            let now = owners.liveness.now_ms();
            let expires_in_ms = holder.expires_at_ms.map_or(0, |t| t.saturating_sub(now));
            return Err(Error::OwnerLive {
                owner: row.owner,
                incarnation: row.incarnation,
                expires_in_ms,
                detail: format!(
                    "it holds namespace {ns}; take_over refuses to take a namespace from a live \
                     owner: have it release the namespace, or wait until its lease expires (in \
                     {expires_in_ms} ms) if it is gone, or pass TakeOver::force(true) to take it \
                     now (its writes are fenced once revocation completes)"
                ),
            });
        }
        let fence = &self.inner.fence;
        if row.epoch >= view.epoch {
            match fence.bump_epoch(ns, view.epoch + 1) {
                Ok(()) => {}
                // Someone else bumped meanwhile: past the holder's grant is all this needs.
                Err(Error::InvalidArgument(_)) if fence.current_epoch(ns)? > row.epoch => {}
                Err(e) => return Err(e),
            }
        }
        ::log::info!(
            "owner {:?} takes namespace {ns} over from {:?} (incarnation {}, {})",
            self.owner(),
            row.owner,
            row.incarnation,
            if holder.live {
                "live: forced"
            } else {
                "its lease expired"
            }
        );
        let mut remaining = 0;
        for _ in 0..how.max_slices {
            match fence.revoke_step(ns, how.budget)? {
                RevokeProgress::Complete => {
                    let grant = owners.adopt(ns, Mode::Fenced, false)?;
                    self.inner.watch.events.emit(|| Event::TookOver {
                        namespace: ns.clone(),
                        from: row.owner.clone(),
                        forced: holder.live,
                        epoch: grant,
                    });
                    return Ok(grant);
                }
                RevokeProgress::Pending { remaining: r } => remaining = r,
            }
        }
        Err(Error::Unavailable {
            reason: format!(
                "revocation of namespace {ns} is still pending after {} slices (at least \
                 {remaining} leases or hold-offs remaining); call take_over again to resume it \
                 (it does not bump again)",
                how.max_slices
            ),
            retry_after_ms: 100,
        })
    }

    /// Who owns a namespace (SPEC F12), for routers: the holder's owner id, incarnation and
    /// grant, the namespace's current epoch, and whether the holder's owner lease is live.
    /// `None` if no engine ever adopted it. Two store reads; changes nothing.
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
    /// let router = Engine::builder(Typed(Total)).store(store).owner("router").open()?;
    /// assert_eq!(router.owner_of(&ns)?, None);
    /// a.own(&ns)?;
    /// let owner = router.owner_of(&ns)?.expect("a holds it");
    /// assert_eq!((owner.owner.as_str(), owner.epoch, owner.live), ("a", 0, true));
    /// assert!(owner.serves());
    /// # Ok(())
    /// # }
    /// ```
    pub fn owner_of(&self, ns: &Namespace) -> Result<Option<NamespaceOwner>> {
        let _open = self.enter()?;
        let owners = &self.inner.owners;
        let (view, row) = owners.lookup(ns)?;
        let Some(row) = row else { return Ok(None) };
        let holder = owners.liveness.holder(&row.owner, row.incarnation)?;
        Ok(Some(NamespaceOwner {
            owner: row.owner,
            incarnation: row.incarnation,
            epoch: row.epoch,
            current_epoch: view.epoch,
            live: holder.live,
            released: row.released,
            fenced: row.fenced,
            lease_expires_at_ms: holder.expires_at_ms,
        }))
    }

    /// Renews this engine's owner lease now (SPEC F12) and re-reads every namespace it holds,
    /// deposing those a take-over moved. The background renewer does this on its own
    /// ([`EngineBuilder::renew_owner_lease`](super::EngineBuilder::renew_owner_lease)); call it
    /// when that is off. Answers [`Error::OwnerLive`] once another engine with this owner id
    /// has replaced this one (its lease had expired): this engine then serves nothing.
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
    /// let engine = Engine::builder(Typed(Total)).store(store).renew_owner_lease(false).open()?;
    /// engine.renew_owner_lease()?;
    /// assert_eq!(engine.stats().owner_lease.renewals, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn renew_owner_lease(&self) -> Result<()> {
        let _open = self.enter()?;
        self.inner.owners.renew()
    }
}
