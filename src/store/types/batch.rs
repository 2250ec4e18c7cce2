//! Guarded batches (SPEC S2, S11): the [`Precondition`]s and [`Op`]s of a [`Batch`], the size
//! checks against a backend's [`StoreLimits`], and the shared evaluation of preconditions and
//! the refusal of deadlines a backend cannot evaluate.
//!
//! Owns what a batch may carry and how its guards are judged; the backends call these checks
//! from their commit step. Calls only the other vocabulary types and the error type.

use std::ops::Bound;

use crate::error::{Error, Result};

use super::{KeyRange, Outcome, StoreLimits};

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
    /// Every backend calls this with its [`Store::limits`](crate::store::Store::limits) before
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
