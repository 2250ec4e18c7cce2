//! A bounded table of open journal segment files, so a journal of any number of segments needs
//! a bounded number of file descriptors (100 GiB of 32 MiB segments would be over 3,000).
//!
//! Every segment is reached through a [`SegmentFile`]: a [`VfsFile`] that takes its handle from
//! the table, opening the file when it is not open and closing the least recently used one
//! when the table is full. A handle in use stays open until its user drops it, so the files open
//! at once are the table plus those in flight.
//!
//! A segment written since its last sync is never closed: after a failed writeback, Linux
//! reports the error to the descriptors open at the time, and a descriptor opened later could
//! miss it (the fsyncgate findings). Its handle stays in the table until a sync succeeds.
//!
//! Readers that hold a location into a segment that compaction deletes are kept out by the
//! journal's reader pins (see `Journal::pin`), not by open handles. Calls only the file layer.
//!
//! Also owns [`SegmentSet`], the journal's segments by number and what is known of each one's
//! header. Open reads only the headers of the segments it scans (from the heads snapshot's
//! position on); every older, sealed segment is checked on first use, so open costs the same
//! whatever the number of segments. A header found damaged, or a segment file found missing,
//! is remembered and answers `Corrupt` from then on (SPEC S4).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::sync::{Mutex, RwLock};

use super::format::{self, SEGMENT_HEADER_LEN};
use super::journal::{Segment, segment_file_name};
use super::vfs::{OpenMode, Vfs, VfsFile};
use crate::error::{Error, Result};

/// The open segment files of one journal directory.
#[derive(Debug)]
pub struct SegmentFiles {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    capacity: usize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// Open handles and when each was last used. Ordered maps: a table of a few dozen small
    /// integer keys is searched faster than it is hashed (every value read looks one up).
    open: BTreeMap<u32, (Arc<dyn VfsFile>, u64)>,
    /// Segments written since their last successful sync: never closed.
    dirty: BTreeSet<u32>,
    clock: u64,
}

impl SegmentFiles {
    pub fn new(dir: PathBuf, vfs: Arc<dyn Vfs>, capacity: usize) -> Arc<Self> {
        Arc::new(SegmentFiles {
            dir,
            vfs,
            capacity: capacity.max(2),
            table: Mutex::new(Table::default()),
        })
    }

    /// The file of segment `number`, opened on demand.
    pub fn file(self: &Arc<Self>, number: u32) -> Arc<dyn VfsFile> {
        Arc::new(SegmentFile {
            number,
            files: self.clone(),
        })
    }

    /// Adopts a handle just opened (say, by creating the file), so it is not opened twice.
    pub fn adopt(&self, number: u32, file: Arc<dyn VfsFile>) {
        let mut table = self.table.lock();
        table.clock += 1;
        let now = table.clock;
        table.open.insert(number, (file, now));
        self.evict(&mut table);
    }

    /// Closes the handle of a deleted segment.
    pub fn forget(&self, number: u32) {
        let mut table = self.table.lock();
        table.open.remove(&number);
        table.dirty.remove(&number);
    }

    /// Reads and checks the header of segment `number` through the table (see [`seed_of`]).
    fn check_header(self: &Arc<Self>, number: u32) -> Result<u32> {
        let shown = self
            .dir
            .join(segment_file_name(number))
            .display()
            .to_string();
        let mut header = vec![0u8; SEGMENT_HEADER_LEN as usize];
        let file = match self.handle(number, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::corrupt(shown, "the segment file is missing"));
            }
            Err(e) => return Err(Error::io(format!("opening {shown}"), e)),
        };
        let len = file
            .len()
            .map_err(|e| Error::io(format!("sizing {shown}"), e))?;
        header.truncate(len.min(SEGMENT_HEADER_LEN) as usize);
        file.read_exact_at(&mut header, 0)
            .map_err(|e| Error::io(format!("reading {shown}"), e))?;
        seed_of(&header, number, &shown)
    }

    /// Files open in the table now.
    #[cfg(test)]
    pub fn open_count(&self) -> usize {
        self.table.lock().open.len()
    }

    /// The handle of `number`; `writing` marks it dirty first, so it cannot be closed between
    /// the write and its sync.
    fn handle(&self, number: u32, writing: bool) -> io::Result<Arc<dyn VfsFile>> {
        let mut table = self.table.lock();
        table.clock += 1;
        let now = table.clock;
        if writing {
            table.dirty.insert(number);
        }
        if let Some((file, used)) = table.open.get_mut(&number) {
            *used = now;
            return Ok(file.clone());
        }
        // Opening under the table's mutex keeps the count bounded; it is a short system call.
        let path = self.dir.join(segment_file_name(number));
        let file = match self.vfs.open(&path, OpenMode::ReadWrite) {
            Ok(file) => file,
            Err(e) => {
                if writing {
                    table.dirty.remove(&number);
                }
                return Err(e);
            }
        };
        table.open.insert(number, (file.clone(), now));
        self.evict(&mut table);
        Ok(file)
    }

    fn evict(&self, table: &mut Table) {
        while table.open.len() > self.capacity {
            let victim = table
                .open
                .iter()
                .filter(|(n, _)| !table.dirty.contains(n))
                .min_by_key(|(_, (_, used))| *used)
                .map(|(n, _)| *n);
            match victim {
                Some(n) => {
                    table.open.remove(&n);
                }
                // Every open segment has unsynced writes: keep them all.
                None => break,
            }
        }
    }

    fn synced(&self, number: u32) {
        let mut table = self.table.lock();
        table.dirty.remove(&number);
        self.evict(&mut table);
    }
}

/// The checksum seed of segment `number` from its header bytes: `Corrupt` if the header is
/// damaged or names another segment, `UnsupportedVersion` if it is newer (SPEC S10).
pub fn seed_of(header: &[u8], number: u32, shown: &str) -> Result<u32> {
    match format::decode_segment_header(header, shown)? {
        (n, _) if n != number => Err(Error::corrupt(
            shown.to_owned(),
            format!("the header names segment {n}"),
        )),
        (_, salt) => Ok(format::salt_seed(salt)),
    }
}

/// What is known of a segment's header.
#[derive(Clone, Debug)]
pub enum Header {
    /// Listed in the journal directory, not read yet (a sealed segment open did not scan).
    Unchecked,
    /// Read and intact: the seed its checksums use.
    Good(u32),
    /// Damaged or missing: why. The segment is kept as evidence and never read.
    Damaged(String),
}

/// The journal's segments by number, each reached through the bounded table (see the module
/// docs). A number that is not here is a missing segment.
#[derive(Debug)]
pub struct SegmentSet {
    files: Arc<SegmentFiles>,
    headers: RwLock<BTreeMap<u32, Header>>,
}

impl SegmentSet {
    pub fn new(files: Arc<SegmentFiles>, headers: BTreeMap<u32, Header>) -> Self {
        SegmentSet {
            files,
            headers: RwLock::new(headers),
        }
    }

    /// Segment `number`, its header checked on first use. A damaged header or a missing file
    /// answers `Corrupt` naming the segment, now and every later time; any other I/O error
    /// answers `Io` and is not remembered.
    pub fn get(&self, number: u32) -> Result<Segment> {
        let seed = self.seed(number)?;
        Ok(Segment {
            file: self.files.file(number),
            seed,
        })
    }

    /// The open file of segment `number` for reading, from the table, without allocating
    /// (a [`Segment`] costs an allocation, and reads take one per value or record read). Its
    /// header is not checked: call [`SegmentSet::seed`] first. Open until dropped, like any
    /// handle in use; hold it for one read or a few, not longer.
    pub fn reader(&self, number: u32) -> io::Result<Arc<dyn VfsFile>> {
        self.files.handle(number, false)
    }

    /// The checksum seed of segment `number`, its header checked on first use, with the
    /// refusals of [`SegmentSet::get`].
    pub fn seed(&self, number: u32) -> Result<u32> {
        let known = match self.headers.read().get(&number) {
            // The common case copies the seed out under the read lock, cloning nothing.
            Some(Header::Good(seed)) => return Ok(*seed),
            other => other.cloned(),
        };
        let seed = match known {
            Some(Header::Good(seed)) => seed,
            Some(Header::Damaged(reason)) => return Err(damaged(number, &reason)),
            None => return Err(damaged(number, "the segment file is missing")),
            Some(Header::Unchecked) => {
                let checked = self.files.check_header(number);
                let mut headers = self.headers.write();
                // Deleted meanwhile: missing, as for any other reader.
                let Some(entry) = headers.get_mut(&number) else {
                    return Err(damaged(number, "the segment file is missing"));
                };
                match checked {
                    Ok(seed) => {
                        *entry = Header::Good(seed);
                        seed
                    }
                    Err(Error::Corrupt { detail, .. }) => {
                        log::error!(
                            "journal segment {number} has a damaged header ({detail}); it is kept, and the partitions that need it are refused"
                        );
                        *entry = Header::Damaged(detail.clone());
                        return Err(damaged(number, &detail));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        Ok(seed)
    }

    /// Adds a segment whose header was just written or read.
    pub fn insert(&self, number: u32, seed: u32) {
        self.headers.write().insert(number, Header::Good(seed));
    }

    /// Removes a deleted segment and closes its file.
    pub fn remove(&self, number: u32) {
        self.headers.write().remove(&number);
        self.files.forget(number);
    }

    /// The segments that may hold records: every one but those found damaged.
    pub fn live(&self) -> Vec<u32> {
        self.headers
            .read()
            .iter()
            .filter(|(_, h)| !matches!(h, Header::Damaged(_)))
            .map(|(&n, _)| n)
            .collect()
    }
}

fn damaged(number: u32, reason: &str) -> Error {
    Error::corrupt(
        format!("journal segment {number}"),
        format!("the segment cannot be read: {reason}"),
    )
}

/// A segment file reached through the table (see the module docs).
#[derive(Debug)]
struct SegmentFile {
    number: u32,
    files: Arc<SegmentFiles>,
}

impl VfsFile for SegmentFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.files.handle(self.number, false)?.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.files
            .handle(self.number, true)?
            .write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        // Dirty, so the handle that wrote is the one synced.
        let file = self.files.handle(self.number, true)?;
        file.sync_data()?;
        self.files.synced(self.number);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        self.files.handle(self.number, false)?.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.files.handle(self.number, true)?.set_len(len)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // One handle for the whole read.
        self.files
            .handle(self.number, false)?
            .read_exact_at(buf, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::FaultFs;
    use std::path::Path;

    #[test]
    fn at_most_capacity_clean_files_stay_open_and_dirty_ones_are_kept() {
        let fs = FaultFs::new();
        let dir = Path::new("/j");
        fs.create_dir_all(dir).unwrap();
        for n in 1..=10u32 {
            fs.open(&dir.join(segment_file_name(n)), OpenMode::CreateNew)
                .unwrap();
        }
        let files = SegmentFiles::new(dir.to_path_buf(), Arc::new(fs.clone()), 3);
        for n in 1..=10u32 {
            files.file(n).write_all_at(&[n as u8], 0).unwrap();
        }
        // Nothing was synced: every written file stays open.
        assert_eq!(files.open_count(), 10);
        for n in 1..=10u32 {
            files.file(n).sync_data().unwrap();
        }
        files.file(1).len().unwrap();
        assert_eq!(files.open_count(), 3);
        for n in 1..=10u32 {
            let mut b = [0u8; 1];
            files.file(n).read_exact_at(&mut b, 0).unwrap();
            assert_eq!(b[0], n as u8);
            assert!(files.open_count() <= 3);
        }
    }
}
