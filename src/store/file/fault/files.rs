//! The [`Vfs`] that [`FaultFs`] implements, and its file and lock handles: every operation
//! passes the fault model's gate (`begin`) first, then acts on the modelled disk.
//!
//! May call: the disk model and the fault state of [`super`] only.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::disk::normalize;
use super::model::{FileId, FileWrite};
use super::{Access, FaultFs, begin, fault_rng};
use super::{OpenMode, PathKind, Vfs, VfsFile, VfsLock};

fn show(path: &Path) -> String {
    path.display().to_string()
}

impl Vfs for FaultFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        let mut state = self.shared.lock();
        let access = match mode {
            OpenMode::Read | OpenMode::ReadWrite => Access::Read,
            OpenMode::CreateNew | OpenMode::CreateTruncate => Access::Write,
        };
        begin(&mut state, access, || {
            format!("open {mode:?} {}", show(path))
        })?;
        if state.disk.is_dir(path) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", show(path)),
            ));
        }
        let existing = state.disk.lookup(path)?;
        let id = match (mode, existing) {
            (OpenMode::Read | OpenMode::ReadWrite, Some(id)) => id,
            (OpenMode::Read | OpenMode::ReadWrite, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} does not exist", show(path)),
                ));
            }
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} already exists", show(path)),
                ));
            }
            (OpenMode::CreateNew | OpenMode::CreateTruncate, None) => state.disk.create(path)?,
            (OpenMode::CreateTruncate, Some(id)) => {
                state.disk.file_mut(id).write(FileWrite::SetLen(0));
                id
            }
        };
        Ok(Arc::new(FaultFile {
            fs: self.clone(),
            id,
            path: normalize(path),
            writable: mode != OpenMode::Read,
        }))
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.shared.lock();
        begin(&mut state, Access::Write, || {
            format!("create_dir_all {}", show(path))
        })?;
        state.disk.create_dir_all(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut state = self.shared.lock();
        begin(&mut state, Access::Read, || format!("list {}", show(dir)))?;
        state.disk.list(dir)
    }

    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        let mut state = self.shared.lock();
        begin(&mut state, Access::Read, || format!("kind {}", show(path)))?;
        if state.disk.is_dir(path) {
            return Ok(Some(PathKind::Dir));
        }
        // A missing parent directory means the path does not exist either.
        Ok(match state.disk.lookup(path) {
            Ok(Some(_)) => Some(PathKind::File),
            Ok(None) => None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        })
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.shared.lock();
        begin(&mut state, Access::Write, || {
            format!("remove {}", show(path))
        })?;
        state.disk.remove(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.shared.lock();
        begin(&mut state, Access::Write, || {
            format!("rename {} -> {}", show(from), show(to))
        })?;
        state.disk.rename(from, to)
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.shared.lock();
        begin(&mut state, Access::Write, || {
            format!("hard_link {} -> {}", show(from), show(to))
        })?;
        state.disk.link(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.shared.lock();
        begin(&mut state, Access::Sync, || {
            format!("sync_dir {}", show(dir))
        })?;
        state.disk.sync_dir(dir)
    }

    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        let mut state = self.shared.lock();
        let path = normalize(path);
        // Like the OS layer, the lock file is created if missing (its entry unsynced), which
        // makes the call a write.
        let exists = matches!(state.disk.lookup(&path), Ok(Some(_)));
        let access = if exists { Access::Read } else { Access::Write };
        begin(&mut state, access, || format!("try_lock {}", show(&path)))?;
        if !exists {
            state.disk.create(&path)?;
        }
        if !state.locks.insert(path.clone()) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is locked", show(&path)),
            ));
        }
        Ok(Box::new(FaultLock {
            fs: self.clone(),
            path,
        }))
    }
}

/// An open file of a [`FaultFs`]: names the file's contents, not its path, so a removed or
/// renamed file stays readable through handles opened before.
struct FaultFile {
    fs: FaultFs,
    id: FileId,
    path: PathBuf,
    writable: bool,
}

impl fmt::Debug for FaultFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultFile")
            .field("path", &self.path)
            .field("writable", &self.writable)
            .finish()
    }
}

impl FaultFile {
    fn check_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} was opened read-only", show(&self.path)),
            ))
        }
    }
}

impl VfsFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut state = self.fs.shared.lock();
        begin(&mut state, Access::Read, || {
            format!("read_at {}", show(&self.path))
        })?;
        let data = &state.disk.file(self.id).current;
        let start = (offset as usize).min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.fs.shared.lock();
        let outcome = begin(&mut state, Access::Write, || {
            format!("write_all_at {}", show(&self.path))
        });
        if outcome.is_err() && std::mem::take(&mut state.faults.tear) && self.writable {
            // A write that fails may have copied part of its bytes before the error.
            let mut rng = fault_rng(&state.faults, state.faults.ops);
            let done = if rng.one_in(3) {
                0
            } else {
                rng.below(buf.len() as u64 + 1) as usize
            };
            if done > 0 {
                state.disk.file_mut(self.id).write(FileWrite::Data {
                    offset,
                    bytes: buf[..done].to_vec(),
                });
            }
        }
        outcome?;
        self.check_writable()?;
        state.disk.file_mut(self.id).write(FileWrite::Data {
            offset,
            bytes: buf.to_vec(),
        });
        state.written += buf.len() as u64;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.fs.shared.lock();
        let outcome = begin(&mut state, Access::Sync, || {
            format!("sync_data {}", show(&self.path))
        });
        match outcome {
            Ok(()) => state.disk.file_mut(self.id).sync(),
            Err(_) => {
                // Some pages may have reached the disk before the error; the rest never will.
                let mut rng = fault_rng(&state.faults, state.faults.ops);
                state.disk.fail_sync(self.id, &mut rng);
            }
        }
        outcome
    }

    fn len(&self) -> io::Result<u64> {
        let mut state = self.fs.shared.lock();
        begin(&mut state, Access::Read, || {
            format!("len {}", show(&self.path))
        })?;
        Ok(state.disk.file(self.id).current.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.fs.shared.lock();
        begin(&mut state, Access::Write, || {
            format!("set_len {}", show(&self.path))
        })?;
        self.check_writable()?;
        state.disk.file_mut(self.id).write(FileWrite::SetLen(len));
        Ok(())
    }
}

/// A held lock of a [`FaultFs`]; dropping it frees the path.
struct FaultLock {
    fs: FaultFs,
    path: PathBuf,
}

impl fmt::Debug for FaultLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultLock")
            .field("path", &self.path)
            .finish()
    }
}

impl VfsLock for FaultLock {}

impl Drop for FaultLock {
    fn drop(&mut self) {
        self.fs.shared.lock().locks.remove(&self.path);
    }
}
