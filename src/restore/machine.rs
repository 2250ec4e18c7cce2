//! The application's state machine: what restore folds records into (SPEC R, R3).

use std::fmt;

use crate::entity::EntityId;

/// An application's refusal to fold a record, decode a checkpoint or repair an entity.
///
/// ```
/// use portcullis::restore::Rejection;
/// let r = Rejection::new("balance would go negative");
/// assert_eq!(r.to_string(), "balance would go negative");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Why, in the application's words.
    pub reason: String,
}

impl Rejection {
    /// A rejection with a reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Rejection {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Rejection {}

/// Where a record being folded comes from, so an application can suppress side effects (emails,
/// notifications, external calls) when a record is only being replayed (SPEC R3, R8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// Stored history folded again by a restore unit: the record was accepted in the past
    /// (in this process or an earlier one). Its side effects, if any, already happened.
    Replay,
    /// Deferred work folded for the first time, inside the restore unit, right after the
    /// unit moved it into the log (SPEC R8).
    Deferred,
    /// A record the application's unclean-restart repair returned, folded for the first time
    /// right after it was appended (SPEC R3).
    Repair,
    /// A record a write (`Engine::write`, `append`, or `defer` to a restored entity) has just
    /// appended.
    Live,
}

impl Origin {
    /// Whether the record is stored history folded again (its side effects already happened).
    pub fn is_replay(self) -> bool {
        self == Origin::Replay
    }
}

/// What [`StateMachine::apply`] learns about the record it folds, besides its bytes.
///
/// ```
/// use portcullis::EntityId;
/// use portcullis::restore::{ApplyContext, Origin};
/// let room = EntityId::new("chat", "room-1").unwrap();
/// let ctx = ApplyContext::new(&room, 7, Origin::Live);
/// assert_eq!((ctx.seq, ctx.origin.is_replay()), (7, false));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ApplyContext<'a> {
    /// The entity the record belongs to.
    pub entity: &'a EntityId,
    /// The record's sequence number in the entity's log.
    pub seq: u64,
    /// Where the record comes from.
    pub origin: Origin,
}

impl<'a> ApplyContext<'a> {
    /// A context (the engine makes these; tests of a state machine may too).
    pub fn new(entity: &'a EntityId, seq: u64, origin: Origin) -> Self {
        ApplyContext {
            entity,
            seq,
            origin,
        }
    }
}

/// The state machine of one kind of entity, supplied by the application.
///
/// Restore starts from [`fresh`](Self::fresh) or a decoded checkpoint and folds records with
/// [`apply`](Self::apply). Every method may be called from any thread, for many entities at
/// once. A method that panics contains only the entity it was working on (SPEC R4).
///
/// ```
/// use portcullis::EntityId;
/// use portcullis::restore::{ApplyContext, Rejection, StateMachine};
///
/// /// Sums little-endian u64 records.
/// struct Counter;
///
/// impl StateMachine for Counter {
///     type State = u64;
///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
///     fn apply(&self, state: &mut u64, _: &ApplyContext<'_>, record: &[u8]) -> Result<(), Rejection> {
///         let bytes: [u8; 8] = record.try_into().map_err(|_| Rejection::new("not a u64"))?;
///         *state += u64::from_le_bytes(bytes);
///         Ok(())
///     }
///     fn encode_checkpoint(&self, state: &u64) -> Vec<u8> { state.to_le_bytes().to_vec() }
///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<u64, Rejection> {
///         Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| Rejection::new("bad checkpoint"))?))
///     }
/// }
/// ```
pub trait StateMachine: Send + Sync + 'static {
    /// An entity's folded state.
    type State: Send + 'static;

    /// The state of an entity with no history.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, EntityId, Origin, Rejection, StateMachine};
    ///
    /// struct Total; // sums records of 8 little-endian bytes
    /// impl StateMachine for Total {
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         let n: [u8; 8] = record.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         *t += u64::from_le_bytes(n);
    ///         Ok(())
    ///     }
    ///     fn encode_checkpoint(&self, t: &u64) -> Vec<u8> { t.to_le_bytes().to_vec() }
    ///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<u64, Rejection> {
    ///         let n: [u8; 8] = bytes.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         Ok(u64::from_le_bytes(n))
    ///     }
    ///     fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
    ///         if record.len() == 8 { Ok(()) } else { Err(Rejection::new("not 8 bytes")) }
    ///     }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let e = EntityId::new("totals", "a")?;
    /// assert_eq!(Total.fresh(&e), 0);
    /// # Ok(())
    /// # }
    /// ```
    fn fresh(&self, entity: &EntityId) -> Self::State;

    /// Folds record `ctx.seq` into `state`, or refuses it. A refusal during restore contains the
    /// entity (SPEC R4). When it refuses, it should leave `state` unchanged.
    ///
    /// `ctx.origin` tells a replayed record ([`Origin::Replay`]: suppress side effects) from
    /// one folded for the first time (deferred, repair, live). `apply` runs while the engine
    /// holds the entity (inside its restore unit, or under its state lock during a write):
    /// calling back into the engine for the same entity is refused with
    /// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock); see `docs/restore.md`, "Locking
    /// rules for application code".
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, EntityId, Origin, Rejection, StateMachine};
    ///
    /// struct Total; // sums records of 8 little-endian bytes
    /// impl StateMachine for Total {
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         let n: [u8; 8] = record.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         *t += u64::from_le_bytes(n);
    ///         Ok(())
    ///     }
    ///     fn encode_checkpoint(&self, t: &u64) -> Vec<u8> { t.to_le_bytes().to_vec() }
    ///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<u64, Rejection> {
    ///         let n: [u8; 8] = bytes.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         Ok(u64::from_le_bytes(n))
    ///     }
    ///     fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
    ///         if record.len() == 8 { Ok(()) } else { Err(Rejection::new("not 8 bytes")) }
    ///     }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let e = EntityId::new("totals", "a")?;
    /// let mut t = Total.fresh(&e);
    /// Total.apply(&mut t, &ApplyContext::new(&e, 1, Origin::Live), &5u64.to_le_bytes()).unwrap();
    /// assert_eq!(t, 5);
    /// assert!(Total.apply(&mut t, &ApplyContext::new(&e, 2, Origin::Live), b"x").is_err());
    /// assert_eq!(t, 5); // a refusal leaves the state unchanged
    /// # Ok(())
    /// # }
    /// ```
    fn apply(
        &self,
        state: &mut Self::State,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection>;

    /// Encodes a state for a checkpoint (SPEC L3).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, EntityId, Origin, Rejection, StateMachine};
    ///
    /// struct Total; // sums records of 8 little-endian bytes
    /// impl StateMachine for Total {
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         let n: [u8; 8] = record.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         *t += u64::from_le_bytes(n);
    ///         Ok(())
    ///     }
    ///     fn encode_checkpoint(&self, t: &u64) -> Vec<u8> { t.to_le_bytes().to_vec() }
    ///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<u64, Rejection> {
    ///         let n: [u8; 8] = bytes.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         Ok(u64::from_le_bytes(n))
    ///     }
    ///     fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
    ///         if record.len() == 8 { Ok(()) } else { Err(Rejection::new("not 8 bytes")) }
    ///     }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let e = EntityId::new("totals", "a")?;
    /// assert_eq!(Total.encode_checkpoint(&7), 7u64.to_le_bytes());
    /// # Ok(())
    /// # }
    /// ```
    fn encode_checkpoint(&self, state: &Self::State) -> Vec<u8>;

    /// Decodes a checkpoint written by [`encode_checkpoint`](Self::encode_checkpoint).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, EntityId, Origin, Rejection, StateMachine};
    ///
    /// struct Total; // sums records of 8 little-endian bytes
    /// impl StateMachine for Total {
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         let n: [u8; 8] = record.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         *t += u64::from_le_bytes(n);
    ///         Ok(())
    ///     }
    ///     fn encode_checkpoint(&self, t: &u64) -> Vec<u8> { t.to_le_bytes().to_vec() }
    ///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<u64, Rejection> {
    ///         let n: [u8; 8] = bytes.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         Ok(u64::from_le_bytes(n))
    ///     }
    ///     fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
    ///         if record.len() == 8 { Ok(()) } else { Err(Rejection::new("not 8 bytes")) }
    ///     }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let e = EntityId::new("totals", "a")?;
    /// let bytes = Total.encode_checkpoint(&7);
    /// assert_eq!(Total.decode_checkpoint(&e, &bytes).unwrap(), 7);
    /// assert!(Total.decode_checkpoint(&e, b"short").is_err()); // refused: the entity is contained
    /// # Ok(())
    /// # }
    /// ```
    fn decode_checkpoint(&self, entity: &EntityId, bytes: &[u8]) -> Result<Self::State, Rejection>;

    /// Checks a record before it is accepted (written or deferred), so a record that cannot be
    /// decoded is refused with a clear error and never enters history. The default accepts
    /// everything.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, EntityId, Origin, Rejection, StateMachine};
    ///
    /// struct Total; // sums records of 8 little-endian bytes
    /// impl StateMachine for Total {
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         let n: [u8; 8] = record.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         *t += u64::from_le_bytes(n);
    ///         Ok(())
    ///     }
    ///     fn encode_checkpoint(&self, t: &u64) -> Vec<u8> { t.to_le_bytes().to_vec() }
    ///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<u64, Rejection> {
    ///         let n: [u8; 8] = bytes.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         Ok(u64::from_le_bytes(n))
    ///     }
    ///     fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
    ///         if record.len() == 8 { Ok(()) } else { Err(Rejection::new("not 8 bytes")) }
    ///     }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let e = EntityId::new("totals", "a")?;
    /// assert!(Total.validate(&1u64.to_le_bytes()).is_ok());
    /// assert!(Total.validate(b"oops").is_err()); // an engine refuses to write it
    /// # Ok(())
    /// # }
    /// ```
    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        let _ = record;
        Ok(())
    }

    /// Repairs an entity after incarnation `unclean` ended without a clean shutdown, returning
    /// records to append (SPEC R3). They are appended durably, in one batch that also records
    /// that this entity was repaired for `unclean`, so the repair runs exactly once per entity
    /// and incarnation, even across another crash. The default repairs nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, EntityId, Origin, Rejection, StateMachine};
    ///
    /// struct Total; // sums records of 8 little-endian bytes
    /// impl StateMachine for Total {
    ///     type State = u64;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, t: &mut u64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         let n: [u8; 8] = record.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         *t += u64::from_le_bytes(n);
    ///         Ok(())
    ///     }
    ///     fn encode_checkpoint(&self, t: &u64) -> Vec<u8> { t.to_le_bytes().to_vec() }
    ///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<u64, Rejection> {
    ///         let n: [u8; 8] = bytes.try_into().map_err(|_| Rejection::new("not 8 bytes"))?;
    ///         Ok(u64::from_le_bytes(n))
    ///     }
    ///     fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
    ///         if record.len() == 8 { Ok(()) } else { Err(Rejection::new("not 8 bytes")) }
    ///     }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let e = EntityId::new("totals", "a")?;
    /// // Total keeps the default: nothing to repair after an unclean shutdown.
    /// assert!(Total.repair(&e, &0, 1).unwrap().is_empty());
    /// # Ok(())
    /// # }
    /// ```
    fn repair(
        &self,
        entity: &EntityId,
        state: &Self::State,
        unclean: u64,
    ) -> Result<Vec<Vec<u8>>, Rejection> {
        let _ = (entity, state, unclean);
        Ok(Vec::new())
    }
}

/// A shared state machine is a state machine, so an application can keep a handle on its own
/// machine (for counters, configuration) while the engine owns another.
impl<M: StateMachine> StateMachine for std::sync::Arc<M> {
    type State = M::State;

    fn fresh(&self, entity: &EntityId) -> Self::State {
        (**self).fresh(entity)
    }

    fn apply(
        &self,
        state: &mut Self::State,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        (**self).apply(state, ctx, record)
    }

    fn encode_checkpoint(&self, state: &Self::State) -> Vec<u8> {
        (**self).encode_checkpoint(state)
    }

    fn decode_checkpoint(&self, entity: &EntityId, bytes: &[u8]) -> Result<Self::State, Rejection> {
        (**self).decode_checkpoint(entity, bytes)
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        (**self).validate(record)
    }

    fn repair(
        &self,
        entity: &EntityId,
        state: &Self::State,
        unclean: u64,
    ) -> Result<Vec<Vec<u8>>, Rejection> {
        (**self).repair(entity, state, unclean)
    }
}
