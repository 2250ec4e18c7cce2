//! The disk the store workload's store sees: the fault-injecting disk (`FaultFs`) behind
//! syncs that take time and a capacity that can run out.
//!
//! - **Slow syncs.** Each sync of a file or a directory first lets the other tasks run
//!   `sync_steps` steps, as a real `fdatasync` takes milliseconds while other threads run. On
//!   `FaultFs` alone a sync is one step, so the group-commit leader is seldom inside its sync
//!   when background work (compaction, snapshots) chooses what to do; on a real disk it often is.
//! - **A full disk.** Once `full_after` bytes have been written in all (`FaultFs::bytes_written`),
//!   every write, and every `set_len` that grows a file, fails with `StorageFull` and writes
//!   nothing, as `ENOSPC` does; reads, syncs, renames and removals still work.
//!
//! Everything else is passed through unchanged.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use portcullis::store::{FaultFs, OpenMode, PathKind, Vfs, VfsFile, VfsLock};

use super::pause;

/// `FaultFs` with slow syncs and, optionally, a capacity.
#[derive(Clone)]
pub struct SimDisk {
    pub fs: FaultFs,
    /// Steps the other tasks may run before each sync.
    pub sync_steps: u64,
    /// Bytes written (in all) after which the disk is full (`u64::MAX`: never), shared by
    /// every handle on this disk so a workload can set it once its store is open.
    pub full_after: Arc<AtomicU64>,
}

impl SimDisk {
    /// The disk a reopen after the run sees: fast, with room.
    pub fn plain(fs: FaultFs) -> SimDisk {
        SimDisk {
            fs,
            sync_steps: 0,
            full_after: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    fn room(&self) -> io::Result<()> {
        if self.fs.bytes_written() >= self.full_after.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "no space left on device (the simulated disk is full)",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SimDisk({} steps per sync, full after {} bytes)",
            self.sync_steps,
            self.full_after.load(Ordering::SeqCst)
        )
    }
}

struct SimFile {
    file: Arc<dyn VfsFile>,
    disk: SimDisk,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimFile({:?})", self.file)
    }
}

impl VfsFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.disk.room()?;
        self.file.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        pause(self.disk.sync_steps);
        self.file.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        if len > self.file.len()? {
            self.disk.room()?;
        }
        self.file.set_len(len)
    }
}

impl Vfs for SimDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        if matches!(mode, OpenMode::CreateNew | OpenMode::CreateTruncate) {
            self.room()?;
        }
        Ok(Arc::new(SimFile {
            file: self.fs.open(path, mode)?,
            disk: self.clone(),
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
