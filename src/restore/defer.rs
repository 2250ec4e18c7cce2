//! Deferred work (SPEC R8): a record queued for a pending entity without restoring it, durable
//! when accepted and applied inside the entity's restore unit.

use crate::sync::atomic::Ordering;
use std::sync::Arc;

use super::gate::{Gate, Phase};
use super::keys;
use super::machine::StateMachine;
use super::registry::{Deferral, Restorer, fail_closed, stopping};
use super::restoring;
use super::waits::RunnerOf;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::store::{Batch, Outcome};

impl<M: StateMachine> Restorer<M> {
    /// Queues a record for a pending entity durably, without restoring it (SPEC R8). If the
    /// entity is restored, answers [`Deferral::AlreadyRestored`] and stores nothing.
    ///
    /// The row is written without the gate's mutex (a slow sync stalls nobody else, SPEC R11);
    /// a count of deferrals in flight in the pending phase keeps the unit from starting, and
    /// scanning the rows, until the row is committed or refused.
    pub(crate) fn defer(
        &self,
        entity: &EntityId,
        record: &[u8],
        extra: &Batch,
    ) -> Result<Deferral> {
        if restoring::is_restoring(self.owner(), entity) && restoring::held(self.owner()).is_none()
        {
            // Code inside the entity's own unit (its repair, say) defers work to it: this
            // thread runs the unit, so the row is written at once, and the unit drains it
            // before the entity is served (SPEC R3, R8).
            let arrival = self.arrivals.fetch_add(1, Ordering::Relaxed);
            let written = self.write_deferral(entity, arrival, record, extra);
            if matches!(written, Ok(Deferral::Queued)) {
                restoring::deferred_inside_unit();
            }
            return self.reported(entity, record, written);
        }
        self.check_reentry(entity)?;
        let slot = self.slot(entity)?;
        let me = restoring::token();
        let mut phase = slot.gate.lock();
        let arrival = loop {
            match &mut *phase {
                Phase::Pending { deferring } => {
                    *deferring += 1;
                    break self.arrivals.fetch_add(1, Ordering::Relaxed);
                }
                Phase::Restored => return Ok(Deferral::AlreadyRestored),
                Phase::Contained(reason) => return Err(reason.to_error(entity)),
                Phase::Damaged => return Err(fail_closed(entity)),
                Phase::Running { by } => {
                    let by = *by;
                    if self.is_stopping() {
                        return Err(stopping(entity));
                    }
                    let target: Arc<dyn RunnerOf> = Arc::clone(&slot) as Arc<dyn RunnerOf>;
                    let _waiting = self.waits.enter(me, entity, target, by)?;
                    slot.gate.wait(&mut phase);
                }
            }
        };
        drop(phase);
        let in_flight = InFlight(&slot.gate);
        let written = self.write_deferral(entity, arrival, record, extra);
        // The gate is released (the count of deferrals in flight goes down) before the hook
        // runs: a hook that touches this very entity would otherwise wait for its own
        // deferral (SPEC R11).
        drop(in_flight);
        self.reported(entity, record, written)
    }

    /// Reports a committed deferral to the metrics hook (no lock held, the gate released).
    fn reported(
        &self,
        entity: &EntityId,
        record: &[u8],
        written: Result<Deferral>,
    ) -> Result<Deferral> {
        if let (Ok(Deferral::Queued), Some(hook)) = (&written, &self.metrics) {
            if self.config.guards.deferred_hook_under_gate {
                return written; // reported under the gate already (the negative control)
            }
            hook.deferred(entity, record.len());
        }
        written
    }

    /// Writes one deferred row. `extra` (guards and operations) commits in the same batch,
    /// after the row's own guard.
    fn write_deferral(
        &self,
        entity: &EntityId,
        arrival: u64,
        record: &[u8],
        extra: &Batch,
    ) -> Result<Deferral> {
        let term = (self.config.defer_term)(entity.namespace())?;
        let key = keys::deferred_key(term, arrival);
        let mut batch = Batch::new().absent(key.clone());
        for guard in extra.guards() {
            batch = batch.guard(guard.clone());
        }
        batch = batch.put(key, record.to_vec());
        for op in extra.ops() {
            batch = batch.op(op.clone());
        }
        match self.store.apply(&entity.partition(), &batch)? {
            Outcome::PreconditionFailed { index } if index > 0 => Ok(Deferral::Duplicate),
            Outcome::Committed => {
                if self.config.guards.deferred_hook_under_gate
                    && let Some(hook) = &self.metrics
                {
                    // The negative control: the hook runs while the deferral still counts
                    // in the gate, as it did before.
                    hook.deferred(entity, record.len());
                }
                Ok(Deferral::Queued)
            }
            other => Err(Error::Unavailable {
                reason: format!("deferring to {entity} was refused: {other:?}"),
                retry_after_ms: 10,
            }),
        }
    }
}

/// Decrements a pending gate's count of deferrals in flight when dropped (also on unwind),
/// waking a toucher that waits to start the unit.
struct InFlight<'a>(&'a Gate);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut phase = self.0.lock();
        if let Phase::Pending { deferring } = &mut *phase {
            *deferring = deferring.saturating_sub(1);
        }
        drop(phase);
        self.0.nudge();
    }
}
