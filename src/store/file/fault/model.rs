//! The disk model behind [`FaultFs`](super::FaultFs): what is in the page cache (current) and
//! what would survive a power cut (durable), for file bytes and for directory entries.
//!
//! This module knows nothing of fault injection or operation counting; it only answers "what
//! does the disk hold now" and "what could it hold after a crash".

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::rng::Rng;

/// Identifies a file's contents independently of its names (an inode).
pub(crate) type FileId = u64;

/// One change to a file's bytes, kept until a sync makes it durable.
#[derive(Clone, Debug)]
pub(crate) enum FileWrite {
    /// Bytes written at an offset (the file grows, zero-filled, if needed).
    Data { offset: u64, bytes: Vec<u8> },
    /// The file truncated or extended (zero-filled) to a length.
    SetLen(u64),
}

impl FileWrite {
    fn apply(&self, data: &mut Vec<u8>) {
        match self {
            FileWrite::Data { offset, bytes } => write_at(data, *offset, bytes),
            FileWrite::SetLen(len) => data.resize(*len as usize, 0),
        }
    }

    /// Applies part of this change, as a power cut in the middle of it would: a prefix of the
    /// bytes, possibly followed by garbage where the rest should be (a sector that was being
    /// written). Changing a length is all or nothing.
    fn apply_torn(&self, data: &mut Vec<u8>, rng: &mut Rng) {
        let FileWrite::Data { offset, bytes } = self else {
            return;
        };
        let cut = rng.below(bytes.len() as u64 + 1) as usize;
        write_at(data, *offset, &bytes[..cut]);
        if rng.one_in(2) {
            let mut garbage = vec![0u8; rng.below((bytes.len() - cut) as u64 + 1) as usize];
            // Half the time zeros (allocated but never written), half random bytes.
            if rng.one_in(2) {
                rng.fill(&mut garbage);
            }
            write_at(data, *offset + cut as u64, &garbage);
        }
    }
}

fn write_at(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let offset = offset as usize;
    let end = offset + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[offset..end].copy_from_slice(bytes);
}

/// A file's bytes: what readers see now, what survives a crash, and the writes in between.
#[derive(Clone, Debug, Default)]
pub(crate) struct FileData {
    pub(crate) current: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<FileWrite>,
}

impl FileData {
    fn durable(bytes: Vec<u8>) -> Self {
        FileData {
            current: bytes.clone(),
            durable: bytes,
            unsynced: Vec::new(),
        }
    }

    /// Applies a change to the current bytes; it becomes durable at the next sync.
    pub(crate) fn write(&mut self, change: FileWrite) {
        change.apply(&mut self.current);
        self.unsynced.push(change);
    }

    /// Makes every write so far durable.
    pub(crate) fn sync(&mut self) {
        for change in self.unsynced.drain(..) {
            change.apply(&mut self.durable);
        }
    }

    /// A failed sync: like Linux after a failed fsync, the pages are marked clean, so readers
    /// still see the writes but they never reach the disk, not even through a later sync.
    pub(crate) fn lose_unsynced(&mut self) {
        self.unsynced.clear();
    }

    /// Whether any write awaits a sync.
    pub(crate) fn has_unsynced(&self) -> bool {
        !self.unsynced.is_empty()
    }

    fn crash_image(&self, rng: &mut Rng) -> Vec<u8> {
        let mut bytes = self.durable.clone();
        let kept = rng.survivors(self.unsynced.len());
        for change in &self.unsynced[..kept] {
            change.apply(&mut bytes);
        }
        if let Some(next) = self.unsynced.get(kept)
            && rng.one_in(2)
        {
            next.apply_torn(&mut bytes, rng);
        }
        bytes
    }
}

/// One atomic change to a directory's entries (a rename is one change of two entries).
type DirChange = Vec<(String, Option<FileId>)>;

/// A directory's name -> file mapping, current and durable.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirData {
    current: BTreeMap<String, FileId>,
    durable: BTreeMap<String, FileId>,
    unsynced: Vec<DirChange>,
}

impl DirData {
    fn change(&mut self, change: DirChange) {
        apply_dir_change(&mut self.current, &change);
        self.unsynced.push(change);
    }

    /// Makes every entry change so far durable.
    pub(crate) fn sync(&mut self) {
        for change in self.unsynced.drain(..) {
            apply_dir_change(&mut self.durable, &change);
        }
    }

    /// Whether any entry change awaits a directory sync.
    pub(crate) fn has_unsynced(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// The entries after a crash: the durable ones plus, in order, a seeded number of the
    /// changes since (journaling file systems commit directory changes in order).
    fn crash_image(&self, rng: &mut Rng) -> BTreeMap<String, FileId> {
        let mut entries = self.durable.clone();
        let kept = rng.survivors(self.unsynced.len());
        for change in &self.unsynced[..kept] {
            apply_dir_change(&mut entries, change);
        }
        entries
    }
}

fn apply_dir_change(entries: &mut BTreeMap<String, FileId>, change: &DirChange) {
    for (name, target) in change {
        match target {
            Some(id) => entries.insert(name.clone(), *id),
            None => entries.remove(name),
        };
    }
}

/// The whole disk: directories (which exist durably once created) and files.
#[derive(Clone, Debug)]
pub(crate) struct Disk {
    dirs: BTreeMap<PathBuf, DirData>,
    files: BTreeMap<FileId, FileData>,
    next_id: FileId,
}

impl Default for Disk {
    fn default() -> Self {
        let mut dirs = BTreeMap::new();
        // Both roots exist: "/" for absolute paths, "" as the parent of relative ones.
        dirs.insert(PathBuf::from("/"), DirData::default());
        dirs.insert(PathBuf::new(), DirData::default());
        Disk {
            dirs,
            files: BTreeMap::new(),
            next_id: 1,
        }
    }
}

/// Splits a path into its directory and its file name, normalising `.` and trailing slashes.
pub(crate) fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let path = normalize(path);
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => Ok((dir.to_path_buf(), name.to_string_lossy().into_owned())),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} does not name a file", path.display()),
        )),
    }
}

/// The canonical spelling of a path in the model.
pub(crate) fn normalize(path: &Path) -> PathBuf {
    path.components().collect()
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} does not exist", path.display()),
    )
}

impl Disk {
    fn dir(&self, dir: &Path) -> io::Result<&DirData> {
        self.dirs.get(dir).ok_or_else(|| not_found(dir))
    }

    fn dir_mut(&mut self, dir: &Path) -> io::Result<&mut DirData> {
        self.dirs.get_mut(dir).ok_or_else(|| not_found(dir))
    }

    /// The file a path names now, if any.
    pub(crate) fn lookup(&self, path: &Path) -> io::Result<Option<FileId>> {
        let (dir, name) = split(path)?;
        Ok(self.dir(&dir)?.current.get(&name).copied())
    }

    /// Whether a path names a directory.
    pub(crate) fn is_dir(&self, path: &Path) -> bool {
        self.dirs.contains_key(&normalize(path))
    }

    /// Creates an empty file under `path` (its entry durable only after a directory sync).
    pub(crate) fn create(&mut self, path: &Path) -> io::Result<FileId> {
        let (dir, name) = split(path)?;
        self.dir(&dir)?;
        if self.is_dir(path) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", path.display()),
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.files.insert(id, FileData::default());
        self.dir_mut(&dir)?.change(vec![(name, Some(id))]);
        Ok(id)
    }

    /// The bytes of a file.
    pub(crate) fn file(&self, id: FileId) -> &FileData {
        &self.files[&id]
    }

    /// The bytes of a file, for changing them.
    pub(crate) fn file_mut(&mut self, id: FileId) -> &mut FileData {
        self.files.get_mut(&id).expect("file ids are never reused")
    }

    /// Replaces a file's bytes, durably, creating it (durably) if needed. For tests that damage
    /// a file on purpose.
    pub(crate) fn replace(&mut self, path: &Path, bytes: Vec<u8>) -> io::Result<()> {
        let id = match self.lookup(path)? {
            Some(id) => id,
            None => {
                let id = self.create(path)?;
                self.dir_mut(&split(path)?.0)?.sync();
                id
            }
        };
        *self.file_mut(id) = FileData::durable(bytes);
        Ok(())
    }

    /// Creates a directory and its parents, durably.
    pub(crate) fn create_dir_all(&mut self, path: &Path) -> io::Result<()> {
        let path = normalize(path);
        for ancestor in path.ancestors() {
            if self.lookup(ancestor).ok().flatten().is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} is a file", ancestor.display()),
                ));
            }
        }
        for ancestor in path.ancestors() {
            self.dirs.entry(ancestor.to_path_buf()).or_default();
        }
        Ok(())
    }

    /// The names in a directory: its files and its subdirectories, sorted.
    pub(crate) fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let dir = normalize(dir);
        let mut names: BTreeSet<String> = self.dir(&dir)?.current.keys().cloned().collect();
        for sub in self.dirs.keys() {
            if sub.parent() == Some(dir.as_path())
                && let Some(name) = sub.file_name()
            {
                names.insert(name.to_string_lossy().into_owned());
            }
        }
        Ok(names.into_iter().collect())
    }

    /// Removes a file's entry (durable only after a directory sync).
    pub(crate) fn remove(&mut self, path: &Path) -> io::Result<()> {
        if self.lookup(path)?.is_none() {
            return Err(not_found(path));
        }
        let (dir, name) = split(path)?;
        self.dir_mut(&dir)?.change(vec![(name, None)]);
        Ok(())
    }

    /// Renames a file over another. Within a directory this is one atomic entry change.
    pub(crate) fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let id = self.lookup(from)?.ok_or_else(|| not_found(from))?;
        let (from_dir, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        self.dir(&to_dir)?;
        if self.is_dir(to) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", to.display()),
            ));
        }
        if from_dir == to_dir {
            self.dir_mut(&from_dir)?
                .change(vec![(from_name, None), (to_name, Some(id))]);
        } else {
            self.dir_mut(&to_dir)?.change(vec![(to_name, Some(id))]);
            self.dir_mut(&from_dir)?.change(vec![(from_name, None)]);
        }
        Ok(())
    }

    /// Makes a directory's entry changes durable.
    pub(crate) fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        self.dir_mut(&normalize(dir))?.sync();
        Ok(())
    }

    /// What awaits a sync: directories with unsynced entry changes, and files (by their current
    /// names) with unsynced writes.
    pub(crate) fn unsynced(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (path, dir) in &self.dirs {
            if dir.has_unsynced() {
                found.push(format!("entries of {}", path.display()));
            }
            for (name, id) in &dir.current {
                if self.files[id].has_unsynced() {
                    found.push(format!("writes to {}", path.join(name).display()));
                }
            }
        }
        found
    }

    /// A disk as a power cut could leave this one, chosen by `rng`. Everything in it is durable.
    pub(crate) fn crash_image(&self, rng: &mut Rng) -> Disk {
        let mut image = Disk {
            dirs: BTreeMap::new(),
            files: BTreeMap::new(),
            next_id: self.next_id,
        };
        for (path, dir) in &self.dirs {
            let entries = dir.crash_image(rng);
            for id in entries.values() {
                // A file reachable under two names (a rename across directories) gets one image.
                if !image.files.contains_key(id) {
                    let bytes = self.files[id].crash_image(rng);
                    image.files.insert(*id, FileData::durable(bytes));
                }
            }
            image.dirs.insert(path.clone(), durable_dir(entries));
        }
        image
    }

    /// The disk a killed process leaves behind: the operating system keeps every write, so
    /// the current state survives whole.
    pub(crate) fn process_crash_image(&self) -> Disk {
        let mut image = Disk {
            dirs: BTreeMap::new(),
            files: BTreeMap::new(),
            next_id: self.next_id,
        };
        for (path, dir) in &self.dirs {
            for id in dir.current.values() {
                let bytes = self.files[id].current.clone();
                image.files.insert(*id, FileData::durable(bytes));
            }
            image
                .dirs
                .insert(path.clone(), durable_dir(dir.current.clone()));
        }
        image
    }
}

fn durable_dir(entries: BTreeMap<String, FileId>) -> DirData {
    DirData {
        current: entries.clone(),
        durable: entries,
        unsynced: Vec::new(),
    }
}
