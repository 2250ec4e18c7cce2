//! The engine's counters through C (SPEC E2, R9).
//!
//! Owns: `pc_engine_stats` and the function that fills it.

use crate::boundary::boundary;
use crate::engine::{live, pc_engine};
use crate::error::pc_error;
use crate::warm::write_sized;

/// A snapshot of the engine's counters. Set `struct_size = sizeof(pc_engine_stats)` before the
/// call: the library writes only that many bytes, so counters added at the end leave compiled
/// callers working.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_engine_stats {
    /// `sizeof(pc_engine_stats)` as the caller compiled it (left unchanged).
    pub struct_size: usize,
    /// This open's incarnation number.
    pub incarnation: u64,
    /// The previous incarnation if it ended without a clean shutdown, else 0.
    pub unclean_previous: u64,
    /// Registered entities known to the engine.
    pub entities: u64,
    /// Entities not restored yet.
    pub pending: u64,
    /// Entities whose restore is running.
    pub running: u64,
    /// Entities restored.
    pub restored: u64,
    /// Entities contained (SPEC R4).
    pub contained: u64,
    /// Restore units run since open.
    pub units_run: u64,
    /// Batches the store committed since open.
    pub store_batches: u64,
    /// Syncs the store issued since open.
    pub store_syncs: u64,
    /// Partitions the store knows.
    pub store_partitions: u64,
    /// Restored entities in memory now (SPEC R10).
    pub resident: u64,
    /// Entities passivated (dropped from memory, to restore on their next touch) since open.
    pub passivated: u64,
    /// The budget of restored entities in memory (0: none).
    pub max_resident_entities: u64,
    /// Namespaces this engine serves now.
    pub namespaces: u64,
    /// Owner lease renewals that succeeded since open.
    pub owner_lease_renewals: u64,
    /// Owner lease renewals that failed since open.
    pub owner_lease_failed_renewals: u64,
    /// Commit stalls of the store since open.
    pub store_stalls: u64,
    /// Commit syncs of the store timed since open.
    pub store_sync_count: u64,
    /// Their total time, in microseconds.
    pub store_sync_total_us: u64,
    /// The longest, in microseconds.
    pub store_sync_max_us: u64,
    /// Compactions of the store completed since open.
    pub store_compactions: u64,
    /// Compactions of the store that failed since open.
    pub store_compactions_failed: u64,
    /// `PC_DEGRADED_*` when the engine (or its store) is degraded (its reason:
    /// `pc_engine_degraded`), else 0 (SPEC E8).
    pub degraded: u64,
}

/// Fills `*out` with the engine's counters (at most `out->struct_size` bytes). A closed engine
/// still answers.
///
/// # Safety
/// `engine` live; `out` writable for its `struct_size`. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_get_stats(
    engine: *const pc_engine,
    out: *mut pc_engine_stats,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        let s = live(engine)?.stats();
        let stats = pc_engine_stats {
            struct_size: 0,
            incarnation: s.incarnation,
            unclean_previous: s.unclean_previous.unwrap_or(0),
            entities: s.phases.entities,
            pending: s.phases.pending,
            running: s.phases.running,
            restored: s.phases.restored,
            contained: s.phases.contained,
            units_run: s.units_run,
            store_batches: s.store.batches,
            store_syncs: s.store.syncs,
            store_partitions: s.store.partitions,
            resident: s.passivation.resident,
            passivated: s.passivation.passivations,
            max_resident_entities: s.max_resident_entities.unwrap_or(0),
            namespaces: s.namespaces.len() as u64,
            owner_lease_renewals: s.owner_lease.renewals,
            owner_lease_failed_renewals: s.owner_lease.failed_renewals,
            store_stalls: s.store.stalls,
            store_sync_count: s.store.sync_latency.count,
            store_sync_total_us: u64::try_from(s.store.sync_latency.total.as_micros())
                .unwrap_or(u64::MAX),
            store_sync_max_us: u64::try_from(s.store.sync_latency.max.as_micros())
                .unwrap_or(u64::MAX),
            store_compactions: s.store.compactions,
            store_compactions_failed: s.store.compactions_failed,
            degraded: crate::observe::degraded_code(&s.degraded),
        };
        // SAFETY: the caller's contract.
        unsafe { write_sized(out, &stats, "out") }
    })
}
