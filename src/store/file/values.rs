//! Reading values by location with few reads (SPEC S1, S5, S8).
//!
//! Owns two things: merging the reads of many values (a scan page, a `get_many`, a copy made by
//! compaction) into as few reads as possible, and a small, bounded cache of record bodies read
//! whole during a chain walk, so the first reads after a load take their values from the bytes
//! the load has just read instead of reading them again.
//!
//! Merging: the locations are sorted; values in one segment that lie at most [`MERGE_GAP`]
//! bytes apart are read with one read spanning at most [`MERGE_SPAN`] bytes, and each value is
//! cut out of it. Every value still passes its own checksum, and damage still answers `Corrupt`
//! naming the partition, the segment and the value's offset: a merged read that fails is retried
//! value by value, so the error names the value it concerns (SPEC S4).
//!
//! The cache holds only bodies whose checksum passed when they were read, keyed by location.
//! A location's bytes never change while its segment exists (the journal's tail only moves
//! forwards and segment numbers are never reused), so a cached body is never stale; a value
//! taken from it is checked against its own checksum like any other.

use std::collections::{BTreeMap, VecDeque};

use parking_lot::RwLock;

use super::format::{Loc, ValueLoc, loc_segment};
use super::journal::{Journal, value_damage};
use crate::error::{Error, Result};

/// Bytes of unneeded journal a merged read may span between two values.
pub const MERGE_GAP: u64 = 4 << 10;
/// Most bytes one merged read covers.
pub const MERGE_SPAN: u64 = 256 << 10;
/// Bytes of record bodies the cache of recent records holds at most.
pub const RECENT_BYTES: usize = 64 << 10;
/// Largest record body the cache takes (a chain walk reads records up to this size whole).
pub const RECENT_BODY_MAX: usize = 4 << 10;

/// Record bodies read recently by chain walks, oldest dropped first; at most
/// [`RECENT_BYTES`] of bodies.
#[derive(Default)]
pub struct RecentRecords {
    inner: RwLock<Recent>,
}

#[derive(Default)]
struct Recent {
    /// Body start to body bytes.
    bodies: BTreeMap<Loc, Box<[u8]>>,
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
            while recent.bytes + body.len() > RECENT_BYTES {
                let Some(oldest) = recent.order.pop_front() else {
                    break;
                };
                if let Some(dropped) = recent.bodies.remove(&oldest) {
                    recent.bytes -= dropped.len();
                }
            }
            recent.bytes += body.len();
            recent.bodies.insert(body_at, body);
            recent.order.push_back(body_at);
        }
    }

    /// The value at `v` if a remembered body holds all of it and it passes its checksum.
    pub fn value(&self, v: &ValueLoc, check: bool) -> Option<Vec<u8>> {
        let recent = self.inner.read();
        let (&start, body) = recent.bodies.range(..=v.at).next_back()?;
        if loc_segment(start) != loc_segment(v.at) {
            return None;
        }
        let from = (v.at - start) as usize;
        let bytes = body.get(from..from.checked_add(v.len as usize)?)?;
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

/// Reads the values at `locs` (in any order, answers in the same order), taking those the
/// cache holds from it (when given) and merging the reads of the others; also returns how many
/// came from the cache. `check: false` skips the checksum of values cut out of a merged read or
/// the cache (a test's negative control only).
pub fn read_many(
    journal: &Journal,
    recent: Option<&RecentRecords>,
    locs: &[ValueLoc],
    partition: &dyn std::fmt::Display,
    check: bool,
) -> Result<(Vec<Vec<u8>>, usize)> {
    let mut out: Vec<Option<Vec<u8>>> = match recent {
        Some(recent) => locs.iter().map(|v| recent.value(v, check)).collect(),
        None => vec![None; locs.len()],
    };
    let mut todo: Vec<usize> = (0..locs.len()).filter(|&i| out[i].is_none()).collect();
    let from_recent = locs.len() - todo.len();
    todo.sort_by_key(|&i| locs[i].at);
    let mut run_start = 0;
    while run_start < todo.len() {
        let first = &locs[todo[run_start]];
        let (start, mut end) = (first.at, first.at + first.len as u64);
        let mut run_end = run_start + 1;
        while let Some(&i) = todo.get(run_end) {
            let v = &locs[i];
            let v_end = v.at + v.len as u64;
            let joins = loc_segment(v.at) == loc_segment(start)
                && v.at <= end + MERGE_GAP
                && v_end.max(end) - start <= MERGE_SPAN;
            if !joins {
                break;
            }
            end = end.max(v_end);
            run_end += 1;
        }
        let run = &todo[run_start..run_end];
        if run.len() == 1 {
            out[run[0]] = Some(journal.read_value(first, partition)?);
        } else {
            read_run(journal, locs, run, start, end, partition, check, &mut out)?;
        }
        run_start = run_end;
    }
    let values = out.into_iter().map(|v| v.unwrap_or_default()).collect();
    Ok((values, from_recent))
}

/// Reads `start..end` once and cuts out the values of `run`; a failed read is retried value by
/// value, so an error names the value it concerns.
#[allow(clippy::too_many_arguments)]
fn read_run(
    journal: &Journal,
    locs: &[ValueLoc],
    run: &[usize],
    start: Loc,
    end: Loc,
    partition: &dyn std::fmt::Display,
    check: bool,
    out: &mut [Option<Vec<u8>>],
) -> Result<()> {
    let mut buf = vec![0u8; (end - start) as usize];
    match journal.read_at(start, &mut buf) {
        Ok(()) => {}
        Err(Error::Io { .. } | Error::Corrupt { .. }) => {
            for &i in run {
                out[i] = Some(journal.read_value(&locs[i], partition)?);
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    for &i in run {
        let v = &locs[i];
        let from = (v.at - start) as usize;
        let bytes = &buf[from..from + v.len as usize];
        if check && crc32c::crc32c(bytes) != v.crc {
            return Err(value_damage(v, partition, "failed its checksum"));
        }
        out[i] = Some(bytes.to_vec());
    }
    Ok(())
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
