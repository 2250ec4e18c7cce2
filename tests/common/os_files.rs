//! The operating system's files with an observer on every read and sync, for the tests that
//! measure or pause what the file store does there (its heap at a read, a reader held inside its
//! value read, a group-commit leader held inside its sync). Everything else goes straight to
//! [`OsFs`].

use std::fmt::Debug;
use std::io;
use std::path::Path;
use std::sync::Arc;

use portcullis::store::{OpenMode, OsFs, PathKind, Vfs, VfsFile, VfsLock};

/// Told of every read, and of every sync, before it happens.
pub trait ReadObserver: Send + Sync + Debug + 'static {
    /// Called with the length of the read about to happen.
    fn before_read(&self, len: usize);
    /// Called before every `sync_data` of a file (nothing by default).
    fn before_sync(&self) {}
}

/// The operating system's files, telling the observer of every read before it happens.
#[derive(Debug)]
pub struct ObservedOs<O: ReadObserver>(pub Arc<O>);

/// A file of [`ObservedOs`].
#[derive(Debug)]
struct ObservedFile<O: ReadObserver>(Arc<dyn VfsFile>, Arc<O>);

impl<O: ReadObserver> VfsFile for ObservedFile<O> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.1.before_read(buf.len());
        self.0.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.1.before_sync();
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl<O: ReadObserver> Vfs for ObservedOs<O> {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        Ok(Arc::new(ObservedFile(
            OsFs.open(path, mode)?,
            Arc::clone(&self.0),
        )))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        OsFs.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        OsFs.list(dir)
    }
    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        OsFs.kind(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        OsFs.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        OsFs.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        OsFs.sync_dir(dir)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        OsFs.try_lock(path)
    }
}
