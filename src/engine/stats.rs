//! Engine counters.

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
}
