//! The disk model behind [`FaultFs`](super::FaultFs): what is in the page cache (current) and
//! what would survive a power cut (durable), for file bytes and for directory entries.
//!
//! A power cut is modelled as unkindly as the ALICE and CrashMonkey studies found real file
//! systems to be: unsynced writes reach the disk in 4 KiB pieces, any subset of them, in any
//! order, and a piece may be cut short; unsynced directory changes (creations, renames,
//! removals, new subdirectories) survive in any subset. What a sync made durable stays.
//!
//! This module knows nothing of fault injection or operation counting; it only answers "what
//! does the disk hold now" and "what could it hold after a crash".

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::rng::Rng;

/// The unit in which unsynced writes reach the disk (a page of the page cache).
pub(crate) const PAGE: u64 = 4096;

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

    /// This change cut at page boundaries: the pieces that reach the disk independently.
    fn pieces(&self) -> Vec<FileWrite> {
        let FileWrite::Data { offset, bytes } = self else {
            return vec![self.clone()];
        };
        let mut pieces = Vec::new();
        let mut at = 0usize;
        while at < bytes.len() {
            let pos = offset + at as u64;
            let room = (PAGE - pos % PAGE) as usize;
            let end = bytes.len().min(at + room);
            pieces.push(FileWrite::Data {
                offset: pos,
                bytes: bytes[at..end].to_vec(),
            });
            at = end;
        }
        pieces
    }

    /// Applies part of this change, as a power cut in the middle of it would: a prefix of the
    /// bytes, then, where the rest should be, the old bytes; past the old end of the file (newly
    /// allocated space), zeros or garbage may appear instead. Only the bytes this change writes
    /// are touched, and bytes already there are never garbled (sector writes are atomic; SQLite
    /// calls this "powersafe overwrite"). Changing a length is all or nothing.
    fn apply_torn(&self, data: &mut Vec<u8>, rng: &mut Rng) {
        let FileWrite::Data { offset, bytes } = self else {
            if rng.one_in(2) {
                self.apply(data);
            }
            return;
        };
        let cut = rng.below(bytes.len() as u64 + 1) as usize;
        write_at(data, *offset, &bytes[..cut]);
        // Fill only what lies past the current end: old bytes stay as they were.
        let from = (*offset as usize + cut).max(data.len());
        let end = *offset as usize + bytes.len();
        if from >= end {
            return;
        }
        match rng.below(3) {
            0 => {}
            1 => write_at(data, from as u64, &vec![0u8; end - from]),
            _ => {
                let mut garbage = vec![0u8; rng.below((end - from) as u64 + 1) as usize];
                rng.fill(&mut garbage);
                write_at(data, from as u64, &garbage);
            }
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

/// How many of a set of pending changes a crash keeps, and which.
#[derive(Clone, Copy)]
enum Survival {
    /// None of them.
    None,
    /// All of them, whole (the page cache reached the disk just in time).
    All,
    /// A prefix in order, the next one possibly torn (an ordered file system).
    Prefix(usize),
    /// Each independently, any one possibly torn (write-back in any order).
    Subset,
}

fn survival(rng: &mut Rng, len: usize) -> Survival {
    match rng.below(6) {
        0 => Survival::None,
        1 => Survival::All,
        2 => Survival::Prefix(rng.below(len as u64 + 1) as usize),
        _ => Survival::Subset,
    }
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

    /// A failed sync: some of the pages may have reached the disk before the error, the others
    /// never will. Like Linux after a failed fsync, the pages are marked clean, so readers
    /// still see every write but no later sync saves the lost ones.
    pub(crate) fn fail_sync(&mut self, rng: &mut Rng) {
        self.durable = self.crash_bytes(rng);
        self.unsynced.clear();
    }

    /// Whether any write awaits a sync.
    pub(crate) fn has_unsynced(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// The bytes a power cut now could leave: the durable bytes, plus the unsynced writes' page
    /// pieces that `rng` keeps, applied in the order they were written (a later write to the
    /// same bytes wins when both survive), any kept piece possibly torn.
    fn crash_bytes(&self, rng: &mut Rng) -> Vec<u8> {
        let mut bytes = self.durable.clone();
        if self.unsynced.is_empty() {
            return bytes;
        }
        let pieces: Vec<FileWrite> = self.unsynced.iter().flat_map(FileWrite::pieces).collect();
        match survival(rng, pieces.len()) {
            Survival::None => {}
            Survival::All => pieces.iter().for_each(|p| p.apply(&mut bytes)),
            Survival::Prefix(kept) => {
                pieces[..kept].iter().for_each(|p| p.apply(&mut bytes));
                if let Some(next) = pieces.get(kept)
                    && rng.one_in(2)
                {
                    next.apply_torn(&mut bytes, rng);
                }
            }
            Survival::Subset => {
                for piece in &pieces {
                    if !rng.one_in(2) {
                        continue;
                    }
                    if rng.one_in(4) {
                        piece.apply_torn(&mut bytes, rng);
                    } else {
                        piece.apply(&mut bytes);
                    }
                }
            }
        }
        bytes
    }
}

/// What a directory entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    File(FileId),
    Dir,
}

/// One atomic change to a directory's entries (a rename is one change of two entries).
type DirChange = Vec<(String, Option<Node>)>;

/// A directory's entries (name -> file or subdirectory), current and durable.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirData {
    current: BTreeMap<String, Node>,
    durable: BTreeMap<String, Node>,
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

    /// The entries after a crash: the durable ones plus any subset of the changes since, in
    /// order (a file created or renamed since the last sync may vanish, one removed may
    /// reappear). A rename within the directory stays atomic.
    fn crash_entries(&self, rng: &mut Rng) -> BTreeMap<String, Node> {
        let mut entries = self.durable.clone();
        let kept: Vec<&DirChange> = match survival(rng, self.unsynced.len()) {
            Survival::None => Vec::new(),
            Survival::All => self.unsynced.iter().collect(),
            Survival::Prefix(n) => self.unsynced[..n].iter().collect(),
            Survival::Subset => self.unsynced.iter().filter(|_| rng.one_in(2)).collect(),
        };
        for change in kept {
            apply_dir_change(&mut entries, change);
        }
        entries
    }
}

fn apply_dir_change(entries: &mut BTreeMap<String, Node>, change: &DirChange) {
    for (name, target) in change {
        match target {
            Some(node) => entries.insert(name.clone(), *node),
            None => entries.remove(name),
        };
    }
}

/// The whole disk: directories and files. Files are shared between copies of the disk until
/// one of them writes (copy on write), so taking a copy at every operation is cheap.
#[derive(Clone, Debug)]
pub(crate) struct Disk {
    dirs: BTreeMap<PathBuf, DirData>,
    files: BTreeMap<FileId, Arc<FileData>>,
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
    path.components()
        .filter(|c| *c != std::path::Component::CurDir)
        .collect()
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
        Ok(match self.dir(&dir)?.current.get(&name) {
            Some(Node::File(id)) => Some(*id),
            _ => None,
        })
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
        self.files.insert(id, Arc::default());
        self.dir_mut(&dir)?
            .change(vec![(name, Some(Node::File(id)))]);
        Ok(id)
    }

    /// The bytes of a file.
    pub(crate) fn file(&self, id: FileId) -> &FileData {
        &self.files[&id]
    }

    /// The bytes of a file, for changing them (copied first if another disk shares them).
    pub(crate) fn file_mut(&mut self, id: FileId) -> &mut FileData {
        Arc::make_mut(self.files.get_mut(&id).expect("file ids are never reused"))
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

    /// Creates a directory and its missing parents. Each new directory's entry in its parent
    /// is durable only after that parent is synced, like any other entry.
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
        let missing: Vec<PathBuf> = path
            .ancestors()
            .filter(|a| !self.dirs.contains_key(*a))
            .map(Path::to_path_buf)
            .collect();
        // Parents first.
        for dir in missing.into_iter().rev() {
            let (parent, name) = split(&dir)?;
            self.dir_mut(&parent)?.change(vec![(name, Some(Node::Dir))]);
            self.dirs.insert(dir, DirData::default());
        }
        Ok(())
    }

    /// The names in a directory (files and subdirectories), sorted.
    pub(crate) fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        Ok(self.dir(&normalize(dir))?.current.keys().cloned().collect())
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
        let node = Some(Node::File(id));
        if from_dir == to_dir {
            self.dir_mut(&from_dir)?
                .change(vec![(from_name, None), (to_name, node)]);
        } else {
            self.dir_mut(&to_dir)?.change(vec![(to_name, node)]);
            self.dir_mut(&from_dir)?.change(vec![(from_name, None)]);
        }
        Ok(())
    }

    /// Makes a directory's entry changes durable (not its own entry in its parent).
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
            for (name, node) in &dir.current {
                if let Node::File(id) = node
                    && self.files[id].has_unsynced()
                {
                    found.push(format!("writes to {}", path.join(name).display()));
                }
            }
        }
        found
    }

    /// A disk as a power cut could leave this one, chosen by `rng`. Everything in it is durable.
    /// A directory whose own entry did not survive is gone with everything in it.
    pub(crate) fn crash_image(&self, rng: &mut Rng) -> Disk {
        let mut image = Disk {
            dirs: BTreeMap::new(),
            files: BTreeMap::new(),
            next_id: self.next_id,
        };
        // Sorted paths put every parent before its children.
        for (path, dir) in &self.dirs {
            let reachable = match (path.parent(), path.file_name()) {
                (Some(parent), Some(name)) => image
                    .dirs
                    .get(parent)
                    .is_some_and(|p| p.current.get(&*name.to_string_lossy()) == Some(&Node::Dir)),
                _ => true,
            };
            if !reachable {
                continue;
            }
            let entries = dir.crash_entries(rng);
            for node in entries.values() {
                // A file reachable under two names (a rename across directories) gets one image.
                if let Node::File(id) = node
                    && !image.files.contains_key(id)
                {
                    let bytes = self.files[id].crash_bytes(rng);
                    image.files.insert(*id, Arc::new(FileData::durable(bytes)));
                }
            }
            image.dirs.insert(path.clone(), durable_dir(entries));
        }
        image
    }

    /// Applies a failed sync to a file (see [`FileData::fail_sync`]).
    pub(crate) fn fail_sync(&mut self, id: FileId, rng: &mut Rng) {
        self.file_mut(id).fail_sync(rng);
    }
}

fn durable_dir(entries: BTreeMap<String, Node>) -> DirData {
    DirData {
        current: entries.clone(),
        durable: entries,
        unsynced: Vec::new(),
    }
}
