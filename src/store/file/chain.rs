//! A partition's chain of records: writing base records (the partition's whole key index, split
//! over several records when it is large) and building the index by walking the chain back from
//! the partition's newest record (SPEC S5, S7, S8).
//!
//! Owns the chain rules: every record links to the partition's previous one; a walk stops at the
//! newest complete base. A base too large for one record is a *run* of [`RecordKind::BasePart`]
//! records (part 0 to n-1, consecutive in the chain, the last one newest); only a complete run
//! is a base. A run cut short by a crash carries nothing: a walk passes over its parts to the
//! record before them, whose state they would have restated. Calls only the journal.
//!
//! A load holds the keys and value locations of the chain, never its values: records longer
//! than one small read are read in full, one at a time, when they are applied (the rest after
//! the start the walk read, while the kept starts stay within [`RECENT_BYTES`]). Records whose
//! chain link points close before them are taken from one window read of the bytes before
//! them (see [`Journal::fill_window`]), each checked as its own read would be. The verified
//! bodies of the batch records it reads go to the store's cache of recent records, up to its
//! bound, so the reads that follow take their values from there (see [`super::values`]).

use crate::sync::atomic::Ordering;
use std::cell::RefCell;

use super::format::Frame;
use super::format::{
    self, FRAME_LEN, Item, JournalOp, Loc, RecordKind, decode_base_part_head, decode_body_head,
    loc_offset, loc_segment,
};
use super::journal::{Journal, RecordStart, Window};
use super::partition::{self, Chain, CommitState, Index, PartState};
use super::values::{RECENT_BODY_MAX, RECENT_BYTES, RecentRecords};
use crate::error::{Error, Result};

/// Bytes of index entries per base record. A partition whose index is larger gets a base run
/// of several records, so a base of any size fits the record frame and a load holds one part at
/// a time.
pub const BASE_PART_BYTES: usize = 8 << 20;

/// Records of a walked chain whose room a thread keeps for its next load: a chain at the
/// default base interval (64 records) fits.
const CHAIN_ROOM: usize = 64;

/// Writes the partition's base: one record, or a run of parts of at most [`BASE_PART_BYTES`]
/// each; packed (format version 3) unless `packed` is false (the tests that write version 2
/// records, to check they are still read). The caller holds the partition's `commit` lock, so
/// nothing of the partition is appended between the parts. On error nothing is promised: a
/// partial run is passed over by loads.
pub fn write_base(
    journal: &Journal,
    state: &PartState,
    commit: &mut CommitState,
    index: &Index,
    packed: bool,
) -> Result<Vec<(u32, u64)>> {
    let name = state.name.as_bytes();
    let head_len = if packed {
        format::packed_head_len(name)
    } else {
        format::base_head_len(name)
    };
    // Entries per record, planned first so every part can say how many there are (a packed
    // entry by the most it can take).
    let mut plan: Vec<usize> = Vec::new();
    let (mut bytes, mut count) = (head_len, 0usize);
    for key in index.keys() {
        let len = if packed {
            format::packed_entry_max(key)
        } else {
            format::base_entry_len(key)
        };
        if count > 0 && bytes + len > BASE_PART_BYTES {
            plan.push(count);
            (bytes, count) = (head_len + 8, 0);
        }
        bytes += len;
        count += 1;
    }
    plan.push(count);
    if plan.len() > 1 {
        log::debug!(
            "partition {}: base of {} keys written as {} records",
            state.name,
            index.len(),
            plan.len()
        );
    }
    // The records written, so the chain knows them even if a later part fails.
    let mut written: Vec<(Loc, u64)> = Vec::with_capacity(plan.len());
    let appended = append_base(journal, state, &plan, index, packed, &mut written);
    if let Err(e) = appended {
        // A run cut short is in the chain now (loads pass over it).
        for &(at, bytes) in &written {
            commit.chain.push(at, bytes);
        }
        return Err(e);
    }
    Ok(commit.chain.restart(&written))
}

/// Appends the base's records as `plan` says, each one's location and length into `written`.
fn append_base(
    journal: &Journal,
    state: &PartState,
    plan: &[usize],
    index: &Index,
    packed: bool,
    written: &mut Vec<(Loc, u64)>,
) -> Result<()> {
    let name = state.name.as_bytes();
    let mut entries = index.iter();
    let place_head = |lsn, at| state.place_head(lsn, at);
    if plan.len() == 1 {
        let prev = partition::head_of(state);
        let (kind, body) = if packed {
            let body = format::encode_packed_base_body(name, prev, None, entries);
            (RecordKind::PackedBase, body)
        } else {
            (
                RecordKind::Base,
                format::encode_base_body(name, prev, entries),
            )
        };
        let (_, at) = journal.append(kind, state.hash, &body, place_head)?;
        written.push((at, (FRAME_LEN + body.len()) as u64));
    } else {
        let parts = plan.len() as u32;
        for (part, &n) in plan.iter().enumerate() {
            let (prev, slice) = (partition::head_of(state), entries.by_ref().take(n));
            let (kind, body) = if packed {
                let place = Some((part as u32, parts));
                let body = format::encode_packed_base_body(name, prev, place, slice);
                (RecordKind::PackedBasePart, body)
            } else {
                let body = format::encode_base_part_body(name, prev, part as u32, parts, slice);
                (RecordKind::BasePart, body)
            };
            let (_, at) = journal.append(kind, state.hash, &body, place_head)?;
            written.push((at, (FRAME_LEN + body.len()) as u64));
        }
    }
    Ok(())
}

enum Link {
    /// A small record, read whole and verified during the walk, decoded when it is applied
    /// (so no decoded form is held between the walk and the forward pass); and whether its
    /// body then goes to the cache of recent records.
    Whole(Loc, RecordKind, Vec<u8>, bool),
    /// A larger record, read (whole, verified) when it is applied: the rest of it after the
    /// start the walk read and kept, or all of it again.
    Reread(Loc, Option<(Frame, Vec<u8>)>),
}

/// What a walk reuses from one load to the next.
#[derive(Default)]
struct WalkBuffers {
    /// The buffer of the records' first reads: allocated and zero-filled once per thread, not
    /// once per load. Bounded: a first read asks for at most one speculative read (4 KiB).
    scratch: Vec<u8>,
    /// The walked chain, newest first (empty between loads).
    links: Vec<Link>,
    /// The first-read size the last load's head record called for (its length with room to
    /// spare; 0: no load yet). A store's partitions tend to be alike, so the next load asks
    /// for that much for its own head: not 4 KiB for a record of a few hundred bytes. A head
    /// longer than that is read on with a second read, as any record longer than its guess.
    head_guess: usize,
    /// Bytes before a record read in one go, when its chain link points close before it, for
    /// the records there (see [`Journal::fill_window`]). Bounded: one window of 64 KiB,
    /// allocated once per thread.
    window: Window,
}

thread_local! {
    /// Kept per thread, so loads on different threads do not contend for them.
    static WALK_BUFFERS: RefCell<WalkBuffers> = RefCell::new(WalkBuffers::default());
}

/// Builds a partition's index by walking its chain back from `head` to its newest complete base
/// (or the chain's start), then applying forward. Reads only this partition's recent records:
/// the walk is bounded by the base interval, not by history (SPEC S5, S8).
///
/// Returns the index and the chain since the base: its length (a base run counts once) and
/// the bytes of every record the walk read, besides their values.
pub fn load_index(
    journal: &Journal,
    recent: &RecentRecords,
    state: &PartState,
    head: Loc,
) -> Result<(Index, Chain)> {
    // Taken out of their slot while the load runs (a load inside it would get fresh ones),
    // and put back whatever the load's outcome.
    let mut buffers = WALK_BUFFERS.try_with(|b| b.take()).unwrap_or_default();
    let loaded = walk_and_apply(journal, recent, state, head, &mut buffers);
    buffers.links.clear();
    // A chain far longer than the usual one (a large base interval) does not keep its room.
    buffers.links.shrink_to(CHAIN_ROOM);
    let _ = WALK_BUFFERS.try_with(|b| b.replace(buffers));
    loaded
}

fn walk_and_apply(
    journal: &Journal,
    recent: &RecentRecords,
    state: &PartState,
    head: Loc,
    buffers: &mut WalkBuffers,
) -> Result<(Index, Chain)> {
    let WalkBuffers {
        scratch,
        links,
        head_guess,
        window,
    } = buffers;
    // A window left by the load before describes bytes that are still there, but it is not
    // this walk's: start empty.
    window.clear();
    let corrupt = |at: Loc, what: &str| {
        state.corrupt_error(&format!(
            "{what} (record at segment {} offset {})",
            loc_segment(at),
            loc_offset(at)
        ))
    };
    let mut chain_len = 0u32;
    let mut chain = Chain::default();
    // While inside a complete base run: the part expected next (walking back) and the run size.
    let mut run: Option<(u32, u32)> = None;
    let mut at = head;
    // The record read last (0: none yet), whose chain link is `at`.
    let mut after = 0;
    // Bytes of the bodies of the batch records read, kept for the reads that follow the load.
    let mut warm_bytes = 0usize;
    // Bytes of the starts of larger records kept for the forward pass (bounded: past it they
    // are read again).
    let mut kept_starts = 0usize;
    // The size to ask for in a record's first read (into `scratch`): the last record's, with
    // room to spare (a partition's records tend to be alike), so small records are not read
    // 4 KiB at a time.
    let mut guess = match *head_guess {
        0 => usize::MAX,
        g => g,
    };
    loop {
        if at == 0 {
            if run.is_some() {
                return Err(corrupt(head, "a base run misses its first parts"));
            }
            break;
        }
        if after != 0 && !window.holds(at) {
            journal.fill_window(after, at, window);
        }
        after = at;
        let start = match journal.record_in_window(at, window) {
            Some(start) => start,
            None => journal.read_record_start_in(at, guess, scratch),
        };
        let start = start.map_err(|e| match e {
            Error::Corrupt { detail, what } => state.corrupt_error(&format!("{what}: {detail}")),
            other => other,
        })?;
        let (frame, bytes, whole) = match start {
            RecordStart::Whole(frame, body) => (frame, body, true),
            RecordStart::Partial(frame, start) => (frame, start, false),
        };
        let len = FRAME_LEN + frame.body_len as usize;
        guess = len.saturating_add(len / 2).next_power_of_two();
        if at == head {
            *head_guess = guess;
        }
        if frame.partition_hash != state.hash {
            return Err(corrupt(at, "a chain link belongs to another partition"));
        }
        let Some((name, prev)) = decode_body_head(&bytes) else {
            return Err(corrupt(at, "a record in its chain is malformed"));
        };
        if name != state.name.as_bytes() {
            return Err(corrupt(at, "a record in its chain names another partition"));
        }
        // Chains only point backwards; anything else is damage, and would loop.
        if !frame.kind.is_base() && prev >= at {
            return Err(corrupt(at, "a chain link points forwards"));
        }
        let mut link = |bytes: Vec<u8>, warm: bool| -> Link {
            if !whole {
                let keep = kept_starts + bytes.len() <= RECENT_BYTES;
                if keep {
                    kept_starts += bytes.len();
                }
                return Link::Reread(at, keep.then_some((frame, bytes)));
            }
            Link::Whole(at, frame.kind, bytes, warm)
        };
        match (frame.kind, run) {
            (RecordKind::Batch, None) => {
                // Its values may be read next: its verified body goes to the cache once it is
                // applied (moved, not copied).
                let warm = whole && warm_bytes + bytes.len() <= RECENT_BYTES;
                if warm {
                    warm_bytes += bytes.len();
                }
                links.push(link(bytes, warm));
                chain_len += 1;
                at = prev;
            }
            (RecordKind::Base | RecordKind::PackedBase, None) => {
                links.push(link(bytes, false));
                chain_len += 1;
                break;
            }
            (RecordKind::Values, None) => {
                // Compaction's copies whose base never followed (a crash or a failed write
                // came between): they restate values the records before them hold, so they
                // carry nothing. Verified, since the walk follows its link.
                if !whole {
                    verify_passed_over(journal, state, at)?;
                }
                chain.note(at, len as u64);
                chain_len += 1;
                at = prev;
            }
            (RecordKind::BasePart | RecordKind::PackedBasePart, _) => {
                let Some((part, parts)) = decode_base_part_head(&bytes) else {
                    return Err(corrupt(at, "a base part in its chain is malformed"));
                };
                match run {
                    Some((expected, n)) if (part, parts) != (expected, n) => {
                        return Err(corrupt(at, "a base run has a part out of place"));
                    }
                    None if part + 1 != parts => {
                        // A run cut short (by a crash or a failed write): its parts carry
                        // nothing. Verified, since the walk follows its link.
                        if !whole {
                            verify_passed_over(journal, state, at)?;
                        }
                        chain.note(at, len as u64);
                        chain_len += 1;
                        at = prev;
                        continue;
                    }
                    _ => {}
                }
                links.push(link(bytes, false));
                if part == 0 {
                    chain_len += 1;
                    break;
                }
                run = Some((part - 1, parts));
                at = prev;
            }
            (_, Some(_)) => return Err(corrupt(at, "a base run is interrupted")),
        }
    }

    let mut index = Index::new();
    // The bodies of the batch records read, for the reads that follow the load.
    let mut warm = Vec::with_capacity(links.len());
    for link in links.drain(..).rev() {
        match link {
            Link::Whole(at, kind, body, keep) => {
                let values = apply(&mut index, state, kind, &body, at)?;
                chain.note(at, (FRAME_LEN + body.len()) as u64 - values);
                if keep {
                    warm.push((at + FRAME_LEN as u64, body.into_boxed_slice()));
                }
            }
            Link::Reread(at, start) => {
                let read = match start {
                    Some((frame, start)) => journal.finish_record(at, frame, start),
                    None => journal.read_record(at),
                };
                let (frame, body) = read.map_err(|e| match e {
                    Error::Corrupt { detail, what } => {
                        state.corrupt_error(&format!("{what}: {detail}"))
                    }
                    other => other,
                })?;
                let values = apply(&mut index, state, frame.kind, &body, at)?;
                chain.note(at, (FRAME_LEN + body.len()) as u64 - values);
                // Its values are read next: keep the verified body too, so they are not read
                // from the file a second time (moved, not copied).
                if frame.kind == RecordKind::Batch
                    && body.len() <= RECENT_BODY_MAX
                    && warm_bytes + body.len() <= RECENT_BYTES
                {
                    warm_bytes += body.len();
                    warm.push((at + FRAME_LEN as u64, body.into_boxed_slice()));
                }
            }
        }
    }
    // Reads look in the cache only if this load put bodies there (a chain that is one base,
    // as compaction leaves it, puts none).
    state.warm.store(!warm.is_empty(), Ordering::Relaxed);
    recent.insert_many(warm);
    // Held until the partition is unloaded: no room left over from growing it.
    index.shrink_to_fit();
    chain.len = chain_len;
    Ok((index, chain))
}

/// Reads a record the walk passes over whole, to verify the link it follows.
fn verify_passed_over(journal: &Journal, state: &PartState, at: Loc) -> Result<()> {
    journal.read_record(at).map(|_| ()).map_err(|e| match e {
        Error::Corrupt { detail, what } => state.corrupt_error(&format!("{what}: {detail}")),
        other => other,
    })
}

/// Applies a verified record of the partition to the index being built, as it is decoded (no
/// list of its operations or entries is made, and keys go from the body straight into the
/// index's arena); values stay on disk. The record's body starts after `at`. On an error the
/// index holds part of the record: the load fails and drops it. Returns the bytes of the
/// values the record puts.
fn apply(
    index: &mut Index,
    state: &PartState,
    kind: RecordKind,
    body: &[u8],
    at: Loc,
) -> Result<u64> {
    let mut values = 0u64;
    let head = format::visit_body(kind, body, |item| match item {
        // A base's entries come in key order: into an empty index (the usual case) each one
        // is appended to the index's arena, so room for all of them is made at once.
        Item::Entries { count, key_bytes } => index.reserve(count, key_bytes),
        Item::Entry(key, loc) => {
            index.insert(key, loc);
        }
        Item::Op(op) => {
            if let JournalOp::Put(_, _, len) = op {
                values += len as u64;
            }
            let op = partition::journal_op_to_index(at, body, op);
            partition::apply_to_index(index, [op], |_, _| {});
        }
    })
    .map_err(|_| state.corrupt_error("a record in its chain is malformed"))?;
    if head.partition != state.name.as_bytes() {
        return Err(state.corrupt_error("a record in its chain names another partition"));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use crate::sync::atomic::Ordering;
    use std::path::Path;

    use crate::store::{Batch, FileStore, Partition, Store};

    /// Writes `batches` small batches to `p` with a base every `base_every` records, reopens,
    /// loads `p` without reading a value, and tells whether the load marked it warm.
    fn warm_after_load(dir: &Path, p: &Partition, batches: u32, base_every: u32) -> bool {
        let store = FileStore::builder(dir)
            .base_every_records(base_every)
            .open()
            .unwrap();
        for i in 0..batches {
            let b = Batch::new().put(format!("k{i}").into_bytes(), b"v".to_vec());
            assert!(store.apply(p, &b).unwrap().is_committed());
        }
        store.close().unwrap();
        let store = FileStore::builder(dir).open().unwrap();
        let state = store.inner.readable(p).unwrap().unwrap();
        let warm = state.warm.load(Ordering::Relaxed);
        store.close().unwrap();
        warm
    }

    #[test]
    fn a_walk_reads_records_longer_than_the_ones_before_them_whole() {
        // Each record's first read is sized by the record before it in the walk (newest
        // first): a record longer than that, within one speculative read or beyond it, and a
        // short one after a long one are all read whole and applied.
        let p = Partition::new("p").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let lens = [10usize, 3_000, 10, 20_000, 10, 10, 600, 10, 4_000, 10];
        let store = FileStore::builder(dir.path())
            .base_every_records(1_000)
            .open()
            .unwrap();
        for (i, &len) in lens.iter().enumerate() {
            let b = Batch::new().put(format!("k{i}").into_bytes(), vec![i as u8; len]);
            assert!(store.apply(&p, &b).unwrap().is_committed());
        }
        store.close().unwrap();
        let store = FileStore::builder(dir.path()).open().unwrap();
        for (i, &len) in lens.iter().enumerate().rev() {
            let got = store.get(&p, format!("k{i}").as_bytes()).unwrap();
            assert_eq!(got, Some(vec![i as u8; len]), "key {i}");
        }
        store.close().unwrap();
    }

    #[test]
    fn a_head_longer_than_the_last_loads_head_is_read_whole() {
        // The first read of a head is sized by the head of the load before it on the thread:
        // heads longer than that, within one speculative read or beyond it, are read on.
        let dir = tempfile::tempdir().unwrap();
        let heads = [10usize, 3_000, 10, 20_000, 10];
        let parts: Vec<Partition> = (0..heads.len())
            .map(|i| Partition::new(format!("p{i}")).unwrap())
            .collect();
        let store = FileStore::builder(dir.path())
            .base_every_records(1_000)
            .open()
            .unwrap();
        for (p, &len) in parts.iter().zip(&heads) {
            for (key, len) in [(b"a", 10), (b"h", len)] {
                let b = Batch::new().put(key.to_vec(), vec![len as u8; len]);
                assert!(store.apply(p, &b).unwrap().is_committed());
            }
        }
        store.close().unwrap();
        let store = FileStore::builder(dir.path()).open().unwrap();
        for (p, &len) in parts.iter().zip(&heads) {
            assert_eq!(store.get(p, b"h").unwrap(), Some(vec![len as u8; len]));
            assert_eq!(store.get(p, b"a").unwrap(), Some(vec![10u8; 10]));
        }
        store.close().unwrap();
    }

    #[test]
    fn only_a_load_that_cached_bodies_marks_its_partition_warm() {
        let p = Partition::new("p").unwrap();
        // A chain of small batch records: the load keeps their bodies for the reads after it.
        let dir = tempfile::tempdir().unwrap();
        assert!(warm_after_load(dir.path(), &p, 3, 1_000));
        // A chain that is one base: nothing cached, so reads do not look in the cache.
        let dir = tempfile::tempdir().unwrap();
        assert!(!warm_after_load(dir.path(), &p, 2, 2));
    }
}
