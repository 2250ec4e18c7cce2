//! Application code the engine calls back that calls into the engine in turn: the `deferred`
//! metrics hook reads the entity it reports on. SPEC R11 lets it: the hook runs once the
//! deferral no longer counts in the entity's gate. Run while it still counts (the defect
//! `OwnerSwitches::deferred_hook_under_gate` puts back), the read waits for its own deferral
//! for ever, and shuttle reports the deadlock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use portcullis::EntityId;
use portcullis::restore::Metrics;

use super::owners::SimEngine;

/// The `deferred` hook that reads the entity it reports on, once given its engine.
#[derive(Default)]
pub struct ReadsOnDeferral {
    engine: StdMutex<Option<SimEngine>>,
    /// Reads the hook made (whatever they answered).
    pub reads: AtomicU64,
}

impl ReadsOnDeferral {
    pub fn new() -> Arc<ReadsOnDeferral> {
        Arc::default()
    }

    /// Gives the hook its engine (the engine holds the hook: the two hold each other until
    /// [`ReadsOnDeferral::detach`]).
    pub fn attach(&self, engine: SimEngine) {
        *self.engine.lock().unwrap_or_else(|p| p.into_inner()) = Some(engine);
    }

    /// Drops the hook's handle on its engine, so the engine can be dropped.
    pub fn detach(&self) {
        self.engine.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

impl Metrics for ReadsOnDeferral {
    fn deferred(&self, entity: &EntityId, _bytes: usize) {
        // Cloned out first: no lock of ours is held while the engine runs.
        let engine = self
            .engine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(engine) = engine {
            let _ = engine.read(entity, |state| state.len());
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
    }
}
