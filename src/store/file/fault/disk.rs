//! The whole modelled disk behind [`FaultFs`](super::FaultFs): a tree of directories, each known
//! by an identity rather than by its path (so a directory can be renamed with everything in it),
//! and the files they name, each known by an identity too (so two names can share one file: a
//! hard link). What each file and directory holds now and after a crash is in [`model`].
//!
//! A path is looked up by walking the tree from its root through the entries readers see now. A
//! crash image walks it from the roots through the entries that survive: a directory whose entry
//! did not survive is gone with everything in it, and one that survives under two names (a
//! rename across directories, both sides kept) is one directory.
//!
//! May call: the file and directory model ([`model`]) only.

use crate::sync::HashSet;
use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::model::{self, DirData, DirId, FileData, FileId, Node};
use super::rng::Rng;

/// The root of absolute paths.
const ROOT: DirId = 0;
/// The root of relative paths (the empty path).
const RELATIVE: DirId = 1;

/// The whole disk: directories and files. Files are shared between copies of the disk until
/// one of them writes (copy on write), so taking a copy at every operation is cheap.
#[derive(Clone, Debug)]
pub(crate) struct Disk {
    dirs: BTreeMap<DirId, DirData>,
    files: BTreeMap<FileId, Arc<FileData>>,
    next_id: FileId,
    next_dir: DirId,
}

impl Default for Disk {
    fn default() -> Self {
        let mut dirs = BTreeMap::new();
        // Both roots exist: "/" for absolute paths, "" as the parent of relative ones.
        dirs.insert(ROOT, DirData::default());
        dirs.insert(RELATIVE, DirData::default());
        Disk {
            dirs,
            files: BTreeMap::new(),
            next_id: 1,
            next_dir: 2,
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
        .filter(|c| *c != Component::CurDir)
        .collect()
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} does not exist", path.display()),
    )
}

impl Disk {
    /// The directory a path names now, if any.
    fn resolve(&self, path: &Path) -> Option<DirId> {
        let path = normalize(path);
        let mut id = if path.has_root() { ROOT } else { RELATIVE };
        for component in path.components() {
            match component {
                Component::RootDir => {}
                Component::Normal(name) => {
                    match self.dirs[&id].current.get(&*name.to_string_lossy()) {
                        Some(Node::Dir(child)) => id = *child,
                        _ => return None,
                    }
                }
                // `..` and prefixes are not modelled: such a path names nothing.
                _ => return None,
            }
        }
        Some(id)
    }

    fn dir(&self, dir: &Path) -> io::Result<&DirData> {
        let id = self.resolve(dir).ok_or_else(|| not_found(dir))?;
        Ok(&self.dirs[&id])
    }

    fn dir_mut(&mut self, dir: &Path) -> io::Result<&mut DirData> {
        let id = self.resolve(dir).ok_or_else(|| not_found(dir))?;
        Ok(self.dirs.get_mut(&id).expect("resolved directories exist"))
    }

    /// What a path names now, if anything.
    fn entry(&self, path: &Path) -> io::Result<Option<Node>> {
        let (dir, name) = split(path)?;
        Ok(self.dir(&dir)?.current.get(&name).copied())
    }

    /// The file a path names now, if any.
    pub(crate) fn lookup(&self, path: &Path) -> io::Result<Option<FileId>> {
        Ok(match self.entry(path)? {
            Some(Node::File(id)) => Some(id),
            _ => None,
        })
    }

    /// Whether a path names a directory.
    pub(crate) fn is_dir(&self, path: &Path) -> bool {
        self.resolve(path).is_some()
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

    /// Gives the file `from` names a second name, `to`, which must not exist (its entry durable
    /// only after a sync of its directory). Both names then share the file's bytes.
    pub(crate) fn link(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let id = match self.entry(from)? {
            Some(Node::File(id)) => id,
            Some(Node::Dir(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{} is a directory: it cannot be linked", from.display()),
                ));
            }
            None => return Err(not_found(from)),
        };
        let (dir, name) = split(to)?;
        if self.dir(&dir)?.current.contains_key(&name) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} already exists", to.display()),
            ));
        }
        self.dir_mut(&dir)?
            .change(vec![(name, Some(Node::File(id)))]);
        Ok(())
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
        let mut id = if path.has_root() { ROOT } else { RELATIVE };
        let mut at = PathBuf::new();
        for component in path.components() {
            at.push(component);
            let name = match component {
                Component::RootDir => continue,
                Component::Normal(name) => name.to_string_lossy().into_owned(),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{} is not modelled", path.display()),
                    ));
                }
            };
            let parent = self.dirs.get_mut(&id).expect("walked directories exist");
            id = match parent.current.get(&name) {
                Some(Node::Dir(child)) => *child,
                Some(Node::File(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} is a file", at.display()),
                    ));
                }
                None => {
                    let child = self.next_dir;
                    self.next_dir += 1;
                    parent.change(vec![(name, Some(Node::Dir(child)))]);
                    self.dirs.insert(child, DirData::default());
                    child
                }
            };
        }
        Ok(())
    }

    /// The names in a directory (files and subdirectories), sorted.
    pub(crate) fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        Ok(self.dir(dir)?.current.keys().cloned().collect())
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

    /// Renames a file over another, or a directory (with everything in it) to a name that does
    /// not exist. Within a directory this is one atomic entry change; across directories it is
    /// one change in each, which a crash may keep either, both or neither of.
    pub(crate) fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let node = self.entry(from)?.ok_or_else(|| not_found(from))?;
        let (from_dir, from_name) = split(from)?;
        let (to_dir, to_name) = split(to)?;
        self.dir(&to_dir)?;
        match (node, self.entry(to)?) {
            (_, Some(Node::Dir(_))) => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{} is a directory", to.display()),
                ));
            }
            (Node::Dir(_), Some(Node::File(_))) => {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} is a file", to.display()),
                ));
            }
            (Node::Dir(_), None) if normalize(to).starts_with(normalize(from)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is inside {}", to.display(), from.display()),
                ));
            }
            _ => {}
        }
        if normalize(&from_dir) == normalize(&to_dir) {
            self.dir_mut(&from_dir)?
                .change(vec![(from_name, None), (to_name, Some(node))]);
        } else {
            self.dir_mut(&to_dir)?.change(vec![(to_name, Some(node))]);
            self.dir_mut(&from_dir)?.change(vec![(from_name, None)]);
        }
        Ok(())
    }

    /// Makes a directory's entry changes durable (not its own entry in its parent).
    pub(crate) fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        self.dir_mut(dir)?.sync();
        Ok(())
    }

    /// What awaits a sync: directories with unsynced entry changes, and files (by their current
    /// names) with unsynced writes. Only what a path reaches now is listed.
    pub(crate) fn unsynced(&self) -> Vec<String> {
        let mut found = Vec::new();
        let mut seen = HashSet::default();
        for (root, path) in [(RELATIVE, PathBuf::new()), (ROOT, PathBuf::from("/"))] {
            self.unsynced_under(root, &path, &mut seen, &mut found);
        }
        found
    }

    fn unsynced_under(
        &self,
        id: DirId,
        path: &Path,
        seen: &mut HashSet<DirId>,
        found: &mut Vec<String>,
    ) {
        if !seen.insert(id) {
            return;
        }
        let dir = &self.dirs[&id];
        if dir.has_unsynced() {
            found.push(format!("entries of {}", path.display()));
        }
        for (name, node) in &dir.current {
            match node {
                Node::File(file) if self.files[file].has_unsynced() => {
                    found.push(format!("writes to {}", path.join(name).display()));
                }
                Node::File(_) => {}
                Node::Dir(child) => self.unsynced_under(*child, &path.join(name), seen, found),
            }
        }
    }

    /// A disk as a power cut could leave this one, chosen by `rng`. Everything in it is durable.
    /// A directory whose own entry did not survive is gone with everything in it.
    pub(crate) fn crash_image(&self, rng: &mut Rng) -> Disk {
        let mut image = Disk {
            dirs: BTreeMap::new(),
            files: BTreeMap::new(),
            next_id: self.next_id,
            next_dir: self.next_dir,
        };
        // Depth first, each directory's entries in name order: every parent before its
        // children, in the order of their paths.
        for root in [RELATIVE, ROOT] {
            self.crash_under(root, &mut image, rng);
        }
        image
    }

    fn crash_under(&self, id: DirId, image: &mut Disk, rng: &mut Rng) {
        if image.dirs.contains_key(&id) {
            // Reachable under two names: one directory.
            return;
        }
        let entries = self.dirs[&id].crash_entries(rng);
        image.dirs.insert(id, model::durable_dir(entries.clone()));
        // The directory's files first, then its subdirectories.
        for node in entries.values() {
            // A file reachable under two names (a link, a rename across directories) gets one
            // image.
            if let Node::File(file) = node
                && !image.files.contains_key(file)
            {
                let bytes = self.files[file].crash_bytes(rng);
                image
                    .files
                    .insert(*file, Arc::new(FileData::durable(bytes)));
            }
        }
        for node in entries.values() {
            if let Node::Dir(child) = node {
                self.crash_under(*child, image, rng);
            }
        }
    }

    /// Applies a failed sync to a file (see [`FileData::fail_sync`]).
    pub(crate) fn fail_sync(&mut self, id: FileId, rng: &mut Rng) {
        self.file_mut(id).fail_sync(rng);
    }
}
