//! Refusing before writing (SPEC R12): the state machine's `check` on every record of a write,
//! a decision that may refuse ([`Engine::try_write`]), and the deferred records the state
//! refused inside a restore unit ([`Engine::refused_deferrals`]).
//!
//! Owns no state: the switch that runs `check` lives in the restore registry (where the
//! deferred drain reads it too). Calls [`crate::restore`] only; the write path
//! (`write.rs`) calls [`Engine::check_with_state`] under the entity's state lock.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::Engine;
use super::write::Written;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::restore::{
    ApplyContext, Containment, Loaded, Origin, RefusedDeferral, Rejection, Slot, StateMachine,
};
use crate::store::{Batch, Precondition};

/// The error of a refused write (SPEC R12).
pub(super) fn refused(entity: &EntityId, reason: String) -> Error {
    Error::Refused {
        entity: entity.to_string(),
        reason,
    }
}

impl<M: StateMachine> Engine<M> {
    /// Runs the state machine's `check` on each record of a write, in order, against the
    /// state the write starts from, with the sequence number each would get (SPEC R12). A
    /// refusal answers [`Error::Refused`]; a panic contains the entity (SPEC R4), reported by
    /// the caller through `contained` once the state lock is released. Runs under the state
    /// lock, with the thread marked as holding the entity (a call back into it is refused).
    pub(super) fn check_with_state(
        &self,
        entity: &EntityId,
        slot: &Arc<Slot<M::State>>,
        loaded: &Loaded<M::State>,
        records: &[Vec<u8>],
        contained: &mut Option<Arc<Containment>>,
    ) -> Result<()> {
        let restorer = &self.inner.restorer;
        if !restorer.checks.on() {
            return Ok(());
        }
        let machine = restorer.machine();
        let first = loaded.head.head.next_seq;
        for (i, record) in records.iter().enumerate() {
            let seq = first + i as u64;
            let ctx = ApplyContext::new(entity, seq, Origin::Live);
            match catch_unwind(AssertUnwindSafe(|| {
                machine.check(&loaded.state, &ctx, record)
            })) {
                Ok(Ok(())) => {}
                Ok(Err(r)) if records.len() == 1 => {
                    return Err(self.refusal_told(entity, refused(entity, r.reason)));
                }
                Ok(Err(r)) => {
                    let which =
                        format!("record {} of {} (it would be {seq})", i + 1, records.len());
                    let error = refused(entity, format!("{which}: {r}"));
                    return Err(self.refusal_told(entity, error));
                }
                Err(payload) => {
                    let step = format!("check of record {seq} (nothing was written)");
                    let reason = Containment::from_panic(&step, &*payload);
                    let (error, reason) = restorer.contain_restored(slot, reason);
                    *contained = Some(reason);
                    return Err(error);
                }
            }
        }
        Ok(())
    }

    /// Whether one of `extra`'s guards fails now (read under the entity's state lock, which
    /// every write to the entity holds). Deadlines are not guards on the rows: ignored.
    pub(super) fn guards_fail(&self, entity: &EntityId, extra: &Batch) -> Result<bool> {
        let p = entity.partition();
        for guard in extra.guards() {
            let holds = match guard {
                Precondition::Absent(k) => self.inner.store.get(&p, k)?.is_none(),
                Precondition::Present(k) => self.inner.store.get(&p, k)?.is_some(),
                Precondition::Equals(k, v) => self.inner.store.get(&p, k)?.as_ref() == Some(v),
                Precondition::NotAfter(_) => true,
            };
            if !holds {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// [`write`](Self::write) whose decision may refuse the command (SPEC R12): `decide` sees
    /// the entity's current state and returns the records to append and a value for the
    /// caller, or a [`Rejection`]. A rejection answers [`Error::Refused`] with its reason,
    /// writes nothing, and leaves the entity serving; so does a record that
    /// [`StateMachine::check`] refuses. This is the place for rules that look at several
    /// records of one write together, since `check` sees each record against the state the
    /// write starts from.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, unless
    /// [`EngineBuilder::register_on_first_write`](crate::EngineBuilder::register_on_first_write)
    /// is on (a refused first write still registers the entity, which is a write of its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Typed, TypedMachine};
    /// use portcullis::typed::encode;
    ///
    /// struct Seats; // seats taken; records are how many more are taken
    /// impl TypedMachine for Seats {
    ///     type Record = u64;
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Typed(Seats)).store(store).open()?;
    /// let show = EntityId::new("shows", "friday")?;
    /// engine.register(&show)?;
    /// // Book 3 seats of 4, then 2 more: the second booking is refused.
    /// let book = |n: u64| {
    ///     engine.try_write(&show, |taken| {
    ///         if taken + n > 4 {
    ///             return Err(Rejection::new(format!("only {} seats left", 4 - taken)));
    ///         }
    ///         Ok((vec![encode(&n).unwrap()], taken + n))
    ///     })
    /// };
    /// assert_eq!(book(3)?.value, 3);
    /// let refused = book(2);
    /// assert!(matches!(&refused, Err(Error::Refused { reason, .. }) if reason == "only 1 seats left"));
    /// assert_eq!(engine.read(&show, |taken| *taken)?, 3); // nothing was written
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write<T>(
        &self,
        entity: &EntityId,
        decide: impl FnOnce(&M::State) -> std::result::Result<(Vec<Vec<u8>>, T), Rejection>,
    ) -> Result<Written<T>> {
        self.write_extra(entity, Batch::new(), decide)
    }

    /// The deferred records `entity`'s state refused when its restore unit drained them, in
    /// the order they were deferred (SPEC R8, R12). Deferring to a pending entity cannot check
    /// the record against the state it will meet, so the unit checks it then
    /// ([`StateMachine::check`], with [`Origin::Deferred`]); a record it refuses is set aside
    /// here, in the same batch that takes it off the deferred queue, and is never appended.
    /// Each is also reported once, to
    /// [`Metrics::deferral_refused`](crate::restore::Metrics::deferral_refused) and in a `warn`
    /// line. They are kept until the entity's partition is removed.
    ///
    /// Reads the rows; does not restore the entity (one still pending has refused none yet).
    /// Answers [`Error::UnknownEntity`] if the entity was never registered.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
    /// use portcullis::engine::Deferred;
    ///
    /// struct Chat; // a room's messages; an empty one is refused
    /// impl TypedMachine for Chat {
    ///     type Record = String;
    ///     type State = Vec<String>;
    ///     fn fresh(&self, _: &EntityId) -> Vec<String> { Vec::new() }
    ///     fn check(&self, _: &Vec<String>, _: &ApplyContext, text: &String) -> Result<(), Rejection> {
    ///         if text.is_empty() { Err(Rejection::new("an empty message")) } else { Ok(()) }
    ///     }
    ///     fn apply(&self, room: &mut Vec<String>, _: &ApplyContext, text: String) -> Result<(), Rejection> {
    ///         room.push(text);
    ///         Ok(())
    ///     }
    /// }
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// // No background warm: it could restore the room before the deferrals, which are then
    /// // checked at once instead of queued.
    /// let engine = Engine::builder(Typed(Chat)).store(store).background_warm(false).open()?;
    /// let lobby = EntityId::new("chat", "lobby")?;
    /// engine.register(&lobby)?; // pending: deferrals are queued, not checked yet
    /// assert_eq!(engine.defer_typed(&lobby, &"hello".to_string())?, Deferred::Queued);
    /// assert_eq!(engine.defer_typed(&lobby, &String::new())?, Deferred::Queued);
    /// assert_eq!(engine.read(&lobby, |room| room.len())?, 1); // restored: "" was set aside
    /// let refused = engine.refused_deferrals(&lobby)?;
    /// assert_eq!((refused.len(), refused[0].reason.as_str()), (1, "an empty message"));
    /// assert_eq!(engine.history(&lobby, 1)?.count(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn refused_deferrals(&self, entity: &EntityId) -> Result<Vec<RefusedDeferral>> {
        let _open = self.enter()?;
        self.inner.restorer.refused_deferrals(entity)
    }

    /// Test-only negative control: stops running the state machine's `check`, on writes and
    /// in the restore unit's deferred drain (SPEC R12), so tests can show they catch it.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_skip_checks_for_test(&self, skip: bool) {
        self.inner.restorer.checks.set_skip(skip);
    }
}
