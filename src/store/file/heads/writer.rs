//! Writing a heads snapshot: the pages streamed in name order (the base's entries merged
//! with the changed heads), then the meta and the header, atomically (temp file, sync, rename,
//! sync directory); and, for tests of reading old stores, the whole-file format of version 2.
//!
//! May call: the file layer and, for the version 2 format, the whole-file container only; the
//! layout is [`super`]'s.

use std::path::Path;

use super::{
    HEADER_LEN, Loc, Meta, OpenMode, PAGE_HEAD, PAGE_LEN, PAGED_MAGIC, PAGES_AT, PREAMBLE_LEN,
    Page, Pages, Position, Vfs, VfsFile, format, page_crc,
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
        first_names: Vec::new(),
        first_ends: Vec::new(),
    };
    let mut changed = changed.iter().peekable();
    let base_pages: Box<dyn Iterator<Item = Result<Page>>> = match base {
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
    let meta = Meta {
        position: position.clone(),
        partitions,
        first_names: writer.first_names,
        first_ends: writer.first_ends,
    };
    let body =
        postcard::to_stdvec(&meta).map_err(|e| Error::invalid(format!("encoding {name}: {e}")))?;
    let meta_at = PAGES_AT + writer.pages as u64 * PAGE_LEN as u64;
    file.write_all_at(&body, meta_at)
        .map_err(|e| io("writing", e))?;
    let mut header = [0u8; HEADER_LEN];
    header[..PREAMBLE_LEN].copy_from_slice(&format::encode_preamble(PAGED_MAGIC));
    let fields = PREAMBLE_LEN;
    header[fields..fields + 4].copy_from_slice(&(PAGE_LEN as u32).to_le_bytes());
    header[fields + 4..fields + 8].copy_from_slice(&writer.pages.to_le_bytes());
    header[fields + 8..fields + 12].copy_from_slice(&(body.len() as u32).to_le_bytes());
    header[fields + 12..fields + 16].copy_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    let crc = crc32c::crc32c(&header[fields..fields + 16]);
    header[fields + 16..fields + 20].copy_from_slice(&crc.to_le_bytes());
    file.write_all_at(&header, 0)
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
    first_names: Vec<u8>,
    first_ends: Vec<u32>,
}

impl PageWriter<'_> {
    fn push(&mut self, name: &[u8], head: Loc) -> std::io::Result<()> {
        let len = 9 + name.len();
        if self.fill + len > self.page.len() || self.count == u16::MAX {
            self.finish_page()?;
        }
        if self.count == 0 {
            self.first_names.extend_from_slice(name);
            self.first_ends.push(self.first_names.len() as u32);
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
