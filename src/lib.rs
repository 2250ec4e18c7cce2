//! # Portcullis
//!
//! Durable entities for synchronous Rust programs. Applications that hold many durable entities
//! (conversations, sessions, workflows, shards), each with an append-only history, get:
//!
//! 1. a crash-safe, file-backed, append-only store of partitions with atomic guarded batches and
//!    paged scans ([`store`]);
//! 2. lazy restore: opening reads no history, and each entity restores on first touch, exactly
//!    once ([`engine::Engine`] over [`restore`] and [`log`]);
//! 3. epoch fencing: once revocation reports complete, no write planned under an older epoch
//!    commits.
//!
//! Everything is blocking; there is no async runtime.
//!
//! Non-goals: a query language, secondary indexes, multi-partition transactions, replication.
//!
//! ## Guarantees
//!
//! The documentation cites what Portcullis promises by stable ids: "SPEC R4" is guarantee R4,
//! "(SPEC F2, F3)" two of them. Each id is a section of [`guarantees`] (the file
//! `docs/GUARANTEES.md`), in the words a user needs, with the tests that check it and what is
//! not guaranteed yet.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod clock;
pub mod engine;
pub mod entity;
pub mod error;
pub mod fence;
pub mod inspect;
pub mod log;
pub mod observe;
pub mod restore;
pub mod spawn;
pub mod store;
pub(crate) mod sync;
pub mod typed;

pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use engine::{Engine, EngineBuilder};
pub use entity::{EntityId, Namespace};
pub use error::{Error, Result};
pub use restore::{ApplyContext, Origin, Rejection, StateMachine, Warm};
pub use spawn::{Joiner, Spawner};
pub use store::SyncPolicy;
pub use typed::{Typed, TypedMachine};

/// What Portcullis promises, by id (S1 ... E6), with the tests that check each promise. The
/// same text as `docs/GUARANTEES.md`.
#[doc = include_str!("../docs/GUARANTEES.md")]
pub mod guarantees {}

/// The README's usage example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
