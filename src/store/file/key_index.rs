//! [`KeyIndex`]: one partition's map from keys to value locations, held in a few allocations
//! whatever its key count (SPEC S8).
//!
//! Owns the layout and its invariants; calls nothing else in the store. Keys live end to end in
//! one byte arena, in key order, with each key's end offset and value location in two parallel
//! vectors (the *run*). What the common cases do:
//! - a key greater than the run's last one (a log's next sequence number, a base record's
//!   entries, which come in key order) is appended to the end of the arena;
//! - overwriting a key of the run updates its location in place, and removing one marks it dead
//!   (a bit in its end offset), so a later insert of the same key revives it in place; removing
//!   the run's last keys truncates the run instead;
//! - a new key close to the run's end (at most [`SHIFT_KEYS`] keys after it) is put in place,
//!   the keys after it moving up;
//! - any other new key goes to a small ordered side map, disjoint from the run.
//!
//! When the side map and the dead keys together pass a quarter of the run, both are merged into
//! a new run in one pass. Every operation is thus O(log n) amortised (a merge costs O(n) after
//! at least n/4 operations), and reads and iteration merge the run with the side map.
//!
//! Offsets are `u32`, with the top bit for "dead": a run holds at most 2 GiB of key bytes. Keys
//! past that stay in the side map, which is correct, only slower (a partition that large does not
//! fit a sane memory budget anyway).

use std::collections::BTreeMap;
use std::collections::btree_map;
use std::ops::{Bound, Range, RangeBounds};

use super::format::ValueLoc;

/// The mark of a dead (removed) key in its end offset.
const DEAD: u32 = 1 << 31;
/// The most key bytes the run's arena holds (offsets below [`DEAD`]).
const ARENA_MAX: u32 = DEAD - 1;
/// Side map entries and dead keys always allowed before a merge, so small indexes are not
/// merged on every insert.
const MERGE_MIN: usize = 32;
/// A new key with at most this many keys, of at most [`SHIFT_BYTES`] in all, after it in the
/// run is put in the run in place (they move up), not in the side map: a bounded move, and a
/// small partition whose keys come a little out of order keeps no side map.
const SHIFT_KEYS: usize = 32;
const SHIFT_BYTES: usize = 4096;

/// A partition's keys and value locations, ordered by key (as bytes, like `[u8]`'s `Ord`).
#[derive(Clone, Debug)]
pub struct KeyIndex {
    /// The run's keys, end to end, in key order (dead ones too, until the next merge).
    arena: Vec<u8>,
    /// Where each run key ends in `arena` (it starts where the one before ends), with
    /// [`DEAD`] set if it was removed.
    ends: Vec<u32>,
    /// Each run key's value location (meaningless when dead).
    locs: Vec<ValueLoc>,
    /// Dead keys in the run.
    dead: usize,
    /// Keys not in the run (live only): inserted out of order since the last merge, or past
    /// the arena's limit.
    side: BTreeMap<Box<[u8]>, ValueLoc>,
    /// Side map entries the last merge left there (keys past the arena's limit): they do not
    /// count towards the next merge.
    side_kept: usize,
    /// The arena's limit ([`ARENA_MAX`]; lower in tests, to reach it).
    arena_max: u32,
    /// Merges so far, to test that they stay few.
    #[cfg(test)]
    merges: usize,
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex {
            arena: Vec::new(),
            ends: Vec::new(),
            locs: Vec::new(),
            dead: 0,
            side: BTreeMap::new(),
            side_kept: 0,
            arena_max: ARENA_MAX,
            #[cfg(test)]
            merges: 0,
        }
    }
}

impl KeyIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// An index whose arena holds at most `arena_max` bytes, to test what happens past it.
    #[cfg(test)]
    pub fn with_arena_max(arena_max: u32) -> Self {
        KeyIndex {
            arena_max: arena_max.min(ARENA_MAX),
            ..Self::default()
        }
    }

    /// Live keys.
    pub fn len(&self) -> usize {
        self.ends.len() - self.dead + self.side.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes room for `keys` more appended keys of `bytes` bytes in all.
    pub fn reserve(&mut self, keys: usize, bytes: usize) {
        self.arena.reserve(bytes);
        self.ends.reserve(keys);
        self.locs.reserve(keys);
    }

    /// Gives back the room reserved or grown beyond what the run holds.
    pub fn shrink_to_fit(&mut self) {
        self.arena.shrink_to_fit();
        self.ends.shrink_to_fit();
        self.locs.shrink_to_fit();
    }

    /// Key `i` of the run.
    fn key(&self, i: usize) -> &[u8] {
        &self.arena[self.start_of(i)..(self.ends[i] & !DEAD) as usize]
    }

    fn is_dead(&self, i: usize) -> bool {
        self.ends[i] & DEAD != 0
    }

    /// Where `key` is in the run: `Ok(i)` (live or dead), or `Err` where it would go.
    fn find(&self, key: &[u8]) -> Result<usize, usize> {
        match self.ends.len() {
            0 => Err(0),
            // Keys at or past the end (appends, and reads of the newest) cost one comparison.
            n => match key.cmp(self.key(n - 1)) {
                std::cmp::Ordering::Greater => Err(n),
                std::cmp::Ordering::Equal => Ok(n - 1),
                std::cmp::Ordering::Less => {
                    let at = self.partition_point(|k| k < key);
                    if at < n && self.key(at) == key {
                        Ok(at)
                    } else {
                        Err(at)
                    }
                }
            },
        }
    }

    /// The first run position whose key does not satisfy `before` (which holds for a prefix
    /// of the run).
    fn partition_point(&self, mut before: impl FnMut(&[u8]) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.ends.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if before(self.key(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub fn get(&self, key: &[u8]) -> Option<&ValueLoc> {
        match self.find(key) {
            Ok(i) if self.is_dead(i) => None,
            Ok(i) => Some(&self.locs[i]),
            Err(_) => self.side.get(key),
        }
    }

    #[cfg(test)]
    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut ValueLoc> {
        match self.find(key) {
            Ok(i) if self.is_dead(i) => None,
            Ok(i) => Some(&mut self.locs[i]),
            Err(_) => self.side.get_mut(key),
        }
    }

    /// Sets `key`'s location; returns the one it replaces.
    pub fn insert(&mut self, key: impl AsRef<[u8]>, loc: ValueLoc) -> Option<ValueLoc> {
        let key = key.as_ref();
        // The usual case (a log's next key, a base record's entries), in as few steps as can
        // be: past the run's last key, with no side map that could hold it.
        if self.side.is_empty()
            && self.fits(key)
            && self
                .ends
                .last()
                .is_none_or(|_| key > self.key(self.ends.len() - 1))
        {
            self.push(key, loc);
            return None;
        }
        match self.find(key) {
            Ok(i) if self.is_dead(i) => {
                self.ends[i] &= !DEAD;
                self.dead -= 1;
                self.locs[i] = loc;
                None
            }
            Ok(i) => Some(std::mem::replace(&mut self.locs[i], loc)),
            Err(at) => {
                // Not in the run, but the side map may hold it (inserted when it could not go
                // in the run, or past the arena's limit).
                if let Some(slot) = self.side.get_mut(key) {
                    return Some(std::mem::replace(slot, loc));
                }
                if at == self.ends.len() && self.fits(key) {
                    self.push(key, loc);
                    return None;
                }
                // Close to the end of the run: moving the keys after it costs less than a
                // side map entry (a log's head row, written after its first record).
                if self.ends.len() - at <= SHIFT_KEYS
                    && self.fits(key)
                    && self.arena.len() - self.start_of(at) <= SHIFT_BYTES
                {
                    self.insert_at(at, key, loc);
                    return None;
                }
                self.side.insert(Box::from(key), loc);
                self.maybe_merge();
                None
            }
        }
    }
    /// Appends `key`, which is past the run's last key and fits.
    #[inline]
    fn push(&mut self, key: &[u8], loc: ValueLoc) {
        self.arena.extend_from_slice(key);
        self.ends.push(self.arena.len() as u32);
        self.locs.push(loc);
    }

    /// Where run key `i` starts in the arena (the arena's end for `i` past the last key).
    fn start_of(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            (self.ends[i - 1] & !DEAD) as usize
        }
    }

    /// Puts `key`, which belongs at run position `at` and fits, there: the keys after it move
    /// up by its length.
    fn insert_at(&mut self, at: usize, key: &[u8], loc: ValueLoc) {
        let start = self.start_of(at);
        self.arena.extend_from_slice(key);
        self.arena[start..].rotate_right(key.len());
        // The offsets stay below DEAD (the arena fits), so the dead mark is kept.
        for end in &mut self.ends[at..] {
            *end += key.len() as u32;
        }
        self.ends.insert(at, (start + key.len()) as u32);
        self.locs.insert(at, loc);
    }

    /// Whether `key` can be appended to the arena.
    fn fits(&self, key: &[u8]) -> bool {
        self.arena.len() + key.len() <= self.arena_max as usize
    }

    /// Removes `key`; returns its location.
    pub fn remove(&mut self, key: &[u8]) -> Option<ValueLoc> {
        match self.find(key) {
            Ok(i) if self.is_dead(i) => None,
            Ok(i) => {
                let old = self.locs[i];
                self.kill(i);
                self.trim();
                self.maybe_merge();
                Some(old)
            }
            Err(_) => self.side.remove(key),
        }
    }

    fn kill(&mut self, i: usize) {
        self.ends[i] |= DEAD;
        self.dead += 1;
    }

    /// Drops dead keys from the end of the run (its arena shrinks with them).
    fn trim(&mut self) {
        while let Some(&end) = self.ends.last() {
            if end & DEAD == 0 {
                break;
            }
            self.ends.pop();
            self.locs.pop();
            self.dead -= 1;
            let start = self.ends.last().map_or(0, |e| e & !DEAD);
            self.arena.truncate(start as usize);
        }
    }

    /// Removes every key in `range`, calling `removed` with each key and its location, in key
    /// order within the run and within the side map.
    pub fn remove_range(
        &mut self,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        mut removed: impl FnMut(&[u8], ValueLoc),
    ) {
        let run = self.run_range(range);
        for i in run {
            if !self.is_dead(i) {
                removed(self.key(i), self.locs[i]);
                self.kill(i);
            }
        }
        if valid_range(range) {
            let doomed: Vec<Box<[u8]>> = self
                .side
                .range::<[u8], _>(range)
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                if let Some(loc) = self.side.remove(&k) {
                    removed(&k, loc);
                }
            }
        }
        self.trim();
        self.maybe_merge();
    }

    /// Run positions of the keys in `range`.
    fn run_range(&self, (start, end): (Bound<&[u8]>, Bound<&[u8]>)) -> Range<usize> {
        let lo = match start {
            Bound::Included(s) => self.partition_point(|k| k < s),
            Bound::Excluded(s) => self.partition_point(|k| k <= s),
            Bound::Unbounded => 0,
        };
        let hi = match end {
            Bound::Included(e) => self.partition_point(|k| k <= e),
            Bound::Excluded(e) => self.partition_point(|k| k < e),
            Bound::Unbounded => self.ends.len(),
        };
        lo..hi.max(lo)
    }

    /// Merges the side map and drops dead keys once they are a large enough share of the run
    /// that the O(n) pass costs O(1) per operation since the last one.
    fn maybe_merge(&mut self) {
        let waiting = self.side.len().saturating_sub(self.side_kept) + self.dead;
        if waiting > MERGE_MIN.max((self.ends.len() + self.side_kept) / 4) {
            self.merge();
        }
    }

    /// Rebuilds the run from its live keys and the side map's, in key order; keys past the
    /// arena's limit stay in the side map.
    fn merge(&mut self) {
        let live = self.ends.len() - self.dead;
        let bytes = self.arena.len() + self.side.keys().map(|k| k.len()).sum::<usize>();
        let mut next = KeyIndex {
            arena: Vec::with_capacity(bytes.min(self.arena_max as usize)),
            ends: Vec::with_capacity(live + self.side.len()),
            locs: Vec::with_capacity(live + self.side.len()),
            arena_max: self.arena_max,
            ..KeyIndex::default()
        };
        let side = std::mem::take(&mut self.side);
        let mut side = side.into_iter().peekable();
        let mut run = (0..self.ends.len())
            .filter(|&i| !self.is_dead(i))
            .peekable();
        loop {
            let from_run = match (run.peek(), side.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(&i), Some((k, _))) => self.key(i) < &**k,
            };
            if from_run {
                let i = run.next().expect("peeked");
                next.push_or_keep(self.key(i), self.locs[i]);
            } else {
                let (k, loc) = side.next().expect("peeked");
                next.push_or_keep(&k, loc);
            }
        }
        next.side_kept = next.side.len();
        #[cfg(test)]
        {
            next.merges = self.merges + 1;
        }
        *self = next;
    }

    /// While merging (keys come in order): appends the key to the run, or keeps it in the side
    /// map once the arena is full.
    fn push_or_keep(&mut self, key: &[u8], loc: ValueLoc) {
        if self.side.is_empty() && self.fits(key) {
            self.push(key, loc);
        } else {
            self.side.insert(Box::from(key), loc);
        }
    }

    /// Every key and its location, in key order.
    pub fn iter(&self) -> Entries<'_> {
        Entries {
            iter: self.range::<[u8], _>(..),
            left: self.len(),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.iter().map(|(k, _)| k)
    }

    /// Every location, in key order. Without a side map that is the run's live ones as they
    /// lie, walked without looking at a key (loads check every value's segment this way).
    pub fn values(&self) -> impl Iterator<Item = &ValueLoc> {
        let run_only = self.side.is_empty();
        let run = run_only.then(|| {
            let live = self.ends.iter().map(|&end| end & DEAD == 0);
            live.zip(&self.locs)
                .filter_map(|(live, loc)| live.then_some(loc))
        });
        let merged = (!run_only).then(|| self.iter().map(|(_, v)| v));
        run.into_iter()
            .flatten()
            .chain(merged.into_iter().flatten())
    }

    /// The keys in `range` and their locations, in key order. Shaped like `BTreeMap::range`
    /// (`index.range::<[u8], _>(bounds)`), but an empty or inverted range is empty, not a
    /// panic.
    pub fn range<T, R>(&self, range: R) -> Iter<'_>
    where
        T: AsRef<[u8]> + ?Sized,
        R: RangeBounds<T>,
    {
        let range = (as_bytes(range.start_bound()), as_bytes(range.end_bound()));
        let mut side = (valid_range(range) && !self.side.is_empty())
            .then(|| self.side.range::<[u8], _>(range));
        let run = self.run_range(range);
        Iter {
            arena: &self.arena,
            start: if run.start == 0 {
                0
            } else {
                (self.ends[run.start - 1] & !DEAD) as usize
            },
            ends: &self.ends[run.clone()],
            locs: &self.locs[run],
            next_side: next_side(&mut side),
            side,
        }
    }
}

fn next_side<'a>(
    side: &mut Option<btree_map::Range<'a, Box<[u8]>, ValueLoc>>,
) -> Option<(&'a [u8], &'a ValueLoc)> {
    side.as_mut()?.next().map(|(k, v)| (&**k, v))
}

fn as_bytes<T: AsRef<[u8]> + ?Sized>(bound: Bound<&T>) -> Bound<&[u8]> {
    bound.map(|k| k.as_ref())
}

/// Whether `BTreeMap::range` accepts `range` (it panics on an inverted one); the others are
/// empty.
fn valid_range((start, end): (Bound<&[u8]>, Bound<&[u8]>)) -> bool {
    match (start, end) {
        (Bound::Excluded(s), Bound::Excluded(e)) => s < e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => {
            s <= e
        }
        _ => true,
    }
}

impl<K: AsRef<[u8]>> Extend<(K, ValueLoc)> for KeyIndex {
    fn extend<I: IntoIterator<Item = (K, ValueLoc)>>(&mut self, entries: I) {
        for (k, v) in entries {
            self.insert(k, v);
        }
    }
}

impl<K: AsRef<[u8]>> FromIterator<(K, ValueLoc)> for KeyIndex {
    fn from_iter<I: IntoIterator<Item = (K, ValueLoc)>>(entries: I) -> Self {
        let mut index = KeyIndex::new();
        index.extend(entries);
        index
    }
}

/// An ordered walk over part of a [`KeyIndex`]: the run's live keys merged with the side map's.
pub struct Iter<'a> {
    arena: &'a [u8],
    /// Where the first key of `ends` starts in `arena`.
    start: usize,
    /// The end offsets and locations of the run's keys not yet visited.
    ends: &'a [u32],
    locs: &'a [ValueLoc],
    side: Option<btree_map::Range<'a, Box<[u8]>, ValueLoc>>,
    /// The side map's next entry, looked at ahead.
    next_side: Option<(&'a [u8], &'a ValueLoc)>,
}

impl<'a> Iter<'a> {
    /// The run's next live key, whatever the side map holds.
    #[inline]
    fn next_in_run(&mut self) -> Option<(&'a [u8], &'a ValueLoc)> {
        while let [end, ends @ ..] = self.ends {
            let end_at = (end & !DEAD) as usize;
            let key = &self.arena[self.start..end_at];
            let (loc, locs) = self.locs.split_first()?;
            (self.start, self.ends, self.locs) = (end_at, ends, locs);
            if end & DEAD == 0 {
                return Some((key, loc));
            }
        }
        None
    }

    /// The next entry while the side map has some left: the smaller of its next key and the
    /// run's.
    #[inline(never)]
    fn next_merged(&mut self) -> Option<(&'a [u8], &'a ValueLoc)> {
        let side = self.next_side?;
        let run_first = {
            let mut ahead = Iter {
                side: None,
                next_side: None,
                ..*self
            };
            ahead.next_in_run().map(|(k, _)| k < side.0)
        };
        if run_first == Some(true) {
            return self.next_in_run();
        }
        self.next_side = next_side(&mut self.side);
        Some(side)
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a [u8], &'a ValueLoc);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.next_side.is_none() {
            // Only the run is left: the usual case.
            return self.next_in_run();
        }
        self.next_merged()
    }
}

/// Every entry of a [`KeyIndex`], in key order, counted (base records are written from it).
pub struct Entries<'a> {
    iter: Iter<'a>,
    left: usize,
}

impl<'a> Iterator for Entries<'a> {
    type Item = (&'a [u8], &'a ValueLoc);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let next = self.iter.next()?;
        self.left -= 1;
        Some(next)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Entries<'_> {}

#[cfg(test)]
mod tests;
