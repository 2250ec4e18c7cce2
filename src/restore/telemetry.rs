//! Telemetry (SPEC R9): one `info` line per restored entity, one `warn` per refusal, a summary
//! per warm; counters and timings through a [`Metrics`] hook.
//!
//! The hook is an `Option<Arc<dyn Metrics>>`: when none is installed, reporting costs one
//! branch.

use std::sync::Arc;
use std::time::Duration;

use super::containment::Containment;
use super::refused::RefusedDeferral;
use super::unit::UnitReport;
use super::warm::WarmProgress;
use crate::entity::EntityId;

/// Receives counters and timings. Every method has an empty default; implement what you need.
/// Methods are called on the thread that did the work, so they should be quick.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use portcullis::EntityId;
/// use portcullis::restore::{Metrics, UnitReport};
///
/// #[derive(Default)]
/// struct Replayed(AtomicU64);
/// impl Metrics for Replayed {
///     fn entity_restored(&self, _: &EntityId, report: &UnitReport) {
///         self.0.fetch_add(report.replayed, Ordering::Relaxed);
///     }
/// }
/// ```
pub trait Metrics: Send + Sync {
    /// An entity's restore unit succeeded.
    fn entity_restored(&self, entity: &EntityId, report: &UnitReport) {
        let _ = (entity, report);
    }

    /// An entity was contained.
    fn entity_contained(&self, entity: &EntityId, reason: &Containment, elapsed: Duration) {
        let _ = (entity, reason, elapsed);
    }

    /// A warm finished (ran out of pending entities, or was stopped).
    fn warm_finished(&self, progress: &WarmProgress) {
        let _ = progress;
    }

    /// A record was deferred to a pending entity.
    fn deferred(&self, entity: &EntityId, bytes: usize) {
        let _ = (entity, bytes);
    }

    /// Records were appended to an entity's log by a write.
    fn appended(&self, entity: &EntityId, records: u64, bytes: u64) {
        let _ = (entity, records, bytes);
    }

    /// A deferred record was refused by the entity's state when its restore unit drained it,
    /// and set aside instead of appended (SPEC R8, R12). Called once per record, after the
    /// batch that set it aside committed, on the thread running the unit (no lock held, but
    /// the entity is being restored: do not touch it from here).
    ///
    /// ```
    /// use portcullis::EntityId;
    /// use portcullis::restore::{Metrics, RefusedDeferral};
    ///
    /// struct Alerts;
    /// impl Metrics for Alerts {
    ///     fn deferral_refused(&self, entity: &EntityId, refused: &RefusedDeferral) {
    ///         eprintln!("{entity}: deferred work refused: {}", refused.reason);
    ///     }
    /// }
    /// ```
    fn deferral_refused(&self, entity: &EntityId, refused: &RefusedDeferral) {
        let _ = (entity, refused);
    }
}

/// The optional hook, as the engine and restore layer hold it.
pub(crate) type MetricsHook = Option<Arc<dyn Metrics>>;

pub(crate) fn restored(hook: &MetricsHook, entity: &EntityId, report: &UnitReport) {
    ::log::info!(
        "restored {entity}: {} records replayed ({} bytes) after checkpoint {:?}, {} deferred, {} deferred refused, {} repaired, checkpoint published: {}, in {:?}",
        report.replayed,
        report.replayed_bytes,
        report.checkpoint_seq,
        report.deferred,
        report.deferred_refused,
        report.repaired,
        report.checkpoint_published,
        report.elapsed
    );
    if let Some(hook) = hook {
        hook.entity_restored(entity, report);
    }
}

pub(crate) fn contained(
    hook: &MetricsHook,
    entity: &EntityId,
    reason: &Containment,
    elapsed: Duration,
) {
    ::log::warn!("contained {entity} after {elapsed:?}: {reason}");
    if let Some(hook) = hook {
        hook.entity_contained(entity, reason, elapsed);
    }
}

/// Logs a warm's summary line (SPEC R9). Called before the warm's waiters wake, so a caller of
/// `Warm::wait` finds it logged.
pub(crate) fn log_warm_finished(progress: &WarmProgress) {
    let state = if progress.stopped {
        "stopped"
    } else {
        "finished"
    };
    let names: Vec<String> = progress
        .refused_entities
        .iter()
        .map(ToString::to_string)
        .collect();
    let more = progress.refused.saturating_sub(names.len() as u64);
    let refused = match (names.is_empty(), more) {
        (true, _) => String::new(),
        (false, 0) => format!(" ({})", names.join(", ")),
        (false, more) => format!(" ({} and {more} more)", names.join(", ")),
    };
    ::log::info!(
        "warm {state}: {} of {} entities done, {} refused{refused}, in {:?}",
        progress.done,
        progress.total,
        progress.refused,
        progress.elapsed
    );
}

/// Reports a finished warm to the metrics hook, after its waiters woke (a hook may wait on
/// the warm itself).
pub(crate) fn warm_finished(hook: &MetricsHook, progress: &WarmProgress) {
    if let Some(hook) = hook {
        hook.warm_finished(progress);
    }
}
