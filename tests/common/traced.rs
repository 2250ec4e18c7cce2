//! A [`Vfs`] that records what the store asks of the file system, so tests can count what an
//! open or a read does (files opened, directories listed, syncs) without timing anything, and,
//! where a test asks, replay the changes made to files' bytes in order.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use portcullis::store::{OpenMode, PathKind, Vfs, VfsFile, VfsLock};

/// One change to a file, as [`Traced::recording_changes`] records it once it succeeded.
#[derive(Clone, Debug)]
pub enum Change {
    /// `len` bytes written at `offset`; `zeros` when every one of them was zero.
    Write {
        offset: u64,
        len: u64,
        zeros: bool,
    },
    Sync,
    SetLen(u64),
}

/// The changes made to files, with the path of each, in the order they were made.
pub type Changes = Arc<Mutex<Vec<(PathBuf, Change)>>>;

/// Forwards every call to `inner` and records it as a line: `open <path>`, `list <dir>`,
/// `sync_dir <dir>`, `sync_data <path>`, `write <path>` (any change to a file's bytes or length).
#[derive(Debug, Clone)]
pub struct Traced {
    inner: Arc<dyn Vfs>,
    calls: Arc<Mutex<Vec<String>>>,
    changes: Option<Changes>,
}

impl Traced {
    pub fn new(inner: Arc<dyn Vfs>) -> Self {
        Traced {
            inner,
            calls: Arc::default(),
            changes: None,
        }
    }

    /// Also records each successful write, sync and `set_len` of a file, with its offsets,
    /// into `changes` (which several of these may share, one per disk a test opens).
    pub fn recording_changes(inner: Arc<dyn Vfs>, changes: Changes) -> Self {
        Traced {
            changes: Some(changes),
            ..Traced::new(inner)
        }
    }

    /// Takes the calls recorded since the last take.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.calls.lock())
    }

    fn note(&self, what: &str, path: &Path) {
        self.calls.lock().push(format!("{what} {}", path.display()));
    }

    fn changed(&self, path: &Path, change: Change) {
        if let Some(changes) = &self.changes {
            changes.lock().push((path.to_path_buf(), change));
        }
    }
}

#[derive(Debug)]
struct TracedFile {
    inner: Arc<dyn VfsFile>,
    vfs: Traced,
    path: PathBuf,
}

impl VfsFile for TracedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.vfs.note("write", &self.path);
        self.inner.write_all_at(buf, offset)?;
        let change = Change::Write {
            offset,
            len: buf.len() as u64,
            zeros: buf.iter().all(|&b| b == 0),
        };
        self.vfs.changed(&self.path, change);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.vfs.note("sync_data", &self.path);
        self.inner.sync_data()?;
        self.vfs.changed(&self.path, Change::Sync);
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.vfs.note("write", &self.path);
        self.inner.set_len(len)?;
        self.vfs.changed(&self.path, Change::SetLen(len));
        Ok(())
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
