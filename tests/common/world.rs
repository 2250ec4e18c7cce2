//! A world of owners for the engine-level property test: two or three engines over one shared
//! store, each behind its own [`OwnerStore`] view, with the steps they take ([`Step`]) and
//! the checks made after every step. Steps run on one thread; an interleaving (a step of one
//! owner paused at a fence hook point while other owners act) runs the other owners' steps
//! from inside the hook, so every schedule replays from its step list.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use portcullis::engine::{Deferred, Engine};
use portcullis::fence::{
    Fence, FenceConfig, FenceGrant, FenceHooks, FenceKind, GuardSwitches, HookPoint, LeaseRow,
    RevokeBudget, RevokeProgress, decode_row, write_under,
};
use portcullis::store::{Batch, Store};
use portcullis::{EntityId, Error, ManualClock, Namespace};

use super::owners::{CallGrant, ListMachine, OwnerClock, OwnerStore, Shared, UnitCounter};

pub type Eng = Engine<ListMachine>;

/// One step of one owner (or of the clock). Entities are numbered; entity `i` lives in
/// namespace `i % namespaces`.
#[derive(Clone, Debug)]
pub enum Step {
    /// Restore an entity (a read that looks at nothing).
    Touch {
        o: usize,
        e: usize,
    },
    /// Read an entity's state and compare it with the fold of its committed log.
    Read {
        o: usize,
        e: usize,
    },
    /// Append one record through the engine.
    Write {
        o: usize,
        e: usize,
    },
    /// Defer one record (SPEC R8).
    Defer {
        o: usize,
        e: usize,
    },
    /// Publish a checkpoint (and truncate, if the owner is configured to).
    Checkpoint {
        o: usize,
        e: usize,
    },
    /// Advance a namespace's epoch by one.
    Bump {
        o: usize,
        ns: usize,
    },
    /// One revocation slice with a small budget.
    Revoke {
        o: usize,
        ns: usize,
        pages: usize,
        pushes: usize,
    },
    /// An application row written through the engine's fence under the owner's grant.
    Renew {
        o: usize,
        e: usize,
    },
    /// An application row written through the engine's fence under the current epoch.
    FenceWrite {
        o: usize,
        e: usize,
    },
    /// One sweep of expired leased-shard rows.
    Sweep {
        o: usize,
        ns: usize,
    },
    /// Advance the store's clock (every owner's moves with it).
    Advance {
        ms: u64,
    },
    /// Set one owner's clock skew against the store's.
    Skew {
        o: usize,
        ms: i64,
    },
    /// Declare a namespace's lease table recovered (SPEC F6).
    MarkRecovered {
        o: usize,
        ns: usize,
    },
    /// The authority fence (SPEC F10): bump, one slice, a write under both fences.
    AuthBump {
        o: usize,
        ns: usize,
    },
    AuthRevoke {
        o: usize,
        ns: usize,
    },
    AuthWrite {
        o: usize,
        e: usize,
        refresh: bool,
    },
    /// The owner's process dies (no clean close) and a new engine with the same owner id opens.
    Crash {
        o: usize,
    },
    /// Release a namespace (a clean hand-over).
    Release {
        o: usize,
        ns: usize,
    },
    /// Adopt a namespace, when no other owner may still write it.
    Own {
        o: usize,
        ns: usize,
    },
    /// Bump, revoke until `Complete` (bounded), adopt.
    TakeOver {
        o: usize,
        ns: usize,
    },
    /// The coordinator is restored from an older copy (its leased-shard rows are lost) and
    /// declared recovered at once, as SPEC F6 requires.
    LoseRows {
        o: usize,
        ns: usize,
    },
    /// Run `then`; when owner `o`'s fence reaches `point`, run `actions` (other owners) there.
    Interleave {
        o: usize,
        point: HookPoint,
        actions: Vec<Step>,
        then: Box<Step>,
    },
}

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

/// Shape of a world.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub owners: usize,
    pub namespaces: usize,
    pub entities: usize,
}

pub struct World {
    pub shape: Shape,
    pub base: Arc<dyn Store>,
    pub clock: ManualClock,
    pub config: FenceConfig,
    pub shared: Arc<Shared>,
    pub switches: GuardSwitches,
    owners: Vec<Mutex<Option<Owner>>>,
    armed: Mutex<Option<Armed>>,
    /// Whether an interleaving ran during the current step.
    fired: AtomicBool,
    /// Records written so far (payloads are unique).
    counter: Mutex<u64>,
    /// Deferrals refused because their row's key was taken (see `Step::Defer`).
    pub defer_collisions: Mutex<u64>,
    /// Every deferral the engine accepted: entity and payload.
    pub deferred: Mutex<Vec<(EntityId, Vec<u8>)>>,
    /// The steps run, nested ones indented.
    pub trace: Mutex<Vec<String>>,
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

pub fn namespace(i: usize) -> Namespace {
    Namespace::new(format!("ns{i}")).unwrap()
}

impl World {
    /// A world over `base` (whose clock is `clock`); owner `o` first serves the namespaces
    /// `ns % owners == o` and registers their entities.
    pub fn new(
        shape: Shape,
        base: Arc<dyn Store>,
        clock: ManualClock,
        switches: GuardSwitches,
    ) -> Arc<World> {
        let world = Arc::new_cyclic(|me| World {
            shape,
            base,
            clock,
            config: FenceConfig::default(),
            shared: Arc::new(Shared::default()),
            switches,
            owners: (0..shape.owners).map(|_| Mutex::new(None)).collect(),
            armed: Mutex::new(None),
            fired: AtomicBool::new(false),
            counter: Mutex::new(0),
            defer_collisions: Mutex::new(0),
            deferred: Mutex::new(Vec::new()),
            trace: Mutex::new(Vec::new()),
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

    fn open(&self, o: usize, skew: i64) {
        let store = Arc::new(OwnerStore::new(
            Arc::clone(&self.base),
            o,
            skew,
            Arc::clone(&self.shared),
        ));
        let units = Arc::new(UnitCounter::default());
        let engine = Engine::builder(ListMachine)
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .owner(format!("owner-{o}"))
            .adopt_on_first_use(false)
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

    /// Runs one top-level step; `Err` describes a violation.
    pub fn run(&self, step: &Step) -> Result<(), String> {
        self.trace.lock().push(format!("{step:?}"));
        self.fired.store(false, Ordering::SeqCst);
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
    /// moved leases under the step.
    fn expected(&self, what: &str, e: Error) -> Result<(), String> {
        match e {
            Error::Fenced { .. } | Error::NotServed { .. } => Ok(()),
            Error::Unavailable { .. } if self.fired.load(Ordering::SeqCst) => Ok(()),
            e => Err(format!("{what}: unexpected {e}")),
        }
    }

    fn completed(&self, kind: FenceKind, fence: &Fence, ns: usize) -> Result<(), String> {
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
                    Ok(Deferred::Queued) => self.deferred.lock().push((x, payload)),
                    Ok(Deferred::Applied { seq }) => {
                        self.deferred.lock().push((x.clone(), payload.clone()));
                        self.check_at(&x, seq, &payload)?;
                    }
                    Ok(Deferred::AlreadyAccepted) => return Err("defer: a duplicate".into()),
                    // Deferred rows keyed by the owner's incarnation collide when a new owner
                    // (with the same incarnation number) defers to an entity whose earlier
                    // deferral is still queued: the guarded put refuses, nothing is lost.
                    Err(Error::Unavailable { reason, .. })
                        if reason.contains("PreconditionFailed { index: 0 }") =>
                    {
                        *self.defer_collisions.lock() += 1;
                    }
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
            Step::Crash { o } => {
                let skew = self.owner(o).store.skew_ms.load(Ordering::SeqCst);
                let dead = self.owners[o].lock().take().expect("open");
                dead.store.dead.store(true, Ordering::SeqCst);
                drop(dead); // its clean close fails: the store refuses the dead process
                self.open(o, skew);
            }
            Step::Release { o, ns } => {
                let (owner, ns) = (self.owner(o), namespace(ns));
                owner
                    .engine
                    .release_namespace(&ns)
                    .map_err(|e| e.to_string())?;
                owner.store.grants.lock().remove(&ns);
            }
            Step::Own { o, ns } => {
                let (owner, ns) = (self.owner(o), namespace(ns));
                if !self.may_own(o, &ns).map_err(|e| e.to_string())? {
                    return Ok(());
                }
                let before = owner.engine.grant(&ns);
                match owner.engine.own(&ns) {
                    Ok(grant) => {
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

    /// The record at `seq` of `entity` committed with `payload`.
    fn check_at(&self, entity: &EntityId, seq: u64, payload: &[u8]) -> Result<(), String> {
        let ghost = self.shared.ghost_of(entity);
        match ghost.iter().find(|(s, _)| *s == seq) {
            Some((_, p)) if p == payload => Ok(()),
            other => Err(format!(
                "{entity}: the engine answered seq {seq} for {:?}, the log holds {other:?}",
                String::from_utf8_lossy(payload)
            )),
        }
    }

    /// Reads an entity through owner `o`; if `o` serves its namespace at the current epoch,
    /// its state must equal the fold of every record committed to it.
    pub fn read(&self, o: usize, e: usize) -> Result<(), String> {
        let (engine, x) = (self.owner(o).engine, self.entity(e));
        let state = match engine.read(&x, |s| s.records.clone()) {
            Ok(state) => state,
            Err(err) => return self.expected("read", err),
        };
        let current = engine
            .current_epoch(x.namespace())
            .map_err(|e| e.to_string())?;
        if engine.grant(x.namespace()) != Some(current) {
            return Ok(()); // a deposed owner's reads may be stale (docs/fencing.md, limits)
        }
        let ghost = self.shared.ghost_of(&x);
        if state != ghost {
            return Err(format!(
                "owner {o}: the state of {x} is not the fold of its committed log:\n  state {:?}\n  log   {:?}",
                show(&state),
                show(&ghost)
            ));
        }
        Ok(())
    }
}

fn ns_index(ns: &Namespace) -> usize {
    ns.as_str()[2..].parse().unwrap()
}

fn show(records: &[(u64, Vec<u8>)]) -> Vec<String> {
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
