//! Writing heads snapshots and pointing the manifest at them, or abandoning them when a page
//! open read is damaged.
//!
//! May call: the heads, container and journal modules (pausing appends to take a consistent
//! position) and the fold ([`fold`](super::fold)); takes the partition table for reading, and
//! for writing when the written heads are folded back.

use crate::sync::atomic::Ordering;

use super::{Inner, MANIFEST, MANIFEST_MAGIC, Manifest, SnapshotState, container, heads};
use crate::error::{Error, Result};

impl Inner {
    /// Writes a heads snapshot at the current journal position, then points the manifest at it.
    pub(super) fn write_snapshot(&self) -> Result<()> {
        let mut state = self.snapshot.lock();
        if state.finished {
            return Ok(());
        }
        self.write_snapshot_locked(&mut state)
    }

    pub(super) fn write_snapshot_locked(&self, state: &mut SnapshotState) -> Result<()> {
        let base = self.table.read().base.clone();
        if base.as_ref().is_some_and(|b| b.any_damaged()) {
            return self.abandon_snapshot(state);
        }
        let bytes_before = self.journal.counters.bytes_appended.load(Ordering::Relaxed);
        let damage = self.damage.lock().clone();
        if state.current_at == Some(bytes_before) && damage == state.damage_on_disk {
            // Nothing was appended since the snapshot on disk: it is still exact.
            return Ok(());
        }
        // The heads that differ from the pages open read, at one journal position; the pages
        // never change, so they are merged in after the pause.
        let (segment, offset, next_lsn, changed) = self
            .journal
            .with_appends_paused(|| self.table.read().changed());
        // Every head must point at a durable record before the snapshot names it.
        self.journal.sync_all()?;
        let position = heads::Position {
            segment,
            offset,
            next_lsn,
            damage: damage.clone(),
            garbage_bytes: self.space.total(),
            segments: self.segment_counts(),
        };
        let name = format!("heads-{next_lsn:020}.snap");
        let vfs = &*self.config.vfs;
        let dir = &self.config.dir;
        let partitions = match heads::write(vfs, dir, &name, &position, base.as_deref(), &changed) {
            Err(Error::Corrupt { .. }) if base.as_ref().is_some_and(|b| b.any_damaged()) => {
                return self.abandon_snapshot(state);
            }
            other => other?,
        };
        container::write_atomic(
            vfs,
            dir,
            MANIFEST,
            MANIFEST_MAGIC,
            &Manifest {
                snapshot: Some(name.clone()),
                damage: damage.clone(),
            },
        )?;
        // Lookups still read the pages of the file open read, through the handle open keeps,
        // which a removed file's name does not affect.
        // The heads it holds leave memory (it is durable and the manifest names it).
        self.fold_back(&name, base.as_ref(), &changed);
        if let Some(old) = state.newest.replace(name.clone())
            && old != name
        {
            // The manifest no longer names it; a failure here only leaves a stray file.
            if let Err(e) = vfs.remove(&dir.join(&old)) {
                log::warn!("could not remove old heads snapshot {old}: {e}");
            }
        }
        self.bytes_at_last_snapshot
            .store(bytes_before, Ordering::Relaxed);
        state.current_at = Some(bytes_before);
        state.damage_on_disk = damage;
        self.snapshot_written();
        log::debug!("wrote heads snapshot {name} ({partitions} partitions)");
        Ok(())
    }

    /// A page of the snapshot open read is damaged: the journal is synced and the manifest
    /// names no snapshot (keeping the damaged file as evidence), so the next open rebuilds
    /// every head from the journal (SPEC S4) instead of losing the page's partitions.
    fn abandon_snapshot(&self, state: &mut SnapshotState) -> Result<()> {
        let appended = self.journal.counters.bytes_appended.load(Ordering::Relaxed);
        self.journal.sync_all()?;
        // Commits do not ask again until another interval of journal is written.
        self.bytes_at_last_snapshot
            .store(appended, Ordering::Relaxed);
        let damage = self.damage.lock().clone();
        if state.abandoned && damage == state.damage_on_disk {
            return Ok(());
        }
        let vfs = &*self.config.vfs;
        container::write_atomic(
            vfs,
            &self.config.dir,
            MANIFEST,
            MANIFEST_MAGIC,
            &Manifest {
                snapshot: None,
                damage: damage.clone(),
            },
        )?;
        if !state.abandoned {
            self.snapshots_stopped();
            log::warn!(
                "a page of the heads snapshot is damaged; the manifest names no snapshot now, so the next open rebuilds the heads from the journal"
            );
        }
        state.abandoned = true;
        state.newest = None;
        state.current_at = None;
        state.damage_on_disk = damage;
        Ok(())
    }
}
