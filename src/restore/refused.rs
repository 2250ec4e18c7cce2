//! Deferred records the state refused (SPEC R8, R12): work deferred to a pending entity could
//! not be checked against the state it would meet, so the restore unit checks it when it
//! drains it, and sets aside what the state refuses instead of appending it.
//!
//! Owns: [`RefusedDeferral`], the format of the `\0refused.` rows (their keys are in `keys.rs`),
//! listing an entity's refused deferrals, reporting one (a `warn` line and the metrics hook),
//! and the switch that runs the state machine's `check` (a test-only negative control can turn
//! it off). Calls the store and the log's row codec only.

use serde::{Deserialize, Serialize};

use super::keys;
use super::machine::StateMachine;
use super::registry::Restorer;
use super::telemetry::MetricsHook;
use crate::entity::EntityId;
use crate::error::Result;
use crate::store::{Entries, Store};

/// The longest reason kept in a refused row, in bytes; a longer one is cut (at a character
/// boundary) so a row stays small whatever the application answers.
const MAX_REASON_BYTES: usize = 4096;

/// A deferred record that the entity's state refused when its restore unit drained it
/// (SPEC R8, R12): its [`check`](crate::StateMachine::check) refused it. It was set aside in
/// the same batch that took it off the deferred queue, so it is never appended to the history
/// and never lost (a crash leaves it either still deferred or set aside, never both); the
/// entity keeps serving.
///
/// List them with [`Engine::refused_deferrals`](crate::Engine::refused_deferrals); each is
/// reported once, when it is set aside, to [`Metrics::deferral_refused`](crate::restore::Metrics::deferral_refused)
/// and in a `warn` log line.
///
/// ```
/// use portcullis::restore::RefusedDeferral;
/// fn describe(r: &RefusedDeferral) -> String {
///     format!("{} refused {} bytes at seq {}: {}", r.entity, r.record.len(), r.seq, r.reason)
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RefusedDeferral {
    /// The entity it was deferred to.
    pub entity: EntityId,
    /// The sequence number it would have had in the entity's log.
    pub seq: u64,
    /// The state machine's reason (at most 4 KiB of it).
    pub reason: String,
    /// The record, as it was deferred.
    pub record: Vec<u8>,
    /// Its row key: refused deferrals sort in the order they were deferred. Opaque.
    pub key: Vec<u8>,
}

/// The stored form of a refused deferral (after the row's version byte).
#[derive(Serialize, Deserialize)]
struct Row {
    reason: String,
    seq: u64,
    record: Vec<u8>,
}

impl RefusedDeferral {
    /// A refusal of the deferred record stored under `deferred_key`, with its reason cut to
    /// [`MAX_REASON_BYTES`].
    pub(crate) fn new(
        entity: &EntityId,
        deferred_key: &[u8],
        seq: u64,
        reason: &str,
        record: Vec<u8>,
    ) -> Self {
        let mut end = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        RefusedDeferral {
            entity: entity.clone(),
            seq,
            reason: reason[..end].to_owned(),
            record,
            key: keys::refused_key(deferred_key),
        }
    }

    /// The row's value: a version byte, then postcard.
    pub(crate) fn encode_row(&self) -> Vec<u8> {
        crate::log::encode_row(&Row {
            reason: self.reason.clone(),
            seq: self.seq,
            record: self.record.clone(),
        })
    }

    /// Reports it once it is durable: a `warn` line and the metrics hook (SPEC R9).
    pub(crate) fn report(&self, metrics: &MetricsHook) {
        ::log::warn!(
            "{}: a deferred record ({} bytes) was refused by the state and set aside, not appended (it would have been record {}): {}",
            self.entity,
            self.record.len(),
            self.seq,
            self.reason
        );
        if let Some(hook) = metrics {
            hook.deferral_refused(&self.entity, self);
        }
    }
}

impl<M: StateMachine> Restorer<M> {
    /// Every refused deferral of a registered entity, in the order they were deferred. Reads
    /// the rows; does not touch (restore) the entity.
    pub(crate) fn refused_deferrals(&self, entity: &EntityId) -> Result<Vec<RefusedDeferral>> {
        self.existing(entity)?;
        list(&*self.store, entity)
    }
}

/// Every refused deferral of `entity`, in the order they were deferred.
fn list(store: &dyn Store, entity: &EntityId) -> Result<Vec<RefusedDeferral>> {
    let p = entity.partition();
    let mut out = Vec::new();
    for row in Entries::new(store, p.clone(), keys::refused_range()) {
        let (key, value) = row?;
        let row: Row = crate::log::decode_row(&p, "refused deferral", &value)?;
        out.push(RefusedDeferral {
            entity: entity.clone(),
            seq: row.seq,
            reason: row.reason,
            record: row.record,
            key,
        });
    }
    Ok(out)
}

/// Whether the engine runs the state machine's `check` (SPEC R12). Always, except when a test
/// turns it off to show that the tests of R12 catch its absence (a negative control).
#[derive(Debug, Default)]
pub(crate) struct CheckSwitch {
    #[cfg(feature = "test-hooks")]
    skip: crate::sync::atomic::AtomicBool,
}

impl CheckSwitch {
    /// Whether `check` runs.
    pub(crate) fn on(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        {
            !self.skip.load(crate::sync::atomic::Ordering::Relaxed)
        }
        #[cfg(not(feature = "test-hooks"))]
        {
            true
        }
    }

    /// Test-only: skip `check` everywhere (writes and the deferred drain).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn set_skip(&self, skip: bool) {
        self.skip
            .store(skip, crate::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Batch, MemoryStore};

    #[test]
    fn a_refused_row_round_trips_and_its_reason_is_bounded() {
        let store = MemoryStore::new();
        let e = EntityId::new("chat", "lobby").unwrap();
        let long = "é".repeat(MAX_REASON_BYTES);
        let key = keys::deferred_key(3, 1);
        let r = RefusedDeferral::new(&e, &key, 7, &long, b"rec".to_vec());
        assert!(r.reason.len() <= MAX_REASON_BYTES && r.reason.starts_with('é'));
        let batch = Batch::new().put(r.key.clone(), r.encode_row());
        assert!(store.apply(&e.partition(), &batch).unwrap().is_committed());
        assert_eq!(list(&store, &e).unwrap(), [r]);
    }
}
