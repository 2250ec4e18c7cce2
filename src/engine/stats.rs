//! Engine counters.

use super::HeldNamespace;
use crate::observe::Degraded;
use crate::restore::{PassivationStats, PhaseCounts, WarmProgress};
use crate::store::StoreStats;

/// A snapshot of the engine's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// This process's incarnation.
    pub incarnation: u64,
    /// The unclean incarnation repairs are owed for (see `Engine::unclean_previous`).
    pub unclean_previous: Option<u64>,
    /// Entities by phase.
    pub phases: PhaseCounts,
    /// Restore units run in this process.
    pub units_run: u64,
    /// Resident entities, registry slots, passivations and reactivations (SPEC R10).
    pub passivation: PassivationStats,
    /// The most recent warm's progress, if one was started.
    pub warm: Option<WarmProgress>,
    /// The store's counters.
    pub store: StoreStats,
    /// The owner lease's renewals (SPEC F12).
    pub owner_lease: OwnerLeaseStats,
    /// The budget `passivation.resident` is held to, if one is set (SPEC R10).
    pub max_resident_entities: Option<u64>,
    /// The namespaces this engine serves now, with the epochs they are served under (SPEC
    /// F11), in name order.
    pub namespaces: Vec<HeldNamespace>,
    /// Why the engine is degraded, if it is (SPEC E8): its store's reason (see
    /// [`StoreStats::degraded`]), the engine's background thread dead and not started
    /// again (see [`BackgroundStats`](super::BackgroundStats)), or an owner lease that could not be renewed. The
    /// gravest standing one; an engine failing in the background never reports `None`.
    pub degraded: Option<Degraded>,
    /// The engine's background thread (renewals, sweeps, the background warm) and the
    /// background warm's progress.
    pub background: super::BackgroundStats,
}

/// Counters of the engine's owner lease (SPEC F12).
///
/// # Examples
///
/// ```
/// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
///
/// struct Total; // the sum of the numbers written
/// impl TypedMachine for Total {
///     type Record = u64;
///     type State = u64;
///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
/// }
/// # fn main() -> portcullis::Result<()> {
/// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
/// let engine = Engine::builder(Typed(Total)).store(store).renew_owner_lease(false).open()?;
/// let lease = engine.stats().owner_lease;
/// assert!(lease.valid_until_ms > engine.now_ms()); // live since open
/// assert_eq!((lease.renewals, lease.failed_renewals), (0, 0));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnerLeaseStats {
    /// Renewals that succeeded (in the background, on demand, or asked for).
    pub renewals: u64,
    /// Renewals that failed (a store error; the next one tries again).
    pub failed_renewals: u64,
    /// Until when (engine clock, ms) the engine takes itself for live; a call after that
    /// renews first.
    pub valid_until_ms: u64,
}
