//! One partition's in-memory state: its key index (keys to value locations, never values;
//! SPEC S8), the batches committed but not yet durable, and how it is loaded from its chain.
//!
//! Lock order inside a partition: `commit` (serialises writers) before `view` (what readers
//! see). Readers take only `view`. Never hold either while waiting for another partition.

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::collections::VecDeque;

use crate::sync::{Mutex, RwLock};

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
    /// Whether the table's current snapshot pages hold this partition (counting partitions).
    /// Changed only under the table's write lock, when a snapshot's heads are folded back.
    pub in_base: AtomicBool,
    /// The head those pages hold for it (0: none): while `head` is still this one, dropping
    /// the index need not remember it. Changed only under the table's write lock.
    pub base_head: AtomicU64,
    pub commit: Mutex<CommitState>,
    pub view: RwLock<View>,
}

pub struct CommitState {
    pub load: Load,
    /// Committed-but-not-yet-durable batches, oldest first. Writers check preconditions against
    /// these (so a hot partition commits at group-commit speed); readers never see them.
    pub pending: VecDeque<Pending>,
    /// The records a load of this partition walks: those since (and including) its newest
    /// base.
    pub chain: Chain,
}

/// The records of a partition's chain since (and including) its newest base: how many, and
/// their bytes by segment besides the values in them (a value counts as garbage when it is
/// overwritten or deleted; the rest of these bytes once the next base supersedes them).
/// Complete: every record a load walks is here (compaction relies on it to leave alone a
/// partition that needs none of its victims; see `compaction`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// Records (a base run counts once), for the base interval.
    pub len: u32,
    /// Bytes by segment, in chain order, a run of records in one segment merged.
    bytes: Vec<(u32, u64)>,
}

impl Chain {
    /// A record at `at` joined the chain, `bytes` of it besides its values.
    pub fn push(&mut self, at: Loc, bytes: u64) {
        self.len += 1;
        self.note(at, bytes);
    }

    /// Bytes of a record at `at` joined the chain without counting as a record of it (the
    /// later parts of a base run).
    pub fn note(&mut self, at: Loc, bytes: u64) {
        let segment = format::loc_segment(at);
        match self.bytes.last_mut() {
            Some((s, b)) if *s == segment => *b += bytes,
            _ => self.bytes.push((segment, bytes)),
        }
    }

    /// Whether a record of the chain lies in one of `segments`.
    pub fn passes_through(&self, segments: &crate::sync::HashSet<u32>) -> bool {
        self.bytes.iter().any(|(s, _)| segments.contains(s))
    }

    /// The chain a new base starts: the base's records only. Returns the bytes of the chain
    /// it supersedes (garbage from now on).
    pub fn restart(&mut self, base: &[(Loc, u64)]) -> Vec<(u32, u64)> {
        let old = std::mem::take(&mut self.bytes);
        self.len = 1;
        for &(at, bytes) in base {
            self.note(at, bytes);
        }
        old
    }
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
    /// A state whose newest record is `head` (0: none); `base_head` is the head the table's
    /// snapshot pages hold for it (0: none).
    pub fn new(name: Partition, head: Loc, in_base: bool, base_head: Loc) -> Self {
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
            in_base: AtomicBool::new(in_base),
            base_head: AtomicU64::new(base_head),
            commit: Mutex::new(CommitState {
                load: Load::NotLoaded,
                pending: VecDeque::new(),
                chain: Chain::default(),
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

/// Applies one batch's effect to an index; hands `freed` the location of each value it made
/// unreachable and the bytes that frees (a removed key's with its value's).
pub fn apply_to_index<K: AsRef<[u8]>>(
    index: &mut Index,
    ops: impl IntoIterator<Item = IndexOp<K>>,
    mut freed: impl FnMut(Loc, u64),
) {
    for op in ops {
        match op {
            IndexOp::Put(k, v) => {
                if let Some(old) = index.insert(k.as_ref(), v) {
                    freed(old.at, old.len as u64);
                }
            }
            IndexOp::Delete(k) => {
                let k = k.as_ref();
                if let Some(old) = index.remove(k) {
                    freed(old.at, old.len as u64 + k.len() as u64);
                }
            }
            IndexOp::DeleteRange(r) => {
                if r.is_empty() {
                    continue;
                }
                index.remove_range(r.as_bounds(), |k, old| {
                    freed(old.at, old.len as u64 + k.len() as u64);
                });
            }
        }
    }
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
