//! Restore next to the peers: opens Portcullis's engine over the per-entity logs data set
//! (written by `sys_portcullis` into the engine's entity partitions, with the registration
//! marker) and restores every entity with `Engine::warm`, checking that each entity replayed
//! its whole history.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use portcullis::EntityId;
use portcullis::engine::Engine;
use portcullis::restore::{ApplyContext, Metrics, Rejection, StateMachine, UnitReport};

use crate::common::{DataSet, R, RestoreRun};

/// Folds an entity's records into (records, bytes): the least an application's `apply` does.
pub struct Histories;

impl StateMachine for Histories {
    type State = [u64; 2];

    fn fresh(&self, _: &EntityId) -> [u64; 2] {
        [0, 0]
    }

    fn apply(
        &self,
        s: &mut [u64; 2],
        _: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        s[0] += 1;
        s[1] += record.len() as u64;
        Ok(())
    }

    fn encode_checkpoint(&self, s: &[u64; 2]) -> Result<Vec<u8>, Rejection> {
        let mut out = s[0].to_le_bytes().to_vec();
        out.extend_from_slice(&s[1].to_le_bytes());
        Ok(out)
    }

    fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<[u64; 2], Rejection> {
        let word = |i: usize| {
            bytes
                .get(i..i + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| Rejection::new("a checkpoint is 16 bytes"))
        };
        Ok([word(0)?, word(8)?])
    }
}

/// Counts what the restore units replayed.
#[derive(Default)]
struct Replayed {
    units: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
}

impl Metrics for Replayed {
    fn entity_restored(&self, _: &EntityId, report: &UnitReport) {
        self.units.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(report.replayed, Ordering::Relaxed);
        self.bytes
            .fetch_add(report.replayed_bytes, Ordering::Relaxed);
    }
}

/// How the engine is configured for the restore row, in one line.
pub const CONFIG: &str = "restore: `Engine` over the same per-entity logs data set \
    (`EngineBuilder::directory`, every option default: a pool of one thread per core, \
    `warm_parallelism` 4), `Engine::warm` to completion; the state machine only counts records \
    and bytes";

/// Opens the engine over `dir`, restores every entity, checks what was replayed, closes.
pub fn restore_all(dir: &Path, data: &DataSet) -> R<RestoreRun> {
    let metrics = Arc::new(Replayed::default());
    let started = Instant::now();
    let engine = Engine::builder(Histories)
        .directory(dir)
        .metrics(Arc::clone(&metrics) as Arc<dyn Metrics>)
        .open()?;
    let open = started.elapsed();
    let warm_started = Instant::now();
    let progress = engine.warm()?.wait()?;
    let warm = warm_started.elapsed();
    let (units, records, bytes) = (
        metrics.units.load(Ordering::Relaxed),
        metrics.records.load(Ordering::Relaxed),
        metrics.bytes.load(Ordering::Relaxed),
    );
    engine.close()?;
    if progress.refused != 0 || progress.done != data.entities || units != data.entities {
        return Err(format!(
            "the warm restored {} entities ({units} units, {} refused) of {}",
            progress.done, progress.refused, data.entities
        )
        .into());
    }
    let want_records = data.entities * data.records;
    if records != want_records || bytes != want_records * data.value_len as u64 {
        return Err(format!(
            "the warm replayed {records} records ({bytes} bytes), not {want_records}"
        )
        .into());
    }
    Ok(RestoreRun { open, warm })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::{Order, System};
    use crate::sys_portcullis::Portcullis;

    /// The per-entity logs as Portcullis loads them are what the engine restores: every
    /// entity, every record.
    #[test]
    fn the_engine_restores_the_log_data_set() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataSet {
            entities: 12,
            records: 5,
            value_len: 30,
            order: Order::Interleaved,
            rows_per_txn: 10,
        };
        Portcullis.load(dir.path(), &data).unwrap();
        restore_all(dir.path(), &data).unwrap();
        // Negative control: a data set the store does not hold is refused.
        let more = DataSet { records: 6, ..data };
        assert!(restore_all(dir.path(), &more).is_err());
    }
}
