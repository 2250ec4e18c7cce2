//! Whether revocation has completed at the current epoch, read and never run (SPEC F5, F12).
//!
//! A take-over may adopt a namespace from another owner only with proof that no write planned
//! under an older epoch can commit any more. A slice that answered `Complete` left that proof
//! in the coordinator: its checkpoint, written for the epoch and recovery marker it read, with
//! the cursor at the end of the table, committed guarded on both. So the proof is read, not
//! re-run: the checkpoint valid for the current epoch and marker, its cursor `Done`, and no
//! recovery hold-off pending now (SPEC F6). Rows added since are at the current epoch (a
//! renewal's row is guarded on the epoch as read), so they vouch for nothing older.
//!
//! [`CoordinatorView::guard`] adds guards on the rows as read to a batch on the coordinator
//! partition: such a batch commits only while the epoch, the marker and the checkpoint are
//! still what the proof was read from. Calls only the store.

use super::rows::{self, CheckpointRow, RecoveryRow, ScanPosition};
use super::{Fence, guard_as_read, unfenced};
use crate::entity::Namespace;
use crate::error::Result;
use crate::store::Batch;

/// A namespace's coordinator as one read found it (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct CoordinatorView {
    /// The current epoch.
    pub(crate) epoch: u64,
    /// Whether the namespace is declared unfenced.
    pub(crate) unfenced: bool,
    /// Whether revocation has completed at `epoch` (see the module documentation).
    pub(crate) complete: bool,
    /// Why not, when it has not (for messages).
    pub(crate) pending: &'static str,
    /// The extra keys asked for, as read.
    pub(crate) extra: Vec<Option<Vec<u8>>>,
    /// The epoch, recovery and checkpoint rows as read, with their keys.
    read: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl CoordinatorView {
    /// `batch`, guarded on the epoch, the recovery marker and the checkpoint as read.
    pub(crate) fn guard(&self, mut batch: Batch) -> Batch {
        for (key, raw) in &self.read {
            batch = guard_as_read(batch, key, raw.as_deref());
        }
        batch
    }
}

impl Fence {
    /// Reads the namespace's coordinator in one store call: the epoch, the unfenced
    /// declaration, whether revocation has completed at the epoch (see the module
    /// documentation), and `extra` keys of the same partition.
    pub(crate) fn coordinator_view(
        &self,
        ns: &Namespace,
        extra: &[&[u8]],
    ) -> Result<CoordinatorView> {
        let keys = &self.inner.keys;
        let (current, unfenced_key, recovery, checkpoint) = (
            keys.current(),
            keys.unfenced(),
            keys.recovery(),
            keys.checkpoint(),
        );
        let mut wanted: Vec<&[u8]> = vec![&current, &unfenced_key, &recovery, &checkpoint];
        wanted.extend_from_slice(extra);
        let mut read = self
            .inner
            .store
            .get_many(&ns.coordinator_partition(), &wanted)?;
        let extra = read.split_off(4);
        let epoch = rows::decode_epoch(read[0].as_deref())?;
        let declared = unfenced::decode_unfenced(read[1].as_deref())?.is_some();
        if declared {
            self.remember_unfenced(ns);
        }
        let marker: Option<RecoveryRow> = rows::decode_opt("recovery marker", read[2].as_deref())?;
        let resumed_at = marker.map(|r| r.resumed_at_ms);
        let cp: Option<CheckpointRow> =
            rows::decode_opt("revocation checkpoint", read[3].as_deref())?;
        let config = self.inner.config;
        let holding_off = resumed_at.is_some_and(|r| {
            self.now()
                < r.saturating_add(config.epoch_lease_ms())
                    .saturating_add(config.lease_margin_ms())
        });
        let pending = match &cp {
            _ if declared => "",
            Some(cp) if cp.epoch != epoch || cp.recovery != resumed_at => {
                "no revocation slice has run since the last bump or recovery"
            }
            None => "no revocation slice has run since the last bump or recovery",
            Some(cp) if cp.cursor != ScanPosition::Done => "leases remain to be revoked",
            Some(_) if holding_off => "a declared recovery holds completion off",
            Some(_) => "",
        };
        let complete = !declared && pending.is_empty();
        let mut rows_read = Vec::with_capacity(3);
        for (key, raw) in [current, recovery, checkpoint]
            .into_iter()
            .zip([&read[0], &read[2], &read[3]])
        {
            rows_read.push((key, raw.clone()));
        }
        Ok(CoordinatorView {
            epoch,
            unfenced: declared,
            complete,
            pending,
            extra,
            read: rows_read,
        })
    }
}
