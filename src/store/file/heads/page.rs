//! A data page of a heads snapshot, read and verified: its entries searched in place (SPEC
//! S5). Reading and verifying it is [`Pages`](super::Pages)'s.

use super::Loc;

/// A page read and verified: its bytes and where each entry's name starts, in name order (no
/// allocation per entry: a first touch reads one page).
pub(super) struct Page {
    pub buf: Vec<u8>,
    pub names: Vec<(u16, u8)>,
}

impl Page {
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn entry(&self, i: usize) -> (&[u8], Loc) {
        let (at, len) = (self.names[i].0 as usize, self.names[i].1 as usize);
        let head = &self.buf[at + len..at + len + 8];
        (
            &self.buf[at..at + len],
            u64::from_le_bytes(head.try_into().expect("8 bytes")),
        )
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Loc)> {
        (0..self.len()).map(|i| self.entry(i))
    }

    pub fn find(&self, name: &[u8]) -> Option<Loc> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (n, head) = self.entry(mid);
            match n.cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(head),
            }
        }
        None
    }
}
