//! A slow disk in front of the fault-injecting one: each sync takes a number of scheduling
//! steps the seed chooses, as a real `fdatasync` takes milliseconds while other threads run.
//!
//! On `FaultFs` alone a sync is one step (one lock), so the group-commit leader is almost never
//! inside its sync when background work (compaction, snapshots) chooses what to do; on a real
//! disk it usually is. Everything else is passed through unchanged.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use portcullis::store::{FaultFs, OpenMode, PathKind, Vfs, VfsFile, VfsLock};

use super::pause;

/// `FaultFs` whose syncs (of files and directories) each let the other tasks run `sync_steps`
/// steps first.
#[derive(Clone)]
pub struct SlowDisk {
    pub fs: FaultFs,
    pub sync_steps: u64,
}

impl fmt::Debug for SlowDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlowDisk({} steps per sync)", self.sync_steps)
    }
}

struct SlowFile {
    file: Arc<dyn VfsFile>,
    sync_steps: u64,
}

impl fmt::Debug for SlowFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlowFile({:?})", self.file)
    }
}

impl VfsFile for SlowFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        pause(self.sync_steps);
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
}

impl Vfs for SlowDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        Ok(Arc::new(SlowFile {
            file: self.fs.open(path, mode)?,
            sync_steps: self.sync_steps,
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.fs.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.fs.list(dir)
    }
    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        self.fs.kind(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.fs.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.fs.rename(from, to)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.fs.hard_link(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        pause(self.sync_steps);
        self.fs.sync_dir(dir)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        self.fs.try_lock(path)
    }
}
