//! Files with an observer on every read and sync, for the tests that measure or pause what the
//! file store does there (its heap at a read, a reader held inside its value read, a
//! group-commit leader held inside its sync): the operating system's files ([`observed_os`]) or
//! any other ([`ObservedOs::over`], the fault-injecting disk for one). Everything else goes
//! straight to the files underneath. [`SyncGate`] holds one sync until a test lets it go.

use std::fmt::Debug;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam::channel::{Receiver, Sender, bounded};
use portcullis::store::{OpenMode, OsFs, PathKind, Vfs, VfsFile, VfsLock};

/// Told of every read, and of every sync, before it happens.
pub trait ReadObserver: Send + Sync + Debug + 'static {
    /// Called with the length of the read about to happen.
    fn before_read(&self, len: usize);
    /// Called before every `sync_data` of a file (nothing by default).
    fn before_sync(&self) {}
}

/// Files (the operating system's unless said otherwise), telling the observer of every read and
/// sync before it happens.
#[derive(Debug)]
pub struct ObservedOs<O: ReadObserver, V: Vfs = OsFs> {
    observer: Arc<O>,
    files: V,
}

/// The operating system's files, observed.
pub fn observed_os<O: ReadObserver>(observer: Arc<O>) -> ObservedOs<O> {
    ObservedOs {
        observer,
        files: OsFs,
    }
}

impl<O: ReadObserver, V: Vfs> ObservedOs<O, V> {
    /// `files`, observed.
    pub fn over(observer: Arc<O>, files: V) -> Self {
        ObservedOs { observer, files }
    }
}

/// A file of [`ObservedOs`].
#[derive(Debug)]
struct ObservedFile<O: ReadObserver>(Arc<dyn VfsFile>, Arc<O>);

impl<O: ReadObserver> VfsFile for ObservedFile<O> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.1.before_read(buf.len());
        self.0.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.1.before_sync();
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl<O: ReadObserver, V: Vfs> Vfs for ObservedOs<O, V> {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        Ok(Arc::new(ObservedFile(
            self.files.open(path, mode)?,
            Arc::clone(&self.observer),
        )))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.files.create_dir_all(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.files.list(dir)
    }
    fn kind(&self, path: &Path) -> io::Result<Option<PathKind>> {
        self.files.kind(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.files.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.files.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.files.sync_dir(dir)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Box<dyn VfsLock>> {
        self.files.try_lock(path)
    }
}

/// How long a test waits for one step of another thread (a bound on a hang, far above what a
/// step takes; nothing waits for time to pass).
pub const STEP: Duration = Duration::from_secs(30);

/// The next message on `rx`, or a test failure naming what did not happen.
#[track_caller]
pub fn wait<T>(rx: &Receiver<T>, what: &str) -> T {
    match rx.recv_timeout(STEP) {
        Ok(message) => message,
        Err(e) => panic!("{what} within {STEP:?} ({e}): the test would hang"),
    }
}

/// Holds the first sync after it is armed: reports it on `held`, then waits to be let go.
#[derive(Debug)]
pub struct SyncGate {
    armed: AtomicBool,
    held: Sender<()>,
    go: Receiver<()>,
}

impl SyncGate {
    /// A gate, with the receiver that hears a sync is held and the sender that lets it go.
    pub fn new() -> (Arc<SyncGate>, Receiver<()>, Sender<()>) {
        let (held_tx, held_rx) = bounded(1);
        let (go_tx, go_rx) = bounded(1);
        let gate = SyncGate {
            armed: AtomicBool::new(false),
            held: held_tx,
            go: go_rx,
        };
        (Arc::new(gate), held_rx, go_tx)
    }

    /// Holds the next sync.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }
}

impl ReadObserver for SyncGate {
    fn before_read(&self, _len: usize) {}
    fn before_sync(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.held.send(()).unwrap();
            wait(&self.go, "the test did not let the held sync go");
        }
    }
}
