//! Writing a heads snapshot: the data pages streamed in name order (the base's entries merged
//! with the changed heads), then the index pages, the meta and the header, atomically (temp
//! file, sync, rename, sync directory); and, for tests of reading old stores, the whole-file
//! format of version 2 and the paged layout whose index is in the meta.
//!
//! May call: the file layer and, for the version 2 format, the whole-file container only; the
//! layout is [`super`]'s.

use std::path::Path;
use std::sync::Arc;

use super::index::INDEX_HEAD;
use super::{
    FLAT_HEADER_LEN, FlatMeta, HEADER_LEN, Loc, Meta, Names, OpenMode, PAGE_HEAD, PAGE_LEN,
    PAGED_MAGIC, PAGES_AT, PREAMBLE_LEN, Page, Pages, Position, Vfs, VfsFile, format, page_crc,
};
#[cfg(feature = "test-hooks")]
use super::{SNAPSHOT_MAGIC, WholeV2, container};
use crate::error::{Error, Result};

/// Writes a snapshot to `dir/name` atomically: the entries of `base` merged with `changed`
/// (sorted by name, no duplicates; an entry of `changed` replaces the base's). Returns the
/// partitions written. Fails on a damaged base page, before renaming anything.
pub fn write(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    position: &Position,
    base: Option<&Pages>,
    changed: &[(Box<[u8]>, Loc)],
) -> Result<u64> {
    write_as(vfs, dir, name, position, base, changed, false)
}

/// Writes a snapshot whose index is in the meta, as builds before the paged index did (tests
/// of reading old stores).
#[cfg(test)]
pub fn write_flat(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    position: &Position,
    changed: &[(Box<[u8]>, Loc)],
) -> Result<u64> {
    write_as(vfs, dir, name, position, None, changed, true)
}

fn write_as(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    position: &Position,
    base: Option<&Pages>,
    changed: &[(Box<[u8]>, Loc)],
    flat: bool,
) -> Result<u64> {
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let io = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
    let file = vfs
        .open(&tmp, OpenMode::CreateTruncate)
        .map_err(|e| io("creating", e))?;
    let mut writer = PageWriter {
        file: &*file,
        page: vec![0u8; PAGE_LEN],
        fill: PAGE_HEAD,
        count: 0,
        pages: 0,
        partitions: 0,
        first: Names::default(),
    };
    let mut changed = changed.iter().peekable();
    let base_pages: Box<dyn Iterator<Item = Result<Arc<Page>>>> = match base {
        Some(base) => Box::new(base.pages()),
        None => Box::new(std::iter::empty()),
    };
    for page in base_pages {
        for (n, head) in page?.iter() {
            while let Some((c, h)) = changed.next_if(|(c, _)| **c < *n) {
                writer.push(c, *h).map_err(|e| io("writing", e))?;
            }
            match changed.next_if(|(c, _)| **c == *n) {
                Some((c, h)) => writer.push(c, *h),
                None => writer.push(n, head),
            }
            .map_err(|e| io("writing", e))?;
        }
    }
    for (c, h) in changed {
        writer.push(c, *h).map_err(|e| io("writing", e))?;
    }
    writer.finish_page().map_err(|e| io("writing", e))?;
    let partitions = writer.partitions;
    let encode = |e: postcard::Error| Error::invalid(format!("encoding {name}: {e}"));
    let (body, index_pages) = if flat {
        let meta = FlatMeta {
            position: position.clone(),
            partitions,
            first: writer.first,
        };
        (postcard::to_stdvec(&meta).map_err(encode)?, 0)
    } else {
        let (root, starts) =
            write_index(&*file, writer.pages, &writer.first).map_err(|e| io("writing", e))?;
        let index_pages = starts.len() as u32;
        let meta = Meta {
            position: position.clone(),
            partitions,
            root,
            starts,
        };
        // Format version 3: the per-segment counts follow the meta.
        let mut body = postcard::to_stdvec(&meta).map_err(encode)?;
        body.extend(postcard::to_stdvec(&position.segments).map_err(encode)?);
        (body, index_pages)
    };
    let pages = writer.pages + index_pages;
    let meta_at = PAGES_AT + pages as u64 * PAGE_LEN as u64;
    file.write_all_at(&body, meta_at)
        .map_err(|e| io("writing", e))?;
    let mut header = [0u8; HEADER_LEN];
    header[..PREAMBLE_LEN].copy_from_slice(&format::encode_preamble(PAGED_MAGIC));
    let fields = PREAMBLE_LEN;
    header[fields..fields + 4].copy_from_slice(&(PAGE_LEN as u32).to_le_bytes());
    header[fields + 4..fields + 8].copy_from_slice(&pages.to_le_bytes());
    header[fields + 8..fields + 12].copy_from_slice(&(body.len() as u32).to_le_bytes());
    header[fields + 12..fields + 16].copy_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    let crc = crc32c::crc32c(&header[fields..fields + 16]);
    header[fields + 16..fields + 20].copy_from_slice(&crc.to_le_bytes());
    let header_len = if flat {
        FLAT_HEADER_LEN
    } else {
        header[fields + 20..fields + 24].copy_from_slice(&index_pages.to_le_bytes());
        let crc = crc32c::crc32c(&header[fields..fields + 24]);
        header[fields + 24..fields + 28].copy_from_slice(&crc.to_le_bytes());
        HEADER_LEN
    };
    file.write_all_at(&header[..header_len], 0)
        .map_err(|e| io("writing", e))?;
    file.sync_data().map_err(|e| io("syncing", e))?;
    drop(file);
    vfs.rename(&tmp, &path)
        .map_err(|e| io("renaming into", e))?;
    vfs.sync_dir(dir)
        .map_err(|e| io("syncing the directory of", e))?;
    Ok(partitions)
}

/// Fills pages in order and writes each when full.
struct PageWriter<'a> {
    file: &'a dyn VfsFile,
    page: Vec<u8>,
    fill: usize,
    count: u16,
    pages: u32,
    partitions: u64,
    /// The first name of each data page.
    first: Names,
}

impl PageWriter<'_> {
    fn push(&mut self, name: &[u8], head: Loc) -> std::io::Result<()> {
        let len = 9 + name.len();
        if self.fill + len > self.page.len() || self.count == u16::MAX {
            self.finish_page()?;
        }
        if self.count == 0 {
            self.first.push(name);
        }
        let at = self.fill;
        self.page[at] = name.len() as u8;
        self.page[at + 1..at + 1 + name.len()].copy_from_slice(name);
        self.page[at + 1 + name.len()..at + len].copy_from_slice(&head.to_le_bytes());
        self.fill += len;
        self.count += 1;
        self.partitions += 1;
        Ok(())
    }

    fn finish_page(&mut self) -> std::io::Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        self.page[4..6].copy_from_slice(&self.count.to_le_bytes());
        let crc = page_crc(self.pages, &self.page[4..]);
        self.page[0..4].copy_from_slice(&crc.to_le_bytes());
        let at = PAGES_AT + self.pages as u64 * PAGE_LEN as u64;
        self.file.write_all_at(&self.page, at)?;
        self.page.fill(0);
        self.fill = PAGE_HEAD;
        self.count = 0;
        self.pages += 1;
        Ok(())
    }
}

/// Writes the index pages after the `data_pages` data pages: each data page's first name, in
/// order. Returns the root: each index page's first name and first data page.
fn write_index(
    file: &dyn VfsFile,
    data_pages: u32,
    first: &Names,
) -> std::io::Result<(Names, Vec<u32>)> {
    let mut root = Names::default();
    let mut starts = Vec::new();
    let mut page = vec![0u8; PAGE_LEN];
    let (mut fill, mut count) = (INDEX_HEAD, 0u16);
    let finish = |page: &mut Vec<u8>, count: u16, number: u32| {
        page[4..6].copy_from_slice(&count.to_le_bytes());
        let crc = page_crc(number, &page[4..]);
        page[0..4].copy_from_slice(&crc.to_le_bytes());
        let at = PAGES_AT + number as u64 * PAGE_LEN as u64;
        let written = file.write_all_at(page, at);
        page.fill(0);
        written
    };
    for i in 0..first.len() {
        let name = first.get(i);
        if fill + 1 + name.len() > PAGE_LEN || count == u16::MAX {
            finish(&mut page, count, data_pages + starts.len() as u32 - 1)?;
            (fill, count) = (INDEX_HEAD, 0);
        }
        if count == 0 {
            root.push(name);
            starts.push(i as u32);
        }
        page[fill] = name.len() as u8;
        page[fill + 1..fill + 1 + name.len()].copy_from_slice(name);
        fill += 1 + name.len();
        count += 1;
    }
    if count > 0 {
        finish(&mut page, count, data_pages + starts.len() as u32 - 1)?;
    }
    Ok((root, starts))
}

/// Writes a snapshot in the whole-file format of version 2 (tests of reading old stores).
#[cfg(feature = "test-hooks")]
pub fn write_version_2(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    position: &Position,
    heads: Vec<(Vec<u8>, Loc)>,
) -> Result<()> {
    let whole = WholeV2 {
        segment: position.segment,
        offset: position.offset,
        next_lsn: position.next_lsn,
        heads,
        damage: position.damage.clone(),
        garbage_bytes: position.garbage_bytes,
    };
    container::write_atomic(vfs, dir, name, SNAPSHOT_MAGIC, &whole)
}
