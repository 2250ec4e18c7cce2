//! Entity logs and checkpoints, expressed as rows of the entity's partition (SPEC L1-L4).
//!
//! Owns: the layout of the reserved log rows inside an entity partition (`keys`), the head
//! row (next sequence number, first retained sequence number, running digest, newest checkpoint
//! mark), appending records with the caller's guards and row operations in the same atomic batch
//! ([`fn@append`]), paging through history ([`read_log`], or [`visit_log`] lending each
//! record instead of copying it out), verified replay
//! ([`replay`]), checkpoints ([`write_checkpoint`], [`load_restore_point`]), verification of a
//! checkpoint against history and prefix truncation
//! ([`truncate_before`]).
//!
//! It calls only the [`Store`](crate::store::Store) trait and knows nothing of restores, epochs
//! or the application's state machine. Every write is one guarded batch on the entity's
//! partition, guarded on the head row exactly as it was read, so two writers can never assign
//! the same sequence number and a crash leaves either all of an append or none of it.
//!
//! ```
//! use portcullis::log;
//! use portcullis::store::{Batch, MemoryStore, Partition};
//! let store = MemoryStore::new();
//! let p = Partition::new("e/chat/room-1").unwrap();
//! let appended = log::append(&store, &p, &[b"hello".to_vec(), b"world".to_vec()], Batch::new())
//!     .unwrap()
//!     .committed()
//!     .unwrap();
//! assert_eq!((appended.first_seq, appended.last_seq), (1, 2));
//! let page = log::read_log(&store, &p, 1, 10).unwrap();
//! assert_eq!(page.records[1].payload, b"world");
//! assert!(page.next_seq.is_none());
//! ```

mod append;
mod checkpoint;
mod digest;
mod head;
#[cfg(feature = "test-hooks")]
pub mod keys;
#[cfg(not(feature = "test-hooks"))]
pub(crate) mod keys;
mod read;
mod truncate;

pub use append::{Appended, Guarded, MAX_RECORD_BYTES, append};
pub(crate) use checkpoint::load_restore_point_with;
pub use checkpoint::{Checkpoint, CheckpointMark, load_restore_point, write_checkpoint};
pub use head::{HeadSnapshot, LogHead, read_head, seal};
pub use read::{LogPage, LogRecord, LogRecordRef, read_log, replay, visit_log};
pub use truncate::truncate_before;

// The steps the engine composes itself (an append at a head it already read, the digest chain,
// the audit of a checkpoint), public only to the tests that check them one by one.
#[cfg(feature = "test-hooks")]
pub use append::{PreparedAppend, append_at, prepare_append};
#[cfg(not(feature = "test-hooks"))]
pub(crate) use append::{append_at, prepare_append};
#[cfg(feature = "test-hooks")]
pub use checkpoint::verify_checkpoint_against_history;
#[cfg(not(feature = "test-hooks"))]
pub(crate) use checkpoint::verify_checkpoint_against_history;
#[cfg(not(feature = "test-hooks"))]
pub(crate) use digest::GENESIS_DIGEST;
#[cfg(feature = "test-hooks")]
pub use digest::{GENESIS_DIGEST, chain_digest};

/// How many times [`fn@append`] re-reads a head that moved under it before answering
/// [`crate::Error::Unavailable`].
#[cfg(feature = "test-hooks")]
pub const APPEND_RETRIES: usize = 16;
#[cfg(not(feature = "test-hooks"))]
pub(crate) const APPEND_RETRIES: usize = 16;

/// Rows read per page while replaying or verifying history.
#[cfg(feature = "test-hooks")]
pub const REPLAY_PAGE: usize = 256;
#[cfg(not(feature = "test-hooks"))]
pub(crate) const REPLAY_PAGE: usize = 256;

/// The first byte of every row format version written by this module. A row carrying a newer
/// version is refused with [`Error::UnsupportedVersion`].
pub(crate) const ROW_VERSION: u8 = 1;

use crate::error::Error;
use crate::store::Partition;

/// A corrupt-row error naming the partition and what was wrong.
pub(crate) fn corrupt(p: &Partition, detail: impl Into<String>) -> Error {
    Error::corrupt(p.to_string(), detail)
}

/// Checks the version byte of a row and returns the rest.
pub(crate) fn strip_version<'a>(
    p: &Partition,
    what: &str,
    row: &'a [u8],
) -> crate::Result<&'a [u8]> {
    match row.split_first() {
        None => Err(corrupt(p, format!("the {what} row is empty"))),
        Some((&ROW_VERSION, rest)) => Ok(rest),
        Some((&v, _)) if v > ROW_VERSION => Err(Error::UnsupportedVersion {
            file: format!("{what} row of {p}"),
            found: u32::from(v),
            supported: u32::from(ROW_VERSION),
        }),
        Some((&v, _)) => Err(corrupt(
            p,
            format!("the {what} row has unknown version {v}"),
        )),
    }
}

/// Encodes a serde value as a versioned postcard row.
pub(crate) fn encode_row<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![ROW_VERSION];
    // Encoding plain structs of integers and byte vectors into a Vec cannot fail.
    out.extend(postcard::to_stdvec(value).expect("postcard encodes plain structs"));
    out
}

/// Decodes a versioned postcard row, naming the partition on failure.
pub(crate) fn decode_row<T: serde::de::DeserializeOwned>(
    p: &Partition,
    what: &str,
    row: &[u8],
) -> crate::Result<T> {
    let body = strip_version(p, what, row)?;
    postcard::from_bytes(body)
        .map_err(|e| corrupt(p, format!("the {what} row does not decode: {e}")))
}
