//! [`Engine::backup`]: an online backup of the engine's store, delegated to the store (SPEC S12).
//!
//! May call: the store's [`Store::backup`](crate::store::Store::backup) only (close waits for a backup under way, as for
//! any call).

use std::path::Path;

use super::Engine;
use crate::error::Result;
use crate::restore::StateMachine;
use crate::store::BackupReport;

impl<M: StateMachine> Engine<M> {
    /// Writes a consistent copy of the engine's store, as it is at one instant during the
    /// call, to the directory `dest`, which must not exist, while the engine keeps serving
    /// (SPEC S12). On a file store this is [`FileStore::backup`](crate::store::FileStore::backup):
    /// the copy holds every batch acknowledged before the call and none started after it
    /// returned, and opens as an ordinary store. An engine opened on the copy starts as after
    /// an unclean stop at that instant: it runs each entity's repair as the entity restores
    /// (SPEC R3). Before it serves writes, it declares recovery for every namespace whose
    /// coordinator it holds ([`Engine::mark_lease_table_recovered`], SPEC F6): leases granted
    /// after the backup's point are not in it.
    ///
    /// On another store this answers [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// saying what to do instead: the in-memory store has nothing on disk to copy, and an etcd
    /// store is backed up with etcd's own snapshot (docs/etcd.md, "Backup").
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    ///
    /// struct Total; // the sum of the numbers written
    /// impl TypedMachine for Total {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let engine = Engine::builder(Typed(Total)).directory(dir.path().join("live")).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1, 2])?;
    /// engine.backup(dir.path().join("backup"))?; // while the engine keeps serving
    /// engine.append_typed(&clicks, &[3])?; // after the backup: not in it
    ///
    /// let restored = Engine::builder(Typed(Total)).directory(dir.path().join("backup")).open()?;
    /// assert_eq!(restored.read(&clicks, |total| *total)?, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<BackupReport> {
        let _open = self.enter()?;
        self.inner.store.backup(dest.as_ref())
    }
}
