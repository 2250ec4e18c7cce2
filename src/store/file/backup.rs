//! Online backup (SPEC S12): a copy of the running store as it was at one journal position, the
//! backup's *point*, that opens as an ordinary store.
//!
//! The point is taken under the journal's append mutex, as a heads snapshot takes its position,
//! while the heads snapshot's lock keeps the manifest and the snapshot it names as they are; the
//! backup copies that manifest and links (or copies) that snapshot, whose position is at or
//! before the point. The journal is then synced through the point, so every segment before the
//! point's is sealed (written, trimmed, synced; never written again) and is linked, and the
//! point's own segment is copied up to the point. The copy's open scans the journal from its
//! snapshot's position to the point, exactly as a store that stopped at the point would. From
//! the point until every segment is taken the backup holds compaction's lock, so no segment it
//! has yet to take is deleted.
//!
//! Everything is written into a directory beside the destination (`DEST.partial`), synced
//! (files, then directories), and renamed into place: the destination appears whole or not at
//! all. A `DEST.partial` left by a backup that was cut short is emptied and used again by the
//! next backup to the same destination (its `LOCK` keeps two backups from sharing it).
//!
//! May call: the journal (pausing appends, syncing), the container module (reading the
//! manifest), durability (creating the destination's parent) and the file layer. Takes
//! compaction's lock, then the heads snapshot's lock, then the journal's append mutex (see
//! docs/DESIGN.md, "Locking order"); nothing else of the store.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(feature = "fault-injection")]
use super::SkipSync;
use super::journal::parse_segment_file_name;
use super::vfs::{OpenMode, OsFs, PathKind, Vfs, VfsLock};
use super::{
    FileStore, Inner, JOURNAL_DIR, LOCK_FILE, MANIFEST, MANIFEST_MAGIC, container, decode_manifest,
    durability,
};
use crate::error::{Error, Result};

/// Bytes a backup copies per read and write.
const CHUNK: u64 = 1 << 20;

/// What a backup took, and what it cost (see [`FileStore::backup`]).
///
/// ```
/// use portcullis::store::{Batch, FileStore, Partition, Store};
///
/// # fn main() -> portcullis::Result<()> {
/// let dir = tempfile::tempdir().expect("a temporary directory");
/// let store = FileStore::builder(dir.path().join("live")).segment_bytes(4096).open()?;
/// let p = Partition::new("accounts")?;
/// for n in 0..100 {
///     store.apply(&p, &Batch::new().put(format!("k{n}"), vec![0u8; 200]))?;
/// }
/// let report = store.backup(dir.path().join("copy"))?;
/// assert!(report.files_linked > 0); // the sealed segments, on this file system
/// assert!(report.bytes_copied < 4096 + 1024); // the newest segment and the manifest
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackupReport {
    /// The backup's point, as a journal sequence number: the backup holds every batch the
    /// journal numbered below it, and none from it on.
    pub next_lsn: u64,
    /// Files given a second name in the backup (sealed journal segments, the heads snapshot):
    /// they cost no space until the store or the backup deletes its name.
    pub files_linked: u64,
    /// Bytes of the linked files.
    pub bytes_linked: u64,
    /// Files copied (the manifest, the journal's tail up to the point, and whatever the file
    /// system could not link).
    pub files_copied: u64,
    /// Bytes copied.
    pub bytes_copied: u64,
    /// Wall time of the whole backup.
    pub elapsed: Duration,
}

impl FileStore {
    /// Writes a consistent copy of the store, as it is now, to the directory `dest`, while
    /// other threads keep reading, writing and compacting (SPEC S12).
    ///
    /// The copy holds exactly the batches the journal held at one instant during the call,
    /// its point ([`BackupReport::next_lsn`]): every batch acknowledged before the call
    /// started, none started after it returned. It opens as an ordinary store (with
    /// [`FileStore::open`], or an engine's `directory`), and `portcullis-inspect verify` passes
    /// on it. Sealed journal segments and the heads snapshot are shared with the store by hard
    /// links where the file system allows (costing no space until one side deletes them), the
    /// rest is copied; see [`BackupReport`]. Everything is synced before the call returns:
    /// a power cut then loses nothing of the backup. `dest` appears only once it is whole, by a
    /// rename from `DEST.partial` beside it; a backup cut short leaves no `dest`, and the next
    /// backup to the same `dest` takes the leftover over.
    ///
    /// A hard-linked backup shares its files' blocks with the store: to guard against losing
    /// the disk, copy the backup elsewhere (it is an ordinary directory nobody writes).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `dest` exists (a backup goes to a new directory), lies
    /// inside the store's directory, or has no name; [`Error::Closed`] if the store closes
    /// first; [`Error::SyncFailed`] if the journal cannot be synced; [`Error::Io`] if the
    /// destination cannot be written (the store itself is unaffected).
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::open(dir.path().join("live"))?;
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    ///
    /// let report = store.backup(dir.path().join("backup-1"))?; // writers may keep going
    /// println!("linked {} bytes, copied {}", report.bytes_linked, report.bytes_copied);
    ///
    /// let copy = FileStore::open(dir.path().join("backup-1"))?; // an ordinary store
    /// assert_eq!(copy.get(&p, b"alice")?, Some(b"10".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<BackupReport> {
        let vfs = self.inner.config.vfs.clone();
        self.backup_to(&*vfs, dest.as_ref())
    }

    /// [`FileStore::backup`], writing the destination through `dst` (the store's own files are
    /// read, and linked, through the store's file layer).
    pub(crate) fn backup_to(&self, dst: &dyn Vfs, dest: &Path) -> Result<BackupReport> {
        self.inner.check_open()?;
        let started = self.inner.config.clock.instant();
        let on = Switches::of(&self.inner);
        let paths = Paths::of(&self.inner, dst, dest, on.rename)?;
        let _lock = prepare(dst, &paths)?;
        let mut copier = Copier {
            src: &*self.inner.config.vfs,
            dst,
            sync: on.file_syncs,
            report: BackupReport::default(),
        };
        {
            let _no_compaction = on
                .compaction_lock
                .then(|| self.inner.compaction_lock.lock());
            // Close waits for compaction's lock: a closed store is not backed up.
            self.inner.check_open()?;
            let point = copier.point(&self.inner, &paths.root)?;
            self.inner.journal.sync_all()?;
            #[cfg(feature = "fault-injection")]
            if let Some(observe) = &self.inner.config.backup_point_observer {
                (observe.0)();
            }
            copier.segments(&self.inner, &paths.root.join(JOURNAL_DIR), point)?;
            copier.report.next_lsn = point.next_lsn;
        }
        finish(dst, &paths, &on)?;
        let mut report = copier.report;
        report.elapsed = self
            .inner
            .config
            .clock
            .instant()
            .saturating_duration_since(started);
        log::info!(
            "backed up store {} to {}: {} files linked ({} bytes), {} copied ({} bytes) in {:?}",
            self.inner.config.dir.display(),
            dest.display(),
            report.files_linked,
            report.bytes_linked,
            report.files_copied,
            report.bytes_copied,
            report.elapsed
        );
        Ok(report)
    }
}

/// Backs up the store in `dir`, which no process may have open, to `dest`, changing nothing in
/// `dir` (SPEC E5): the store is opened through the overlay that keeps recovery's writes in
/// memory, so the backup copies what an open would recover (a torn tail cut off, say) and
/// links only the files the overlay has not changed. Refuses a directory that holds no store.
pub(crate) fn backup_unopened(dir: &Path, dest: &Path) -> Result<BackupReport> {
    let store = FileStore::open_unchanged(dir)?;
    if store.open_report().created {
        return Err(Error::invalid(format!(
            "{} holds no store to back up",
            dir.display()
        )));
    }
    store.backup_to(&OsFs, dest)
}

/// Which of its guards and syncs a backup makes: all of them, except that a test may turn one
/// off (feature `fault-injection`, see `SkipSync`) to show that it is needed.
struct Switches {
    compaction_lock: bool,
    rename: bool,
    file_syncs: bool,
    dir_syncs: bool,
    parent_sync: bool,
}

impl Switches {
    #[cfg(not(feature = "fault-injection"))]
    fn of(_: &Inner) -> Switches {
        Switches {
            compaction_lock: true,
            rename: true,
            file_syncs: true,
            dir_syncs: true,
            parent_sync: true,
        }
    }

    #[cfg(feature = "fault-injection")]
    fn of(inner: &Inner) -> Switches {
        let on = |skip: SkipSync| !inner.config.skip_syncs.contains(&skip);
        Switches {
            compaction_lock: on(SkipSync::BackupCompactionLock),
            rename: on(SkipSync::BackupRename),
            file_syncs: on(SkipSync::BackupFileSyncs),
            dir_syncs: on(SkipSync::BackupDirectorySyncs),
            parent_sync: on(SkipSync::BackupParentSync),
        }
    }
}

/// Where a backup goes.
struct Paths {
    dest: PathBuf,
    /// The directory that holds `dest`.
    parent: PathBuf,
    /// Where the files are written: `DEST.partial`, renamed to `dest` at the end (or `dest`
    /// itself, only with the negative control `SkipSync::BackupRename`).
    root: PathBuf,
}

impl Paths {
    fn of(inner: &Inner, dst: &dyn Vfs, dest: &Path, rename: bool) -> Result<Paths> {
        let Some(name) = dest.file_name() else {
            return Err(Error::invalid(format!(
                "the backup destination {} names no directory; give a path such as backups/2024-05-01",
                dest.display()
            )));
        };
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        if absolute(dest).starts_with(absolute(&inner.config.dir)) {
            return Err(Error::invalid(format!(
                "the backup destination {} is inside the store's directory {}; back up to a directory outside it",
                dest.display(),
                inner.config.dir.display()
            )));
        }
        let exists = |p: &Path| {
            dst.kind(p)
                .map_err(|e| Error::io(format!("inspecting {}", p.display()), e))
        };
        if exists(dest)?.is_some() {
            return Err(Error::invalid(format!(
                "the backup destination {} exists; a backup is written to a new directory, so choose a path that does not exist (or remove that one)",
                dest.display()
            )));
        }
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        match exists(&parent)? {
            Some(PathKind::Dir) => {}
            Some(PathKind::File) => {
                return Err(Error::invalid(format!(
                    "{} is a file; the backup destination {} must be in a directory",
                    parent.display(),
                    dest.display()
                )));
            }
            None => durability::create_dir_durably(dst, &parent)?,
        }
        let mut partial = name.to_os_string();
        partial.push(".partial");
        let root = match rename {
            true => parent.join(partial),
            false => dest.to_path_buf(),
        };
        Ok(Paths {
            dest: dest.to_path_buf(),
            parent,
            root,
        })
    }
}

/// Makes the directory the backup is written into, with its journal directory, and takes its
/// lock; a leftover of a backup that was cut short is emptied first.
fn prepare(dst: &dyn Vfs, paths: &Paths) -> Result<Box<dyn VfsLock>> {
    let root = &paths.root;
    let io = |what: &str, p: &Path, e| Error::io(format!("{what} {}", p.display()), e);
    let leftover = dst.kind(root).map_err(|e| io("inspecting", root, e))?;
    if leftover == Some(PathKind::File) {
        return Err(Error::invalid(format!(
            "{} is a file in the way of the backup to {}; remove it",
            root.display(),
            paths.dest.display()
        )));
    }
    dst.create_dir_all(root)
        .map_err(|e| io("creating", root, e))?;
    let lock = match dst.try_lock(&root.join(LOCK_FILE)) {
        Ok(lock) => lock,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(Error::invalid(format!(
                "another backup to {} is running (it holds {}); wait for it to finish",
                paths.dest.display(),
                root.display()
            )));
        }
        Err(e) => return Err(io("locking", root, e)),
    };
    let journal = root.join(JOURNAL_DIR);
    if leftover.is_some() {
        log::warn!(
            "emptying {}, left by a backup to {} that was cut short",
            root.display(),
            paths.dest.display()
        );
        empty_leftover(dst, root, &paths.dest)?;
    }
    dst.create_dir_all(&journal)
        .map_err(|e| io("creating", &journal, e))?;
    Ok(lock)
}

/// Removes what a backup writes from a directory a backup cut short left (its directories and
/// lock file stay); refuses anything a backup does not write, which is not its to remove.
fn empty_leftover(dst: &dyn Vfs, root: &Path, dest: &Path) -> Result<()> {
    let io = |what: &str, p: &Path, e| Error::io(format!("{what} {}", p.display()), e);
    let foreign = |p: &Path| {
        Error::invalid(format!(
            "{} is in the way of the backup to {}, and a backup did not write it; remove it",
            p.display(),
            dest.display()
        ))
    };
    let journal = root.join(JOURNAL_DIR);
    for name in dst.list(root).map_err(|e| io("listing", root, e))? {
        let path = root.join(&name);
        if name == LOCK_FILE {
            continue;
        }
        if name == JOURNAL_DIR {
            for segment in dst.list(&journal).map_err(|e| io("listing", &journal, e))? {
                let path = journal.join(&segment);
                if parse_segment_file_name(&segment).is_none() {
                    return Err(foreign(&path));
                }
                dst.remove(&path).map_err(|e| io("removing", &path, e))?;
            }
            continue;
        }
        if name != MANIFEST && !(name.starts_with("heads-") && name.ends_with(".snap")) {
            return Err(foreign(&path));
        }
        dst.remove(&path).map_err(|e| io("removing", &path, e))?;
    }
    Ok(())
}

/// Syncs what the backup wrote and puts it in place: the journal directory and the backup's
/// own, then the rename to the destination, then the destination's parent.
fn finish(dst: &dyn Vfs, paths: &Paths, on: &Switches) -> Result<()> {
    let sync = |dir: &Path| {
        dst.sync_dir(dir)
            .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
    };
    if on.dir_syncs {
        sync(&paths.root.join(JOURNAL_DIR))?;
        sync(&paths.root)?;
    }
    if paths.root != paths.dest {
        dst.rename(&paths.root, &paths.dest).map_err(|e| {
            Error::io(
                format!(
                    "renaming {} to {}",
                    paths.root.display(),
                    paths.dest.display()
                ),
                e,
            )
        })?;
    }
    if on.parent_sync {
        sync(&paths.parent)?;
    }
    Ok(())
}

/// The journal position of a backup's point.
#[derive(Clone, Copy, Debug)]
struct Point {
    segment: u32,
    offset: u64,
    next_lsn: u64,
}

/// Links and copies files from the store into the backup, and counts them.
struct Copier<'a> {
    src: &'a dyn Vfs,
    dst: &'a dyn Vfs,
    /// Whether each copied file is synced (always, but for a negative control).
    sync: bool,
    report: BackupReport,
}

impl Copier<'_> {
    /// Takes the point, and the manifest and the heads snapshot it names as they are at the
    /// point: nothing writes either while the heads snapshot's lock is held.
    fn point(&mut self, inner: &Inner, root: &Path) -> Result<Point> {
        let state = inner.snapshot.lock();
        if state.finished {
            return Err(Error::Closed);
        }
        let (segment, offset, next_lsn, ()) = inner.journal.with_appends_paused(|| ());
        let dir = &inner.config.dir;
        let manifest = container::read(self.src, dir, MANIFEST, MANIFEST_MAGIC)
            .and_then(|env| env.map(|env| decode_manifest(&env)).transpose())
            .map_err(|e| match e {
                Error::Corrupt { what, detail } => Error::corrupt(
                    what,
                    format!(
                        "{detail}; it cannot be backed up: reopen the store (open sets a damaged manifest aside and writes a fresh one)"
                    ),
                ),
                e => e,
            })?;
        // Open always leaves a manifest; without one the backup's open rebuilds from the
        // journal, which it holds whole.
        if let Some(manifest) = manifest {
            self.copy(&dir.join(MANIFEST), &root.join(MANIFEST), None)?;
            if let Some(name) = manifest.snapshot {
                self.link_or_copy(&dir.join(&name), &root.join(&name))?;
            }
        }
        drop(state);
        Ok(Point {
            segment,
            offset,
            next_lsn,
        })
    }

    /// Links every segment before the point's (all sealed once the journal is synced through
    /// the point) and copies the point's segment up to the point. Segments after it hold only
    /// records from after the point.
    fn segments(&mut self, inner: &Inner, to: &Path, point: Point) -> Result<()> {
        let from = inner.config.dir.join(JOURNAL_DIR);
        debug_assert!(inner.journal.sealed_through() + 1 >= point.segment);
        let names = self
            .src
            .list(&from)
            .map_err(|e| Error::io(format!("listing {}", from.display()), e))?;
        let mut tail = false;
        for name in names {
            let Some(number) = parse_segment_file_name(&name) else {
                continue;
            };
            let (source, target) = (from.join(&name), to.join(&name));
            if number < point.segment {
                self.link_or_copy(&source, &target)?;
            } else if number == point.segment {
                self.copy(&source, &target, Some(point.offset))?;
                tail = true;
            }
        }
        if !tail {
            return Err(Error::corrupt(
                format!("journal segment {}", point.segment),
                "the segment appends go to is missing",
            ));
        }
        Ok(())
    }

    /// Gives `from` a second name `to`; copies it where the file system cannot link.
    fn link_or_copy(&mut self, from: &Path, to: &Path) -> Result<()> {
        match self.src.hard_link(from, to) {
            Ok(()) => {
                let len = self
                    .src
                    .open(from, OpenMode::Read)
                    .and_then(|f| f.len())
                    .map_err(|e| Error::io(format!("sizing {}", from.display()), e))?;
                self.report.files_linked += 1;
                self.report.bytes_linked += len;
                Ok(())
            }
            Err(e) if copy_instead(&e) => {
                log::debug!("copying {} instead of linking it: {e}", from.display());
                self.copy(from, to, None)
            }
            Err(e) => Err(Error::io(
                format!("linking {} to {}", from.display(), to.display()),
                e,
            )),
        }
    }

    /// Copies the first `len` bytes of `from` (all of it if `None`, and no more than it holds)
    /// to a new file `to`, and syncs it.
    fn copy(&mut self, from: &Path, to: &Path, len: Option<u64>) -> Result<()> {
        let io = |what: &str, p: &Path, e| Error::io(format!("{what} {}", p.display()), e);
        let source = self
            .src
            .open(from, OpenMode::Read)
            .map_err(|e| io("opening", from, e))?;
        let whole = source.len().map_err(|e| io("sizing", from, e))?;
        let len = match len {
            Some(len) if len > whole => {
                // Only a store whose open found its tail shorter than its snapshot says (damage
                // it reports): the backup holds the same file, and its open finds the same.
                log::warn!(
                    "{} holds {whole} bytes, less than the {len} the journal counts; the backup copies what it holds",
                    from.display()
                );
                whole
            }
            Some(len) => len,
            None => whole,
        };
        let target = self
            .dst
            .open(to, OpenMode::CreateNew)
            .map_err(|e| io("creating", to, e))?;
        let mut buf = vec![0u8; CHUNK.min(len) as usize];
        let mut at = 0;
        while at < len {
            let n = CHUNK.min(len - at) as usize;
            source
                .read_exact_at(&mut buf[..n], at)
                .map_err(|e| io("reading", from, e))?;
            target
                .write_all_at(&buf[..n], at)
                .map_err(|e| io("writing", to, e))?;
            at += n as u64;
        }
        if self.sync {
            target.sync_data().map_err(|e| io("syncing", to, e))?;
        }
        self.report.files_copied += 1;
        self.report.bytes_copied += len;
        Ok(())
    }
}

/// Whether a failed link means "copy it instead": the two names are on different file systems,
/// or this one cannot link (or not this file: `EPERM` from file systems without links and
/// from `protected_hardlinks`; `EMLINK` once a file has as many names as it may).
fn copy_instead(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::CrossesDevices
            | io::ErrorKind::Unsupported
            | io::ErrorKind::PermissionDenied
            | io::ErrorKind::TooManyLinks
    )
}
