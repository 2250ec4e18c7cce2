//! The engine workload's owners: the state machine they run (records are 8-byte numbers,
//! folded into the list of them), the store they share (or, behind the simulated network, a
//! view of it each), and how an owner's engine is opened on the simulated clock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use portcullis::clock::SimClock;
use portcullis::engine::OwnerSwitches;
use portcullis::store::Store;
use portcullis::{ApplyContext, Engine, EntityId, Rejection, StateMachine};

use super::hooks::ReadsOnDeferral;
use super::net::Net;
use super::pause;

/// Folds records (8-byte numbers) into the list of them; counts restore units per entity.
/// Applying a record lets the other tasks run `apply_steps` steps first, as folding real
/// records takes time (restore units then span more of what other tasks do).
#[derive(Debug, Default)]
pub struct Sim {
    pub units: StdMutex<BTreeMap<String, u64>>,
    apply_steps: u64,
}

impl StateMachine for Sim {
    type State = Vec<u64>;

    fn fresh(&self, e: &EntityId) -> Vec<u64> {
        *self
            .units
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(e.to_string())
            .or_default() += 1;
        Vec::new()
    }

    fn apply(&self, s: &mut Vec<u64>, _: &ApplyContext<'_>, r: &[u8]) -> Result<(), Rejection> {
        let bytes: [u8; 8] = r
            .try_into()
            .map_err(|_| Rejection::new("a record is 8 bytes"))?;
        pause(self.apply_steps);
        s.push(u64::from_le_bytes(bytes));
        Ok(())
    }

    fn encode_checkpoint(&self, s: &Vec<u64>) -> Result<Vec<u8>, Rejection> {
        Ok(s.iter().flat_map(|n| n.to_le_bytes()).collect())
    }

    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<Vec<u64>, Rejection> {
        if !b.len().is_multiple_of(8) {
            return Err(Rejection::new("a checkpoint is whole records"));
        }
        Ok(b.chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect())
    }
}

pub type SimEngine = Engine<Arc<Sim>>;

pub struct Owner {
    pub name: &'static str,
    pub engine: SimEngine,
    pub machine: Arc<Sim>,
    pub budget: Option<usize>,
    /// Passes of the engine's lease sweeper, which only its background thread's schedule
    /// starts (`Event::Swept`).
    pub sweeps: Arc<AtomicU64>,
    /// Its `deferred` metrics hook that reads the entity it reports on, if it has one.
    pub hook: Option<Arc<ReadsOnDeferral>>,
}

/// The store the owners share, or (behind the simulated network) a view of it per owner.
#[derive(Clone)]
pub struct Backend {
    pub store: Arc<dyn Store>,
    pub net: Option<Arc<Net>>,
    pub clock: SimClock,
    /// Steps each owner's state machine takes to apply a record.
    pub apply_steps: u64,
    /// Each owner's close bound (`EngineBuilder::close_timeout`).
    pub close_timeout: std::time::Duration,
}

impl Backend {
    fn store_for(&self, owner: &'static str) -> Arc<dyn Store> {
        match &self.net {
            Some(net) => net.view(owner),
            None => self.store.clone(),
        }
    }
}

pub fn open_owner(name: &'static str, backend: &Backend, budget: Option<usize>) -> Owner {
    try_open_owner(
        name,
        backend,
        budget,
        false,
        OwnerSwitches::default(),
        false,
    )
    .expect("the engine opens")
}

/// Opens an engine with owner id `name` over `backend`.
pub fn try_open_owner(
    name: &'static str,
    backend: &Backend,
    budget: Option<usize>,
    first_use: bool,
    switches: OwnerSwitches,
    reads_on_deferral: bool,
) -> portcullis::Result<Owner> {
    let machine = Arc::new(Sim {
        apply_steps: backend.apply_steps,
        ..Sim::default()
    });
    let sweeps = Arc::new(AtomicU64::new(0));
    let counted = sweeps.clone();
    let listener = move |event: &portcullis::observe::Event| {
        if let portcullis::observe::Event::Swept { .. } = event {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    };
    let mut builder = Engine::builder(machine.clone())
        .listener(Arc::new(listener))
        .store(backend.store_for(name))
        .clock(Arc::new(backend.clock.clone()))
        // Sweeps fall due within a seed's virtual time (the default is a minute).
        .sweep_interval(std::time::Duration::from_secs(10))
        .owner(name)
        .close_timeout(backend.close_timeout)
        .adopt_on_first_use(first_use)
        .owner_switches_for_test(switches)
        .warm_parallelism(2);
    if let Some(b) = budget {
        builder = builder.max_resident_entities(b);
    }
    let hook = reads_on_deferral.then(ReadsOnDeferral::new);
    if let Some(hook) = &hook {
        builder = builder.metrics(hook.clone());
    }
    let engine = builder.open()?;
    if let Some(hook) = &hook {
        hook.attach(engine.clone());
    }
    Ok(Owner {
        name,
        engine,
        machine,
        budget,
        sweeps,
        hook,
    })
}
