//! Scanning a partition as an iterator: [`Store::scan`] pages, resumed by their cursors.

use std::collections::VecDeque;

use super::{Cursor, KeyRange, Partition, Store};
use crate::error::Result;

/// Entries read per page by [`Entries`].
pub const ENTRIES_PAGE: usize = 256;

/// Every entry of a key range of one partition, in key order, read a page at a time
/// (see [`Store::entries`]).
///
/// Each page is consistent on its own (SPEC S1); a batch that commits while the iteration runs
/// is seen in the pages read after it. An error is returned once and ends the iteration.
///
/// ```
/// use portcullis::store::{Batch, Entries, KeyRange, MemoryStore, Partition, Store};
/// let store = MemoryStore::new();
/// let p = Partition::new("inventory").unwrap();
/// store.apply(&p, &Batch::new().put(b"a".to_vec(), b"1".to_vec()).put(b"b".to_vec(), b"2".to_vec())).unwrap();
/// let all = Entries::new(&store, p, KeyRange::all()).collect::<Result<Vec<_>, _>>().unwrap();
/// assert_eq!(all.len(), 2);
/// ```
pub struct Entries<'a> {
    store: &'a dyn Store,
    partition: Partition,
    range: KeyRange,
    cursor: Option<Cursor>,
    done: bool,
    page: VecDeque<(Vec<u8>, Vec<u8>)>,
    page_size: usize,
}

impl std::fmt::Debug for Entries<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entries")
            .field("partition", &self.partition)
            .field("range", &self.range)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<'a> Entries<'a> {
    /// Iterates `range` of partition `p` of any store, including a `dyn Store`.
    pub fn new(store: &'a dyn Store, p: Partition, range: KeyRange) -> Self {
        Entries {
            store,
            partition: p,
            range,
            cursor: None,
            done: false,
            page: VecDeque::new(),
            page_size: ENTRIES_PAGE,
        }
    }

    /// Reads pages of `entries` (at least 1) instead of [`ENTRIES_PAGE`].
    ///
    /// ```
    /// use portcullis::store::{Batch, Entries, KeyRange, MemoryStore, Partition, Store};
    /// let store = MemoryStore::new();
    /// let p = Partition::new("inventory").unwrap();
    /// for k in 0u8..5 {
    ///     store.apply(&p, &Batch::new().put(vec![k], vec![k])).unwrap();
    /// }
    /// let keys: Vec<Vec<u8>> = Entries::new(&store, p, KeyRange::all())
    ///     .page_size(2)
    ///     .map(|e| e.map(|(k, _)| k))
    ///     .collect::<Result<_, _>>()
    ///     .unwrap();
    /// assert_eq!(keys, vec![vec![0], vec![1], vec![2], vec![3], vec![4]]);
    /// ```
    pub fn page_size(mut self, entries: usize) -> Self {
        self.page_size = entries.max(1);
        self
    }
}

impl Iterator for Entries<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(entry) = self.page.pop_front() {
                return Some(Ok(entry));
            }
            if self.done {
                return None;
            }
            match self.store.scan(
                &self.partition,
                &self.range,
                self.cursor.as_ref(),
                self.page_size,
            ) {
                Ok(page) => {
                    self.done = page.next.is_none();
                    self.cursor = page.next;
                    self.page = page.entries.into();
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
