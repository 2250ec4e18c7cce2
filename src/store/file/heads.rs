//! The heads snapshot: every partition's newest record at a journal position, in fixed-size
//! pages sorted by name, so open reads a small index and a partition's head is found on its
//! first touch with one page read (SPEC S5, S8).
//!
//! Owns the snapshot file's format (paged, magic [`PAGED_MAGIC`]), writing it (streamed, atomically: temp file,
//! sync, rename, sync directory), reading what open needs, page lookups and iteration, and
//! reading the whole-file snapshots of format versions 1 and 2 (magic `PCLSHEAD`), which
//! open converts. Writing is in [`writer`].
//!
//! Layout:
//!
//! | part   | bytes                | contents                                                   |
//! |--------|----------------------|------------------------------------------------------------|
//! | header | [`HEADER_LEN`]       | preamble (magic, version, its crc) \| page length \| pages \| meta length \| meta crc32c \| crc32c of these 16 bytes \| index pages \| crc32c of the 24 bytes after the preamble |
//! | pages  | pages x page length  | from offset [`PAGES_AT`]; data pages, each: crc32c (seeded with the page number) \| entry count (u16) \| entries (name length u8, name, head u64), zero padding; then the index pages ([`index`]) |
//! | meta   | meta length          | postcard: journal position, damage, garbage estimate, partition count, the index's root |
//!
//! Open reads the header and the meta: with the index paged, a few dozen bytes whatever the
//! number of partitions, and, when the index is one page (it lies just before the meta), that
//! page in the same read; it never reads a data page. A first touch reads the index page if
//! open did not (kept) and one data page; the data page read last is kept too. A page is verified when read; a damaged data page refuses exactly the names
//! it could hold (from its first name up to the next page's), a damaged index page the names
//! of every data page it names, and either is remembered, so the store stops writing
//! snapshots that would have to copy it and the next open rebuilds the heads from the journal.
//!
//! Paged snapshots written before the index was paged have the same magic and data pages, a
//! header that ends after the first crc (zeros follow) and every data page's first name in the
//! meta; they are still read (open reads that meta whole), and the next snapshot is written in
//! the current layout. Earlier builds refuse a snapshot with a paged index as damaged (its
//! meta does not match their layout) and rebuild the heads from the journal (SPEC S4).

#[cfg(feature = "test-hooks")]
use crate::sync::atomic::AtomicBool;
#[cfg(feature = "test-hooks")]
use crate::sync::atomic::Ordering;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::sync::Mutex;
use serde::{Deserialize, Serialize};

use super::damage::{Damage, shown};
use super::format::{self, Loc, PREAMBLE_LEN};
use super::vfs::{OpenMode, Vfs, VfsFile};
use super::{SNAPSHOT_MAGIC, container};
use crate::error::{Error, Result};

mod index;
mod page;
#[cfg(test)]
mod tests;
mod writer;

use index::{Index, Names, Paged};
use page::Page;
pub use writer::write;
#[cfg(feature = "test-hooks")]
pub use writer::write_version_2;

/// The magic of a paged snapshot. The whole-file snapshots of format versions 1 and 2 carry
/// [`SNAPSHOT_MAGIC`]; a paged one is a file of another kind, versioned from the current
/// format version on like every file (SPEC S10).
pub const PAGED_MAGIC: &[u8; 8] = b"PCLSHPAG";
/// Bytes per page.
pub const PAGE_LEN: usize = 16 << 10;
const HEADER_LEN: usize = PREAMBLE_LEN + 28;
/// The header of the layout whose index is in the meta: the part both layouts share.
const FLAT_HEADER_LEN: usize = PREAMBLE_LEN + 20;
/// Where the first page starts (the header padded to a block).
const PAGES_AT: u64 = 4096;
/// Page checksum and entry count.
const PAGE_HEAD: usize = 6;

/// The journal position and what else a snapshot records besides the heads.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Position {
    pub segment: u32,
    pub offset: u64,
    pub next_lsn: u64,
    pub damage: Damage,
    /// The garbage estimate at that position, so compaction still starts by itself in a
    /// process that restarts often.
    pub garbage_bytes: u64,
    /// Per segment: (number, bytes of records appended apart from their partition's previous
    /// one, dead bytes), so compaction of scattered and mostly dead segments resumes after a
    /// restart. Format version 3 keeps it after the meta (see [`fn@write`]); older files have
    /// none.
    #[serde(skip)]
    pub segments: Vec<(u32, u64, u64)>,
}

/// The meta of a snapshot whose index is paged.
#[derive(Serialize, Deserialize)]
struct Meta {
    position: Position,
    partitions: u64,
    /// The first name of each index page.
    root: Names,
    /// The first data page each index page names.
    starts: Vec<u32>,
}

/// The meta of a snapshot whose index is in it: every data page's first name.
#[derive(Serialize, Deserialize)]
struct FlatMeta {
    position: Position,
    partitions: u64,
    first: Names,
}

/// A heads snapshot as versions 1 and 2 wrote it: one postcard body, read whole.
#[derive(Serialize, Deserialize)]
struct WholeV2 {
    segment: u32,
    offset: u64,
    next_lsn: u64,
    heads: Vec<(Vec<u8>, u64)>,
    damage: Damage,
    garbage_bytes: u64,
}

#[derive(Deserialize)]
struct WholeV1 {
    segment: u32,
    offset: u64,
    next_lsn: u64,
    heads: Vec<(Vec<u8>, u64)>,
}

/// What open reads of a snapshot.
pub struct Opened {
    pub position: Position,
    /// Bytes of the header and the meta read.
    pub bytes: u64,
    /// Bytes of index pages read with the meta (not verified yet).
    pub index_bytes: u64,
    pub heads: Heads,
}

// The simulation's locks and atomics (test-only feature) are a word larger each.
#[cfg_attr(feature = "simulation", allow(clippy::large_enum_variant))]
pub enum Heads {
    /// Version 3: looked up page by page.
    Paged(Pages),
    /// Versions 1 and 2: every head, read whole (open converts the file).
    Listed(Vec<(Vec<u8>, Loc)>),
}

/// The pages of a version 3 snapshot, read on demand. Immutable but for the damage found.
pub struct Pages {
    file: Arc<dyn VfsFile>,
    shown: String,
    page_len: usize,
    partitions: u64,
    index: Index,
    /// Data pages found damaged, with what was found.
    damaged: Mutex<BTreeMap<u32, String>>,
    /// Index pages found damaged, with what was found.
    damaged_index: Mutex<BTreeMap<u32, String>>,
    /// The data page read last, verified: partitions are usually touched in name order (a
    /// read of every history, a restore), so the next lookup mostly hits it and costs no read,
    /// checksum or decode. One page, so memory stays bounded (SPEC S8).
    last: Mutex<Option<(u32, Arc<Page>)>>,
    /// Test-only negative control: pages are used without checking their checksum.
    #[cfg(feature = "test-hooks")]
    pub unchecked: AtomicBool,
    /// Test-only negative control: the page read last is not kept.
    #[cfg(feature = "test-hooks")]
    pub uncached: AtomicBool,
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages").field("file", &self.shown).finish()
    }
}

/// Reads what open needs of snapshot `dir/name`: `Ok(None)` if it does not exist, a newer
/// version is `UnsupportedVersion`, anything wrong in what is read is `Corrupt`.
pub fn open(vfs: &dyn Vfs, dir: &Path, name: &str) -> Result<Option<Opened>> {
    let path = dir.join(name);
    let shown_path = path.display().to_string();
    let file = match vfs.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("opening {shown_path}"), e)),
    };
    let io = |e| Error::io(format!("reading {shown_path}"), e);
    let corrupt = |detail: &str| Error::corrupt(shown_path.clone(), detail.to_owned());
    let len = file.len().map_err(io)?;
    let mut header = [0u8; HEADER_LEN];
    let head_len = (len as usize).min(HEADER_LEN);
    file.read_exact_at(&mut header[..head_len], 0).map_err(io)?;
    if header[..head_len.min(8)] != PAGED_MAGIC[..] {
        // A whole-file snapshot of an older format (its own reader checks the magic).
        drop(file);
        return read_whole(vfs, dir, name);
    }
    let version = format::read_preamble(&header[..head_len], PAGED_MAGIC, &shown_path)?;
    if version < 2 {
        return Err(corrupt("a paged snapshot has no format version 1"));
    }
    if head_len < HEADER_LEN {
        return Err(corrupt("file too short"));
    }
    let field = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
    let fields = PREAMBLE_LEN;
    if crc32c::crc32c(&header[fields..fields + 16]) != field(fields + 16) {
        return Err(corrupt("header checksum mismatch"));
    }
    // The earlier layout left zeros after its header; the current one checks what it adds.
    let flat = header[FLAT_HEADER_LEN..].iter().all(|&b| b == 0);
    if !flat && crc32c::crc32c(&header[fields..fields + 24]) != field(fields + 24) {
        return Err(corrupt("header checksum mismatch"));
    }
    let (page_len, pages, meta_len, meta_crc, index_pages) = (
        field(fields) as usize,
        field(fields + 4),
        field(fields + 8) as u64,
        field(fields + 12),
        field(fields + 20),
    );
    let meta_at = PAGES_AT + pages as u64 * page_len as u64;
    if page_len < 512 || meta_at + meta_len != len || index_pages > pages {
        return Err(corrupt("length does not match the file size"));
    }
    // A single index page lies just before the meta: read both at once, so the first lookup
    // reads only its data page (a cold first answer costs its random reads). The page is kept
    // as read and verified on its first use, as any index page; open stays one page at most
    // whatever the number of partitions (SPEC S5).
    let prefetch = if !flat && index_pages == 1 {
        page_len
    } else {
        0
    };
    let mut body = vec![0u8; prefetch + meta_len as usize];
    file.read_exact_at(&mut body, meta_at - prefetch as u64)
        .map_err(io)?;
    let index_page: Vec<u8> = body.drain(..prefetch).collect();
    if crc32c::crc32c(&body) != meta_crc {
        return Err(corrupt("checksum mismatch in the page index"));
    }
    let undecodable = |e: postcard::Error| corrupt(&format!("undecodable: {e}"));
    let mismatch = || corrupt("the page index does not match the pages");
    let (position, partitions, index) = if flat {
        let (meta, rest): (FlatMeta, _) = postcard::take_from_bytes(&body).map_err(undecodable)?;
        if meta.first.len() as u64 != pages as u64 || !meta.first.consistent() {
            return Err(mismatch());
        }
        let position = with_segments(meta.position, version, rest).map_err(undecodable)?;
        (position, meta.partitions, Index::Flat(meta.first))
    } else {
        let (meta, rest): (Meta, _) = postcard::take_from_bytes(&body).map_err(undecodable)?;
        let position = with_segments(meta.position, version, rest).map_err(undecodable)?;
        let data_pages = pages - index_pages;
        let mut paged = Paged::new(file.clone(), page_len, data_pages, meta.root, meta.starts)
            .filter(|p| p.starts.len() as u32 == index_pages)
            .ok_or_else(mismatch)?;
        if prefetch > 0 {
            paged.prefetched(0, index_page);
        }
        (position, meta.partitions, Index::Paged(Box::new(paged)))
    };
    let header_len = if flat { FLAT_HEADER_LEN } else { HEADER_LEN };
    Ok(Some(Opened {
        position,
        bytes: header_len as u64 + meta_len,
        index_bytes: prefetch as u64,
        heads: Heads::Paged(Pages {
            file,
            shown: shown_path,
            page_len,
            partitions,
            index,
            damaged: Mutex::new(BTreeMap::new()),
            damaged_index: Mutex::new(BTreeMap::new()),
            last: Mutex::new(None),
            #[cfg(feature = "test-hooks")]
            unchecked: AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            uncached: AtomicBool::new(false),
        }),
    }))
}

/// The position with the per-segment counts that follow the meta from format version 3 on.
fn with_segments(
    mut position: Position,
    version: u32,
    rest: &[u8],
) -> std::result::Result<Position, postcard::Error> {
    if version >= 3 && !rest.is_empty() {
        position.segments = postcard::from_bytes(rest)?;
    }
    Ok(position)
}

fn read_whole(vfs: &dyn Vfs, dir: &Path, name: &str) -> Result<Option<Opened>> {
    let Some(env) = container::read(vfs, dir, name, SNAPSHOT_MAGIC)? else {
        return Ok(None);
    };
    let whole = if env.version == 1 {
        let s: WholeV1 = env.decode()?;
        WholeV2 {
            segment: s.segment,
            offset: s.offset,
            next_lsn: s.next_lsn,
            heads: s.heads,
            damage: Damage::default(),
            garbage_bytes: 0,
        }
    } else {
        env.decode()?
    };
    Ok(Some(Opened {
        position: Position {
            segment: whole.segment,
            offset: whole.offset,
            next_lsn: whole.next_lsn,
            damage: whole.damage,
            garbage_bytes: whole.garbage_bytes,
            segments: Vec::new(),
        },
        bytes: env.len,
        index_bytes: 0,
        heads: Heads::Listed(whole.heads),
    }))
}

/// Reads snapshot `dir/name` and checks every page (the inspection's check).
pub fn verify(vfs: &dyn Vfs, dir: &Path, name: &str) -> Result<Option<Position>> {
    let Some(opened) = open(vfs, dir, name)? else {
        return Ok(None);
    };
    if let Heads::Paged(pages) = &opened.heads {
        let mut count = 0u64;
        for page in 0..pages.page_count() {
            count += pages.read_page(page)?.len() as u64;
        }
        if count != pages.partitions {
            return Err(Error::corrupt(
                pages.shown.clone(),
                format!(
                    "the pages hold {count} partitions, the index says {}",
                    pages.partitions
                ),
            ));
        }
    }
    Ok(Some(opened.position))
}

impl Pages {
    /// Partitions in the snapshot.
    pub fn partitions(&self) -> u64 {
        self.partitions
    }

    fn checked(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        {
            !self.unchecked.load(Ordering::Relaxed)
        }
        #[cfg(not(feature = "test-hooks"))]
        true
    }

    /// Data pages.
    fn page_count(&self) -> u32 {
        match &self.index {
            Index::Flat(first) => first.len() as u32,
            Index::Paged(paged) => paged.data_pages,
        }
    }

    /// Data page `page`'s first name, reading its index page if needed.
    fn first_name(&self, page: u32) -> Result<&[u8]> {
        match &self.index {
            Index::Flat(first) => Ok(first.get(page as usize)),
            Index::Paged(paged) => {
                self.index_page_usable(paged, paged.index_page_of(page))?;
                paged
                    .first_name(page, self.checked())
                    .map_err(|(j, e)| self.index_unusable(paged, j, e))
            }
        }
    }

    /// Data page `page`'s first name if known without reading, for messages.
    fn known_first_name(&self, page: u32) -> Option<&[u8]> {
        match &self.index {
            Index::Flat(first) => Some(first.get(page as usize)),
            Index::Paged(paged) => paged.known_first_name(page),
        }
    }

    /// The data page that could hold `name`: the last whose first name is not after it.
    fn page_for(&self, name: &[u8]) -> Result<Option<u32>> {
        match &self.index {
            Index::Flat(first) => {
                Ok(Names::last_not_after(first.len(), |i| first.get(i), name).map(|i| i as u32))
            }
            Index::Paged(paged) => {
                let Some(j) = paged.index_page_for(name) else {
                    return Ok(None);
                };
                self.index_page_usable(paged, j)?;
                paged
                    .page_within(j, name, self.checked())
                    .map(Some)
                    .map_err(|e| self.index_unusable(paged, j, e))
            }
        }
    }

    /// The names page `page` could hold, for messages.
    fn span(&self, page: u32) -> String {
        let name = |p| self.known_first_name(p).map_or("?".to_owned(), shown);
        match page + 1 < self.page_count() {
            true => format!("from {} up to {}", name(page), name(page + 1)),
            false => format!("from {} on", name(page)),
        }
    }

    fn refusal(&self, page: u32, found: &str) -> Error {
        Error::corrupt(
            format!("heads snapshot {} page {page}", self.shown),
            format!(
                "{found}; the partitions named {} cannot be proven intact and are refused until the store is reopened, which rebuilds the heads from the journal",
                self.span(page)
            ),
        )
    }

    /// Reads and verifies one page, or takes the one read last. A damaged page is remembered
    /// and refused.
    fn read_page(&self, page: u32) -> Result<Arc<Page>> {
        if let Some((_, cached)) = self.last.lock().as_ref().filter(|(p, _)| *p == page) {
            return Ok(cached.clone());
        }
        if let Some(found) = self.damaged.lock().get(&page) {
            return Err(self.refusal(page, found));
        }
        let first = self.first_name(page)?;
        let mut buf = vec![0u8; self.page_len];
        let at = PAGES_AT + page as u64 * self.page_len as u64;
        self.file
            .read_exact_at(&mut buf, at)
            .map_err(|e| Error::io(format!("reading {} page {page}", self.shown), e))?;
        match self.decode_page(page, &buf, first) {
            Some(names) => {
                let read = Arc::new(Page { buf, names });
                #[cfg(feature = "test-hooks")]
                if self.uncached.load(Ordering::Relaxed) {
                    return Ok(read);
                }
                *self.last.lock() = Some((page, read.clone()));
                Ok(read)
            }
            None => {
                let found = "checksum mismatch or undecodable entries".to_owned();
                log::error!(
                    "heads snapshot {} page {page} is damaged; refusing the partitions named {}",
                    self.shown,
                    self.span(page)
                );
                let err = self.refusal(page, &found);
                self.damaged.lock().insert(page, found);
                Err(err)
            }
        }
    }

    fn decode_page(&self, page: u32, buf: &[u8], first: &[u8]) -> Option<Vec<(u16, u8)>> {
        let checked = self.checked();
        if checked && page_crc(page, &buf[4..]) != u32::from_le_bytes(buf[0..4].try_into().ok()?) {
            return None;
        }
        let count = u16::from_le_bytes(buf[4..6].try_into().ok()?) as usize;
        let mut names = Vec::with_capacity(count);
        let mut at = PAGE_HEAD;
        // Names must be in order and within the page's span, or lookups would miss them.
        let mut ordered = true;
        let mut previous: Option<&[u8]> = None;
        for _ in 0..count {
            let len = *buf.get(at)? as usize;
            let name = buf.get(at + 1..at + 1 + len)?;
            buf.get(at + 1 + len..at + 9 + len)?;
            ordered &= match previous {
                Some(p) => p < name,
                None => name == first,
            };
            previous = Some(name);
            names.push(((at + 1) as u16, len as u8));
            at += 9 + len;
        }
        (!checked || ordered).then_some(names)
    }

    /// The head of partition `name` in the snapshot, if it is there.
    pub fn lookup(&self, name: &[u8]) -> Result<Option<Loc>> {
        let Some(page) = self.page_for(name)? else {
            return Ok(None);
        };
        Ok(self.read_page(page)?.find(name))
    }

    /// Whether each of `names` (sorted) is in the snapshot, reading each page at most once.
    /// A damaged page answers true for the names it could hold (they are refused anyway).
    pub fn contains_sorted(&self, names: &[&[u8]]) -> Vec<bool> {
        let mut cached: Option<(u32, Result<Arc<Page>>)> = None;
        names
            .iter()
            .map(|name| {
                let page = match self.page_for(name) {
                    Ok(Some(page)) => page,
                    Ok(None) => return false,
                    Err(_) => return true,
                };
                if cached.as_ref().is_none_or(|(p, _)| *p != page) {
                    cached = Some((page, self.read_page(page)));
                }
                match &cached.as_ref().expect("just filled").1 {
                    Ok(entries) => entries.find(name).is_some(),
                    Err(_) => true,
                }
            })
            .collect()
    }

    /// Calls `each` with every entry whose name starts with `prefix`, in name order.
    pub fn for_each_prefixed(&self, prefix: &[u8], mut each: impl FnMut(&[u8], Loc)) -> Result<()> {
        let mut page = self.page_for(prefix)?.unwrap_or(0);
        while page < self.page_count() {
            if page > 0 {
                let first = self.first_name(page)?;
                if first > prefix && !first.starts_with(prefix) {
                    break;
                }
            }
            for (name, head) in self.read_page(page)?.iter() {
                if name.starts_with(prefix) {
                    each(name, head);
                } else if name > prefix {
                    return Ok(());
                }
            }
            page += 1;
        }
        Ok(())
    }

    /// Every entry, page by page (writing the next snapshot).
    fn pages(&self) -> impl Iterator<Item = Result<Arc<Page>>> + '_ {
        (0..self.page_count()).map(|page| self.read_page(page))
    }

    /// Calls `each` with the name of every partition on a page that reads intact; a damaged
    /// page, or one a damaged index page names, is skipped (its names are refused already). An
    /// error reading a page is returned: it says nothing about the page's names.
    pub fn for_each_readable(&self, mut each: impl FnMut(&[u8])) -> Result<()> {
        for page in self.pages() {
            match page {
                Ok(page) => page.iter().for_each(|(name, _)| each(name)),
                Err(Error::Corrupt { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether any page, data or index, was found damaged.
    pub fn any_damaged(&self) -> bool {
        !self.damaged.lock().is_empty() || !self.damaged_index.lock().is_empty()
    }

    /// What the damaged pages refuse, one line each (the store's damage listing).
    pub fn describe_damage(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Index::Paged(paged) = &self.index {
            let damaged = self.damaged_index.lock().clone();
            lines.extend(
                damaged
                    .iter()
                    .map(|(&j, found)| self.index_refusal(paged, j as usize, found).to_string()),
            );
        }
        let damaged = self.damaged.lock().clone();
        lines.extend(
            damaged
                .iter()
                .map(|(&page, found)| self.refusal(page, found).to_string()),
        );
        lines
    }
}

fn page_crc(page: u32, rest: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&page.to_le_bytes()), rest)
}
