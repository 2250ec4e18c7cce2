//! Test-only switches that turn off one kind of sync of the file-backed store, so the crash
//! tests can show that they catch each missing sync (negative controls; see docs/DESIGN.md,
//! "Testing the store"). Built only with the `fault-injection` feature, never in production.
//!
//! Most switches wrap the store's [`Vfs`]: a skipped sync returns `Ok` without syncing, exactly
//! what a store that forgot the call would see. [`SkipSync::ScannedTail`] is checked by open.
//! [`SkipSync::ZeroEndCheck`] is a check of open's scan, turned off through the segments open
//! found; [`SkipSync::ValueSegmentCheck`] (a check of a load) and [`SkipSync::FoundNothingCheck`]
//! (open's check that it found nothing to sync) are turned off by the store, and so is
//! [`SkipSync::EmptyTailCheck`] (open's check that the tail held a record);
//! [`SkipSync::ZeroFill`] is the journal's zero fill of new space, turned off in the journal;
//! [`SkipSync::GuardOnlyWait`] is `apply`'s wait before it answers a guard-only batch.
//! [`PinSwitch`] turns off a guard rather than a sync: the journal's reader pin.

use crate::sync::HashSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::file::vfs::{OpenMode, PathKind, Vfs, VfsFile, VfsLock};

/// One kind of sync a store can be told to skip (feature `fault-injection`; tests only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipSync {
    /// `fdatasync` of journal segments written by this store: commits are acknowledged before
    /// they are durable (SPEC S3).
    JournalData,
    /// Every directory sync: new segments, renamed snapshots and the manifest, removals, new
    /// directories.
    Directories,
    /// The sync of the store directory's parent when the store directory is created.
    ParentDirectory,
    /// Open's rewrite and sync of the journal it scanned: what a crashed process (or a failed
    /// sync) left readable but not durable, which open must make durable before serving it.
    ScannedTail,
    /// Not a sync but a check of open's scan: that everything from an all-zero frame to the
    /// end of the segment is zeros before the scan takes the zeros as the end of the segment's
    /// records (preallocated, never written space). Without it, valid records after zeros where
    /// durable records were are dropped silently instead of reported as damage.
    ZeroEndCheck,
    /// Not a sync but a check of a partition's load: that every segment one of its values lives
    /// in is there with an intact header (open reads only the headers of the segments it
    /// scans). Without it, a partition with values in a damaged segment loads, and only the
    /// reads of those values fail, while the partition is never refused.
    ValueSegmentCheck,
    /// Open's check that it found nothing to make durable (a clean close) before it skips its
    /// syncs: with this switch open skips them whatever it found, like a store that trusted
    /// every reopen to follow a clean close.
    FoundNothingCheck,
    /// Not a sync but open's check that the tail segment held a record before it skips the
    /// rewrite of that segment's header and the sync of the journal directory: with this
    /// switch open skips them after any crash, so a segment whose creation a kill cut short
    /// can lose its directory entry, with the batches the reopened store put in it.
    EmptyTailCheck,
    /// Not a sync but the journal's zero fill: each step of a segment is sized with `set_len`
    /// (a sparse hole) instead of written as zeros and synced before records go into it, so a
    /// commit's sync into a fresh block also commits the block's allocation.
    ZeroFill,
    /// Not a sync but open's bound on the tail it rewrites and syncs: with this switch open
    /// takes one record more as proven durable than the frames prove, so a record that a
    /// killed or failed sync left only in the page cache is served but never made durable.
    ProofBound,
    /// Not a sync but compaction's choice of victims: with this switch it takes every segment
    /// below the one appends go to, as soon as an appender moves on, instead of only those the
    /// group-commit leader has sealed (every record written, the segment trimmed and synced).
    /// A record still queued for the newest of them is then not found by compaction's read of
    /// the segment, which is deleted with the record in it.
    SealedVictims,
    /// Not a sync but `apply`'s wait, for a batch with guards and no operations, until every
    /// batch of its partition its guards were checked against (committed, maybe not yet
    /// durable) is durable: with this switch it is answered at once, on state a power cut can
    /// still take away.
    GuardOnlyWait,
    /// Not a sync but a backup's hold on compaction's lock from its point until every journal
    /// segment it takes is linked or copied: with this switch compaction may delete a segment
    /// the backup has yet to take.
    BackupCompactionLock,
    /// Not a sync but a backup's rule that its destination appears whole or not at all: with
    /// this switch the backup writes straight into the destination instead of into a
    /// directory beside it that is renamed into place once everything in it is synced.
    BackupRename,
    /// The `fdatasync` of every file a backup copies (the journal's tail, the manifest, and
    /// whatever could not be linked).
    BackupFileSyncs,
    /// The syncs of a backup's directories (their links, copies and subdirectory) before the
    /// backup is renamed into place.
    BackupDirectorySyncs,
    /// The sync of the destination's parent directory after the backup is renamed into place.
    BackupParentSync,
}

/// A [`Vfs`] that skips the chosen syncs of the store in `dir`.
pub(crate) struct SkippingVfs {
    inner: Arc<dyn Vfs>,
    dir: PathBuf,
    skip: HashSet<SkipSync>,
}

impl SkippingVfs {
    pub(crate) fn wrap(inner: Arc<dyn Vfs>, dir: &Path, skip: &HashSet<SkipSync>) -> Arc<dyn Vfs> {
        if skip.is_empty() {
            return inner;
        }
        Arc::new(SkippingVfs {
            inner,
            dir: dir.to_path_buf(),
            skip: skip.clone(),
        })
    }
}

impl fmt::Debug for SkippingVfs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SkippingVfs")
            .field("inner", &self.inner)
            .field("skip", &self.skip)
            .finish()
    }
}

struct SkippingFile {
    inner: Arc<dyn VfsFile>,
    journal: bool,
    skip: HashSet<SkipSync>,
}

impl fmt::Debug for SkippingFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl VfsFile for SkippingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        if self.journal && self.skip.contains(&SkipSync::JournalData) {
            return Ok(());
        }
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Vfs for SkippingVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        Ok(Arc::new(SkippingFile {
            inner: self.inner.open(path, mode)?,
            journal: path.starts_with(self.dir.join("journal")),
            skip: self.skip.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        self.inner.kind(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.hard_link(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let outside = !dir.starts_with(&self.dir);
        if self.skip.contains(&SkipSync::Directories)
            || (outside && self.skip.contains(&SkipSync::ParentDirectory))
        {
            return Ok(());
        }
        self.inner.sync_dir(dir)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        self.inner.try_lock(path)
    }
}

/// Test-only control of the journal's reader pin (`Journal::pin`): a negative control that turns
/// the pin off, so compaction deletes segments a paused reader still holds locations into, and
/// an observer told when compaction finds a pinned reader and waits for it.
#[derive(Clone, Default)]
pub(crate) struct PinSwitch {
    pub(crate) off: bool,
    pub(crate) on_wait: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl fmt::Debug for PinSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinSwitch")
            .field("off", &self.off)
            .field("on_wait", &self.on_wait.is_some())
            .finish()
    }
}
