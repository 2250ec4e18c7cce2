//! The calls over the engine's restored entities as a set (SPEC R4, R6, R7): starting and
//! reading the background warm, folding every entity's state, and reading or releasing an
//! entity's containment.
//!
//! Owns no state of its own: the warm handle lives in the engine's `Inner`, the slots and
//! containments in the restore registry. Calls only [`crate::restore`] and the engine's own
//! touch and lifecycle helpers (`mod.rs`, `lifecycle.rs`).

use super::Engine;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::restore::{self, Containment, StateMachine, Warm};

impl<M: StateMachine> Engine<M> {
    /// Starts a background warm of every pending entity of the namespaces this engine serves,
    /// or returns the one already running (SPEC R6). With adoption on first use, a namespace
    /// nobody holds is adopted for it; the entities of a namespace another owner holds (or this
    /// engine was deposed from) are left alone: not restored, not counted as refused, given no
    /// registry slot (SPEC F12).
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
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1])?;
    /// let warm = engine.warm()?; // restores every pending entity in the background
    /// let progress = warm.wait()?;
    /// assert!(progress.finished);
    /// # Ok(())
    /// # }
    /// ```
    pub fn warm(&self) -> Result<Warm> {
        let _open = self.enter()?;
        let mut current = self.inner.warm.lock();
        if let Some(warm) = current.as_ref()
            && !warm.is_finished()
        {
            return Ok(warm.clone());
        }
        let owners = &self.inner.owners;
        let warm = restore::start_warm(
            &self.inner.restorer,
            &self.inner.spawner,
            self.inner.warm_parallelism,
            &mut |ns| owners.may_serve(ns),
        )?;
        *current = Some(warm.clone());
        Ok(warm)
    }

    /// The warm most recently started, if any.
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
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// assert!(engine.current_warm().is_none());
    /// engine.warm()?.wait()?;
    /// assert!(engine.current_warm().is_some_and(|w| w.is_finished()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn current_warm(&self) -> Option<Warm> {
        self.inner.warm.lock().clone()
    }

    /// Releases a contained entity so its next touch runs its restore unit again (SPEC R4).
    /// Returns whether it was contained.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
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
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// // Nothing to release: the entity is not contained.
    /// assert!(!engine.release(&clicks)?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn release(&self, entity: &EntityId) -> Result<bool> {
        let _open = self.enter()?;
        self.inner.restorer.release(entity)
    }

    /// Why an entity is contained, if it is. Does not touch it.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
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
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1])?;
    /// assert!(engine.containment(&clicks)?.is_none()); // healthy
    /// # Ok(())
    /// # }
    /// ```
    pub fn containment(&self, entity: &EntityId) -> Result<Option<Containment>> {
        let _open = self.enter()?;
        self.inner.restorer.containment(entity)
    }

    /// Folds every entity's state into one answer (SPEC R7): waits for a warm to restore every
    /// pending entity first, then visits each restored entity. Contained entities are skipped
    /// and counted in the second value. Only the entities of namespaces this engine serves are
    /// visited (see [`warm`](Self::warm)): a store shared with other owners folds this
    /// engine's part of it (SPEC F12).
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
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Total)).store(store).open()?;
    /// for (name, n) in [("a", 1), ("b", 2)] {
    ///     let e = EntityId::new("counters", name)?;
    ///     engine.register(&e)?;
    ///     engine.append_typed(&e, &[n])?;
    /// }
    /// let (sum, contained) = engine.fold_all(0, |sum, _, total| sum + total)?;
    /// assert_eq!((sum, contained), (3, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn fold_all<A>(
        &self,
        init: A,
        mut f: impl FnMut(A, &EntityId, &M::State) -> A,
    ) -> Result<(A, u64)> {
        let _open = self.enter()?;
        // Waiting for the warm from inside a closure or a restore unit could wait for this
        // very thread (a warm worker may need the entity it holds): refused (SPEC R11).
        if let Some(kind) = self.inner.restorer.holding_or_restoring() {
            return Err(Error::WouldDeadlock {
                entity: String::new(),
                detail: format!("fold_all waits for the warm, and was called from inside {kind}"),
            });
        }
        self.warm()?.wait()?;
        let mut acc = init;
        let mut contained = 0;
        let mut served: crate::sync::HashMap<crate::entity::Namespace, bool> =
            crate::sync::HashMap::default();
        for entity in self.inner.restorer.entities()? {
            let ns = entity.namespace();
            if !*served
                .entry(ns.clone())
                .or_insert_with(|| self.inner.owners.may_serve(ns))
            {
                continue;
            }
            let slot = match self.touch(&entity) {
                Ok(slot) => slot,
                Err(Error::Contained { .. }) => {
                    contained += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut slot_acc = Some(acc);
            let result = self.with_loaded(&slot, |loaded| {
                let a = slot_acc.take().expect("called once");
                Ok(f(a, &entity, &loaded.state))
            });
            acc = match result {
                Ok(a) => a,
                Err(Error::Contained { .. }) if slot_acc.is_some() => {
                    contained += 1;
                    slot_acc.take().expect("still held")
                }
                Err(e) => return Err(e),
            };
        }
        Ok((acc, contained))
    }
}
