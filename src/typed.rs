//! Typed records and states (SPEC E6): a serde adapter so a state machine works with its own
//! record and state types instead of bytes.
//!
//! Owns: the [`TypedMachine`] trait, the [`Typed`] adapter that turns one into a
//! [`StateMachine`] by encoding records and checkpoints with [postcard] behind a version
//! envelope (SPEC E7; the `codec` submodule owns the encoding: [`encode_versioned`],
//! [`split_version`], the [`encode`] and [`decode`] helpers), and typed calls on an [`Engine`] over a [`Typed`] machine
//! ([`Engine::write_typed`], [`Engine::try_write_typed`], [`Engine::append_typed`],
//! [`Engine::defer_typed`], [`Engine::history_typed`]). It calls only the engine's public API,
//! and takes the engine's machine to read history with its upcast hooks.
//!
//! Raw bytes stay available: an `Engine<Typed<T>>` still has [`Engine::write`],
//! [`Engine::append`] and [`Engine::history`], and a record written as bytes is accepted only if
//! it reads as a `T::Record` ([`StateMachine::validate`]).
//!
//! # Changing your record types
//!
//! Every record and checkpoint is stored with the version it was written in
//! ([`TypedMachine::VERSION`], 1 unless the machine says otherwise); bytes written before
//! versions existed carry no envelope and are version 1. A machine that changes its record or
//! state type raises its version and brings older ones up in [`TypedMachine::upcast_record`]
//! and [`TypedMachine::upcast_checkpoint`]: reading an old record never guesses. A checkpoint
//! the machine cannot read is not fatal while the history it folds is still stored: restore
//! replays that history instead and writes a checkpoint of the current version. The rules,
//! with an example, are in `docs/SCHEMA.md` ("Changing your record types") and
//! `examples/schema_evolution.rs`.
//!
//! ```
//! use portcullis::typed::{Typed, TypedMachine};
//! use portcullis::{ApplyContext, Engine, EntityId, Rejection};
//! use portcullis::store::MemoryStore;
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//!
//! #[derive(Serialize, Deserialize)]
//! enum Event { Deposited(u64), Withdrew(u64) }
//!
//! struct Account;
//! impl TypedMachine for Account {
//!     type Record = Event;
//!     type State = u64;
//!     fn fresh(&self, _: &EntityId) -> u64 { 0 }
//!     // Business rules: refused before anything is written (SPEC R12).
//!     fn check(&self, balance: &u64, _: &ApplyContext<'_>, event: &Event) -> Result<(), Rejection> {
//!         match event {
//!             Event::Withdrew(n) if *n > *balance => Err(Rejection::new("overdrawn")),
//!             _ => Ok(()),
//!         }
//!     }
//!     // Folding only: a record in the history is a fact.
//!     fn apply(&self, balance: &mut u64, _: &ApplyContext<'_>, event: Event) -> Result<(), Rejection> {
//!         match event {
//!             Event::Deposited(n) => *balance += n,
//!             Event::Withdrew(n) => *balance -= n,
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let engine = Engine::builder(Typed(Account)).store(Arc::new(MemoryStore::new())).open()?;
//! let alice = EntityId::new("bank", "alice")?;
//! engine.register(&alice)?;
//! engine.append_typed(&alice, &[Event::Deposited(10)])?;
//! engine.append_typed(&alice, &[Event::Withdrew(3)])?;
//! let overdraft = engine.append_typed(&alice, &[Event::Withdrew(8)]);
//! assert!(matches!(overdraft, Err(portcullis::Error::Refused { .. }))); // nothing was written
//! assert_eq!(engine.read(&alice, |balance| *balance)?, 7);
//! # Ok::<(), portcullis::Error>(())
//! ```

use std::ops::RangeInclusive;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::engine::{Deferred, Engine, History, Written};
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::restore::{ApplyContext, Rejection, StateMachine};

mod codec;

use codec::encode_all;
pub use codec::{UNENVELOPED_VERSION, Versioned, decode, encode, encode_versioned, split_version};

/// A state machine over the application's own record and state types (SPEC E6).
///
/// Wrap it in [`Typed`] to open an engine with it. Records and states are encoded with
/// postcard, behind the envelope of [`VERSION`](Self::VERSION) (SPEC E7); the methods see
/// decoded values of the current version only. A record that does not decode is refused
/// before it is written ([`StateMachine::validate`]); one found undecodable in history
/// contains its entity (SPEC R4). A record the current state does not allow is refused by
/// [`check`](Self::check) before it is written (SPEC R12); `apply` only folds.
///
/// ```
/// use portcullis::typed::TypedMachine;
/// use portcullis::{ApplyContext, EntityId, Rejection};
///
/// struct Chat;
/// impl TypedMachine for Chat {
///     type Record = String;
///     type State = Vec<String>;
///     fn fresh(&self, _: &EntityId) -> Vec<String> { Vec::new() }
///     fn apply(&self, log: &mut Vec<String>, _: &ApplyContext<'_>, line: String) -> Result<(), Rejection> {
///         log.push(line);
///         Ok(())
///     }
/// }
/// ```
pub trait TypedMachine: Send + Sync + 'static {
    /// One record of an entity's history.
    type Record: Serialize + DeserializeOwned;
    /// An entity's folded state; it is also what a checkpoint stores.
    type State: Serialize + DeserializeOwned + Send + 'static;

    /// The version of the records and checkpoints this machine writes (SPEC E7), at least 1.
    /// Raise it when `Record` or `State` changes in a way postcard does not read back (a field
    /// added, removed or reordered, a variant removed or moved), and bring the older versions
    /// up in [`upcast_record`](Self::upcast_record) and
    /// [`upcast_checkpoint`](Self::upcast_checkpoint). Records and checkpoints written without
    /// a version, before versions existed, are version 1.
    const VERSION: u32 = 1;

    /// The state of an entity with no history.
    fn fresh(&self, entity: &EntityId) -> Self::State;

    /// Checks a record against the current state before it is written (see
    /// [`StateMachine::check`], SPEC R12): a refusal answers [`Error::Refused`] and writes
    /// nothing; a deferred record it refuses inside the restore unit is set aside. Must be
    /// pure. The default accepts everything.
    fn check(
        &self,
        state: &Self::State,
        ctx: &ApplyContext<'_>,
        record: &Self::Record,
    ) -> Result<(), Rejection> {
        let _ = (state, ctx, record);
        Ok(())
    }

    /// Folds record `ctx.seq` into `state` (see [`StateMachine::apply`]; `ctx` says whether
    /// the record is replayed, deferred, a repair or live). A refusal here means the code and
    /// the history disagree and contains the entity; business rules belong in
    /// [`check`](Self::check).
    fn apply(
        &self,
        state: &mut Self::State,
        ctx: &ApplyContext<'_>,
        record: Self::Record,
    ) -> Result<(), Rejection>;

    /// Records to append after an unclean restart (see [`StateMachine::repair`]). The default
    /// repairs nothing.
    fn repair(
        &self,
        entity: &EntityId,
        state: &Self::State,
        unclean: u64,
    ) -> Result<Vec<Self::Record>, Rejection> {
        let _ = (entity, state, unclean);
        Ok(Vec::new())
    }

    /// Brings a record of an older `version` (below [`VERSION`](Self::VERSION)) up to the
    /// current `Record`; `bytes` are its postcard encoding, without the envelope (decode them
    /// with [`decode`] as the type that version had). Records without an envelope come here as
    /// version 1. The default refuses, naming both versions: an entity whose history holds
    /// such a record is contained until the code reads it (SPEC R4).
    ///
    /// ```
    /// use portcullis::typed::{self, Typed, TypedMachine};
    /// use portcullis::{ApplyContext, EntityId, Rejection};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct SaidV1 { text: String }
    /// #[derive(Serialize, Deserialize)]
    /// struct Said { text: String, loud: bool } // version 2 added `loud`
    ///
    /// struct Chat;
    /// impl TypedMachine for Chat {
    ///     type Record = Said;
    ///     type State = Vec<String>;
    ///     const VERSION: u32 = 2;
    ///     fn fresh(&self, _: &EntityId) -> Vec<String> { Vec::new() }
    ///     fn apply(&self, s: &mut Vec<String>, _: &ApplyContext<'_>, r: Said) -> Result<(), Rejection> {
    ///         s.push(if r.loud { r.text.to_uppercase() } else { r.text });
    ///         Ok(())
    ///     }
    ///     fn upcast_record(&self, version: u32, bytes: &[u8]) -> Result<Said, Rejection> {
    ///         match version {
    ///             1 => typed::decode::<SaidV1>(bytes).map(|v1| Said { text: v1.text, loud: false }),
    ///             _ => Err(Rejection::new(format!("no reader for records of version {version}"))),
    ///         }
    ///     }
    /// }
    ///
    /// let old = typed::encode(&SaidV1 { text: "hi".into() }).unwrap(); // no envelope: version 1
    /// assert_eq!(Typed(Chat).decode_record(&old).unwrap().text, "hi");
    /// ```
    fn upcast_record(&self, version: u32, bytes: &[u8]) -> Result<Self::Record, Rejection> {
        let _ = bytes;
        Err(codec::no_upcast(
            "record",
            "upcast_record",
            version,
            Self::VERSION,
        ))
    }

    /// Brings the state of a checkpoint of an older `version` up to the current `State`, as
    /// [`upcast_record`](Self::upcast_record) does for records. The default refuses, naming
    /// both versions; restore then replays the entity's history instead, when it is still
    /// stored, and writes a checkpoint of the current version (SPEC E7), or contains the entity
    /// when it is not.
    ///
    /// ```
    /// use portcullis::typed::{self, Typed, TypedMachine};
    /// use portcullis::{ApplyContext, EntityId, Rejection, StateMachine};
    ///
    /// struct Count;
    /// impl TypedMachine for Count {
    ///     type Record = ();
    ///     type State = u64; // version 1 counted in a u32
    ///     const VERSION: u32 = 2;
    ///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
    ///     fn apply(&self, n: &mut u64, _: &ApplyContext<'_>, _: ()) -> Result<(), Rejection> {
    ///         *n += 1;
    ///         Ok(())
    ///     }
    ///     fn upcast_checkpoint(&self, version: u32, bytes: &[u8]) -> Result<u64, Rejection> {
    ///         match version {
    ///             1 => typed::decode::<u32>(bytes).map(u64::from),
    ///             _ => Err(Rejection::new(format!("no reader for checkpoints of version {version}"))),
    ///         }
    ///     }
    /// }
    ///
    /// let entity = EntityId::new("counts", "a").unwrap();
    /// let v1 = typed::encode_versioned(1, &7u32).unwrap();
    /// assert_eq!(Typed(Count).decode_checkpoint(&entity, &v1).unwrap(), 7);
    /// ```
    fn upcast_checkpoint(&self, version: u32, bytes: &[u8]) -> Result<Self::State, Rejection> {
        let _ = bytes;
        Err(codec::no_upcast(
            "checkpoint",
            "upcast_checkpoint",
            version,
            Self::VERSION,
        ))
    }
}

/// The adapter that makes a [`TypedMachine`] a [`StateMachine`]: records and checkpoints are
/// postcard encodings of `T::Record` and `T::State` behind the envelope of `T::VERSION`
/// ([`encode_versioned`]).
///
/// ```
/// use portcullis::typed::{Typed, TypedMachine};
/// use portcullis::{ApplyContext, EntityId, Origin, Rejection, StateMachine};
///
/// struct Sum;
/// impl TypedMachine for Sum {
///     type Record = u32;
///     type State = u64;
///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
///     fn apply(&self, s: &mut u64, _: &ApplyContext<'_>, n: u32) -> Result<(), Rejection> {
///         *s += u64::from(n);
///         Ok(())
///     }
/// }
///
/// let machine = Typed(Sum);
/// let entity = EntityId::new("sums", "a").unwrap();
/// let mut state = machine.fresh(&entity);
/// let ctx = ApplyContext::new(&entity, 1, Origin::Live);
/// machine.apply(&mut state, &ctx, &portcullis::typed::encode(&5u32).unwrap()).unwrap();
/// assert_eq!(state, 5);
/// assert!(machine.validate(b"").is_err()); // not a u32
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Typed<T>(pub T);

impl<T> Typed<T> {
    /// The wrapped machine.
    ///
    /// ```
    /// # use portcullis::typed::Typed;
    /// assert_eq!(*Typed(3).inner(), 3);
    /// ```
    pub fn inner(&self) -> &T {
        &self.0
    }
}

impl<T: TypedMachine> StateMachine for Typed<T> {
    type State = T::State;

    fn fresh(&self, entity: &EntityId) -> Self::State {
        self.0.fresh(entity)
    }

    fn apply(
        &self,
        state: &mut Self::State,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        // The engine names the record in the refusal.
        let record = self.decode_record(record)?;
        self.0.apply(state, ctx, record)
    }

    fn encode_checkpoint(&self, state: &Self::State) -> Result<Vec<u8>, Rejection> {
        // A state serde cannot encode refuses the checkpoint: nothing is published.
        self.encode_state(state)
            .map_err(|e| Rejection::new(format!("the state does not encode: {e}")))
    }

    fn decode_checkpoint(&self, _entity: &EntityId, bytes: &[u8]) -> Result<T::State, Rejection> {
        self.decode_state(bytes)
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        self.decode_record(record).map(|_| ())
    }

    fn check(
        &self,
        state: &Self::State,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        let record = self
            .decode_record(record)
            .map_err(|r| Rejection::new(format!("record {}: {r}", ctx.seq)))?;
        self.0.check(state, ctx, &record)
    }

    fn repair(
        &self,
        entity: &EntityId,
        state: &Self::State,
        unclean: u64,
    ) -> Result<Vec<Vec<u8>>, Rejection> {
        let records = self.0.repair(entity, state, unclean)?;
        encode_all::<T>(&records).map_err(|e| Rejection::new(e.to_string()))
    }
}

/// Typed calls on an engine over a [`Typed`] machine. Each is the raw call of the same name
/// without the suffix, with records encoded as the machine stores them
/// ([`encode_versioned`] with [`TypedMachine::VERSION`]).
impl<T: TypedMachine> Engine<Typed<T>> {
    /// [`Engine::write`] with typed records: `decide` sees the state and returns the records
    /// to append (none means no write) and a value for the caller.
    ///
    /// # Errors
    /// As [`Engine::write`]: among others [`Error::UnknownEntity`] if the entity is not
    /// registered (unless the engine registers on first write), [`Error::Contained`],
    /// [`Error::Fenced`], [`Error::Refused`] if [`TypedMachine::check`] refuses a record;
    /// [`Error::InvalidArgument`] if a record does not encode.
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
    /// engine.append_typed(&clicks, &[5])?;
    /// // Add 3 only if the total stays at most 6.
    /// let added = engine.write_typed(&clicks, |total| {
    ///     if *total + 3 <= 6 { (vec![3], true) } else { (vec![], false) }
    /// })?;
    /// assert_eq!((added.value, added.seqs), (false, None)); // nothing was written
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_typed<V>(
        &self,
        entity: &EntityId,
        decide: impl FnOnce(&T::State) -> (Vec<T::Record>, V),
    ) -> Result<Written<V>> {
        let mut encoded = Ok(());
        let written = self.write(entity, |state| {
            let (records, value) = decide(state);
            match encode_all::<T>(&records) {
                Ok(bytes) => (bytes, value),
                Err(e) => {
                    encoded = Err(e);
                    (Vec::new(), value)
                }
            }
        })?;
        encoded.map(|()| written)
    }

    /// [`Engine::try_write`] with typed records: `decide` sees the state and returns the
    /// records to append and a value for the caller, or refuses the command with a
    /// [`Rejection`] (SPEC R12).
    ///
    /// # Errors
    /// As [`Engine::try_write`]: [`Error::Refused`] if `decide` or
    /// [`TypedMachine::check`] refuses (nothing is written, the entity keeps serving);
    /// [`Error::InvalidArgument`] if a record does not encode.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Typed, TypedMachine};
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
    /// engine.append_typed(&clicks, &[5])?;
    /// // Add 3, refusing if the total would pass 6.
    /// let added = engine.try_write_typed(&clicks, |total| {
    ///     if *total + 3 > 6 {
    ///         return Err(Rejection::new(format!("{total} + 3 is above 6")));
    ///     }
    ///     Ok((vec![3], *total + 3))
    /// });
    /// assert!(matches!(added, Err(Error::Refused { .. })));
    /// assert_eq!(engine.read(&clicks, |t| *t)?, 5); // nothing was written
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write_typed<V>(
        &self,
        entity: &EntityId,
        decide: impl FnOnce(&T::State) -> std::result::Result<(Vec<T::Record>, V), Rejection>,
    ) -> Result<Written<V>> {
        let mut encoded = Ok(());
        let written = self.try_write(entity, |state| {
            let (records, value) = decide(state)?;
            match encode_all::<T>(&records) {
                Ok(bytes) => Ok((bytes, value)),
                Err(e) => {
                    encoded = Err(e);
                    Ok((Vec::new(), value))
                }
            }
        });
        encoded?;
        written
    }

    /// [`Engine::append`] with typed records. Returns their sequence numbers.
    ///
    /// # Errors
    /// As [`Engine::append`]: [`Error::Refused`] if [`TypedMachine::check`] refuses a record
    /// (nothing is written, the entity keeps serving), [`Error::InvalidArgument`] if a record
    /// does not encode.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, unless
    /// [`EngineBuilder::register_on_first_write`](crate::EngineBuilder::register_on_first_write) is on.
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
    /// assert_eq!(engine.append_typed(&clicks, &[1, 2, 3])?, 1..=3);
    /// assert_eq!(engine.read(&clicks, |t| *t)?, 6);
    /// # Ok(())
    /// # }
    /// ```
    pub fn append_typed(
        &self,
        entity: &EntityId,
        records: &[T::Record],
    ) -> Result<RangeInclusive<u64>> {
        self.append(entity, encode_all::<T>(records)?)
    }

    /// [`Engine::defer`] with a typed record (SPEC R8).
    ///
    /// # Errors
    /// As [`Engine::defer`] ([`Error::Refused`] if the entity is restored and
    /// [`TypedMachine::check`] refuses the record; for a pending entity it is checked inside
    /// the restore unit, and set aside if refused), and [`Error::InvalidArgument`] if the
    /// record does not encode.
    ///
    /// Answers [`Error::UnknownEntity`] if the entity was never registered, unless
    /// [`EngineBuilder::register_on_first_write`](crate::EngineBuilder::register_on_first_write) is on.
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
    /// engine.defer_typed(&clicks, &5)?;
    /// assert_eq!(engine.read(&clicks, |t| *t)?, 5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn defer_typed(&self, entity: &EntityId, record: &T::Record) -> Result<Deferred> {
        self.defer(entity, encode_versioned(T::VERSION, record)?)
    }

    /// [`Engine::history`] with records decoded: `(seq, record)` from `from_seq` on, in order.
    /// Records of older versions come through [`TypedMachine::upcast_record`] (SPEC E7). A
    /// record that does not decode, or whose version this code does not read, is answered as
    /// [`Error::Corrupt`] naming the versions, and ends the iteration.
    ///
    /// # Errors
    /// As [`Engine::history`]: [`Error::UnknownEntity`] if the entity is not registered.
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
    /// engine.append_typed(&clicks, &[10, 20])?;
    /// let records: Vec<(u64, u64)> = engine.history_typed(&clicks, 1)?.collect::<Result<_, _>>()?;
    /// assert_eq!(records, [(1, 10), (2, 20)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn history_typed(
        &self,
        entity: &EntityId,
        from_seq: u64,
    ) -> Result<impl Iterator<Item = Result<(u64, T::Record)>> + use<T>> {
        let partition = entity.to_string();
        let mut records: History = self.history(entity, from_seq)?;
        let machine = self.shared_machine();
        let mut failed = false;
        Ok(std::iter::from_fn(move || {
            if failed {
                return None;
            }
            let item = records.next()?.and_then(|r| {
                machine
                    .decode_record(&r.payload)
                    .map(|record| (r.seq, record))
                    .map_err(|e| Error::corrupt(&partition, format!("record {}: {e}", r.seq)))
            });
            failed = item.is_err();
            Some(item)
        }))
    }
}
