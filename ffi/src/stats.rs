//! The engine's counters through C (SPEC E2, R9).
//!
//! Owns: `pc_engine_stats` and the function that fills it.

use crate::boundary::{boundary, out_ptr};
use crate::engine::{live, pc_engine};

/// A snapshot of the engine's counters.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_engine_stats {
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
}

/// Fills `*out` with the engine's counters. A closed engine still answers.
///
/// # Safety
/// `engine` live; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_get_stats(
    engine: *const pc_engine,
    out: *mut pc_engine_stats,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let s = live(engine)?.stats();
        *out = pc_engine_stats {
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
        };
        Ok(())
    })
}
