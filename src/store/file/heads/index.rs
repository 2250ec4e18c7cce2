//! The page index of a heads snapshot: which data page could hold a name, and each data page's
//! first name (SPEC S5, S8).
//!
//! Owns the two layouts of that index. A snapshot written since the index was paged keeps it
//! in index pages after the data pages (each: crc32c seeded with its page number in the file
//! \| entry count (u16) \| entries (name length u8, name), zero padding; entry i is the first
//! name of data page `start + i`), and its meta holds only the root: the first name and first
//! data page of each index page, a few dozen bytes for a million partitions. Open reads the
//! root, so its cost does not follow the number of partitions; an index page is read,
//! verified and kept on its first use, and searched in place (no allocation per entry). The
//! paged snapshots written before that keep every data page's first name in the meta
//! ([`Index::Flat`]), read whole at open; they are still read. Also owns what a damaged index
//! page refuses: the names of every data page it names, from its first name in the root up to
//! the next index page's.

use std::sync::Arc;

use crate::sync::OnceLock;

use crate::sync::Mutex;

use super::{PAGES_AT, Pages, VfsFile, shown};
use crate::error::Error;

/// Index page checksum and entry count.
pub(super) const INDEX_HEAD: usize = 6;

/// Names concatenated, `ends[i]` where name i ends: a sorted list searched in place.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Names {
    pub bytes: Vec<u8>,
    pub ends: Vec<u32>,
}

impl Names {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    pub fn push(&mut self, name: &[u8]) {
        self.bytes.extend_from_slice(name);
        self.ends.push(self.bytes.len() as u32);
    }

    /// Whether the ends are ordered and match the bytes.
    pub fn consistent(&self) -> bool {
        !self.ends.windows(2).any(|w| w[0] > w[1])
            && self.ends.last().map_or(0, |&e| e as usize) == self.bytes.len()
    }

    /// The last entry not after `name`, by binary search over `len` entries named by `at`.
    pub fn last_not_after<'a>(
        len: usize,
        at: impl Fn(usize) -> &'a [u8],
        name: &[u8],
    ) -> Option<usize> {
        let (mut lo, mut hi) = (0, len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if at(mid) <= name {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
    }
}

/// Where a data page's first names are.
pub(super) enum Index {
    /// Every data page's first name, read with the meta at open (the earlier layout).
    Flat(Names),
    /// In index pages, read on first use.
    Paged(Box<Paged>),
}

/// The paged index: the root open read and the index pages read so far.
pub(super) struct Paged {
    pub file: Arc<dyn VfsFile>,
    pub page_len: usize,
    pub data_pages: u32,
    /// The first name of each index page.
    pub root: Names,
    /// The first data page each index page names.
    pub starts: Vec<u32>,
    loaded: Vec<OnceLock<IndexPage>>,
    /// An index page open read with the meta, not verified yet: taken by its first use.
    prefetched: Mutex<Option<(usize, Vec<u8>)>>,
}

/// An index page read and verified: its bytes and where each entry's name is.
struct IndexPage {
    buf: Vec<u8>,
    names: Vec<(u16, u8)>,
}

impl IndexPage {
    /// Entry `i`'s name (empty past the end, which only a page used unchecked can reach).
    fn name(&self, i: usize) -> &[u8] {
        self.names.get(i).map_or(&[][..], |&(at, len)| {
            &self.buf[at as usize..at as usize + len as usize]
        })
    }
}

/// Why an index page could not be used.
pub(super) enum Unusable {
    Io(std::io::Error),
    Damaged,
}

impl Paged {
    pub fn new(
        file: Arc<dyn VfsFile>,
        page_len: usize,
        data_pages: u32,
        root: Names,
        starts: Vec<u32>,
    ) -> Option<Paged> {
        // The root must name index pages in data-page order, each at least one page.
        let ordered = root.len() == starts.len()
            && root.consistent()
            && starts.first().is_none_or(|&s| s == 0)
            && starts.windows(2).all(|w| w[0] < w[1])
            && starts.last().is_none_or(|&s| s < data_pages)
            && (data_pages == 0) == starts.is_empty();
        let loaded = (0..starts.len()).map(|_| OnceLock::new()).collect();
        ordered.then_some(Paged {
            file,
            page_len,
            data_pages,
            root,
            starts,
            loaded,
            prefetched: Mutex::new(None),
        })
    }

    /// Index page `j` as open read it with the meta, to be verified on its first use.
    pub fn prefetched(&mut self, j: usize, buf: Vec<u8>) {
        if buf.len() == self.page_len && j < self.starts.len() {
            *self.prefetched.get_mut() = Some((j, buf));
        }
    }

    /// Whether index page `j` was read (a damaged one never is).
    pub fn is_loaded(&self, j: usize) -> bool {
        self.loaded[j].get().is_some()
    }

    /// Data pages index page `j` names.
    fn count(&self, j: usize) -> usize {
        let end = self.starts.get(j + 1).copied().unwrap_or(self.data_pages);
        (end - self.starts[j]) as usize
    }

    /// The index page naming data page `page`.
    pub fn index_page_of(&self, page: u32) -> usize {
        self.starts.partition_point(|&s| s <= page) - 1
    }

    /// The index page whose span holds `name`, if any.
    pub fn index_page_for(&self, name: &[u8]) -> Option<usize> {
        Names::last_not_after(self.root.len(), |i| self.root.get(i), name)
    }

    /// Data page `page`'s first name if known without reading: an index page's first is in
    /// the root, the others once their index page was read.
    pub fn known_first_name(&self, page: u32) -> Option<&[u8]> {
        let j = self.index_page_of(page);
        let i = (page - self.starts[j]) as usize;
        match self.loaded[j].get() {
            Some(ip) => Some(ip.name(i)),
            None => (i == 0).then(|| self.root.get(j)),
        }
    }

    /// Data page `page`'s first name, reading its index page if needed.
    pub fn first_name(&self, page: u32, checked: bool) -> Result<&[u8], (usize, Unusable)> {
        let j = self.index_page_of(page);
        let ip = self.load(j, checked).map_err(|e| (j, e))?;
        Ok(ip.name((page - self.starts[j]) as usize))
    }

    /// The data page that could hold `name` within index page `j` (whose span holds it).
    pub fn page_within(&self, j: usize, name: &[u8], checked: bool) -> Result<u32, Unusable> {
        let ip = self.load(j, checked)?;
        let i = Names::last_not_after(ip.names.len(), |i| ip.name(i), name).unwrap_or(0);
        Ok(self.starts[j] + i as u32)
    }

    fn load(&self, j: usize, checked: bool) -> Result<&IndexPage, Unusable> {
        if let Some(ip) = self.loaded[j].get() {
            return Ok(ip);
        }
        let number = self.data_pages + j as u32;
        let prefetched = self.prefetched.lock().take_if(|(p, _)| *p == j);
        let buf = match prefetched {
            Some((_, buf)) => buf,
            None => {
                let mut buf = vec![0u8; self.page_len];
                let at = PAGES_AT + number as u64 * self.page_len as u64;
                self.file
                    .read_exact_at(&mut buf, at)
                    .map_err(Unusable::Io)?;
                buf
            }
        };
        let names = self
            .decode(j, number, &buf, checked)
            .ok_or(Unusable::Damaged)?;
        // Two first uses at once read it twice; either copy is the same.
        Ok(self.loaded[j].get_or_init(|| IndexPage { buf, names }))
    }

    fn decode(&self, j: usize, number: u32, buf: &[u8], checked: bool) -> Option<Vec<(u16, u8)>> {
        if checked
            && super::page_crc(number, &buf[4..]) != u32::from_le_bytes(buf[0..4].try_into().ok()?)
        {
            return None;
        }
        let count = u16::from_le_bytes(buf[4..6].try_into().ok()?) as usize;
        let mut names = Vec::with_capacity(count);
        let mut at = INDEX_HEAD;
        // The entries must be the root's span in order, one per data page, or lookups would
        // go to the wrong page.
        let mut ordered = count == self.count(j);
        let mut previous: Option<&[u8]> = None;
        for _ in 0..count {
            let len = *buf.get(at)? as usize;
            let name = buf.get(at + 1..at + 1 + len)?;
            ordered &= match previous {
                Some(p) => p < name,
                None => name == self.root.get(j),
            };
            previous = Some(name);
            names.push(((at + 1) as u16, len as u8));
            at += 1 + len;
        }
        if let (Some(last), true) = (previous, j + 1 < self.root.len()) {
            ordered &= last < self.root.get(j + 1);
        }
        (!checked || ordered).then_some(names)
    }
}

/// What a damaged index page refuses, with the store's damage listing.
impl Pages {
    /// Refuses the names of an index page found damaged before.
    pub(super) fn index_page_usable(&self, paged: &Paged, j: usize) -> crate::error::Result<()> {
        if paged.is_loaded(j) {
            return Ok(());
        }
        match self.damaged_index.lock().get(&(j as u32)) {
            Some(found) => Err(self.index_refusal(paged, j, found)),
            None => Ok(()),
        }
    }

    pub(super) fn index_unusable(&self, paged: &Paged, j: usize, e: Unusable) -> Error {
        match e {
            Unusable::Io(e) => Error::io(format!("reading {} index page {j}", self.shown), e),
            Unusable::Damaged => {
                let found = "checksum mismatch or entries that do not match the root".to_owned();
                let err = self.index_refusal(paged, j, &found);
                log::error!("{err}");
                self.damaged_index.lock().insert(j as u32, found);
                err
            }
        }
    }

    pub(super) fn index_refusal(&self, paged: &Paged, j: usize, found: &str) -> Error {
        let from = shown(paged.root.get(j));
        let span = match j + 1 < paged.root.len() {
            true => format!("from {from} up to {}", shown(paged.root.get(j + 1))),
            false => format!("from {from} on"),
        };
        Error::corrupt(
            format!("heads snapshot {} index page {j}", self.shown),
            format!(
                "{found}; the partitions named {span} cannot be proven intact and are refused until the store is reopened, which rebuilds the heads from the journal"
            ),
        )
    }
}
