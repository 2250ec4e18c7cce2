//! Reading values by location with few reads (SPEC S1, S5, S8).
//!
//! Owns two things: merging the reads of many values (a scan page, a `get_many`, a copy made by
//! compaction) into as few reads as possible, and a small, bounded cache of record bodies read
//! whole during a chain walk, so the first reads after a load take their values from the bytes
//! the load has just read instead of reading them again.
//!
//! Merging: every value of a request is read into one buffer (no buffer per value), sized once for
//! all of the request's reads; the locations are sorted; values in one segment that lie at most
//! [`MERGE_GAP`] bytes apart are read with one read spanning at most [`MERGE_SPAN`] bytes, and each
//! value is cut out of it. Every value still passes its own checksum, and damage still answers
//! `Corrupt` naming the partition, the segment and the value's offset: a merged read that fails is
//! retried value by value, so the error names the value it concerns (SPEC S4).
//!
//! The cache holds only bodies whose checksum passed when they were read, keyed by location.
//! A location's bytes never change while its segment exists (the journal's tail only moves
//! forwards and segment numbers are never reused), so a cached body is never stale. A page lends
//! a value straight from the cached body ([`ReadValues`]), without a copy and without a second
//! checksum (those bytes passed their record's when read); a single value taken from it
//! ([`RecentRecords::value`]) is checked against its own checksum like any other.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::sync::RwLock;

use super::format::{Loc, ValueLoc, loc_segment};
use super::journal::{Journal, value_damage};
use crate::error::{Error, Result};

/// Bytes of unneeded journal a merged read may span between two values.
pub const MERGE_GAP: u64 = 4 << 10;
/// Most bytes one merged read covers.
pub const MERGE_SPAN: u64 = 256 << 10;
/// Bytes the cache of recent records holds at most, bodies and bookkeeping: a load's worth of
/// a chain of a few dozen records of a few KiB, or one batch of 16 values of 4 KiB, so the
/// reads that follow a load find their values there.
pub const RECENT_BYTES: usize = 128 << 10;
/// Largest record body the cache takes.
pub const RECENT_BODY_MAX: usize = RECENT_BYTES / 4 * 3;
/// Bytes counted for each cached body besides its own: its place in the map and the
/// eviction order, and the shared handle pages lend it through.
const ENTRY_COST: usize = 64;

/// Record bodies read recently by chain walks, oldest dropped first; at most
/// [`RECENT_BYTES`], bodies and bookkeeping.
#[derive(Default)]
pub struct RecentRecords {
    inner: RwLock<Recent>,
}

#[derive(Default)]
struct Recent {
    /// Body start to body bytes (shared with the pages that lend values out of them).
    bodies: BTreeMap<Loc, Arc<Box<[u8]>>>,
    /// Insertion order, for eviction.
    order: VecDeque<Loc>,
    bytes: usize,
}

impl RecentRecords {
    /// Remembers a verified record body that starts at `body_at`.
    #[cfg(test)]
    pub fn insert(&self, body_at: Loc, body: &[u8]) {
        self.insert_many(vec![(body_at, Box::from(body))]);
    }

    /// Remembers verified record bodies (body start, bytes), under one lock.
    pub fn insert_many(&self, bodies: Vec<(Loc, Box<[u8]>)>) {
        if bodies.is_empty() {
            return;
        }
        let mut recent = self.inner.write();
        for (body_at, body) in bodies {
            if body.is_empty() || body.len() > RECENT_BODY_MAX {
                continue;
            }
            if recent.bodies.contains_key(&body_at) {
                continue;
            }
            let cost = body.len() + ENTRY_COST;
            while recent.bytes + cost > RECENT_BYTES {
                let Some(oldest) = recent.order.pop_front() else {
                    break;
                };
                if let Some(dropped) = recent.bodies.remove(&oldest) {
                    recent.bytes -= dropped.len() + ENTRY_COST;
                }
            }
            recent.bytes += cost;
            recent.bodies.insert(body_at, Arc::new(body));
            recent.order.push_back(body_at);
        }
    }

    /// The value at `v` if a remembered body holds all of it and it passes its checksum.
    pub fn value(&self, v: &ValueLoc, check: bool) -> Option<Vec<u8>> {
        let recent = self.inner.read();
        let (body, from) = recent.find(v)?;
        let bytes = &body[from..from + v.len as usize];
        if check && crc32c::crc32c(bytes) != v.crc {
            // Read it from disk instead, where damage is reported as such.
            return None;
        }
        Some(bytes.to_vec())
    }

    /// Bytes of bodies held now.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.inner.read().bytes
    }
}

impl Recent {
    /// The remembered body that holds all of the value at `v`, and where the value starts in it.
    fn find(&self, v: &ValueLoc) -> Option<(&Arc<Box<[u8]>>, usize)> {
        let (&start, body) = self.bodies.range(..=v.at).next_back()?;
        if loc_segment(start) != loc_segment(v.at) {
            return None;
        }
        let from = (v.at - start) as usize;
        body.get(from..from.checked_add(v.len as usize)?)?;
        Some((body, from))
    }
}

/// Values read by [`read_into`], without a buffer per value: value `i` is [`ReadValues::get`]
/// of `i`, lent from one buffer of bytes read for the request or from a body of the cache.
///
/// Reusable: [`ReadValues::clear`] empties it and keeps its buffers, and the bytes buffer keeps
/// the bytes it was once zeroed to, so the next request's reads overwrite them and only bytes
/// past the most it ever held are zero-filled (no `unsafe`, so no reading into uninitialised
/// capacity).
#[derive(Default)]
pub struct ReadValues {
    /// Bytes read from the files for this request, values end to end, in `bytes[..used]`;
    /// what lies past `used` is left from earlier requests, kept only so it is not zeroed again.
    bytes: Vec<u8>,
    used: usize,
    /// Cached bodies values are lent from (each once, in the order first used).
    bodies: Vec<Arc<Box<[u8]>>>,
    spans: Vec<Span>,
    /// The values still to read, by location (scratch of [`read_into`], kept for reuse).
    todo: Vec<usize>,
}

#[derive(Clone, Copy)]
struct Span {
    /// An index into `bodies`, or [`Span::READ`] for `bytes`.
    body: usize,
    start: usize,
    len: usize,
}

impl Span {
    const READ: usize = usize::MAX;
    const UNREAD: Span = Span {
        body: Self::READ,
        start: usize::MAX,
        len: 0,
    };
}

impl ReadValues {
    /// Value `i`'s bytes.
    pub fn get(&self, i: usize) -> &[u8] {
        let s = self.spans[i];
        let from = match s.body {
            Span::READ => &self.bytes[..],
            body => &self.bodies[body][..],
        };
        &from[s.start..s.start + s.len]
    }

    /// How many values there are.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Empties it for another request, keeping its buffers; lets go of the cached bodies it
    /// lent from, so a kept `ReadValues` never holds the cache's memory.
    pub fn clear(&mut self) {
        self.used = 0;
        self.bodies.clear();
        self.spans.clear();
        self.todo.clear();
    }

    /// Bytes of memory its buffers hold (their capacities).
    pub fn held(&self) -> usize {
        self.bytes.capacity()
            + self.bodies.capacity() * std::mem::size_of::<Arc<Box<[u8]>>>()
            + self.spans.capacity() * std::mem::size_of::<Span>()
            + self.todo.capacity() * std::mem::size_of::<usize>()
    }

    /// Takes the next `len` bytes of the buffer for a read; returns where they start. Only
    /// bytes the buffer never held are zero-filled.
    fn grow(&mut self, len: usize) -> usize {
        let at = self.used;
        self.used += len;
        if self.bytes.len() < self.used {
            self.bytes.resize(self.used, 0);
        }
        at
    }
}

/// Reads the values at `locs` (in any order; answers in the same order) into `out` (emptied
/// first, its buffers reused), taking those the cache holds from it (when given) and merging
/// the reads of the others; returns how many came from the cache.
///
/// Each value's bytes are checksummed once per read, as they arrive from a merged or a lone
/// read. A value the cache holds is lent from the cached body without a copy and without a
/// second checksum: the body passed its record's checksum when the load read it, and the
/// value's own checksum was taken from those same bytes (a location's bytes never change).
/// `check: false` skips the checksum of values cut out of a merged read (a test's negative
/// control only).
pub fn read_into(
    journal: &Journal,
    recent: Option<&RecentRecords>,
    locs: &[ValueLoc],
    partition: &dyn std::fmt::Display,
    check: bool,
    out: &mut ReadValues,
) -> Result<usize> {
    out.clear();
    out.spans.resize(locs.len(), Span::UNREAD);
    let mut from_recent = 0;
    if let Some(recent) = recent {
        // One lock for the whole request, not one per value.
        let cache = recent.inner.read();
        for (i, v) in locs.iter().enumerate() {
            if let Some((body, start)) = cache.find(v) {
                if !out
                    .bodies
                    .last()
                    .is_some_and(|last| Arc::ptr_eq(last, body))
                {
                    out.bodies.push(Arc::clone(body));
                }
                out.spans[i] = Span {
                    body: out.bodies.len() - 1,
                    start,
                    len: v.len as usize,
                };
                from_recent += 1;
            }
        }
    }
    let mut todo = std::mem::take(&mut out.todo);
    todo.extend((0..locs.len()).filter(|&i| out.spans[i].start == usize::MAX));
    todo.sort_unstable_by_key(|&i| locs[i].at);
    // The buffer is sized once for every read of the request: grown read by read, it would be
    // moved (copying what was already read) each time it doubled.
    let need = buffer_bytes(locs, &todo);
    if out.bytes.len() < need {
        out.bytes.reserve_exact(need - out.bytes.len());
    }
    let read = read_runs(journal, locs, &todo, partition, check, out);
    out.todo = todo;
    read?;
    Ok(from_recent)
}

/// The reads of [`read_into`] (`todo` sorted by location).
fn read_runs(
    journal: &Journal,
    locs: &[ValueLoc],
    todo: &[usize],
    partition: &dyn std::fmt::Display,
    check: bool,
    out: &mut ReadValues,
) -> Result<()> {
    for r in merged_runs(locs, todo) {
        let run = &todo[r.first..r.last];
        if run.len() == 1 {
            let v = &locs[run[0]];
            let at = read_one(journal, v, partition, out)?;
            out.spans[run[0]] = Span::read(at, v);
        } else {
            read_run(journal, locs, run, r.start, r.end, partition, check, out)?;
        }
    }
    Ok(())
}

/// One read of [`read_into`]: the values `todo[first..last]`, which lie in `start..end`.
struct Run {
    first: usize,
    last: usize,
    start: Loc,
    end: Loc,
}

/// The most bytes the buffer of [`read_into`] holds while it reads the values of `todo`: each
/// read's span on top of what the reads before it kept (their spans, or only their values
/// where gaps were closed: see [`read_run`]), so sizing it once takes no more memory than
/// growing it would.
fn buffer_bytes(locs: &[ValueLoc], todo: &[usize]) -> usize {
    let (mut kept, mut most) = (0usize, 0usize);
    for r in merged_runs(locs, todo) {
        let span = (r.end - r.start) as usize;
        most = most.max(kept + span);
        let values: usize = todo[r.first..r.last]
            .iter()
            .map(|&i| locs[i].len as usize)
            .sum();
        kept += if r.last - r.first > 1 && span > 2 * values {
            values
        } else {
            span
        };
    }
    most
}

/// The reads that take the values of `todo` (indexes into `locs`, sorted by location): values
/// of one segment at most [`MERGE_GAP`] apart, spanning at most [`MERGE_SPAN`], go together.
fn merged_runs<'a>(locs: &'a [ValueLoc], todo: &'a [usize]) -> impl Iterator<Item = Run> + 'a {
    let mut first = 0;
    std::iter::from_fn(move || {
        let v = &locs[*todo.get(first)?];
        let (start, mut end) = (v.at, v.at + v.len as u64);
        let mut last = first + 1;
        while let Some(&i) = todo.get(last) {
            let v = &locs[i];
            let v_end = v.at + v.len as u64;
            let joins = loc_segment(v.at) == loc_segment(start)
                && v.at <= end + MERGE_GAP
                && v_end.max(end) - start <= MERGE_SPAN;
            if !joins {
                break;
            }
            end = end.max(v_end);
            last += 1;
        }
        let run = Run {
            first,
            last,
            start,
            end,
        };
        first = last;
        Some(run)
    })
}

impl Span {
    fn read(start: usize, v: &ValueLoc) -> Span {
        Span {
            body: Span::READ,
            start,
            len: v.len as usize,
        }
    }
}

/// Reads one value onto the end of the bytes of `out` and verifies its checksum (always, like
/// [`Journal::read_value`], whose damage answers it gives); returns where it starts.
fn read_one(
    journal: &Journal,
    v: &ValueLoc,
    partition: &dyn std::fmt::Display,
    out: &mut ReadValues,
) -> Result<usize> {
    let at = out.grow(v.len as usize);
    let bytes = &mut out.bytes[at..out.used];
    let damaged = |detail: &str| value_damage(v, partition, detail);
    match journal.read_at(v.at, bytes) {
        Ok(()) => {}
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(damaged("the segment ends before it (truncated)"));
        }
        Err(Error::Corrupt { detail, .. }) => return Err(damaged(&detail)),
        Err(e) => return Err(e),
    }
    if crc32c::crc32c(bytes) != v.crc {
        return Err(damaged("failed its checksum"));
    }
    Ok(at)
}

/// Reads `start..end` once onto the end of the request's bytes and notes where each value of
/// `run` lies in it; a failed read is retried value by value, so an error names the value it
/// concerns.
#[allow(clippy::too_many_arguments)]
fn read_run(
    journal: &Journal,
    locs: &[ValueLoc],
    run: &[usize],
    start: Loc,
    end: Loc,
    partition: &dyn std::fmt::Display,
    check: bool,
    out: &mut ReadValues,
) -> Result<()> {
    let base = out.grow((end - start) as usize);
    match journal.read_at(start, &mut out.bytes[base..out.used]) {
        Ok(()) => {}
        Err(Error::Io { .. } | Error::Corrupt { .. }) => {
            out.used = base;
            for &i in run {
                let at = read_one(journal, &locs[i], partition, out)?;
                out.spans[i] = Span::read(at, &locs[i]);
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    let mut value_bytes = 0;
    for &i in run {
        let v = &locs[i];
        let from = base + (v.at - start) as usize;
        if check && crc32c::crc32c(&out.bytes[from..from + v.len as usize]) != v.crc {
            return Err(value_damage(v, partition, "failed its checksum"));
        }
        out.spans[i] = Span::read(from, v);
        value_bytes += v.len as usize;
    }
    // Mostly gaps (values scattered among other records): keep only the values, so a page
    // holds its values and one merged read, not every read's gaps.
    if (end - start) as usize > 2 * value_bytes {
        close_gaps(locs, run, start, base, out);
    }
    Ok(())
}

/// Moves the values of a merged read (sorted by location) together over the gaps between
/// them. A run whose values overlap (the same value asked for twice) is left as read.
fn close_gaps(locs: &[ValueLoc], run: &[usize], start: Loc, base: usize, out: &mut ReadValues) {
    let disjoint = run
        .windows(2)
        .all(|w| locs[w[0]].at + locs[w[0]].len as u64 <= locs[w[1]].at);
    if !disjoint {
        return;
    }
    let mut to = base;
    for &i in run {
        let (from, len) = (base + (locs[i].at - start) as usize, locs[i].len as usize);
        out.bytes.copy_within(from..from + len, to);
        out.spans[i].start = to;
        to += len;
    }
    out.used = to;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::file::format::loc;

    fn value_loc(at: Loc, bytes: &[u8]) -> ValueLoc {
        ValueLoc {
            at,
            len: bytes.len() as u32,
            crc: crc32c::crc32c(bytes),
        }
    }

    /// The buffer sized up front is what growing it read by read would reach, not the sum of
    /// the reads' spans: a read that is mostly gaps keeps only its values (SPEC S8).
    #[test]
    fn the_read_buffer_is_sized_for_one_read_on_top_of_what_the_reads_before_keep() {
        let v = |segment: u32, offset: u64| ValueLoc {
            at: loc(segment, offset),
            len: 100,
            crc: 0,
        };
        // Three reads of two values 3,000 bytes apart (3,200 bytes each, 200 of values), then
        // one of two adjacent values, then a lone value in another segment.
        let locs = [
            v(1, 0),
            v(1, 3_100),
            v(1, 20_000),
            v(1, 23_100),
            v(1, 40_000),
            v(1, 43_100),
            v(1, 60_000),
            v(1, 60_100),
            v(2, 0),
        ];
        let todo: Vec<usize> = (0..locs.len()).collect();
        assert_eq!(merged_runs(&locs, &todo).count(), 5);
        // Each gapped read keeps its 200 bytes of values; the last gapped one needs its span on
        // top of the 400 kept before it.
        assert_eq!(buffer_bytes(&locs, &todo), 400 + 3_200);
        let adjacent = [v(1, 0), v(1, 100), v(2, 0), v(3, 0)];
        assert_eq!(buffer_bytes(&adjacent, &[0, 1, 2, 3]), 400);
    }

    #[test]
    fn the_cache_answers_values_inside_a_body_and_stays_within_its_bound() {
        let recent = RecentRecords::default();
        let body = b"0123456789".to_vec();
        recent.insert(loc(3, 100), &body);
        assert_eq!(
            recent.value(&value_loc(loc(3, 102), b"234"), true),
            Some(b"234".to_vec())
        );
        // Past the body's end, in another segment, or with the wrong checksum: not from here.
        assert_eq!(recent.value(&value_loc(loc(3, 108), b"89x"), true), None);
        assert_eq!(recent.value(&value_loc(loc(4, 102), b"234"), true), None);
        let wrong = ValueLoc {
            crc: 0,
            ..value_loc(loc(3, 102), b"234")
        };
        assert_eq!(recent.value(&wrong, true), None);
        for i in 0..1_000u64 {
            recent.insert(loc(5, i * 4096), &[7u8; 4000]);
            assert!(recent.bytes() <= RECENT_BYTES);
        }
        // Too large to keep.
        recent.insert(loc(6, 0), &vec![1u8; RECENT_BODY_MAX + 1]);
        assert_eq!(recent.value(&value_loc(loc(6, 0), &[1u8]), true), None);
    }
}
