//! [`FaultFs`]: an in-memory [`Vfs`] that models a disk which can crash and fail, for testing
//! the file-backed store's recovery (SPEC S3, S4) against every crash point.
//!
//! Owns the fault state, the crash points and the gate every operation passes; the [`Vfs`]
//! implementation and its file and lock handles are in [`files`], the disk's tree of directories
//! and files in [`disk`], what each file and directory holds now and after a crash in [`model`].

mod disk;
mod files;
mod model;
mod rng;
#[cfg(feature = "fault-injection")]
pub(crate) mod skip;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sync::Mutex;

use self::disk::Disk;
use self::rng::Rng;
use super::vfs::{OpenMode, PathKind, Vfs, VfsFile, VfsLock};

/// What happens after the operation chosen by [`FaultFs::fail_at`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    /// Only that operation fails; later ones succeed (a transient error).
    Once,
    /// That operation fails, and so does every later write, sync, creation, rename and removal
    /// (a disk that died). Reads keep working, as they would from the page cache.
    DeadDisk,
}

/// A test tool: an in-memory file system that models a disk that can lose power, tear writes
/// and fail operations on demand.
///
/// It keeps, for every file, the bytes readers see now, the bytes the last `sync_data` made
/// durable, and the writes in between; for every directory, the entries readers see now and
/// the entries the last `sync_dir` made durable. A new directory ([`Vfs::create_dir_all`]) is
/// an entry of its parent like any other: durable only once the parent is synced.
///
/// - [`FaultFs::crash`] builds the disk a power cut could leave, as unkindly as real disks and
///   kernels do (the ALICE and CrashMonkey findings): the durable state, plus any subset of the
///   unsynced writes cut into 4 KiB pages ([`FaultFs::PAGE`]), kept out of order, any kept piece possibly
///   torn (cut short, then old bytes, zeros or garbage where the rest should be); and any subset
///   of the directory changes since the directory's last sync (a created or renamed file may
///   vanish, a removed one reappear; a lost directory takes its contents with it). A crash
///   inside a `sync_data` is the same: some of its pages made it.
/// - [`FaultFs::crash_process`] builds the disk a killed process leaves: the operating system
///   keeps every write in its page cache, readable, but no more durable than before, so a
///   later [`FaultFs::crash`] of that image may still lose it.
/// - Every call through [`Vfs`] or [`VfsFile`] is one numbered operation ([`FaultFs::ops`]);
///   [`FaultFs::fail_at`] makes one of them fail, [`FaultFs::fail_syncs`] makes every
///   `sync_data` fail. A failed write may have written a part of its bytes; a failed sync may
///   have made some pages durable and loses the rest for good, as Linux does after a failed
///   fsync.
/// - [`FaultFs::record_crash_points`] keeps a copy of the disk before every operation that
///   changes it, so one run of a workload (threads included) yields every crash point at once.
/// - [`Vfs::try_lock`] is exclusive per path within one `FaultFs` (and all its clones).
///
/// Cloning gives another handle to the same disk. Paths are plain keys: use absolute paths.
///
/// ```
/// use std::path::Path;
/// use portcullis::store::{FaultFs, OpenMode, Vfs};
///
/// let fs = FaultFs::new();
/// fs.create_dir_all(Path::new("/db")).unwrap();
/// fs.sync_dir(Path::new("/")).unwrap(); // a new directory is an entry of its parent
/// let file = fs.open(Path::new("/db/log"), OpenMode::CreateNew).unwrap();
/// fs.sync_dir(Path::new("/db")).unwrap();
/// file.write_all_at(b"durable", 0).unwrap();
/// file.sync_data().unwrap();
/// file.write_all_at(b" and not", 7).unwrap();
///
/// // Whatever the seed, a power cut keeps the synced bytes; the rest may or may not survive.
/// for seed in 0..20 {
///     let image = fs.crash(seed);
///     let bytes = image.read_file(Path::new("/db/log")).unwrap();
///     assert!(bytes.starts_with(b"durable"));
/// }
/// // A killed process loses nothing that reached the operating system ...
/// let image = fs.crash_process();
/// assert_eq!(image.read_file(Path::new("/db/log")).unwrap(), b"durable and not");
/// // ... but what it did not sync is no safer for that: a power cut may still take it.
/// assert!(image.has_unsynced());
/// ```
#[derive(Clone, Default)]
pub struct FaultFs {
    shared: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    disk: Disk,
    faults: Faults,
    locks: BTreeSet<PathBuf>,
    /// Bytes every successful `write_all_at` was given, in every file (write amplification).
    written: u64,
}

#[derive(Default)]
struct Faults {
    ops: u64,
    /// Seeds the choices faults make (how much of a failed write or sync reached the disk).
    seed: u64,
    /// Copies of the disk before each changing operation, while recording.
    recording: Option<Vec<CrashPoint>>,
    fail_at: Option<(u64, FailMode)>,
    dead: bool,
    fail_syncs: bool,
    /// The operation that just failed was chosen by `fail_at`: a write may have done part.
    tear: bool,
    read_only: bool,
    injected: Option<String>,
}

/// What an operation does to the disk, which decides which faults apply to it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    Sync,
}

impl FaultFs {
    /// The unit in which unsynced writes reach the disk at a crash (a page-cache page).
    pub const PAGE: u64 = model::PAGE;

    /// An empty disk holding only the root directory, with no faults planned.
    pub fn new() -> Self {
        Self::default()
    }

    fn from_disk(disk: Disk) -> Self {
        FaultFs {
            shared: Arc::new(Mutex::new(State {
                disk,
                ..State::default()
            })),
        }
    }

    /// The disk a power cut at this instant could leave, chosen by `seed` (the same seed on the
    /// same state gives the same image).
    ///
    /// Each directory keeps its durable entries plus a seeded number of the entry changes made
    /// since its last sync, in order (none, all, or some). Each file keeps its durable bytes plus
    /// a seeded number of its unsynced writes, in order, and the next write may be torn: a
    /// prefix of its bytes, possibly followed by zeros or garbage. Files no entry names are gone.
    /// The image has no locks, no faults planned, an operation count of zero, and everything in
    /// it is durable.
    pub fn crash(&self, seed: u64) -> FaultFs {
        let mut rng = Rng::new(seed);
        FaultFs::from_disk(self.shared.lock().disk.crash_image(&mut rng))
    }

    /// The disk a killed process leaves: every write reached the operating system, so readers
    /// see all of the current state (but no lock survives). What was not synced is still not
    /// durable: a [`FaultFs::crash`] of the image may lose it, as a power cut after the
    /// process died would.
    pub fn crash_process(&self) -> FaultFs {
        FaultFs::from_disk(self.shared.lock().disk.clone())
    }

    /// Starts keeping a copy of the disk before every operation that changes it (a write, a
    /// sync, a creation, a rename, a removal), for [`FaultFs::take_crash_points`]. Copies share
    /// unchanged files, so this is cheap even at every operation.
    pub fn record_crash_points(&self) {
        self.shared.lock().faults.recording = Some(Vec::new());
    }

    /// The crash points recorded since [`FaultFs::record_crash_points`], in order, followed by
    /// one for the disk as it is now; recording stops.
    pub fn take_crash_points(&self) -> Vec<CrashPoint> {
        let mut state = self.shared.lock();
        let mut points = state.faults.recording.take().unwrap_or_default();
        points.push(CrashPoint {
            op: state.faults.ops + 1,
            what: "after the last operation".into(),
            disk: state.disk.clone(),
        });
        points
    }

    /// Seeds the choices faults make: how much of a failed write reached the page cache, and
    /// which pages of a failed sync reached the disk (default 0).
    pub fn set_fault_seed(&self, seed: u64) {
        self.shared.lock().faults.seed = seed;
    }

    /// An independent copy of the disk as it is now: current, durable and unsynced state alike,
    /// so crash images can still be taken from it after the original has moved on (a store
    /// closing on drop, for example). Locks and planned faults are not copied.
    pub fn fork(&self) -> FaultFs {
        FaultFs::from_disk(self.shared.lock().disk.clone())
    }

    /// Makes the `k`-th operation (counting from 1, over every call through [`Vfs`] and
    /// [`VfsFile`]) fail with an I/O error, then behave as `mode` says. A failed write changes
    /// nothing; a failed `sync_data` loses that file's unsynced writes.
    pub fn fail_at(&self, k: u64, mode: FailMode) {
        self.shared.lock().faults.fail_at = Some((k, mode));
    }

    /// Makes every `sync_data` from now on fail. Like Linux after a failed fsync, the writes it
    /// should have made durable are dropped from the durable state for good (readers still see
    /// them), so a later successful sync would not save them either.
    pub fn fail_syncs(&self) {
        self.shared.lock().faults.fail_syncs = true;
    }

    /// Makes every operation that changes the disk fail with `ReadOnlyFilesystem` (as a
    /// read-only mount does), or stops doing so.
    pub fn set_read_only(&self, read_only: bool) {
        self.shared.lock().faults.read_only = read_only;
    }

    /// Cancels every planned fault and revives a dead disk. The operation count, the fault
    /// seed and any recording continue.
    pub fn clear_faults(&self) {
        let mut state = self.shared.lock();
        let faults = std::mem::take(&mut state.faults);
        state.faults = Faults {
            ops: faults.ops,
            seed: faults.seed,
            recording: faults.recording,
            ..Faults::default()
        };
    }

    /// How many operations have run so far (including failed ones).
    pub fn ops(&self) -> u64 {
        self.shared.lock().faults.ops
    }

    /// Bytes written so far: every byte a successful `write_all_at` was given, in every file
    /// (journal records, the zeros that prepare segments, snapshots, the manifest), so a test
    /// can bound what a workload writes per byte of payload (SPEC S13).
    pub fn bytes_written(&self) -> u64 {
        self.shared.lock().written
    }

    /// A description of the operation [`FaultFs::fail_at`] made fail, once it has.
    pub fn injected(&self) -> Option<String> {
        self.shared.lock().faults.injected.clone()
    }

    /// Whether any write or directory change awaits a sync.
    pub fn has_unsynced(&self) -> bool {
        !self.unsynced().is_empty()
    }

    /// What awaits a sync, described: "entries of `dir`" for a directory whose entry changes
    /// are not yet synced, "writes to `file`" for a file with unsynced writes.
    pub fn unsynced(&self) -> Vec<String> {
        self.shared.lock().disk.unsynced()
    }

    /// The bytes a file holds now (what readers see), without counting an operation.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.shared.lock();
        let id = state.disk.lookup(path).ok()??;
        Some(state.disk.file(id).current.clone())
    }

    /// Replaces a file's bytes, durably, creating the file if needed, without counting an
    /// operation. For tests that damage files on purpose; the directory must exist.
    pub fn write_file(&self, path: &Path, bytes: Vec<u8>) -> io::Result<()> {
        self.shared.lock().disk.replace(path, bytes)
    }
}

/// A crash point: the disk as it was just before one operation started.
#[derive(Clone)]
pub struct CrashPoint {
    /// The operation's number (see [`FaultFs::ops`]): the disk holds what operations `1..op`
    /// did.
    pub op: u64,
    /// What that operation was about to do.
    pub what: String,
    disk: Disk,
}

impl CrashPoint {
    /// The disk a power cut at this instant could leave, chosen by `seed` (see
    /// [`FaultFs::crash`]).
    pub fn power_cut(&self, seed: u64) -> FaultFs {
        FaultFs::from_disk(self.disk.crash_image(&mut Rng::new(seed)))
    }

    /// The disk a process killed at this instant leaves (see [`FaultFs::crash_process`]).
    pub fn kill(&self) -> FaultFs {
        FaultFs::from_disk(self.disk.clone())
    }
}

impl fmt::Debug for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "before operation {} ({})", self.op, self.what)
    }
}

/// The generator for the choices the fault at operation `n` makes.
fn fault_rng(faults: &Faults, n: u64) -> Rng {
    Rng::new(faults.seed ^ n.wrapping_mul(0x2545_F491_4F6C_DD1D))
}

/// Counts one operation and decides whether it fails.
fn begin(state: &mut State, access: Access, what: impl FnOnce() -> String) -> io::Result<()> {
    let mut describe = Some(what);
    let mut described: Option<String> = None;
    let mut what = move || {
        if let Some(f) = describe.take() {
            described = Some(f());
        }
        described.clone().unwrap_or_default()
    };
    let faults = &mut state.faults;
    faults.ops += 1;
    faults.tear = false;
    let n = faults.ops;
    if access != Access::Read
        && let Some(points) = &mut faults.recording
    {
        points.push(CrashPoint {
            op: n,
            what: what(),
            disk: state.disk.clone(),
        });
    }
    if let Some((k, mode)) = faults.fail_at
        && k == n
    {
        let what = what();
        faults.dead |= mode == FailMode::DeadDisk;
        faults.tear = true;
        let err = io::Error::other(format!("injected fault at operation {n}: {what}"));
        faults.injected = Some(what);
        return Err(err);
    }
    if access != Access::Read {
        if faults.read_only {
            return Err(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!("read-only file system: {}", what()),
            ));
        }
        if faults.dead {
            return Err(io::Error::other(format!(
                "injected: the disk is dead: {}",
                what()
            )));
        }
    }
    if access == Access::Sync && faults.fail_syncs {
        return Err(io::Error::other(format!(
            "injected sync failure: {}",
            what()
        )));
    }
    Ok(())
}

impl fmt::Debug for FaultFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("FaultFs")
            .field("ops", &state.faults.ops)
            .field("fail_at", &state.faults.fail_at)
            .field("dead", &state.faults.dead)
            .field("fail_syncs", &state.faults.fail_syncs)
            .finish_non_exhaustive()
    }
}
