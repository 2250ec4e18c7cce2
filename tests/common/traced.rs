//! A [`Vfs`] that records what the store asks of the file system, so tests can count what an
//! open or a read does (files opened, directories listed, syncs) without timing anything.

use std::io;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use portcullis::store::{OpenMode, PathKind, Vfs, VfsFile, VfsLock};

/// Forwards every call to `inner` and records it as a line: `open <path>`, `list <dir>`,
/// `sync_dir <dir>`, `sync_data <path>`, `write <path>` (any change to a file's bytes or length).
#[derive(Debug, Clone)]
pub struct Traced {
    inner: Arc<dyn Vfs>,
    calls: Arc<Mutex<Vec<String>>>,
}

impl Traced {
    pub fn new(inner: Arc<dyn Vfs>) -> Self {
        Traced {
            inner,
            calls: Arc::default(),
        }
    }

    /// Takes the calls recorded since the last take.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.calls.lock())
    }

    fn note(&self, what: &str, path: &Path) {
        self.calls.lock().push(format!("{what} {}", path.display()));
    }
}

#[derive(Debug)]
struct TracedFile {
    inner: Arc<dyn VfsFile>,
    vfs: Traced,
    path: std::path::PathBuf,
}

impl VfsFile for TracedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.vfs.note("write", &self.path);
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.vfs.note("sync_data", &self.path);
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.vfs.note("write", &self.path);
        self.inner.set_len(len)
    }
}

impl Vfs for Traced {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        self.note("open", path);
        Ok(Arc::new(TracedFile {
            inner: self.inner.open(path, mode)?,
            vfs: self.clone(),
            path: path.to_path_buf(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.note("list", dir);
        self.inner.list(dir)
    }
    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        self.inner.kind(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.note("remove", path);
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.note("rename", to);
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.note("sync_dir", dir);
        self.inner.sync_dir(dir)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        self.inner.try_lock(path)
    }
}
