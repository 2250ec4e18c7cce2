//! One partition's in-memory state: its key index (keys to value locations, never values;
//! SPEC S8), the batches committed but not yet durable, and how it is loaded from its chain.
//!
//! Lock order inside a partition: `commit` (serialises writers) before `view` (what readers
//! see). Readers take only `view`. Never hold either while waiting for another partition.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::format::{self, FRAME_LEN, JournalOp, Loc, ValueLoc};
use crate::error::Error;
use crate::store::{KeyRange, Partition};

/// A partition's key index (see [`KeyIndex`](super::key_index::KeyIndex)).
pub type Index = super::key_index::KeyIndex;

/// A partition that has been touched since open.
pub struct PartState {
    pub name: Partition,
    pub hash: u64,
    /// Location of the newest record of this partition's chain, durable or not. Written under
    /// the journal's append mutex so a heads snapshot sees it consistent with journal order.
    pub head: AtomicU64,
    /// LSN of the record `head` names (0: one found at open, on disk already). Dropping an
    /// idle index waits until the journal serves it, so a reload can read the whole chain.
    pub head_lsn: AtomicU64,
    /// LSN of the newest batch appended for this partition.
    pub appended_lsn: AtomicU64,
    /// Where the newest batch a commit appended for it ends (0: none since open); written
    /// under `commit`, to tell whether the next one lies close after it (see `scatter`).
    pub last_end: AtomicU64,
    /// LSN of the newest batch folded into the readers' view.
    pub folded_lsn: AtomicU64,
    /// The store's touch counter at this partition's last touch (dropping idle indexes).
    pub last_touch: AtomicU64,
    /// Whether records its last load read may still be in the store's cache of recent
    /// records (set by a load that put some there): reads look there only while this holds,
    /// and clear it on a miss, so reads of a partition loaded long ago, or whose load cached
    /// nothing, never touch the shared cache.
    pub warm: AtomicBool,
    /// Whether the heads snapshot open read holds this partition (counting partitions).
    pub in_base: bool,
    /// Whether `head` was taken from that snapshot's pages: while `head_lsn` is 0 it is still
    /// the snapshot's, and dropping the index need not remember it.
    pub from_base: bool,
    pub commit: Mutex<CommitState>,
    pub view: RwLock<View>,
}

pub struct CommitState {
    pub load: Load,
    /// Committed-but-not-yet-durable batches, oldest first. Writers check preconditions against
    /// these (so a hot partition commits at group-commit speed); readers never see them.
    pub pending: VecDeque<Pending>,
    /// Records in the chain since (and including) the newest base record.
    pub chain_len: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Load {
    NotLoaded,
    Loaded,
    /// The partition cannot be loaded; every access answers this (SPEC S4).
    Corrupt(String),
}

/// What readers see: only durable batches.
#[derive(Default)]
pub struct View {
    pub loaded: bool,
    pub index: Index,
}

pub struct Pending {
    pub lsn: u64,
    pub ops: Vec<PendingOp>,
}

pub enum PendingOp {
    Put(Box<[u8]>, ValueLoc, Vec<u8>),
    Delete(Vec<u8>),
    DeleteRange(KeyRange),
}

/// What a precondition check learns about a key.
pub enum Lookup {
    /// Decided by a pending batch: the value, or absent.
    Pending(Option<Vec<u8>>),
    /// Decided by the durable index.
    Durable(Option<ValueLoc>),
}

impl PartState {
    pub fn new(name: Partition, head: Loc, in_base: bool, from_base: bool) -> Self {
        let hash = format::partition_hash(name.as_bytes());
        PartState {
            name,
            hash,
            head: AtomicU64::new(head),
            head_lsn: AtomicU64::new(0),
            appended_lsn: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            folded_lsn: AtomicU64::new(0),
            last_touch: AtomicU64::new(0),
            warm: AtomicBool::new(false),
            in_base,
            from_base,
            commit: Mutex::new(CommitState {
                load: Load::NotLoaded,
                pending: VecDeque::new(),
                chain_len: 0,
            }),
            view: RwLock::new(View::default()),
        }
    }

    /// Records the newest record of the chain (called under the journal's append mutex, in
    /// journal order).
    pub fn place_head(&self, lsn: u64, at: Loc) {
        self.head_lsn.store(lsn, Ordering::Release);
        self.head.store(at, Ordering::Release);
    }

    pub fn corrupt_error(&self, detail: &str) -> Error {
        Error::corrupt(format!("partition {}", self.name), detail.to_owned())
    }
}

impl CommitState {
    /// The newest committed state of `key`, pending batches first (newest to oldest).
    pub fn lookup(&self, view: &View, key: &[u8]) -> Lookup {
        for pending in self.pending.iter().rev() {
            for op in pending.ops.iter().rev() {
                match op {
                    PendingOp::Put(k, _, v) if &**k == key => {
                        return Lookup::Pending(Some(v.clone()));
                    }
                    PendingOp::Delete(k) if k.as_slice() == key => return Lookup::Pending(None),
                    PendingOp::DeleteRange(r) if r.contains(key) => return Lookup::Pending(None),
                    _ => {}
                }
            }
        }
        Lookup::Durable(view.index.get(key).copied())
    }
}

/// Applies one batch's effect to an index; returns the bytes of values it made unreachable.
pub fn apply_to_index<K: AsRef<[u8]>>(
    index: &mut Index,
    ops: impl IntoIterator<Item = IndexOp<K>>,
) -> u64 {
    let mut freed = 0u64;
    for op in ops {
        match op {
            IndexOp::Put(k, v) => {
                if let Some(old) = index.insert(k.as_ref(), v) {
                    freed += old.len as u64;
                }
            }
            IndexOp::Delete(k) => {
                let k = k.as_ref();
                if let Some(old) = index.remove(k) {
                    freed += old.len as u64 + k.len() as u64;
                }
            }
            IndexOp::DeleteRange(r) => {
                if r.is_empty() {
                    continue;
                }
                index.remove_range(r.as_bounds(), |k, old| {
                    freed += old.len as u64 + k.len() as u64;
                });
            }
        }
    }
    freed
}

/// One operation on an index. The key is owned when it comes from a pending batch and
/// borrowed when a load decodes it from a record's bytes (the index copies it into its arena
/// either way, so a load allocates nothing per key).
pub enum IndexOp<K = Box<[u8]>> {
    Put(K, ValueLoc),
    Delete(K),
    DeleteRange(KeyRange),
}

impl From<PendingOp> for IndexOp {
    fn from(op: PendingOp) -> Self {
        match op {
            PendingOp::Put(k, v, _) => IndexOp::Put(k, v),
            PendingOp::Delete(k) => IndexOp::Delete(k.into_boxed_slice()),
            PendingOp::DeleteRange(r) => IndexOp::DeleteRange(r),
        }
    }
}

/// Converts an operation of the journaled batch at `record` (whose body is `body`) into an
/// index operation, as it is applied: its key stays borrowed from the body.
pub fn journal_op_to_index<'a>(
    record: Loc,
    body: &'a [u8],
    op: JournalOp<'a>,
) -> IndexOp<&'a [u8]> {
    match op {
        JournalOp::Put(k, offset, len) => {
            let value = &body[offset as usize..offset as usize + len as usize];
            IndexOp::Put(
                k,
                ValueLoc {
                    at: record + FRAME_LEN as u64 + offset as u64,
                    len,
                    crc: crc32c::crc32c(value),
                },
            )
        }
        JournalOp::Delete(k) => IndexOp::Delete(k),
        JournalOp::DeleteRange(r) => IndexOp::DeleteRange(r),
    }
}

pub fn head_of(state: &PartState) -> Loc {
    state.head.load(Ordering::Acquire)
}
