//! The stats through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`, off by
//! default; SPEC E8): whatever recorder the application installed (Prometheus, StatsD ...)
//! gets them.
//!
//! - Counters and gauges: [`record_store`] and [`record_engine`] set them from a stats snapshot
//!   (counters as absolute values): call one whenever the exporter scrapes, or on a timer.
//! - Histograms: every journal sync's time (`portcullis_sync_seconds`) is recorded as it
//!   happens, and [`MetricsListener`] records compactions' and commit stalls' times.
//! - Events: [`MetricsListener`] counts every event by name (`portcullis_events_total`);
//!   set it as the listener, or call it from your own.
//!
//! Without a recorder installed every call is a no-op of the facade.
//!
//! ```
//! use std::sync::Arc;
//! use portcullis::observe::metrics::{MetricsListener, record_store};
//! use portcullis::store::{FileStore, Store};
//!
//! # fn main() -> portcullis::Result<()> {
//! let dir = tempfile::tempdir().expect("a temporary directory");
//! let store = FileStore::builder(dir.path())
//!     .listener(Arc::new(MetricsListener))
//!     .open()?;
//! record_store(&store.stats()); // on every scrape
//! # Ok(())
//! # }
//! ```

use metrics::{counter, gauge, histogram};

use super::{Event, Listener};
use crate::engine::EngineStats;
use crate::store::StoreStats;

/// Sets the store's counters and gauges from `stats` (names `portcullis_store_*`).
pub fn record_store(stats: &StoreStats) {
    counter!("portcullis_store_batches").absolute(stats.batches);
    counter!("portcullis_store_syncs").absolute(stats.syncs);
    counter!("portcullis_store_bytes_written").absolute(stats.bytes_written);
    counter!("portcullis_store_stalls").absolute(stats.stalls);
    counter!("portcullis_store_compactions").absolute(stats.compactions);
    counter!("portcullis_store_compactions_failed").absolute(stats.compactions_failed);
    counter!("portcullis_store_compaction_bytes_copied").absolute(stats.compaction_bytes_copied);
    counter!("portcullis_store_compaction_bytes_removed").absolute(stats.compaction_bytes_removed);
    counter!("portcullis_store_indexes_dropped").absolute(stats.indexes_dropped);
    gauge!("portcullis_store_partitions").set(stats.partitions as f64);
    gauge!("portcullis_store_partitions_loaded").set(stats.partitions_loaded as f64);
    if let Some(max) = stats.max_loaded_partitions {
        gauge!("portcullis_store_max_loaded_partitions").set(max as f64);
    }
    gauge!("portcullis_store_segments").set(stats.segments as f64);
    gauge!("portcullis_store_garbage_bytes").set(stats.garbage_bytes as f64);
    gauge!("portcullis_store_sync_seconds_max").set(stats.sync_latency.max.as_secs_f64());
    gauge!("portcullis_store_sync_seconds_mean").set(stats.sync_latency.mean().as_secs_f64());
    gauge!("portcullis_store_degraded").set(f64::from(u8::from(stats.degraded.is_some())));
}

/// Sets the engine's counters and gauges from `stats` (names `portcullis_engine_*`), and its
/// store's ([`record_store`]).
pub fn record_engine(stats: &EngineStats) {
    gauge!("portcullis_engine_entities").set(stats.phases.entities as f64);
    gauge!("portcullis_engine_pending").set(stats.phases.pending as f64);
    gauge!("portcullis_engine_restored").set(stats.phases.restored as f64);
    gauge!("portcullis_engine_contained").set(stats.phases.contained as f64);
    gauge!("portcullis_engine_resident").set(stats.passivation.resident as f64);
    if let Some(max) = stats.max_resident_entities {
        gauge!("portcullis_engine_max_resident_entities").set(max as f64);
    }
    gauge!("portcullis_engine_namespaces").set(stats.namespaces.len() as f64);
    counter!("portcullis_engine_units_run").absolute(stats.units_run);
    counter!("portcullis_engine_passivations").absolute(stats.passivation.passivations);
    counter!("portcullis_engine_owner_lease_renewals").absolute(stats.owner_lease.renewals);
    counter!("portcullis_engine_owner_lease_failed_renewals")
        .absolute(stats.owner_lease.failed_renewals);
    gauge!("portcullis_engine_degraded").set(f64::from(u8::from(stats.degraded.is_some())));
    record_store(&stats.store);
}

/// A listener that counts every event by name (`portcullis_events_total{event}`) and records
/// the durations events carry: compactions (`portcullis_compaction_seconds`) and commit stalls
/// (`portcullis_stall_seconds`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MetricsListener;

impl Listener for MetricsListener {
    fn on_event(&self, event: &Event) {
        counter!("portcullis_events_total", "event" => event.name()).increment(1);
        match event {
            Event::CompactionFinished { elapsed, .. } => {
                histogram!("portcullis_compaction_seconds").record(elapsed.as_secs_f64());
            }
            Event::CommitStall { elapsed, .. } => {
                histogram!("portcullis_stall_seconds").record(elapsed.as_secs_f64());
            }
            _ => {}
        }
    }
}

/// A journal sync took `nanos` (called by the journal for every commit sync).
#[inline]
pub(crate) fn sync_took(nanos: u64) {
    histogram!("portcullis_sync_seconds").record(nanos as f64 / 1e9);
}
