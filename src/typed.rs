//! Typed records and states (SPEC E6): a serde adapter so a state machine works with its own
//! record and state types instead of bytes.
//!
//! Owns: the [`TypedMachine`] trait, the [`Typed`] adapter that turns one into a
//! [`StateMachine`] by encoding records and checkpoints with [postcard], the [`encode`] and
//! [`decode`] helpers, and typed calls on an [`Engine`] over a [`Typed`] machine
//! ([`Engine::write_typed`], [`Engine::append_typed`], [`Engine::defer_typed`],
//! [`Engine::history_typed`]). It calls only the engine's public API.
//!
//! Raw bytes stay available: an `Engine<Typed<T>>` still has [`Engine::write`],
//! [`Engine::append`] and [`Engine::history`], and a record written as bytes is accepted only if
//! it decodes as a `T::Record` ([`StateMachine::validate`]).
//!
//! Postcard is compact and not self-describing: a record or state type must keep decoding what
//! older versions wrote. Add new variants at the end of an enum, never reorder or remove fields;
//! for larger changes, make the record an enum with one variant per version.
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
//!     fn apply(&self, balance: &mut u64, _: &ApplyContext<'_>, event: Event) -> Result<(), Rejection> {
//!         match event {
//!             Event::Deposited(n) => *balance += n,
//!             Event::Withdrew(n) if n <= *balance => *balance -= n,
//!             Event::Withdrew(_) => return Err(Rejection::new("overdrawn")),
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let engine = Engine::builder(Typed(Account)).store(Arc::new(MemoryStore::new())).open()?;
//! let alice = EntityId::new("bank", "alice")?;
//! engine.register(&alice)?;
//! engine.append_typed(&alice, &[Event::Deposited(10), Event::Withdrew(3)])?;
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

/// A state machine over the application's own record and state types (SPEC E6).
///
/// Wrap it in [`Typed`] to open an engine with it. Records and states are encoded with
/// postcard; the methods see decoded values only. A record that does not decode is refused
/// before it is written ([`StateMachine::validate`]); one found undecodable in history
/// contains its entity (SPEC R4).
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

    /// The state of an entity with no history.
    fn fresh(&self, entity: &EntityId) -> Self::State;

    /// Folds record `ctx.seq` into `state`, or refuses it (see [`StateMachine::apply`]; `ctx`
    /// says whether the record is replayed, deferred, a repair or live).
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
}

/// The adapter that makes a [`TypedMachine`] a [`StateMachine`]: records and checkpoints are
/// postcard encodings of `T::Record` and `T::State`.
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

/// Encodes a record (or state) the way [`Typed`] stores it.
///
/// Fails with [`Error::InvalidArgument`] if serde refuses the value (for example a map with
/// non-string keys in a format that needs them); nothing is written then.
///
/// ```
/// let bytes = portcullis::typed::encode(&("hello", 7u8)).unwrap();
/// let back: (String, u8) = portcullis::typed::decode(&bytes).unwrap();
/// assert_eq!(back, ("hello".to_string(), 7));
/// ```
pub fn encode<R: Serialize + ?Sized>(value: &R) -> Result<Vec<u8>> {
    postcard::to_stdvec(value)
        .map_err(|e| Error::invalid(format!("the record does not encode with postcard: {e}")))
}

/// Decodes what [`encode`] produced. Trailing bytes are refused, so a record of another type
/// that happens to share a prefix is not silently misread.
///
/// ```
/// let refused = portcullis::typed::decode::<u64>(&[0xff]);
/// assert!(refused.is_err());
/// ```
pub fn decode<R: DeserializeOwned>(bytes: &[u8]) -> Result<R, Rejection> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(Rejection::new(format!(
            "{} trailing bytes after the {}",
            rest.len(),
            std::any::type_name::<R>()
        ))),
        Err(e) => Err(Rejection::new(format!(
            "does not decode as {}: {e}",
            std::any::type_name::<R>()
        ))),
    }
}

fn encode_all<R: Serialize>(records: &[R]) -> Result<Vec<Vec<u8>>> {
    records.iter().map(|r| encode(r)).collect()
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
        let record = decode::<T::Record>(record)
            .map_err(|r| Rejection::new(format!("record {} {r}", ctx.seq)))?;
        self.0.apply(state, ctx, record)
    }

    fn encode_checkpoint(&self, state: &Self::State) -> Vec<u8> {
        // The trait has no error path here; a state serde cannot encode is a programming error
        // that every checkpoint of that entity would hit, so it fails loudly. The panic is
        // caught and contains only this entity (SPEC R4).
        encode(state).expect("the state type must encode with postcard")
    }

    fn decode_checkpoint(&self, _entity: &EntityId, bytes: &[u8]) -> Result<T::State, Rejection> {
        decode(bytes).map_err(|r| Rejection::new(format!("the checkpoint {r}")))
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        decode::<T::Record>(record).map(|_| ())
    }

    fn repair(
        &self,
        entity: &EntityId,
        state: &Self::State,
        unclean: u64,
    ) -> Result<Vec<Vec<u8>>, Rejection> {
        let records = self.0.repair(entity, state, unclean)?;
        encode_all(&records).map_err(|e| Rejection::new(e.to_string()))
    }
}

/// Typed calls on an engine over a [`Typed`] machine. Each is the raw call of the same name
/// without the suffix, with records encoded by [`encode`].
impl<T: TypedMachine> Engine<Typed<T>> {
    /// [`Engine::write`] with typed records: `decide` sees the state and returns the records
    /// to append (none means no write) and a value for the caller.
    ///
    /// # Errors
    /// As [`Engine::write`]: among others [`Error::UnknownEntity`] if the entity is not
    /// registered (unless the engine registers on first write), [`Error::Contained`],
    /// [`Error::Fenced`]; [`Error::InvalidArgument`] if a record does not encode.
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
            match encode_all(&records) {
                Ok(bytes) => (bytes, value),
                Err(e) => {
                    encoded = Err(e);
                    (Vec::new(), value)
                }
            }
        })?;
        encoded.map(|()| written)
    }

    /// [`Engine::append`] with typed records. Returns their sequence numbers.
    ///
    /// # Errors
    /// As [`Engine::append`], and [`Error::InvalidArgument`] if a record does not encode.
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
        self.append(entity, encode_all(records)?)
    }

    /// [`Engine::defer`] with a typed record (SPEC R8).
    ///
    /// # Errors
    /// As [`Engine::defer`], and [`Error::InvalidArgument`] if the record does not encode.
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
        self.defer(entity, encode(record)?)
    }

    /// [`Engine::history`] with records decoded: `(seq, record)` from `from_seq` on, in order.
    /// A record that does not decode is answered as [`Error::Corrupt`] and ends the iteration.
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
        let mut failed = false;
        Ok(std::iter::from_fn(move || {
            if failed {
                return None;
            }
            let item = records.next()?.and_then(|r| {
                decode(&r.payload)
                    .map(|record| (r.seq, record))
                    .map_err(|e| Error::corrupt(&partition, format!("record {} {e}", r.seq)))
            });
            failed = item.is_err();
            Some(item)
        }))
    }
}
