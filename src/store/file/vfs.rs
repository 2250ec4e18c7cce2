//! The file layer the file-backed store does all its I/O through.
//!
//! The store never calls `std::fs` directly: it goes through a [`Vfs`], so tests can swap in a
//! layer that drops unsynced writes, tears the last write or fails a chosen operation (see
//! `FaultFs`, built with the `fault-injection` feature) and check recovery against every crash
//! point.

use std::fmt::Debug;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// An open file: positional reads and writes, data sync, length.
#[allow(clippy::len_without_is_empty)]
pub trait VfsFile: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// The file's length.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends the file (not durable until [`VfsFile::sync_data`]).
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Fills `buf` from `offset`, failing with `UnexpectedEof` if the file is too short.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write; the file must not exist yet.
    CreateNew,
    /// Read and write; created empty, or truncated if it exists.
    CreateTruncate,
}

/// A held directory lock; dropping it releases the lock.
pub trait VfsLock: Send + Sync + Debug {}

/// A file system: what the store needs of one, and nothing more.
pub trait Vfs: Send + Sync + Debug {
    /// Opens a file.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// The names of the entries of a directory.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Whether a path exists, and whether it is a directory.
    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically renames a file over another, or a directory (with everything in it) to a
    /// name that does not exist.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Gives the file `from` a second name `to` (a hard link), which must not exist; durable
    /// once `to`'s directory is synced. Both names share the file's bytes, so the store links
    /// only files nothing writes again. A file layer that cannot link answers `Unsupported`
    /// (the default); `CrossesDevices` when the two names are on different file systems.
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let _ = (from, to);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this file layer cannot link files",
        ))
    }
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `path` (created if missing) without waiting.
    /// Answers `WouldBlock` if another holder has it.
    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>>;
}

/// What a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
}

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

#[derive(Debug)]
struct OsFile(File);

impl VfsFile for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

#[derive(Debug)]
struct OsLock {
    _file: File,
}

impl VfsLock for OsLock {}

impl Vfs for OsFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::Read => options.read(true),
            OpenMode::ReadWrite => options.read(true).write(true),
            OpenMode::CreateNew => options.read(true).write(true).create_new(true),
            OpenMode::CreateTruncate => options.read(true).write(true).create(true).truncate(true),
        };
        Ok(Arc::new(OsFile(options.open(path)?)))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Ok(Some(PathKind::Dir)),
            Ok(_) => Ok(Some(PathKind::File)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::hard_link(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(OsLock { _file: file })),
            Err(TryLockError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}
