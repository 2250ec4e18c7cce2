//! [`OverlayFs`]: a [`Vfs`] over the real directory that never changes it, for inspecting a
//! store (SPEC E5).
//!
//! Reads go to the disk. Whatever the store would write while it opens and recovers (a torn
//! tail cut off, a snapshot rebuilt, a damaged segment set aside) goes to memory instead, and is
//! gone when the overlay is dropped: a file is copied into memory on its first change (a write
//! of the bytes the disk already holds is no change: open rewrites the journal it scanned over
//! itself, and that copies nothing), new files live only in memory, removals and renames are
//! recorded, syncs do nothing. Files on disk are only ever opened for reading.
//!
//! Files read but never changed are held only while a handle on them lives (the overlay keeps a
//! weak reference, so two handles on one path still share one view): inspecting a journal of
//! any number of segments needs no more descriptors than the store's bounded table holds. A
//! file is held for good once it changes.
//!
//! One call reaches the disk for real: [`Vfs::hard_link`] of a file the overlay has not changed,
//! which gives it a second name outside the store (a backup of a store no process has open).
//!
//! The directory lock (SPEC S6) is taken for real, on the existing lock file opened for
//! reading: a store another process has open is refused with `Locked` (its files are changing
//! under it), and while the overlay holds the lock no process can take the store over. A lock
//! file that does not exist is not created.

use crate::sync::{HashMap, HashSet};
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use crate::sync::Mutex;

use super::vfs::{OpenMode, PathKind, Vfs, VfsFile, VfsLock};

/// A file as the overlay sees it: the disk's bytes until the first change, then a private copy.
#[derive(Debug)]
struct CowFile {
    disk: Option<File>,
    copy: Mutex<Option<Vec<u8>>>,
    /// Set while the overlay holds this file only weakly: on its first change, the file asks
    /// the overlay to hold it for good under this path (a change must outlive its handles).
    promote: Mutex<Option<Promote>>,
}

#[derive(Debug)]
struct Promote {
    state: std::sync::Weak<Mutex<State>>,
    path: PathBuf,
    me: Weak<CowFile>,
}

impl CowFile {
    fn on_disk(file: File, state: &Arc<Mutex<State>>, path: &Path) -> Arc<Self> {
        Arc::new_cyclic(|me| CowFile {
            disk: Some(file),
            copy: Mutex::new(None),
            promote: Mutex::new(Some(Promote {
                state: Arc::downgrade(state),
                path: path.to_path_buf(),
                me: me.clone(),
            })),
        })
    }

    fn in_memory() -> Self {
        CowFile {
            disk: None,
            copy: Mutex::new(Some(Vec::new())),
            promote: Mutex::new(None),
        }
    }

    /// The overlay holds this file for good now (made, renamed, or removed): no promotion.
    fn held(&self) {
        *self.promote.lock() = None;
    }

    /// The private copy, made from the disk's bytes on first need. Never called with the
    /// overlay's state lock held (the first change takes it to promote the file).
    fn with_copy<T>(&self, f: impl FnOnce(&mut Vec<u8>) -> T) -> io::Result<T> {
        let mut copy = self.copy.lock();
        if copy.is_none() {
            let disk = self
                .disk
                .as_ref()
                .expect("a file without a copy is on disk");
            let mut bytes = vec![0; disk.metadata()?.len() as usize];
            disk.read_exact_at(&mut bytes, 0)?;
            *copy = Some(bytes);
            if let Some(p) = self.promote.lock().take()
                && let (Some(state), Some(me)) = (p.state.upgrade(), p.me.upgrade())
            {
                let mut state = state.lock();
                state.disk.remove(&p.path);
                state.files.insert(p.path, me);
            }
        }
        Ok(f(copy.as_mut().expect("made above")))
    }
}

impl CowFile {
    /// Whether the disk holds `buf` at `offset`, so that writing it to a file with no copy
    /// would change nothing (open writes the journal it scanned over itself
    /// before syncing it; copying a whole segment into memory for that would be wasted).
    fn disk_holds(&self, buf: &[u8], offset: u64) -> io::Result<bool> {
        let disk = self
            .disk
            .as_ref()
            .expect("a file without a copy is on disk");
        let mut there = vec![0u8; buf.len()];
        let mut got = 0;
        while got < there.len() {
            match disk.read_at(&mut there[got..], offset + got as u64)? {
                0 => return Ok(false),
                n => got += n,
            }
        }
        Ok(there == buf)
    }
}

impl VfsFile for CowFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(copy) = self.copy.lock().as_ref() {
            let start = (offset as usize).min(copy.len());
            let n = buf.len().min(copy.len() - start);
            buf[..n].copy_from_slice(&copy[start..start + n]);
            return Ok(n);
        }
        self.disk.as_ref().expect("on disk").read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        {
            // Held while comparing, so no copy can be made (and changed) meanwhile.
            let copy = self.copy.lock();
            if copy.is_none() && self.disk_holds(buf, offset)? {
                return Ok(());
            }
        }
        self.with_copy(|copy| {
            let end = offset as usize + buf.len();
            if copy.len() < end {
                copy.resize(end, 0);
            }
            copy[offset as usize..end].copy_from_slice(buf);
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        if let Some(copy) = self.copy.lock().as_ref() {
            return Ok(copy.len() as u64);
        }
        Ok(self.disk.as_ref().expect("on disk").metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with_copy(|copy| copy.resize(len as usize, 0))
    }
}

#[derive(Debug)]
struct DiskLock {
    _file: Option<File>,
}

impl VfsLock for DiskLock {}

#[derive(Debug, Default)]
struct State {
    /// Every file made or changed so far: held for good.
    files: HashMap<PathBuf, Arc<CowFile>>,
    /// Files read but not changed, held only while a handle lives, so two handles on one path
    /// share one view and an unused file's descriptor is closed.
    disk: HashMap<PathBuf, Weak<CowFile>>,
    /// Paths removed (or renamed away) in the overlay; the disk still has them.
    removed: HashSet<PathBuf>,
    /// Directories made in the overlay.
    dirs: HashSet<PathBuf>,
}

/// A file system that reads the real one and keeps every change in memory (see the module
/// docs). Cloning gives another handle on the same overlay.
#[derive(Clone, Debug, Default)]
pub(crate) struct OverlayFs {
    state: Arc<Mutex<State>>,
    /// Whether [`Vfs::try_lock`] takes the real lock (the default) or none.
    skip_lock: bool,
}

impl OverlayFs {
    /// An overlay that takes the directory lock for real.
    pub(crate) fn new() -> Self {
        OverlayFs::default()
    }

    /// An overlay that takes no lock, for a second look at a directory whose lock this process
    /// already holds through another handle.
    pub(crate) fn without_lock() -> Self {
        OverlayFs {
            skip_lock: true,
            ..OverlayFs::default()
        }
    }
}

fn exists_on_disk(path: &Path) -> io::Result<Option<std::fs::Metadata>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl OverlayFs {
    /// The overlay's file at `path`, if it exists in the overlay's view.
    fn lookup(&self, state: &mut State, path: &Path) -> io::Result<Option<Arc<CowFile>>> {
        if let Some(file) = state.files.get(path) {
            return Ok(Some(Arc::clone(file)));
        }
        if state.removed.contains(path) {
            return Ok(None);
        }
        if let Some(file) = state.disk.get(path).and_then(Weak::upgrade) {
            return Ok(Some(file));
        }
        match exists_on_disk(path)? {
            Some(m) if m.is_file() => {
                let file = CowFile::on_disk(File::open(path)?, &self.state, path);
                state.disk.retain(|_, f| f.strong_count() > 0);
                state.disk.insert(path.to_path_buf(), Arc::downgrade(&file));
                Ok(Some(file))
            }
            _ => Ok(None),
        }
    }

    /// Holds `file` for good under `path`.
    fn hold(state: &mut State, path: &Path, file: Arc<CowFile>) {
        file.held();
        state.disk.remove(path);
        state.files.insert(path.to_path_buf(), file);
    }
}

impl Vfs for OverlayFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        let mut state = self.state.lock();
        let existing = self.lookup(&mut state, path)?;
        let file = match (mode, existing) {
            (OpenMode::Read | OpenMode::ReadWrite, Some(file)) => file,
            (OpenMode::Read | OpenMode::ReadWrite, None) => {
                return Err(io::ErrorKind::NotFound.into());
            }
            (OpenMode::CreateNew, Some(_)) => return Err(io::ErrorKind::AlreadyExists.into()),
            (OpenMode::CreateTruncate, Some(file)) => {
                Self::hold(&mut state, path, Arc::clone(&file));
                drop(state);
                file.set_len(0)?;
                file
            }
            (OpenMode::CreateNew | OpenMode::CreateTruncate, None) => {
                let file = Arc::new(CowFile::in_memory());
                state.files.insert(path.to_path_buf(), Arc::clone(&file));
                state.removed.remove(path);
                file
            }
        };
        Ok(file)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        if !exists_on_disk(path)?.is_some_and(|m| m.is_dir()) {
            let mut state = self.state.lock();
            for dir in path.ancestors() {
                state.dirs.insert(dir.to_path_buf());
            }
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.state.lock();
        let mut names = BTreeSet::new();
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry?;
                    if !state.removed.contains(&entry.path()) {
                        names.insert(entry.file_name().to_string_lossy().into_owned());
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && state.dirs.contains(dir) => {}
            Err(e) => return Err(e),
        }
        for path in state.files.keys().chain(state.dirs.iter()) {
            if path.parent() == Some(dir)
                && let Some(name) = path.file_name()
            {
                names.insert(name.to_string_lossy().into_owned());
            }
        }
        Ok(names.into_iter().collect())
    }

    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        let state = self.state.lock();
        if state.files.contains_key(path) {
            return Ok(Some(PathKind::File));
        }
        if state.dirs.contains(path) {
            return Ok(Some(PathKind::Dir));
        }
        if state.removed.contains(path) {
            return Ok(None);
        }
        Ok(exists_on_disk(path)?.map(|m| {
            if m.is_dir() {
                PathKind::Dir
            } else {
                PathKind::File
            }
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        if self.lookup(&mut state, path)?.is_none() {
            return Err(io::ErrorKind::NotFound.into());
        }
        if let Some(file) = state.files.remove(path) {
            file.held();
        }
        if let Some(file) = state.disk.remove(path).and_then(|f| f.upgrade()) {
            file.held();
        }
        state.removed.insert(path.to_path_buf());
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        let Some(file) = self.lookup(&mut state, from)? else {
            return Err(io::ErrorKind::NotFound.into());
        };
        state.files.remove(from);
        state.disk.remove(from);
        state.removed.insert(from.to_path_buf());
        state.removed.remove(to);
        Self::hold(&mut state, to, file);
        Ok(())
    }

    /// Links the file on disk only while the overlay has not changed it (nor made, renamed or
    /// removed it): then the disk's bytes are the overlay's. A changed file answers
    /// `Unsupported`, so a backup copies the overlay's bytes instead. The new name is made on
    /// disk for real: this serves only a backup of the store into another directory.
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let state = self.state.lock();
        if state.removed.contains(from) {
            return Err(io::ErrorKind::NotFound.into());
        }
        if state.files.contains_key(from) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} was changed in memory; the disk does not hold what it reads",
                    from.display()
                ),
            ));
        }
        std::fs::hard_link(from, to)
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        if self.skip_lock || exists_on_disk(path)?.is_none() {
            return Ok(Box::new(DiskLock { _file: None }));
        }
        // Opened for reading only: flock does not need write access, and nothing is created.
        let file = OpenOptions::new().read(true).open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(DiskLock { _file: Some(file) })),
            Err(TryLockError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_state(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = walk(dir)
            .into_iter()
            .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
            .collect();
        files.sort();
        files
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = vec![dir.to_path_buf()];
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
        out.retain(|p| p.is_file());
        out
    }

    #[test]
    fn every_change_stays_in_memory_and_reads_see_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"disk bytes").unwrap();
        let before = disk_state(dir.path());
        let fs = OverlayFs::new();
        let a = fs.open(&dir.path().join("a"), OpenMode::ReadWrite).unwrap();
        a.write_all_at(b"DISK", 0).unwrap();
        a.set_len(6).unwrap();
        let mut buf = [0; 6];
        a.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"DISK b");
        let sub = dir.path().join("sub");
        fs.create_dir_all(&sub).unwrap();
        let new = fs.open(&sub.join("n"), OpenMode::CreateNew).unwrap();
        new.write_all_at(b"new", 0).unwrap();
        fs.rename(&sub.join("n"), &dir.path().join("m")).unwrap();
        fs.remove(&dir.path().join("a")).unwrap();
        assert_eq!(fs.list(dir.path()).unwrap(), ["m", "sub"]);
        assert_eq!(fs.kind(&dir.path().join("a")).unwrap(), None);
        let _lock = fs.try_lock(&dir.path().join("LOCK")).unwrap();
        // Nothing reached the disk, and no lock file was made.
        assert_eq!(disk_state(dir.path()), before);
        assert!(!sub.exists());
    }

    #[test]
    fn a_held_lock_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("LOCK");
        let held = super::super::OsFs.try_lock(&lock).unwrap();
        let err = OverlayFs::new().try_lock(&lock).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        drop(held);
        assert!(OverlayFs::new().try_lock(&lock).is_ok());
    }
}
