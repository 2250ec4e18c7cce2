//! The vocabulary of the store contract (SPEC S1, S2): partitions, key ranges, cursors, guarded
//! batches and their outcomes, with the size limits every backend enforces.

use std::fmt;
use std::ops::Bound;
use std::sync::Arc;

use crate::error::{Error, Result};

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

/// A range of keys: a start bound and an end bound, like `std::ops::RangeBounds` over bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// Where the range starts.
    pub start: Bound<Vec<u8>>,
    /// Where the range ends.
    pub end: Bound<Vec<u8>>,
}

impl KeyRange {
    /// Every key.
    pub fn all() -> Self {
        KeyRange {
            start: Bound::Unbounded,
            end: Bound::Unbounded,
        }
    }

    /// Keys `k` with `start <= k < end`.
    pub fn between(start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> Self {
        KeyRange {
            start: Bound::Included(start.into()),
            end: Bound::Excluded(end.into()),
        }
    }

    /// Keys `k >= start`.
    pub fn from(start: impl Into<Vec<u8>>) -> Self {
        KeyRange {
            start: Bound::Included(start.into()),
            end: Bound::Unbounded,
        }
    }

    /// Keys that start with `prefix`.
    ///
    /// ```
    /// use portcullis::store::KeyRange;
    /// let r = KeyRange::prefix(b"ab");
    /// assert!(r.contains(b"abc") && !r.contains(b"ac") && !r.contains(b"a"));
    /// ```
    pub fn prefix(prefix: &[u8]) -> Self {
        let start = Bound::Included(prefix.to_vec());
        // The smallest key greater than every key with this prefix: drop trailing 0xff bytes,
        // then increment the last byte. A prefix of only 0xff bytes has no upper bound.
        let mut end = prefix.to_vec();
        while end.last() == Some(&0xff) {
            end.pop();
        }
        let end = match end.last_mut() {
            Some(last) => {
                *last += 1;
                Bound::Excluded(end)
            }
            None => Bound::Unbounded,
        };
        KeyRange { start, end }
    }

    /// Whether `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        let after_start = match &self.start {
            Bound::Included(s) => key >= s.as_slice(),
            Bound::Excluded(s) => key > s.as_slice(),
            Bound::Unbounded => true,
        };
        let before_end = match &self.end {
            Bound::Included(e) => key <= e.as_slice(),
            Bound::Excluded(e) => key < e.as_slice(),
            Bound::Unbounded => true,
        };
        after_start && before_end
    }

    /// Whether no key can lie in the range (an inverted or empty range).
    pub fn is_empty(&self) -> bool {
        match (&self.start, &self.end) {
            (Bound::Included(s), Bound::Included(e)) => s > e,
            (Bound::Included(s), Bound::Excluded(e))
            | (Bound::Excluded(s), Bound::Included(e))
            | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
            _ => false,
        }
    }

    /// The part of this range strictly after `key` (used to resume from a cursor).
    pub(crate) fn after(&self, key: &[u8]) -> KeyRange {
        let start = match &self.start {
            Bound::Included(s) | Bound::Excluded(s) if s.as_slice() > key => self.start.clone(),
            _ => Bound::Excluded(key.to_vec()),
        };
        KeyRange {
            start,
            end: self.end.clone(),
        }
    }

    /// The part of this range a scan resumed from `cursor` covers: all of it without one.
    pub(crate) fn resuming(&self, cursor: Option<&Cursor>) -> KeyRange {
        match cursor {
            Some(c) => self.after(&c.0),
            None => self.clone(),
        }
    }

    /// Borrowed bounds, for `BTreeMap::range`.
    pub(crate) fn as_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (as_ref_bound(&self.start), as_ref_bound(&self.end))
    }

    fn bytes(&self) -> usize {
        bound_len(&self.start) + bound_len(&self.end)
    }
}

fn as_ref_bound(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(v) => Bound::Included(v.as_slice()),
        Bound::Excluded(v) => Bound::Excluded(v.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn bound_len(b: &Bound<Vec<u8>>) -> usize {
    match b {
        Bound::Included(v) | Bound::Excluded(v) => v.len(),
        Bound::Unbounded => 0,
    }
}

/// Where a scan resumes: strictly after the last key of the previous page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor(pub(crate) Vec<u8>);

impl Cursor {
    /// A cursor that resumes strictly after `key` (for callers that persist cursors).
    pub fn after_key(key: impl Into<Vec<u8>>) -> Self {
        Cursor(key.into())
    }

    /// The last key returned before this cursor.
    pub fn last_key(&self) -> &[u8] {
        &self.0
    }
}

/// One page of a scan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// Key-value pairs in key order.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// Where the next page starts; `None` when the range is exhausted.
    pub next: Option<Cursor>,
}

/// A condition a batch requires before it applies (SPEC S2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// The key holds exactly this value.
    Equals(Vec<u8>, Vec<u8>),
    /// The key holds no value.
    Absent(Vec<u8>),
    /// The key holds some value.
    Present(Vec<u8>),
    /// The store's clock reads at most this many milliseconds when the batch commits.
    NotAfter(u64),
}

/// A change a batch makes (SPEC S2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Sets a key to a value.
    Put(Vec<u8>, Vec<u8>),
    /// Removes a key (a no-op if it is absent).
    Delete(Vec<u8>),
    /// Removes every key in a range.
    DeleteRange(KeyRange),
}

/// A guarded batch: preconditions, then operations, applied atomically to one partition.
///
/// ```
/// use portcullis::store::Batch;
/// let batch = Batch::new()
///     .absent(b"user/1".to_vec())
///     .put(b"user/1".to_vec(), b"ada".to_vec())
///     .put(b"count".to_vec(), b"1".to_vec());
/// assert_eq!(batch.ops().len(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    guards: Vec<Precondition>,
    ops: Vec<Op>,
}

impl Batch {
    /// An empty batch.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::Batch;
    /// let batch = Batch::new();
    /// assert!(batch.guards().is_empty() && batch.ops().is_empty());
    /// ```
    pub fn new() -> Self {
        Batch::default()
    }

    /// Adds a precondition.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, Precondition};
    /// let batch = Batch::new().guard(Precondition::Absent(b"k".to_vec()));
    /// assert_eq!(batch.guards(), [Precondition::Absent(b"k".to_vec())]);
    /// ```
    pub fn guard(mut self, precondition: Precondition) -> Self {
        self.guards.push(precondition);
        self
    }

    /// Requires `key` to hold exactly `value`.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// // Compare-and-set: only if alice still holds 10.
    /// let cas = Batch::new().equals("alice", "10").put("alice", "15");
    /// assert!(store.apply(&p, &cas)?.is_committed());
    /// assert!(!store.apply(&p, &cas)?.is_committed()); // alice holds 15 now
    /// # Ok(())
    /// # }
    /// ```
    pub fn equals(self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.guard(Precondition::Equals(key.into(), value.into()))
    }

    /// Requires `key` to be absent.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// let create = Batch::new().absent("alice").put("alice", "0");
    /// assert!(store.apply(&p, &create)?.is_committed());
    /// assert!(!store.apply(&p, &create)?.is_committed()); // created only once
    /// # Ok(())
    /// # }
    /// ```
    pub fn absent(self, key: impl Into<Vec<u8>>) -> Self {
        self.guard(Precondition::Absent(key.into()))
    }

    /// Requires `key` to be present.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// let touch = Batch::new().present("alice").put("alice/seen", "yes");
    /// assert!(!store.apply(&p, &touch)?.is_committed()); // no alice yet
    /// store.apply(&p, &Batch::new().put("alice", "0"))?;
    /// assert!(store.apply(&p, &touch)?.is_committed());
    /// # Ok(())
    /// # }
    /// ```
    pub fn present(self, key: impl Into<Vec<u8>>) -> Self {
        self.guard(Precondition::Present(key.into()))
    }

    /// Requires the store's clock to read at most `deadline_ms` at commit.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// let deadline = store.now_ms() + 1_000;
    /// let batch = Batch::new().not_after(deadline).put("alice", "0");
    /// assert!(store.apply(&p, &batch)?.is_committed()); // committed within the second
    /// # Ok(())
    /// # }
    /// ```
    pub fn not_after(self, deadline_ms: u64) -> Self {
        self.guard(Precondition::NotAfter(deadline_ms))
    }

    /// Adds an operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, Op};
    /// let batch = Batch::new().op(Op::Put(b"k".to_vec(), b"v".to_vec()));
    /// assert_eq!(batch.ops().len(), 1);
    /// ```
    pub fn op(mut self, op: Op) -> Self {
        self.ops.push(op);
        self
    }

    /// Sets `key` to `value`.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10").put("bob", "5"))?;
    /// assert_eq!(store.get(&p, b"bob")?, Some(b"5".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn put(self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.op(Op::Put(key.into(), value.into()))
    }

    /// Removes `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// store.apply(&p, &Batch::new().delete("alice"))?;
    /// assert_eq!(store.get(&p, b"alice")?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn delete(self, key: impl Into<Vec<u8>>) -> Self {
        self.op(Op::Delete(key.into()))
    }

    /// Removes every key in `range`.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    /// use portcullis::store::KeyRange;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("tmp/1", "a").put("tmp/2", "b").put("keep", "c"))?;
    /// store.apply(&p, &Batch::new().delete_range(KeyRange::prefix(b"tmp/")))?;
    /// assert_eq!(store.entries(&p, KeyRange::all()).count(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn delete_range(self, range: KeyRange) -> Self {
        self.op(Op::DeleteRange(range))
    }

    /// The preconditions, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, Precondition};
    /// let batch = Batch::new().absent("k").put("k", "v");
    /// assert!(matches!(batch.guards(), [Precondition::Absent(_)]));
    /// ```
    pub fn guards(&self) -> &[Precondition] {
        &self.guards
    }

    /// The operations, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, Op};
    /// let batch = Batch::new().put("k", "v").delete("old");
    /// assert!(matches!(batch.ops(), [Op::Put(..), Op::Delete(_)]));
    /// ```
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Appends another batch's preconditions and operations to this one.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::Batch;
    /// let mut batch = Batch::new().absent("k").put("k", "v");
    /// batch.extend(Batch::new().put("count", "1"));
    /// assert_eq!((batch.guards().len(), batch.ops().len()), (1, 2));
    /// ```
    pub fn extend(&mut self, other: Batch) {
        self.guards.extend(other.guards);
        self.ops.extend(other.ops);
    }

    /// Checks every limit of SPEC S1 and returns the batch's size in bytes.
    ///
    /// The same as [`Batch::validate_within`] with [`StoreLimits::DEFAULT`]; a backend checks
    /// its own limits, which may be tighter (SPEC S11).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MAX_KEY_BYTES};
    /// assert_eq!(Batch::new().put("k", "v").validate()?, 2); // bytes of keys and values
    /// let too_long = vec![b'k'; MAX_KEY_BYTES + 1];
    /// assert!(Batch::new().put(too_long, "v").validate().is_err());
    /// # Ok::<(), portcullis::Error>(())
    /// ```
    pub fn validate(&self) -> Result<usize> {
        self.validate_within(&StoreLimits::DEFAULT)
    }

    /// Checks the batch against a backend's limits (SPEC S1, S11) and returns its size in
    /// bytes: keys not empty and within `max_key_bytes`, values within `max_value_bytes`, at
    /// most `max_batch_ops` operations and as many preconditions, and at most
    /// `max_batch_bytes` in all.
    ///
    /// Every backend calls this with its [`Store::limits`](super::Store::limits) before
    /// touching anything, so an oversize or malformed batch changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{Error, store::{Batch, StoreLimits}};
    /// let limits = StoreLimits::DEFAULT.with_max_batch_ops(2);
    /// let batch = Batch::new().put(b"a".to_vec(), b"1".to_vec()).put(b"b".to_vec(), b"2".to_vec());
    /// assert_eq!(batch.validate_within(&limits).unwrap(), 4);
    /// let batch = batch.delete(b"c".to_vec());
    /// assert!(matches!(batch.validate_within(&limits), Err(Error::TooLarge { size: 3, limit: 2, .. })));
    /// ```
    pub fn validate_within(&self, limits: &StoreLimits) -> Result<usize> {
        let mut size = 0usize;
        for guard in &self.guards {
            size += match guard {
                Precondition::Equals(k, v) => {
                    check_key_within(k, limits)? + check_value(v, limits)?
                }
                Precondition::Absent(k) | Precondition::Present(k) => check_key_within(k, limits)?,
                Precondition::NotAfter(_) => 8,
            };
        }
        for op in &self.ops {
            size += match op {
                Op::Put(k, v) => check_key_within(k, limits)? + check_value(v, limits)?,
                Op::Delete(k) => check_key_within(k, limits)?,
                Op::DeleteRange(r) => {
                    for b in [&r.start, &r.end] {
                        if let Bound::Included(k) | Bound::Excluded(k) = b
                            && k.len() > limits.max_key_bytes
                        {
                            return Err(too_large("range bound", k.len(), limits.max_key_bytes));
                        }
                    }
                    r.bytes()
                }
            };
        }
        if self.ops.len() > limits.max_batch_ops {
            return Err(too_large(
                "operations in a batch",
                self.ops.len(),
                limits.max_batch_ops,
            ));
        }
        if self.guards.len() > limits.max_batch_ops {
            return Err(too_large(
                "preconditions in a batch",
                self.guards.len(),
                limits.max_batch_ops,
            ));
        }
        if size > limits.max_batch_bytes {
            return Err(too_large("batch", size, limits.max_batch_bytes));
        }
        Ok(size)
    }
}

/// Checks a key against SPEC S1 and returns its length.
pub fn check_key(key: &[u8]) -> Result<usize> {
    check_key_within(key, &StoreLimits::DEFAULT)
}

/// Checks a key against a backend's limits (SPEC S1, S11) and returns its length.
pub(crate) fn check_key_within(key: &[u8], limits: &StoreLimits) -> Result<usize> {
    if key.is_empty() {
        return Err(Error::invalid("keys must not be empty"));
    }
    if key.len() > limits.max_key_bytes {
        return Err(too_large("key", key.len(), limits.max_key_bytes));
    }
    Ok(key.len())
}

fn check_value(value: &[u8], limits: &StoreLimits) -> Result<usize> {
    if value.len() > limits.max_value_bytes {
        return Err(too_large("value", value.len(), limits.max_value_bytes));
    }
    Ok(value.len())
}

fn too_large(what: &'static str, size: usize, limit: usize) -> Error {
    Error::TooLarge { what, size, limit }
}

/// What became of a batch (SPEC S2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// Every operation applied; under a syncing policy, durably.
    Committed,
    /// The precondition at `index` (in the order they were added) did not hold; nothing changed.
    PreconditionFailed {
        /// Index into [`Batch::guards`].
        index: usize,
    },
    /// A `NotAfter` deadline had passed on the store's clock; nothing changed.
    DeadlinePassed {
        /// The store's clock when the batch was refused.
        now_ms: u64,
    },
}

impl Outcome {
    /// Whether the batch committed.
    pub fn is_committed(&self) -> bool {
        matches!(self, Outcome::Committed)
    }
}

/// Counters a store exposes so batching and laziness are visible.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Batches committed since open.
    pub batches: u64,
    /// Journal `fdatasync`s issued since open: those that make commits durable (group commit
    /// shows as `syncs < batches`), and those that make a new segment's header and each
    /// zero-filled step of the tail durable before records go there. Open's own syncs and
    /// directory syncs are not counted.
    pub syncs: u64,
    /// Bytes appended to the journal since open.
    pub bytes_written: u64,
    /// Partitions known to the store.
    pub partitions: u64,
    /// Partitions whose index is loaded in memory now.
    pub partitions_loaded: u64,
    /// Idle partition indexes dropped under a budget since open (they load again on their next
    /// touch).
    pub indexes_dropped: u64,
    /// Journal segments live on disk.
    pub segments: u64,
    /// Compactions completed since open.
    pub compactions: u64,
    /// Estimated bytes of overwritten and deleted values that compaction could reclaim. The
    /// file store keeps the estimate across restarts; 0 for backends without compaction.
    pub garbage_bytes: u64,
}

/// Refuses a batch that carries a `NotAfter` precondition, for a backend that cannot evaluate
/// one on its own clock (SPEC S11). Nothing is changed.
pub(crate) fn refuse_deadlines(batch: &Batch, backend: &str) -> Result<()> {
    match batch
        .guards()
        .iter()
        .position(|g| matches!(g, Precondition::NotAfter(_)))
    {
        None => Ok(()),
        Some(index) => Err(Error::invalid(format!(
            "precondition {index} is a NotAfter deadline, which {backend} cannot evaluate on its \
             own clock (Store::evaluates_deadlines is false); leave deadlines out of batches \
             for this store"
        ))),
    }
}

/// Checks a batch's preconditions against a point-in-time view of a partition.
///
/// `read` answers the current value of a key. Returns the outcome to report, or `None` when
/// every precondition holds. `NotAfter` is evaluated against `now_ms`, taken inside the commit
/// step (SPEC F: the deadline must be checked where the commit happens).
pub(crate) fn check_guards(
    guards: &[Precondition],
    now_ms: impl Fn() -> u64,
    mut read: impl FnMut(&[u8]) -> Result<Option<Vec<u8>>>,
) -> Result<Option<Outcome>> {
    for (index, guard) in guards.iter().enumerate() {
        let holds = match guard {
            Precondition::Equals(k, v) => read(k)?.as_deref() == Some(v.as_slice()),
            Precondition::Absent(k) => read(k)?.is_none(),
            Precondition::Present(k) => read(k)?.is_some(),
            Precondition::NotAfter(deadline) => {
                let now = now_ms();
                if now > *deadline {
                    return Ok(Some(Outcome::DeadlinePassed { now_ms: now }));
                }
                true
            }
        };
        if !holds {
            return Ok(Some(Outcome::PreconditionFailed { index }));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges() {
        let r = KeyRange::prefix(&[0x61, 0xff]);
        assert!(r.contains(&[0x61, 0xff, 0]));
        assert!(!r.contains(&[0x62]));
        assert!(KeyRange::prefix(&[0xff]).end == Bound::Unbounded);
    }

    #[test]
    fn after_resumes_strictly_after() {
        let r = KeyRange::between(b"a".to_vec(), b"z".to_vec()).after(b"m");
        assert!(!r.contains(b"m"));
        assert!(r.contains(b"m\0"));
        let r = KeyRange::from(b"q".to_vec()).after(b"c");
        assert!(r.contains(b"q") && !r.contains(b"p"));
    }

    #[test]
    fn empty_ranges() {
        assert!(KeyRange::between(b"b".to_vec(), b"a".to_vec()).is_empty());
        assert!(KeyRange::between(b"a".to_vec(), b"a".to_vec()).is_empty());
        assert!(!KeyRange::all().is_empty());
    }
}
