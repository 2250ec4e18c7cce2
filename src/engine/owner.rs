//! Namespace ownership (SPEC F11): which namespaces this engine serves, under which grant, and
//! the durable owner row that lets several engines share one store and hand namespaces over.
//!
//! An engine serves a namespace under a *holding*: the grant epoch it adopted, whether the
//! namespace is fenced, and the repairs owed to its entities. Every write the engine makes to an
//! entity of that namespace commits under that grant (see `owned_store`). A write that learns
//! the grant is stale deposes the holding: from then on every call for that namespace answers
//! [`Error::Fenced`] from memory, without a store call, until the application adopts the
//! namespace again with [`Engine::own`](super::Engine::own). Nothing re-adopts a deposed
//! namespace on its own: that would take the shard back from its new owner.
//!
//! The owner row (`engine.owner` in the namespace's coordinator partition) names the holder:
//! owner id, incarnation, a *term* (1, 2, 3 ... one per adoption), the grant epoch, whether it
//! was released, and the terms whose holders ended without releasing (owed repairs, SPEC R3).
//! Adoption compare-and-sets it:
//! - absent or released: a clean hand-over, nothing new is owed;
//! - held by an earlier incarnation of this same owner: that incarnation died, its term is owed;
//! - held by an earlier incarnation of this same owner at the current epoch: that incarnation
//!   crashed (this engine could open only once its lease expired), its term is owed;
//! - held by another owner (or by an earlier incarnation of this one at an older epoch): a
//!   take-over, only by an explicit adoption that reads proof that revocation completed at the
//!   current epoch and commits guarded on that proof (SPEC F12); the old holder's term is owed,
//!   since the engine cannot tell a dead owner from a stalled one. Anything else is refused
//!   ([`Error::NotServed`], naming the holder and whether its lease is live): adoption on first
//!   use never takes a namespace from another owner.
//!
//! While this engine's owner lease is not valid any more (`liveness`), every call renews it
//! first; a renewal also re-reads the epoch and owner row of every namespace held and deposes
//! those a take-over moved (SPEC F12: a deposed owner stops serving within a bound).
//!
//! Each owed term is repaired once per entity, in term order, each with its own label; a
//! holder that releases the namespace (or closes cleanly) drops the owed terms only if it
//! restored every entity of the namespace, and otherwise hands them on.
//!
//! Calls: the store (owner rows), the fence (current epoch, completion proof) and `liveness`.
//! No lock here is held across a store call except `adopting`, which serialises this engine's
//! adoptions only, and the liveness's `renewing` (taken after `adopting`, never before).

use crate::sync::HashMap;
use std::sync::Arc;

use crate::sync::OnceLock;

use crate::sync::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

mod live;

use super::liveness::Liveness;
use super::switches::OwnerSwitches;
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::fence::{CoordinatorView, Fence};
use crate::log::{decode_row, encode_row};
use crate::store::{Batch, Outcome, Store};

/// The owner row's key in a namespace's coordinator partition.
pub(crate) const OWNER_KEY: &[u8] = b"engine.owner";

/// How many lost compare-and-set races an adoption or release tolerates.
const ROW_ATTEMPTS: usize = 8;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OwnerRow {
    pub(crate) owner: String,
    pub(crate) incarnation: u64,
    pub(crate) term: u64,
    pub(crate) epoch: u64,
    pub(crate) fenced: bool,
    pub(crate) released: bool,
    /// Terms whose holders ended without releasing, in increasing order; each is repaired once
    /// per entity (SPEC R3).
    pub(crate) owed: Vec<u64>,
}

/// How a namespace is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every write commits through the fence under the grant (SPEC F2, F3).
    Fenced,
    /// No leases and no leased-shard rows; the namespace cannot be handed over by a bump.
    Unfenced,
}

/// This engine's hold on one namespace.
#[derive(Clone, Debug)]
pub(crate) struct Holding {
    pub(crate) grant: u64,
    /// This adoption's term: deferred rows accepted under it are keyed by it (SPEC R8).
    pub(crate) term: u64,
    pub(crate) mode: Mode,
    pub(crate) owed: Arc<Vec<u64>>,
    status: Status,
    /// The owner row as this engine wrote it; a release is guarded on it.
    written: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Serving,
    /// A write learned the grant is stale: the epoch is now `current`.
    Deposed {
        current: u64,
    },
    /// This engine released the namespace.
    Released,
}

/// Called with a namespace when this engine adopts it again after a holding ended: state
/// restored under the old holding may be stale.
/// The flag says whether to wait for entities in use (only the negative control of
/// `OwnerSwitches::readopt_under_adopting` does).
pub(crate) type OnReadopt = Box<dyn Fn(&Namespace, bool) + Send + Sync>;

/// Called after each adoption, with the namespace and its mode.
pub(crate) type OnAdopt = Box<dyn Fn(&Namespace, Mode) + Send + Sync>;

/// The namespaces this engine serves.
pub(crate) struct Owners {
    store: Arc<dyn Store>,
    fence: Fence,
    owner: String,
    incarnation: u64,
    adopt_on_first_use: bool,
    pub(crate) liveness: Arc<Liveness>,
    switches: OwnerSwitches,
    map: RwLock<HashMap<Namespace, Holding>>,
    adopting: Mutex<()>,
    on_readopt: OnceLock<OnReadopt>,
    on_adopt: OnceLock<OnAdopt>,
    /// Test-only negative control: see `set_skip_declaration`.
    skip_declaration: crate::sync::atomic::AtomicBool,
}

impl Owners {
    pub(crate) fn new(
        (store, fence): (Arc<dyn Store>, Fence),
        (owner, incarnation): (String, u64),
        adopt_on_first_use: bool,
        liveness: Arc<Liveness>,
        switches: OwnerSwitches,
    ) -> Self {
        Owners {
            store,
            fence,
            owner,
            incarnation,
            adopt_on_first_use,
            liveness,
            switches,
            map: RwLock::new(HashMap::default()),
            adopting: Mutex::new(()),
            on_readopt: OnceLock::new(),
            on_adopt: OnceLock::new(),
            skip_declaration: crate::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn set_on_readopt(&self, f: OnReadopt) {
        let _ = self.on_readopt.set(f);
    }

    pub(crate) fn set_on_adopt(&self, f: OnAdopt) {
        let _ = self.on_adopt.set(f);
    }

    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The holding a call on `ns` runs under. Answers from memory when the namespace is held or
    /// deposed; adopts it first if it was never held and adoption on first use is on.
    pub(crate) fn serving(&self, ns: &Namespace) -> Result<Holding> {
        self.live()?;
        if let Some(h) = self.map.read().get(ns) {
            return match h.status {
                Status::Serving => Ok(h.clone()),
                Status::Deposed { current } => Err(deposed(ns, h.grant, current)),
                Status::Released => Err(not_served(
                    ns,
                    "it was released; adopt it again with Engine::own",
                )),
            };
        }
        if !self.adopt_on_first_use {
            return Err(not_served(
                ns,
                "adopt it with Engine::own (or EngineBuilder::own) before serving it",
            ));
        }
        self.adopt(ns, Mode::Fenced, true)?;
        self.serving(ns)
    }

    /// Whether the holding of term `term` still serves `ns` (from memory; nothing cloned, as
    /// every engine write asks).
    pub(crate) fn serves_term(&self, ns: &Namespace, term: u64) -> bool {
        self.map
            .read()
            .get(ns)
            .is_some_and(|h| h.status == Status::Serving && h.term == term)
    }

    /// The holding of `ns`, if this engine holds it now (answered from memory).
    pub(crate) fn held(&self, ns: &Namespace) -> Option<Holding> {
        if self.liveness.superseded().is_some() {
            return None;
        }
        self.map
            .read()
            .get(ns)
            .filter(|h| h.status == Status::Serving)
            .cloned()
    }

    /// The term of the holding this engine serves `ns` under now, if it serves it (from memory,
    /// no copy).
    pub(crate) fn term_of(&self, ns: &Namespace) -> Option<u64> {
        if self.liveness.superseded().is_some() {
            return None;
        }
        self.map
            .read()
            .get(ns)
            .filter(|h| h.status == Status::Serving)
            .map(|h| h.term)
    }

    /// The namespace's coordinator (epoch, completion) and owner row, in one store call.
    pub(crate) fn lookup(&self, ns: &Namespace) -> Result<(CoordinatorView, Option<OwnerRow>)> {
        let view = self.fence.coordinator_view(ns, &[OWNER_KEY])?;
        let p = ns.coordinator_partition();
        let row = match &view.extra[0] {
            Some(bytes) => Some(decode_row(&p, "namespace owner", bytes)?),
            None => None,
        };
        Ok((view, row))
    }

    /// The switches this engine was opened with (all off outside tests).
    pub(crate) fn switches(&self) -> OwnerSwitches {
        self.switches
    }

    /// Test-only negative control (feature `test-hooks`): adopt unfenced without declaring
    /// the namespace unfenced in the store, as the engine did before.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_skip_declaration(&self, skip: bool) {
        self.skip_declaration
            .store(skip, crate::sync::atomic::Ordering::Relaxed);
    }

    #[cfg_attr(not(feature = "test-hooks"), inline(always))]
    fn skip_declaration(&self) -> bool {
        self.skip_declaration
            .load(crate::sync::atomic::Ordering::Relaxed)
    }

    /// Every namespace this engine serves now.
    pub(crate) fn all_held(&self) -> Vec<(Namespace, Holding)> {
        if self.liveness.superseded().is_some() {
            return Vec::new();
        }
        self.map
            .read()
            .iter()
            .filter(|(_, h)| h.status == Status::Serving)
            .map(|(ns, h)| (ns.clone(), h.clone()))
            .collect()
    }

    /// Adopts `ns` at its current epoch (SPEC F11) and returns the grant. Adopting a namespace
    /// this engine already serves in the same mode returns its grant if it is still current;
    /// an explicit adoption reads the epoch to know, and one that finds it bumped deposes the
    /// stale holding (as a write meeting `Fenced` would) and adopts again at the current epoch,
    /// or is refused while another owner holds it there. `first_use` marks an implicit
    /// adoption, which never takes a namespace back from a deposed or released holding (and
    /// makes no store call for a namespace it serves: a write learns of a bump soon enough).
    pub(crate) fn adopt(&self, ns: &Namespace, mode: Mode, first_use: bool) -> Result<u64> {
        let (grant, adopted) = self.adopt_locked(ns, mode, first_use)?;
        // With `adopting` released (SPEC R11): forgetting the old holding's state and starting
        // the sweeper wait for nothing held by a call that may itself be waiting to adopt.
        if let Some((readopted, mode)) = adopted {
            if readopted
                && !self.switches.readopt_under_adopting
                && let Some(f) = self.on_readopt.get()
            {
                f(ns, false);
            }
            if let Some(f) = self.on_adopt.get() {
                f(ns, mode);
            }
        }
        Ok(grant)
    }

    /// [`adopt`](Self::adopt) under the `adopting` mutex. Answers the grant and, if this call
    /// adopted the namespace, whether it held it before (a re-adoption) and the mode.
    fn adopt_locked(
        &self,
        ns: &Namespace,
        mode: Mode,
        first_use: bool,
    ) -> Result<(u64, Option<(bool, Mode)>)> {
        let _adopting = self.adopting.lock();
        self.live()?;
        let previous = self.map.read().get(ns).cloned();
        if let Some(h) = &previous {
            match h.status {
                Status::Serving if h.mode == mode => {
                    // Unfenced namespaces are never bumped (SPEC F11).
                    if first_use || mode == Mode::Unfenced {
                        return Ok((h.grant, None));
                    }
                    // An explicit adoption answers the current epoch, not a grant a bump has
                    // made stale before any write learned it (SPEC F11: a stale owner stops
                    // serving at once).
                    let current = self.fence.current_epoch(ns)?;
                    if current == h.grant {
                        return Ok((h.grant, None));
                    }
                    self.depose(ns, h.grant, current);
                }
                Status::Serving if h.mode == Mode::Fenced => {
                    return Err(Error::invalid(format!(
                        "namespace {ns} is already served fenced; release it first to serve it \
                         unfenced"
                    )));
                }
                Status::Serving => {
                    return Err(Error::invalid(format!(
                        "namespace {ns} is served unfenced, which is permanent: it cannot be \
                         served fenced; move its entities to a new namespace to fence them"
                    )));
                }
                Status::Deposed { current } if first_use => {
                    return Err(deposed(ns, h.grant, current));
                }
                _ if first_use => return self.serving(ns).map(|h| (h.grant, None)),
                _ => {}
            }
        }
        let p = ns.coordinator_partition();
        for _ in 0..ROW_ATTEMPTS {
            let (view, old) = self.lookup(ns)?;
            let (epoch, declared) = (view.epoch, view.unfenced);
            let raw = view.extra[0].clone();
            // A namespace declared unfenced is unfenced for ever (SPEC F11): an implicit
            // adoption serves it so; an explicit fenced one is refused, since it promises a
            // hand-over by bump that the namespace can no longer offer.
            let mode = match mode {
                Mode::Fenced if declared && first_use => Mode::Unfenced,
                Mode::Fenced if declared => {
                    return Err(Error::invalid(format!(
                        "namespace {ns} is declared unfenced (permanently), so it cannot be \
                         served fenced: serve it with Engine::own_unfenced, or move its \
                         entities to a new namespace to fence them"
                    )));
                }
                mode => mode,
            };
            if mode == Mode::Unfenced && epoch > 0 {
                return Err(Error::invalid(format!(
                    "namespace {ns} has been fenced (epoch {epoch}); it cannot be served unfenced"
                )));
            }
            let mut owed = Vec::new();
            let mut term = 1;
            // Whether this adoption takes the namespace over on the proof that revocation
            // completed at the current epoch: then its write is guarded on that proof.
            let mut proven = false;
            if let Some(old) = &old {
                term = old.term + 1;
                owed.clone_from(&old.owed);
                if old.owner == self.owner && old.incarnation == self.incarnation {
                    // Our own row: re-adopting after a release, or after a bump (whoever made
                    // it) only on proof that revocation completed: before that, re-adopting
                    // would take the namespace back from a take-over under way (SPEC F12).
                    if !old.released && old.epoch < epoch {
                        if first_use || !(view.complete || self.switches.adopt_without_completion) {
                            return Err(self.refusal(ns, old, &view, first_use));
                        }
                        proven = true;
                    }
                } else if !old.released {
                    let ours_before = old.owner == self.owner && old.incarnation < self.incarnation;
                    // An earlier incarnation of ours at the current epoch crashed: this engine
                    // could open only once its lease had expired. Anyone else's namespace moves
                    // only on proof that revocation completed at the current epoch (SPEC F12),
                    // and never on first use.
                    let restart = ours_before && old.epoch >= epoch;
                    let old_style = first_use && self.switches.first_use_takes_over;
                    if !restart && !old_style {
                        let proof = old.epoch < epoch
                            && (view.complete || self.switches.adopt_without_completion);
                        if first_use || !proof {
                            return Err(self.refusal(ns, old, &view, first_use));
                        }
                        proven = true;
                    } else if old_style && old.epoch >= epoch && !ours_before {
                        return Err(self.refusal(ns, old, &view, first_use));
                    }
                    // The old holder ended (or was deposed) without releasing: repair owed.
                    owed.push(old.term);
                    ::log::warn!(
                        "namespace {ns}: owner {:?} (incarnation {}, term {}) did not release it; \
                         its entities will be repaired as they restore",
                        old.owner,
                        old.incarnation,
                        old.term
                    );
                }
            }
            let row = OwnerRow {
                owner: self.owner.clone(),
                incarnation: self.incarnation,
                term,
                epoch,
                fenced: mode == Mode::Fenced,
                released: false,
                owed,
            };
            let written = encode_row(&row);
            let guarded = if proven && !self.switches.unguarded_proof {
                view.guard(Batch::new())
            } else {
                Batch::new()
            };
            let batch = match &raw {
                Some(bytes) => guarded.equals(OWNER_KEY.to_vec(), bytes.clone()),
                None => guarded.absent(OWNER_KEY.to_vec()),
            }
            .put(OWNER_KEY.to_vec(), written.clone());
            match self.store.apply(&p, &batch)? {
                Outcome::Committed => {}
                _ => continue,
            }
            // Unfenced in the store too, so that no other engine or fence handle can bump it
            // (SPEC F11). Declared while this engine holds the owner row, so no other engine
            // adopts it fenced meanwhile; if the declaration is refused (a bump won the race),
            // the row is put back as it was.
            if mode == Mode::Unfenced
                && !declared
                && !self.skip_declaration()
                && let Err(e) = self.fence.declare_unfenced(ns)
            {
                let undo = Batch::new().equals(OWNER_KEY.to_vec(), written.clone());
                let undo = match &raw {
                    Some(bytes) => undo.put(OWNER_KEY.to_vec(), bytes.clone()),
                    None => undo.delete(OWNER_KEY.to_vec()),
                };
                if let Err(undo_error) = self.store.apply(&p, &undo) {
                    ::log::warn!(
                        "namespace {ns}: could not put the owner row back after a refused \
                         declaration: {undo_error}"
                    );
                }
                return Err(e);
            }
            ::log::info!(
                "owner {:?} adopted namespace {ns} at epoch {epoch} (term {term}{})",
                self.owner,
                if mode == Mode::Unfenced {
                    ", unfenced"
                } else {
                    ""
                }
            );
            let holding = Holding {
                grant: epoch,
                term,
                mode,
                owed: Arc::new(row.owed),
                status: Status::Serving,
                written,
            };
            self.map.write().insert(ns.clone(), holding);
            if previous.is_some()
                && self.switches.readopt_under_adopting
                && let Some(f) = self.on_readopt.get()
            {
                // The negative control: forgotten under `adopting`, as before.
                f(ns, true);
            }
            return Ok((epoch, Some((previous.is_some(), mode))));
        }
        Err(Error::Unavailable {
            reason: format!("the owner row of {ns} kept changing during adoption"),
            retry_after_ms: 10,
        })
    }

    /// A write under `grant` learned that the epoch of `ns` is now `current`: stop serving it.
    /// A newer holding (adopted since that write was planned) is left alone.
    pub(crate) fn depose(&self, ns: &Namespace, grant: u64, current: u64) {
        let mut map = self.map.write();
        if let Some(h) = map.get_mut(ns)
            && h.status == Status::Serving
            && h.grant == grant
        {
            h.status = Status::Deposed { current };
            self.fence.events().emit(|| crate::observe::Event::Deposed {
                namespace: ns.clone(),
                grant,
                epoch: current,
            });
            ::log::warn!(
                "owner {:?} was fenced out of namespace {ns} (grant {grant}, epoch now {current}); \
                 it stops serving it",
                self.owner
            );
        }
    }

    /// Whether this engine's holding of `ns` has ended: the error a call on it answers
    /// (`Fenced` once the epoch moved past the grant, which this reads from the store and then
    /// deposes the holding; `NotServed` once released), or `None` while it is still served.
    /// Tells a log moved by the next holder (no damage) from one moved under a holding still
    /// served (SPEC F11, F12).
    pub(crate) fn ended(&self, ns: &Namespace) -> Result<Option<Error>> {
        let holding = self.map.read().get(ns).cloned();
        let Some(h) = holding else {
            return Ok(Some(not_served(ns, "this engine does not hold it")));
        };
        match h.status {
            Status::Deposed { current } => return Ok(Some(deposed(ns, h.grant, current))),
            Status::Released => return Ok(Some(not_served(ns, "it was released"))),
            Status::Serving if h.mode == Mode::Unfenced => return Ok(None),
            Status::Serving => {}
        }
        let current = self.fence.current_epoch(ns)?;
        if current > h.grant {
            self.depose(ns, h.grant, current);
            return Ok(Some(deposed(ns, h.grant, current)));
        }
        Ok(None)
    }

    /// Releases `ns`: this engine stops serving it and the owner row says so, so the next
    /// holder owes no repair for this term. The owed terms are dropped only if `all_repaired`
    /// (every entity of the namespace had them: restored under this holding, or its repair row
    /// names the newest owed term); otherwise they pass on.
    /// A row some other owner has overwritten since (a take-over) is left alone.
    pub(crate) fn release(&self, ns: &Namespace, all_repaired: bool) -> Result<()> {
        let _adopting = self.adopting.lock();
        let Some(h) = self.held(ns) else {
            return Ok(());
        };
        let p = ns.coordinator_partition();
        let mut row: OwnerRow = decode_row(&p, "namespace owner", &h.written)?;
        row.released = true;
        if all_repaired {
            row.owed.clear();
        } else if !row.owed.is_empty() {
            ::log::info!(
                "namespace {ns}: not every entity was restored; repairs for terms {:?} stay owed",
                row.owed
            );
        }
        let batch = Batch::new()
            .equals(OWNER_KEY.to_vec(), h.written.clone())
            .put(OWNER_KEY.to_vec(), encode_row(&row));
        let outcome = self.store.apply(&p, &batch)?;
        if let Some(held) = self.map.write().get_mut(ns) {
            held.status = Status::Released;
        }
        match outcome {
            Outcome::Committed => {
                ::log::info!("owner {:?} released namespace {ns}", self.owner);
            }
            other => ::log::warn!(
                "owner {:?} could not mark namespace {ns} released: another owner took it over \
                 ({other:?})",
                self.owner
            ),
        }
        Ok(())
    }
}

fn deposed(ns: &Namespace, grant: u64, current: u64) -> Error {
    ::log::debug!("namespace {ns} is deposed (grant {grant}, epoch {current})");
    Error::Fenced { grant, current }
}

fn not_served(ns: &Namespace, detail: &str) -> Error {
    Error::NotServed {
        namespace: ns.to_string(),
        detail: detail.to_string(),
    }
}
