//! What the fence tells an engine's listener (SPEC E8): revocations started and completed,
//! and sweeper passes; the engine's owners tell depositions and failed renewals through the
//! same hub. A fence made on its own has no hub and tells nothing.
//!
//! Owns `FenceWatch` (held in the fence's `Inner`): the hub, set once by the engine, and the
//! newest epoch whose completion was told per namespace (a leaf lock).

use crate::sync::{HashMap, Mutex, OnceLock};

use super::Fence;
use crate::entity::Namespace;
use crate::observe::{Event, Events};

#[derive(Default)]
pub(super) struct FenceWatch {
    events: OnceLock<Events>,
    /// The newest epoch whose completion was told, per namespace: a slice that finds
    /// revocation complete again tells nothing.
    completed: Mutex<HashMap<Namespace, u64>>,
}

/// The hub of a fence no engine set one on.
static NONE: Events = Events::none();

impl Fence {
    /// Sends this fence's events to `events` (the engine's hub). Set once; later calls are
    /// ignored.
    pub(crate) fn set_events(&self, events: Events) {
        let _ = self.inner.watch.events.set(events);
    }

    /// Where this fence's events go (nowhere until an engine sets a hub).
    pub(crate) fn events(&self) -> &Events {
        self.inner.watch.events.get().unwrap_or(&NONE)
    }

    /// An epoch bump committed: revocation to `epoch` begins.
    pub(super) fn told_bumped(&self, ns: &Namespace, epoch: u64) {
        self.events().emit(|| Event::RevocationStarted {
            namespace: ns.clone(),
            epoch,
        });
    }

    /// A slice found revocation to `epoch` complete: told the first time only.
    pub(super) fn told_complete(&self, ns: &Namespace, epoch: u64) {
        let events = self.events();
        if !events.is_on() {
            return;
        }
        let mut completed = self.inner.watch.completed.lock();
        let told = completed.entry(ns.clone()).or_insert(0);
        if *told >= epoch {
            return; // told already (or epoch 0: nothing was ever revoked)
        }
        *told = epoch;
        drop(completed);
        events.emit(|| Event::RevocationCompleted {
            namespace: ns.clone(),
            epoch,
        });
    }
}
