//! What every system implements, and the data every workload writes.

use std::error::Error;
use std::path::Path;

/// Any error of any system, carried up to `main`.
pub type R<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// One thread's unit of work: returns whether it succeeded (a committed row, a won
/// compare-and-set). Its argument is the attempt number of that thread, from 0.
pub type Worker<'a> = Box<dyn FnMut(u64) -> R<bool> + Send + 'a>;

/// A store prepared for a multi-threaded workload.
pub trait Bench: Sync {
    /// A worker for thread `thread`, made before the clock starts.
    fn worker(&self, thread: usize) -> R<Worker<'_>>;
    /// (batches, syncs) counted by the system itself, where it exposes them.
    fn counters(&self) -> Option<(u64, u64)> {
        None
    }
}

/// A reopened store holding per-entity logs.
pub trait Reader {
    /// Reads entity `entity`'s whole history in order; returns (records, value bytes).
    fn read_entity(&self, entity: u64) -> R<(usize, usize)>;
    /// Reads record `seq` (from 0) of `entity`: one point read.
    fn get(&self, entity: u64, seq: u64) -> R<Option<Vec<u8>>>;
    /// Closes the store (so it can be reopened in the same process).
    fn close(self: Box<Self>) -> R<()>;
}

/// Durably writes record `seq` (from 0) of `entity` as one single-row commit; returns once the
/// commit is acknowledged (synced).
pub type PointWriter = Box<dyn FnMut(u64, u64, &[u8]) -> R<()>>;

/// The workloads, for the systems that take part in only some of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Commits,
    Cas,
    /// Loading a data set, reopening it, and reading it (`load`, `open`).
    Read,
    /// Reopen after a writer was killed with SIGKILL mid-write (`load`, `crash_writer`, `open`).
    Crash,
}

/// Times of one restore of every entity (Portcullis's engine only).
pub struct RestoreRun {
    /// Opening the engine over the store.
    pub open: std::time::Duration,
    /// The warm, from its start until every entity is restored.
    pub warm: std::time::Duration,
}

/// In which order the rows of a data set are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Record 0 of every entity, then record 1 of every entity, ... (appends interleaved in
    /// time, as a live system writes them). Each record is its own append.
    Interleaved,
    /// All records of entity 0, then entity 1, ... Each entity's records are one batch.
    PerEntity,
}

/// A data set of per-entity logs.
#[derive(Clone, Copy, Debug)]
pub struct DataSet {
    pub entities: u64,
    pub records: u64,
    pub value_len: usize,
    pub order: Order,
    /// Rows per transaction for the peers' bulk load.
    pub rows_per_txn: usize,
}

impl DataSet {
    /// Bytes of payload: every record's value.
    pub fn payload(&self) -> u64 {
        self.entities * self.records * self.value_len as u64
    }

    /// Every (entity, seq) in write order.
    pub fn rows(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (n, m) = (self.entities, self.records);
        (0..n * m).map(move |i| match self.order {
            Order::Interleaved => (i % n, i / n),
            Order::PerEntity => (i / m, i % m),
        })
    }
}

/// The value of record `seq` of `entity`: pseudo-random bytes, so that no system gains from
/// compressing them.
pub fn value(entity: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut x = entity
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seq.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A system under test.
pub trait System: Sync {
    fn name(&self) -> &'static str;
    /// How the system is configured, in one line.
    fn config(&self) -> String;
    /// Whether the system takes part in `workload` (every one by default).
    fn supports(&self, _workload: Workload) -> bool {
        true
    }
    /// An empty store for durable single-row commits.
    fn commits(&self, dir: &Path) -> R<Box<dyn Bench>>;
    /// A store holding one row, for compare-and-set contention.
    fn cas(&self, dir: &Path) -> R<Box<dyn Bench>>;
    /// Writes `data` into a fresh store in `dir` and closes it cleanly.
    fn load(&self, dir: &Path, data: &DataSet) -> R<()>;
    /// Opens the store in `dir`.
    fn open(&self, dir: &Path) -> R<Box<dyn Reader>>;
    /// Lets the store in `dir` (loaded and closed) settle before its bytes on disk are
    /// measured: reopens it as `open` does, waits until the background work the system does by
    /// itself has finished (compaction, flushes), and closes it. The default, for a system
    /// with no background work: reopen and close.
    fn settle(&self, dir: &Path) -> R<()> {
        self.open(dir)?.close()
    }
    /// How `settle` waits, in a few words, for the report.
    fn settles(&self) -> &'static str {
        "no background work: reopened and closed"
    }
    /// Opens the store in `dir` for durable single-row writes of new records, each synced
    /// before it is acknowledged, into the same table `load` fills.
    fn crash_writer(&self, dir: &Path) -> R<PointWriter>;
    /// Opens the store in `dir` (loaded with `data`) through an engine and restores every
    /// entity; `None` for a system without one.
    fn restore_all(&self, _dir: &Path, _data: &DataSet) -> R<Option<RestoreRun>> {
        Ok(None)
    }
}

/// A 16-byte key: entity then sequence number, both big-endian, so keys sort by entity then seq.
pub fn log_key(entity: u64, seq: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&entity.to_be_bytes());
    k[8..].copy_from_slice(&seq.to_be_bytes());
    k
}
