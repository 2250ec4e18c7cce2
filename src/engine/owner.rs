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
//! - held by another owner at an older epoch than the current one: a take-over (the epoch was
//!   bumped; revocation must have completed), the old holder's term is owed, since the engine
//!   cannot tell a dead owner from a stalled one;
//! - held by another owner at the current epoch: refused ([`Error::NotServed`]); taking it needs
//!   a bump and a completed revocation, or the holder's release.
//!
//! Each owed term is repaired once per entity, in term order, each with its own label; a
//! holder that releases the namespace (or closes cleanly) drops the owed terms only if it
//! restored every entity of the namespace, and otherwise hands them on.
//!
//! Calls: the store (owner rows) and the fence (current epoch). No lock here is held across a
//! store call except `adopting`, which serialises this engine's adoptions only.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::fence::Fence;
use crate::log::{decode_row, encode_row};
use crate::store::{Batch, Outcome, Store};

/// The owner row's key in a namespace's coordinator partition.
pub(crate) const OWNER_KEY: &[u8] = b"engine.owner";

/// How many lost compare-and-set races an adoption or release tolerates.
const ROW_ATTEMPTS: usize = 8;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct OwnerRow {
    owner: String,
    incarnation: u64,
    term: u64,
    epoch: u64,
    fenced: bool,
    released: bool,
    /// Terms whose holders ended without releasing, in increasing order; each is repaired once
    /// per entity (SPEC R3).
    owed: Vec<u64>,
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
pub(crate) type OnReadopt = Box<dyn Fn(&Namespace) + Send + Sync>;

/// Called after each adoption, with its mode.
pub(crate) type OnAdopt = Box<dyn Fn(Mode) + Send + Sync>;

/// The namespaces this engine serves.
pub(crate) struct Owners {
    store: Arc<dyn Store>,
    fence: Fence,
    owner: String,
    incarnation: u64,
    adopt_on_first_use: bool,
    map: RwLock<HashMap<Namespace, Holding>>,
    adopting: Mutex<()>,
    on_readopt: OnceLock<OnReadopt>,
    on_adopt: OnceLock<OnAdopt>,
    /// Test-only negative control: see `set_skip_declaration`.
    skip_declaration: std::sync::atomic::AtomicBool,
}

impl Owners {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        fence: Fence,
        owner: String,
        incarnation: u64,
        adopt_on_first_use: bool,
    ) -> Self {
        Owners {
            store,
            fence,
            owner,
            incarnation,
            adopt_on_first_use,
            map: RwLock::new(HashMap::new()),
            adopting: Mutex::new(()),
            on_readopt: OnceLock::new(),
            on_adopt: OnceLock::new(),
            skip_declaration: std::sync::atomic::AtomicBool::new(false),
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

    /// The holding of `ns`, if this engine holds it now.
    pub(crate) fn held(&self, ns: &Namespace) -> Option<Holding> {
        self.map
            .read()
            .get(ns)
            .filter(|h| h.status == Status::Serving)
            .cloned()
    }

    /// Test-only negative control (feature `test-hooks`): adopt unfenced without declaring
    /// the namespace unfenced in the store, as the engine did before.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_skip_declaration(&self, skip: bool) {
        self.skip_declaration
            .store(skip, std::sync::atomic::Ordering::Relaxed);
    }

    #[cfg_attr(not(feature = "test-hooks"), inline(always))]
    fn skip_declaration(&self) -> bool {
        self.skip_declaration
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every namespace this engine serves now.
    pub(crate) fn all_held(&self) -> Vec<(Namespace, Holding)> {
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
        let _adopting = self.adopting.lock();
        let previous = self.map.read().get(ns).cloned();
        if let Some(h) = &previous {
            match h.status {
                Status::Serving if h.mode == mode => {
                    // Unfenced namespaces are never bumped (SPEC F11).
                    if first_use || mode == Mode::Unfenced {
                        return Ok(h.grant);
                    }
                    // An explicit adoption answers the current epoch, not a grant a bump has
                    // made stale before any write learned it (SPEC F11: a stale owner stops
                    // serving at once).
                    let current = self.fence.current_epoch(ns)?;
                    if current == h.grant {
                        return Ok(h.grant);
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
                _ if first_use => return self.serving(ns).map(|h| h.grant),
                _ => {}
            }
        }
        let p = ns.coordinator_partition();
        for _ in 0..ROW_ATTEMPTS {
            let (epoch, declared) = self.fence.epoch_and_unfenced(ns)?;
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
            let raw = self.store.get(&p, OWNER_KEY)?;
            let old: Option<OwnerRow> = match &raw {
                Some(bytes) => Some(decode_row(&p, "namespace owner", bytes)?),
                None => None,
            };
            if mode == Mode::Unfenced && epoch > 0 {
                return Err(Error::invalid(format!(
                    "namespace {ns} has been fenced (epoch {epoch}); it cannot be served unfenced"
                )));
            }
            let mut owed = Vec::new();
            let mut term = 1;
            if let Some(old) = &old {
                term = old.term + 1;
                owed.clone_from(&old.owed);
                if old.owner == self.owner && old.incarnation == self.incarnation {
                    // Our own row: re-adopting after a release or a deposition that no other
                    // owner followed up on.
                } else if !old.released {
                    let ours_before = old.owner == self.owner && old.incarnation < self.incarnation;
                    if !ours_before && old.epoch >= epoch {
                        return Err(not_served(
                            ns,
                            &format!(
                                "owner {:?} (incarnation {}) holds it at epoch {}; take it over \
                                 (bump the epoch, revoke to Complete, then own) or have it released",
                                old.owner, old.incarnation, old.epoch
                            ),
                        ));
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
            let batch = match &raw {
                Some(bytes) => Batch::new().equals(OWNER_KEY.to_vec(), bytes.clone()),
                None => Batch::new().absent(OWNER_KEY.to_vec()),
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
                && let Some(f) = self.on_readopt.get()
            {
                f(ns);
            }
            if let Some(f) = self.on_adopt.get() {
                f(mode);
            }
            return Ok(epoch);
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
            ::log::warn!(
                "owner {:?} was fenced out of namespace {ns} (grant {grant}, epoch now {current}); \
                 it stops serving it",
                self.owner
            );
        }
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
