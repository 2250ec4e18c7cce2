//! A second engine opened with owner `a`'s id while `a` runs: two processes given one owner id
//! by mistake (SPEC F12). Its open must be refused while `a`'s owner lease is live; it may
//! succeed once the lease lapsed (the wall clock jumps; `a` is then taken for crashed), and
//! then `a` must stop serving before it writes again (it renews first, and finds its
//! incarnation replaced).
//!
//! Checked: no append `a` starts after the second engine's open returned commits. With the
//! open's check of the live incarnation off (`OwnerSwitches::ignore_live_incarnation`) the
//! second engine opens beside a live `a`, whose appends go on committing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use portcullis::EntityId;
use portcullis::engine::OwnerSwitches;

use super::owners::{Backend, Owner, try_open_owner};
use super::{Rng, Trace, pause};

/// The second engine, once it opened.
#[derive(Default)]
pub struct Impostor {
    /// Its open returned: from then on no append `a` starts may commit.
    pub opened: AtomicBool,
    pub owner: StdMutex<Option<Arc<Owner>>>,
}

impl Impostor {
    pub fn has_opened(&self) -> bool {
        self.opened.load(Ordering::SeqCst)
    }

    pub fn owner(&self) -> Option<Arc<Owner>> {
        self.owner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// At a point of the schedule, opens an engine with owner id `a`; if it opens, it adopts the
/// namespace and reads every entity, as a restart does.
pub fn run(
    state: &Impostor,
    backend: &Backend,
    switches: OwnerSwitches,
    entities: &[EntityId],
    rng: &mut Rng,
    trace: &Trace,
) {
    pause(rng.below(150));
    match try_open_owner("a", backend, None, false, switches, false) {
        Ok(owner) => {
            state.opened.store(true, Ordering::SeqCst);
            trace.push("a second engine opened with a's owner id".into());
            // As a restarting process does: adopt the namespace, then serve it.
            let owned = owner.engine.own(entities[0].namespace());
            trace.push(format!("the second engine owns: {owned:?}"));
            for e in entities {
                let read = owner.engine.read(e, |s| s.len());
                trace.push(format!("the second engine reads {e}: {read:?}"));
            }
            *state.owner.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(owner));
        }
        Err(e) => trace.push(format!("a second engine with a's owner id: {e}")),
    }
}
