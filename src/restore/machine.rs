//! The application's state machine: what restore folds records into (SPEC R, R3).

use std::fmt;

use crate::entity::EntityId;

/// An application's refusal: of a command, a record, a checkpoint or a repair.
///
/// Where a refusal belongs (SPEC R12):
/// - **A command the current state does not allow** (an empty message, an overdraft): refuse
///   it before anything is written, in [`StateMachine::check`] (each record a write would
///   append) or in the decision of [`Engine::try_write`](crate::Engine::try_write) (which sees
///   the state and may decide from several records at once). The write answers
///   [`Error::Refused`](crate::Error::Refused), nothing is written and the entity keeps
///   serving. A deferred record the state refuses when its entity restores is set aside, not
///   appended (see [`Engine::refused_deferrals`](crate::Engine::refused_deferrals)).
/// - **In [`StateMachine::apply`]**, a refusal means the code and the history disagree (a bug,
///   or a record type that changed): `apply` of a record already in the history cannot undo
///   it, so the entity is contained with that reason (SPEC R4) until the code is fixed and the
///   entity released.
/// - **In [`StateMachine::decode_checkpoint`] or [`StateMachine::repair`]**, a refusal
///   contains the entity too.
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
    /// unit moved it into the log (SPEC R8); the unit checked it against the state first
    /// (SPEC R12). As a check's origin: a deferred record checked inside the restore unit.
    Deferred,
    /// A record the application's unclean-restart repair returned, folded for the first time
    /// right after it was appended (SPEC R3).
    Repair,
    /// A record a write (`Engine::write`, `append`, or `defer` to a restored entity) has just
    /// appended. As a check's origin: a record such a write is about to append.
    Live,
}

impl Origin {
    /// Whether the record is stored history folded again (its side effects already happened).
    pub fn is_replay(self) -> bool {
        self == Origin::Replay
    }
}

/// What [`StateMachine::apply`] learns about the record it folds (and
/// [`StateMachine::check`] about the record it checks), besides its bytes.
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
    /// The record's sequence number in the entity's log (for [`StateMachine::check`]: the one
    /// it will get if it is written).
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
///     fn encode_checkpoint(&self, state: &u64) -> Result<Vec<u8>, Rejection> { Ok(state.to_le_bytes().to_vec()) }
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
    ///     fn encode_checkpoint(&self, t: &u64) -> Result<Vec<u8>, Rejection> { Ok(t.to_le_bytes().to_vec()) }
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

    /// Folds record `ctx.seq` into `state`.
    ///
    /// Business rules do not belong here: refuse a command in [`check`](Self::check) (or in the
    /// decision of [`Engine::try_write`](crate::Engine::try_write)), before it is written
    /// (SPEC R12). `apply` runs on records that are in the history (or, for deferred work,
    /// about to be): a refusal here means the code and the history disagree (a bug, or a record
    /// type that changed), and it contains the entity (SPEC R4) with a reason that says so.
    /// When it refuses, it should leave `state` unchanged.
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
    ///     fn encode_checkpoint(&self, t: &u64) -> Result<Vec<u8>, Rejection> { Ok(t.to_le_bytes().to_vec()) }
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
    /// Refusing publishes nothing: an explicit [`Engine::checkpoint`](crate::Engine::checkpoint)
    /// answers [`Error::Refused`](crate::Error::Refused) with the reason and the entity keeps
    /// serving from its history; a checkpoint owed after a write
    /// ([`checkpoint_every`](crate::engine::EngineBuilder::checkpoint_every)) is skipped with a
    /// warning and the write stays committed; one a restore unit owes is skipped with a
    /// warning too, and the entity is served. Never publish bytes that do not decode: restore
    /// starts from the newest checkpoint.
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
    ///     fn encode_checkpoint(&self, t: &u64) -> Result<Vec<u8>, Rejection> { Ok(t.to_le_bytes().to_vec()) }
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
    /// assert_eq!(Total.encode_checkpoint(&7).unwrap(), 7u64.to_le_bytes());
    /// # Ok(())
    /// # }
    /// ```
    fn encode_checkpoint(&self, state: &Self::State) -> Result<Vec<u8>, Rejection>;

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
    ///     fn encode_checkpoint(&self, t: &u64) -> Result<Vec<u8>, Rejection> { Ok(t.to_le_bytes().to_vec()) }
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
    /// let bytes = Total.encode_checkpoint(&7).unwrap();
    /// assert_eq!(Total.decode_checkpoint(&e, &bytes).unwrap(), 7);
    /// assert!(Total.decode_checkpoint(&e, b"short").is_err()); // refused: the entity is contained
    /// # Ok(())
    /// # }
    /// ```
    fn decode_checkpoint(&self, entity: &EntityId, bytes: &[u8]) -> Result<Self::State, Rejection>;

    /// Checks a record's bytes before it is accepted (written or deferred), so a record that
    /// cannot be decoded is refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// and never enters history. It sees no state: whether the current state allows the record
    /// is [`check`](Self::check)'s question. The default accepts everything.
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
    ///     fn encode_checkpoint(&self, t: &u64) -> Result<Vec<u8>, Rejection> { Ok(t.to_le_bytes().to_vec()) }
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

    /// Checks a record against the entity's current state before it is written (SPEC R12):
    /// refusing it refuses the write, which answers [`Error::Refused`](crate::Error::Refused)
    /// with the reason, writes nothing, and leaves the entity serving. This is where business
    /// rules go (an empty message, an overdraft); `apply` then only folds. The default accepts
    /// everything.
    ///
    /// The engine runs it under the entity's lock for every record of a write
    /// ([`Engine::write`](crate::Engine::write), [`Engine::try_write`](crate::Engine::try_write),
    /// [`Engine::append`](crate::Engine::append), their typed forms, and
    /// [`Engine::defer`](crate::Engine::defer) to a restored entity), in order, before anything
    /// is committed. `ctx.seq` is the sequence number the record will get and `ctx.origin` is
    /// [`Origin::Live`]. The records of one write are each checked against the state the write
    /// starts from (the state is not copied, and no record of the write is folded before the
    /// batch commits): a rule that depends on an earlier record of the same write belongs in
    /// the decision of [`Engine::try_write`](crate::Engine::try_write), which sees the state
    /// and all the records it decides.
    ///
    /// Deferred work is checked inside the entity's restore unit instead ([`Origin::Deferred`]),
    /// each record against the state after every deferred record before it; a record refused
    /// there is set aside, never appended (SPEC R8, see
    /// [`Engine::refused_deferrals`](crate::Engine::refused_deferrals)).
    ///
    /// It must be pure: no side effects and no change to anything, since it may run for a
    /// write that then does not commit. A panic here contains the entity (SPEC R4).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Error, Origin, Rejection, StateMachine};
    ///
    /// struct Balance; // records are signed amounts of 8 little-endian bytes
    /// fn amount(record: &[u8]) -> Result<i64, Rejection> {
    ///     Ok(i64::from_le_bytes(record.try_into().map_err(|_| Rejection::new("not 8 bytes"))?))
    /// }
    /// impl StateMachine for Balance {
    ///     type State = i64;
    ///     fn fresh(&self, _: &EntityId) -> i64 { 0 }
    ///     fn check(&self, balance: &i64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         if balance + amount(record)? < 0 {
    ///             return Err(Rejection::new("the balance would go negative"));
    ///         }
    ///         Ok(())
    ///     }
    ///     fn apply(&self, balance: &mut i64, _: &ApplyContext, record: &[u8]) -> Result<(), Rejection> {
    ///         *balance += amount(record)?;
    ///         Ok(())
    ///     }
    ///     fn encode_checkpoint(&self, b: &i64) -> Result<Vec<u8>, Rejection> { Ok(b.to_le_bytes().to_vec()) }
    ///     fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Result<i64, Rejection> {
    ///         amount(bytes)
    ///     }
    ///     fn validate(&self, record: &[u8]) -> Result<(), Rejection> { amount(record).map(|_| ()) }
    /// }
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
    /// let engine = Engine::builder(Balance).store(store).open()?;
    /// let alice = EntityId::new("accounts", "alice")?;
    /// engine.register(&alice)?;
    /// engine.append(&alice, vec![10i64.to_le_bytes().to_vec()])?;
    /// let overdraft = engine.append(&alice, vec![(-25i64).to_le_bytes().to_vec()]);
    /// assert!(matches!(overdraft, Err(Error::Refused { .. }))); // nothing was written
    /// assert_eq!(engine.read(&alice, |b| *b)?, 10); // and alice keeps serving
    /// assert_eq!(engine.history(&alice, 1)?.count(), 1);
    /// # Ok(())
    /// # }
    /// ```
    fn check(
        &self,
        state: &Self::State,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        let _ = (state, ctx, record);
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
    ///     fn encode_checkpoint(&self, t: &u64) -> Result<Vec<u8>, Rejection> { Ok(t.to_le_bytes().to_vec()) }
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

    fn encode_checkpoint(&self, state: &Self::State) -> Result<Vec<u8>, Rejection> {
        (**self).encode_checkpoint(state)
    }

    fn decode_checkpoint(&self, entity: &EntityId, bytes: &[u8]) -> Result<Self::State, Rejection> {
        (**self).decode_checkpoint(entity, bytes)
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        (**self).validate(record)
    }

    fn check(
        &self,
        state: &Self::State,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        (**self).check(state, ctx, record)
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
