//! A world of owners for the engine-level property test: two or three engines over one shared
//! store, each behind its own [`OwnerStore`] view, with the steps they take ([`Step`]) and
//! the checks made after every step. Steps run on one thread; an interleaving (a step of one
//! owner paused at a fence hook point while other owners act) runs the other owners' steps
//! from inside the hook, so every schedule replays from its step list.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use portcullis::engine::{Deferred, Engine, NamespaceOwner, OwnerSwitches};
use portcullis::fence::{
    Fence, FenceConfig, FenceGrant, FenceHooks, FenceKind, GuardSwitches, HookPoint, LeaseRow,
    RevokeBudget, RevokeProgress, decode_row, write_under,
};
use portcullis::store::{Batch, Store};
use portcullis::{EntityId, Error, ManualClock, Namespace};

use super::owners::{CallGrant, ListMachine, OwnerClock, OwnerStore, Shared, UnitCounter};
pub use super::steps::{Shape, Step, namespace};

pub type Eng = Engine<ListMachine>;

/// One owner: its engine (re-opened after a crash), its view of the store, its counters.
pub struct Owner {
    pub engine: Eng,
    pub store: Arc<OwnerStore>,
    pub units: Arc<UnitCounter>,
    pub authority: Fence,
    pub auth_grants: HashMap<Namespace, u64>,
}

struct Armed {
    owner: usize,
    point: HookPoint,
    actions: Vec<Step>,
}

pub struct World {
    pub shape: Shape,
    pub base: Arc<dyn Store>,
    pub clock: ManualClock,
    pub config: FenceConfig,
    pub shared: Arc<Shared>,
    pub switches: GuardSwitches,
    /// The ownership switches every engine opens with (a negative control).
    pub owner_switches: OwnerSwitches,
    pub(super) owners: Vec<Mutex<Option<Owner>>>,
    armed: Mutex<Option<Armed>>,
    /// Whether an interleaving ran during the current step.
    fired: AtomicBool,
    /// Negative control: engines commit their entity batches without the fence.
    bypass_fence: AtomicBool,
    /// Records written so far (payloads are unique).
    counter: Mutex<u64>,
    /// Every deferral the engine accepted: entity and payload.
    pub deferred: Mutex<Vec<(EntityId, Vec<u8>)>>,
    /// Outcomes counted by [`World::tally`].
    pub tallies: Mutex<std::collections::BTreeMap<String, u64>>,
    /// The steps run, nested ones indented.
    pub trace: Mutex<Vec<String>>,
    /// Each namespace's holder (its owner row) after the last check.
    pub(super) holders: Mutex<Vec<Option<NamespaceOwner>>>,
    me: Weak<World>,
}

/// The fence hooks of one owner: run an armed interleaving.
struct Hooks {
    world: Weak<World>,
    owner: usize,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hooks({})", self.owner)
    }
}

impl FenceHooks for Hooks {
    fn at(&self, point: HookPoint, _: Option<&EntityId>) {
        if let Some(world) = self.world.upgrade() {
            world.hooked(self.owner, point);
        }
    }
}

impl World {
    /// A world over `base` (whose clock is `clock`); owner `o` first serves the namespaces
    /// `ns % owners == o` and registers their entities.
    pub fn new(
        shape: Shape,
        base: Arc<dyn Store>,
        clock: ManualClock,
        (switches, owner_switches): (GuardSwitches, OwnerSwitches),
    ) -> Arc<World> {
        let world = Arc::new_cyclic(|me| World {
            shape,
            base,
            clock,
            config: FenceConfig::default(),
            shared: Arc::new(Shared::default()),
            switches,
            owner_switches,
            owners: (0..shape.owners).map(|_| Mutex::new(None)).collect(),
            armed: Mutex::new(None),
            fired: AtomicBool::new(false),
            bypass_fence: AtomicBool::new(false),
            counter: Mutex::new(0),
            deferred: Mutex::new(Vec::new()),
            trace: Mutex::new(Vec::new()),
            holders: Mutex::new(vec![None; shape.namespaces]),
            tallies: Mutex::new(Default::default()),
            me: me.clone(),
        });
        for o in 0..shape.owners {
            world.open(o, 0);
        }
        for ns in 0..shape.namespaces {
            let o = ns % shape.owners;
            world.exec(&Step::Own { o, ns }).unwrap();
        }
        for e in 0..shape.entities {
            let owner = world.owner(e % shape.namespaces % shape.owners);
            owner.engine.register(&world.entity(e)).unwrap();
        }
        world
    }

    pub fn entity(&self, i: usize) -> EntityId {
        EntityId::in_namespace(namespace(i % self.shape.namespaces), format!("e{i}")).unwrap()
    }

    pub(super) fn open(&self, o: usize, skew: i64) {
        let store = Arc::new(OwnerStore::new(
            Arc::clone(&self.base),
            o,
            skew,
            Arc::clone(&self.shared),
        ));
        let units = Arc::new(UnitCounter::default());
        // Every owner adopts on first use (the default): a touch by an owner that does not
        // serve a namespace may adopt it only if no other owner holds it (SPEC F12).
        let engine = Engine::builder(ListMachine)
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .owner(format!("owner-{o}"))
            .owner_switches_for_test(self.owner_switches)
            // Sweeps are steps of their own: no background pass on real time. Owner leases are
            // renewed by the calls that find them lapsed, on the world's clock: no background
            // renewal on real time either, and no background warm (restores happen in touch and
            // warm steps), so every case replays from its seed.
            .sweep_expired_leases(false)
            .renew_owner_lease(false)
            .background_warm(false)
            .pool_threads(1)
            .warm_parallelism(1)
            .checkpoint_tail_bound(4)
            .truncate_after_checkpoint(o == 0)
            .fence_config(self.config)
            .metrics(Arc::clone(&units) as _)
            .open()
            .unwrap();
        let clock = Arc::new(OwnerClock(Arc::clone(&store)));
        let authority = Fence::with_kind(
            Arc::clone(&store) as Arc<dyn Store>,
            clock,
            self.config,
            FenceKind::Authority,
        );
        engine.set_bypass_fence_for_test(self.bypass_fence.load(Ordering::SeqCst));
        // The grant of a namespace adopted on first use, which no step recorded.
        let me = self.me.clone();
        store.set_grant_of(Box::new(move |ns| {
            me.upgrade()
                .and_then(|w| w.owners[o].lock().as_ref().map(|x| x.engine.clone()))
                .and_then(|engine| engine.grant(ns))
        }));
        for fence in [engine.fence(), &authority] {
            fence.set_guard_switches(self.switches);
            fence.set_hooks(Arc::new(Hooks {
                world: self.me.clone(),
                owner: o,
            }));
        }
        *self.owners[o].lock() = Some(Owner {
            engine,
            store,
            units,
            authority,
            auth_grants: HashMap::new(),
        });
    }

    /// Negative control: every engine, now and after a crash, commits its entity batches
    /// without the fence (as before SPEC F11).
    pub fn bypass_engine_fence(&self) {
        self.bypass_fence.store(true, Ordering::SeqCst);
        for o in 0..self.shape.owners {
            self.owner(o).engine.set_bypass_fence_for_test(true);
        }
    }

    /// A handle on owner `o` (its parts cloned out, so no lock is held across a call).
    pub fn owner(&self, o: usize) -> OwnerHandle {
        let guard = self.owners[o].lock();
        let owner = guard.as_ref().expect("every owner is open");
        OwnerHandle {
            engine: owner.engine.clone(),
            store: Arc::clone(&owner.store),
            units: Arc::clone(&owner.units),
            authority: owner.authority.clone(),
        }
    }

    fn payload(&self, kind: &str) -> Vec<u8> {
        let mut n = self.counter.lock();
        *n += 1;
        format!("{kind}{n}").into_bytes()
    }

    fn hooked(&self, owner: usize, point: HookPoint) {
        let armed = {
            let mut armed = self.armed.lock();
            match &*armed {
                Some(a) if a.owner == owner && a.point == point => armed.take(),
                _ => None,
            }
        };
        let Some(armed) = armed else { return };
        self.fired.store(true, Ordering::SeqCst);
        self.tally("interleaving ran");
        for step in &armed.actions {
            self.trace
                .lock()
                .push(format!("    at {point:?}: {step:?}"));
            if let Err(v) = self.exec(step) {
                self.shared.violation(v);
            }
        }
    }

    /// Whether owner `o` may adopt `ns` now without two owners writing it: every other owner
    /// serving it holds a grant that a completed revocation has already cut off.
    fn may_own(&self, o: usize, ns: &Namespace) -> portcullis::Result<bool> {
        let current = self.owner(o).engine.current_epoch(ns)?;
        let done = self.shared.completed(FenceKind::Epoch, ns);
        Ok((0..self.shape.owners).filter(|&j| j != o).all(|j| {
            self.owner(j)
                .engine
                .grant(ns)
                .is_none_or(|g| g < current && done >= current)
        }))
    }

    /// No interleaving is armed any more (a step that goes on after its own work).
    pub(super) fn disarm(&self) {
        *self.armed.lock() = None;
    }

    /// Runs one top-level step; `Err` describes a violation.
    pub fn run(&self, step: &Step) -> Result<(), String> {
        self.trace.lock().push(format!("{step:?}"));
        self.fired.store(false, Ordering::SeqCst);
        self.shared.lost.store(false, Ordering::SeqCst);
        let result = self.exec(step);
        *self.armed.lock() = None;
        result?;
        self.check()
    }

    /// The checks made after every step.
    pub fn check(&self) -> Result<(), String> {
        if let Some(v) = self.shared.violations.lock().first() {
            return Err(v.clone());
        }
        self.ownership()?;
        for o in 0..self.shape.owners {
            let owner = self.owner(o);
            if let Some(c) = owner.units.contained.lock().first() {
                return Err(format!("owner {o} contained {c}"));
            }
            if let Some((e, n)) = owner.units.repeated().first() {
                return Err(format!(
                    "owner {o} (incarnation {}) restored {e} {n} times under one adoption",
                    owner.engine.incarnation()
                ));
            }
        }
        Ok(())
    }

    /// Whether an error is one the step may meet; `Unavailable` only when an interleaving
    /// moved leases under the step or an answer was lost during it, `OutcomeUnknown` only in
    /// the latter case.
    pub(super) fn expected(&self, what: &str, e: Error) -> Result<(), String> {
        self.tally(&format!("{what}: {}", e.code()));
        match e {
            Error::Fenced { .. } | Error::NotServed { .. } | Error::OwnerLive { .. } => Ok(()),
            Error::Unavailable { .. } if self.fired.load(Ordering::SeqCst) => Ok(()),
            Error::Unavailable { .. } | Error::OutcomeUnknown { .. }
                if self.shared.lost.load(Ordering::SeqCst) =>
            {
                Ok(())
            }
            e => Err(format!("{what}: unexpected {e}")),
        }
    }

    /// Counts an outcome, to show what the steps reached.
    pub fn tally(&self, what: &str) {
        *self.tallies.lock().entry(what.to_string()).or_default() += 1;
    }

    pub(super) fn completed(
        &self,
        kind: FenceKind,
        fence: &Fence,
        ns: usize,
    ) -> Result<(), String> {
        self.tally(&format!("complete {kind:?}"));
        let ns = namespace(ns);
        let epoch = fence.current_epoch(&ns).map_err(|e| e.to_string())?;
        self.shared.complete(kind, &ns, epoch);
        // No entity of the namespace may still hold a lease usable below the epoch.
        let store_now = self.base.now_ms();
        for i in (0..self.shape.entities).filter(|i| i % self.shape.namespaces == ns_index(&ns)) {
            let e = self.entity(i);
            let raw = self.base.get(&e.partition(), fence.keys().lease()).unwrap();
            if let Some(raw) = raw {
                let lease: LeaseRow = decode_row("lease", &raw).unwrap();
                if lease.epoch < epoch
                    && store_now + self.config.lease_margin_ms() <= lease.expires_at_ms
                {
                    return Err(format!(
                        "F7 violated ({kind:?}): Complete for {epoch} while {e}'s lease {lease:?} is usable"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Runs one step (top-level or nested).
    pub fn exec(&self, step: &Step) -> Result<(), String> {
        match *step {
            Step::Touch { o, e } => {
                if let Err(err) = self.owner(o).engine.read(&self.entity(e), |_| ()) {
                    self.expected("touch", err)?;
                }
            }
            Step::Read { o, e } => self.read(o, e)?,
            Step::Write { o, e } => {
                let (x, payload) = (self.entity(e), self.payload("w"));
                match self.owner(o).engine.append(&x, vec![payload.clone()]) {
                    Ok(seqs) => self.check_at(&x, *seqs.start(), &payload)?,
                    Err(err) => self.expected("write", err)?,
                }
            }
            Step::Defer { o, e } => {
                let (x, payload) = (self.entity(e), self.payload("d"));
                match self.owner(o).engine.defer(&x, payload.clone()) {
                    Ok(Deferred::Queued) => {
                        self.tally("deferral queued");
                        self.deferred.lock().push((x, payload));
                    }
                    Ok(Deferred::Applied { seq }) => {
                        self.deferred.lock().push((x.clone(), payload.clone()));
                        self.check_at(&x, seq, &payload)?;
                    }
                    Ok(Deferred::AlreadyAccepted) => return Err("defer: a duplicate".into()),
                    Err(err) => self.expected("defer", err)?,
                }
            }
            Step::Checkpoint { o, e } => {
                if let Err(err) = self.owner(o).engine.checkpoint(&self.entity(e)) {
                    self.expected("checkpoint", err)?;
                }
            }
            Step::Bump { o, ns } => {
                let (engine, ns) = (self.owner(o).engine, namespace(ns));
                let current = engine.current_epoch(&ns).map_err(|e| e.to_string())?;
                engine
                    .bump_epoch(&ns, current + 1)
                    .map_err(|e| e.to_string())?;
            }
            Step::Revoke {
                o,
                ns,
                pages,
                pushes,
            } => {
                let owner = self.owner(o);
                let budget = RevokeBudget::default()
                    .with_max_pages(pages)
                    .with_max_pushes(pushes);
                match owner.engine.revoke_step(&namespace(ns), budget) {
                    Ok(RevokeProgress::Complete) => {
                        self.completed(FenceKind::Epoch, owner.engine.fence(), ns)?
                    }
                    Ok(_) => {}
                    Err(err) => self.expected("revoke", err)?,
                }
            }
            Step::Renew { o, e } | Step::FenceWrite { o, e } => {
                let (owner, x) = (self.owner(o), self.entity(e));
                let grant = match step {
                    Step::Renew { .. } => owner.engine.grant(x.namespace()),
                    _ => owner.engine.current_epoch(x.namespace()).ok(),
                };
                let Some(grant) = grant else { return Ok(()) };
                let call = CallGrant {
                    ns: x.namespace().clone(),
                    epoch: grant,
                    authority: None,
                };
                let put = Batch::new().put(self.payload("a"), b"v".to_vec());
                let written = self
                    .shared
                    .calling(o, call, || owner.engine.fence().write(&x, grant, put));
                if let Err(err) = written {
                    self.expected("fence write", err)?;
                }
            }
            Step::Sweep { o, ns } => {
                let owner = self.owner(o);
                owner
                    .engine
                    .fence()
                    .sweep_step(&namespace(ns))
                    .map_err(|e| e.to_string())?;
            }
            Step::Advance { ms } => self.clock.advance(ms),
            Step::Skew { o, ms } => self.owner(o).store.skew_ms.store(ms, Ordering::SeqCst),
            Step::MarkRecovered { o, ns } => {
                let engine = self.owner(o).engine;
                engine
                    .mark_lease_table_recovered(&namespace(ns))
                    .map_err(|e| e.to_string())?;
            }
            Step::AuthBump { o, ns } => {
                let authority = self.owner(o).authority;
                authority
                    .advance_epoch(&namespace(ns), 1)
                    .map_err(|e| e.to_string())?;
            }
            Step::AuthRevoke { o, ns } => {
                let authority = self.owner(o).authority;
                match authority.revoke_step(&namespace(ns), RevokeBudget::default()) {
                    Ok(RevokeProgress::Complete) => {
                        self.completed(FenceKind::Authority, &authority, ns)?
                    }
                    Ok(_) => {}
                    Err(err) => self.expected("authority revoke", err)?,
                }
            }
            Step::AuthWrite { o, e, refresh } => self.auth_write(o, e, refresh)?,
            Step::Crash { o } => self.crash(o)?,
            Step::Warm { o } => self.warm(o)?,
            Step::FoldAll { o } => self.fold_all(o)?,
            Step::TakeOverCall { o, ns, force } => self.take_over_call(o, ns, force)?,
            Step::Release { o, ns } => {
                let (owner, ns) = (self.owner(o), namespace(ns));
                owner
                    .engine
                    .release_namespace(&ns)
                    .map_err(|e| e.to_string())?;
                owner.store.grants.lock().remove(&ns);
            }
            Step::Own { o, ns } => {
                self.proof_of_completion(o, ns)?;
                let (owner, ns) = (self.owner(o), namespace(ns));
                if !self.may_own(o, &ns).map_err(|e| e.to_string())? {
                    return Ok(());
                }
                let before = owner.engine.grant(&ns);
                match owner.engine.own(&ns) {
                    Ok(grant) => {
                        self.tally("own");
                        if before != Some(grant) {
                            owner.units.forget(&ns);
                        }
                        owner.store.grants.lock().insert(ns, grant);
                    }
                    Err(err) => self.expected("own", err)?,
                }
            }
            Step::TakeOver { o, ns } => {
                self.exec(&Step::Bump { o, ns })?;
                for _ in 0..16 {
                    let engine = self.owner(o).engine;
                    let slice = engine.revoke_step(&namespace(ns), RevokeBudget::default());
                    if slice.map_err(|e| e.to_string())? == RevokeProgress::Complete {
                        self.completed(FenceKind::Epoch, engine.fence(), ns)?;
                        return self.exec(&Step::Own { o, ns });
                    }
                }
            }
            Step::LoseRows { o, ns } => {
                let (owner, ns) = (self.owner(o), namespace(ns));
                let lost = Batch::new().delete_range(owner.engine.fence().keys().shard_range());
                let _ = self.base.apply(&ns.coordinator_partition(), &lost).unwrap();
                owner
                    .engine
                    .mark_lease_table_recovered(&ns)
                    .map_err(|e| e.to_string())?;
            }
            Step::LoseAnswer { o, commit } => self.owner(o).store.lose_next(commit),
            Step::Deliver { o } => match self.shared.deliver(&*self.base, o) {
                Some(Ok(outcome)) => {
                    let outcome = format!("{outcome:?}");
                    let kind = outcome.split([' ', '{']).next().unwrap_or_default();
                    self.tally(&format!("delivered: {kind}"));
                }
                Some(Err(err)) => return Err(format!("a delayed copy: {err}")),
                None => {}
            },
            Step::Interleave {
                o,
                point,
                ref actions,
                ref then,
            } => {
                *self.armed.lock() = Some(Armed {
                    owner: o,
                    point,
                    actions: actions.clone(),
                });
                self.exec(then)?;
                *self.armed.lock() = None;
            }
        }
        Ok(())
    }

    fn auth_write(&self, o: usize, e: usize, refresh: bool) -> Result<(), String> {
        let (owner, x) = (self.owner(o), self.entity(e));
        let ns = x.namespace().clone();
        let Some(grant) = owner.engine.grant(&ns) else {
            return Ok(());
        };
        let known = self.owners[o]
            .lock()
            .as_ref()
            .and_then(|w| w.auth_grants.get(&ns).copied());
        let auth = match known {
            Some(g) if !refresh => g,
            _ => owner
                .authority
                .current_epoch(&ns)
                .map_err(|e| e.to_string())?,
        };
        if let Some(w) = self.owners[o].lock().as_mut() {
            w.auth_grants.insert(ns.clone(), auth);
        }
        let call = CallGrant {
            ns,
            epoch: grant,
            authority: Some(auth),
        };
        let fences = [
            FenceGrant {
                fence: owner.engine.fence(),
                grant,
            },
            FenceGrant {
                fence: &owner.authority,
                grant: auth,
            },
        ];
        let put = Batch::new().put(self.payload("a"), b"v".to_vec());
        let written = self
            .shared
            .calling(o, call, || write_under(&fences, &x, |_| Some(put.clone())));
        match written {
            Ok(_) => Ok(()),
            Err(err) => self.expected("authority write", err),
        }
    }
}

fn ns_index(ns: &Namespace) -> usize {
    ns.as_str()[2..].parse().unwrap()
}

pub(super) fn show(records: &[(u64, Vec<u8>)]) -> Vec<String> {
    records
        .iter()
        .map(|(s, p)| format!("{s}:{}", String::from_utf8_lossy(p)))
        .collect()
}

/// Parts of one owner, cloned out of the world.
pub struct OwnerHandle {
    pub engine: Eng,
    pub store: Arc<OwnerStore>,
    pub units: Arc<UnitCounter>,
    pub authority: Fence,
}
