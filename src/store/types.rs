//! The vocabulary of the store contract (SPEC S1, S2): partitions, key ranges, cursors, guarded
//! batches and their outcomes, with the size limits every backend enforces.
//!
//! This file owns the size limits and partition names, and re-exports the rest from one file
//! per job: `types/range.rs` (key ranges, cursors, scan pages), `types/batch.rs` (guarded
//! batches and their checks), `types/outcome.rs` (outcomes and counters). Calls only the error
//! type.

mod batch;
mod outcome;
mod range;

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

pub use batch::{Batch, Op, Precondition, check_key};
pub(crate) use batch::{check_guards, check_key_within, refuse_deadlines};
pub use outcome::{Outcome, StoreStats};
pub use range::{Cursor, KeyRange, ScanPage};

/// The largest key, in bytes (SPEC S1).
pub const MAX_KEY_BYTES: usize = 1024;
/// The largest value, in bytes (SPEC S1).
pub const MAX_VALUE_BYTES: usize = 16 << 20;
/// The largest batch, counted as the bytes of every key and value it carries (SPEC S1).
pub const MAX_BATCH_BYTES: usize = 64 << 20;
/// The longest partition name, in bytes.
pub const MAX_PARTITION_NAME_BYTES: usize = 255;

/// How much one batch may carry on a backend, and what a backend can evaluate (SPEC S11).
///
/// Every backend enforces its own limits before touching anything: a batch over any of them is
/// refused with [`Error::TooLarge`] and changes nothing; it is never split. The file-backed and
/// in-memory stores have [`StoreLimits::DEFAULT`] (the limits of SPEC S1, no count limit); a
/// distributed backend is usually tighter (etcd: 128 operations and 1.5 MiB per transaction).
/// Callers that build large batches read [`Store::limits`](super::Store::limits) and split their
/// work themselves.
///
/// ```
/// use portcullis::store::{MemoryStore, Store, StoreLimits};
/// let limits = MemoryStore::new().limits();
/// assert_eq!(limits, StoreLimits::DEFAULT);
/// assert_eq!(limits.max_key_bytes, 1024);
/// let tight = StoreLimits::DEFAULT.with_max_batch_ops(63).with_max_batch_bytes(1 << 20);
/// assert_eq!(tight.max_batch_ops, 63);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreLimits {
    /// The largest key, in bytes. Never above [`MAX_KEY_BYTES`].
    pub max_key_bytes: usize,
    /// The largest value, in bytes. Never above [`MAX_VALUE_BYTES`].
    pub max_value_bytes: usize,
    /// The most operations one batch may carry; its preconditions are limited to the same
    /// number. `usize::MAX` when the backend has no such limit.
    pub max_batch_ops: usize,
    /// The largest batch, counted as the bytes of every key and value it carries (as
    /// [`Batch::validate`] counts them). Never above [`MAX_BATCH_BYTES`].
    pub max_batch_bytes: usize,
}

impl StoreLimits {
    /// The limits of SPEC S1, with no limit on the number of operations: the file-backed and
    /// in-memory stores.
    pub const DEFAULT: StoreLimits = StoreLimits {
        max_key_bytes: MAX_KEY_BYTES,
        max_value_bytes: MAX_VALUE_BYTES,
        max_batch_ops: usize::MAX,
        max_batch_bytes: MAX_BATCH_BYTES,
    };

    /// These limits with the key limit lowered to `bytes` (never raised above S1's).
    pub const fn with_max_key_bytes(mut self, bytes: usize) -> Self {
        self.max_key_bytes = min(bytes, MAX_KEY_BYTES);
        self
    }

    /// These limits with the value limit lowered to `bytes` (never raised above S1's).
    pub const fn with_max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = min(bytes, MAX_VALUE_BYTES);
        self
    }

    /// These limits with at most `ops` operations (and as many preconditions) per batch.
    pub const fn with_max_batch_ops(mut self, ops: usize) -> Self {
        self.max_batch_ops = ops;
        self
    }

    /// These limits with the batch limit lowered to `bytes` (never raised above S1's).
    pub const fn with_max_batch_bytes(mut self, bytes: usize) -> Self {
        self.max_batch_bytes = min(bytes, MAX_BATCH_BYTES);
        self
    }
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits::DEFAULT
    }
}

const fn min(a: usize, b: usize) -> usize {
    if a < b { a } else { b }
}

/// The name of a partition: 1 to 255 arbitrary bytes. Cheap to clone.
///
/// ```
/// use portcullis::store::Partition;
/// let p = Partition::new("orders/42").unwrap();
/// assert_eq!(p.as_bytes(), b"orders/42");
/// assert!(Partition::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partition(Arc<[u8]>);

impl Partition {
    /// Validates and wraps a partition name.
    pub fn new(name: impl AsRef<[u8]>) -> Result<Self> {
        let name = name.as_ref();
        if name.is_empty() || name.len() > MAX_PARTITION_NAME_BYTES {
            return Err(Error::invalid(format!(
                "a partition name must be 1 to {MAX_PARTITION_NAME_BYTES} bytes, got {}",
                name.len()
            )));
        }
        Ok(Partition(Arc::from(name)))
    }

    /// The name's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Partition({})", self)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}
