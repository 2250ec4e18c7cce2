//! Key ranges and scan paging (SPEC S1): [`KeyRange`], the [`Cursor`] a scan resumes from and
//! the [`ScanPage`] it answers.
//!
//! Owns the range arithmetic every backend shares (containment, prefixes, resuming strictly
//! after a key). Calls nothing.

use std::ops::Bound;

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

    /// The bytes of its bounds, as a batch's size counts them.
    pub(super) fn bytes(&self) -> usize {
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
