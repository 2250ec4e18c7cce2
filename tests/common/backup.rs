//! Shared by the backup tests (SPEC S12): writers whose every batch is recognisable and whose
//! journal order is known (through the store's append observer), a clock of backup calls the
//! writers read before and after each batch, and the check that a backup holds exactly the
//! batches the journal numbered below its point.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use portcullis::store::{BackupReport, FileStore, FileStoreBuilder, Partition, Store};

/// The partitions each writer spreads its batches over.
pub const PARTITIONS_PER_WRITER: usize = 4;

/// The partition writer `t`'s batch `i` goes to.
pub fn partition(t: usize, i: usize) -> String {
    format!("w{t:02}-p{}", i % PARTITIONS_PER_WRITER)
}

/// The key of writer `t`'s batch `i` (one key per batch, never overwritten).
pub fn key(i: usize) -> String {
    format!("b{i:05}")
}

/// The value of a batch: recognisably its own, `len` bytes long.
pub fn value(partition: &str, key: &str, len: usize) -> Vec<u8> {
    let mut v = format!("{partition}/{key};").into_bytes();
    let seed = v
        .iter()
        .fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(*b));
    v.extend((0..len.saturating_sub(v.len())).map(|i| seed.wrapping_add(i as u8)));
    v.truncate(len.max(1));
    v
}

/// Counts backup calls: odd while backup `n` (from 0) runs (`2n + 1`), even once it returned
/// (`2n + 2`). Writers read it before handing a batch to `apply` and after it returns.
#[derive(Default)]
pub struct Calls(AtomicU64);

impl Calls {
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Runs `backup` as call number `n`, counting its start and its return.
    pub fn run<T>(&self, backup: impl FnOnce() -> T) -> T {
        self.0.fetch_add(1, Ordering::SeqCst);
        let out = backup();
        self.0.fetch_add(1, Ordering::SeqCst);
        out
    }
}

/// One batch a writer handed to `apply`.
#[derive(Clone, Debug)]
pub struct Written {
    pub partition: String,
    pub key: String,
    pub len: usize,
    /// How many batches this writer had appended to the partition before this one: the index
    /// of its sequence number in the ledger's list for the partition.
    pub nth: usize,
    /// [`Calls::now`] before `apply`.
    pub before: u64,
    /// [`Calls::now`] after `apply` acknowledged it, if it did.
    pub acked: Option<u64>,
}

/// The journal sequence numbers of every batch, by partition, in append order (a partition has
/// one writer, so its appends are in its writer's order).
#[derive(Clone, Default)]
pub struct Ledger {
    lsns: Arc<Mutex<HashMap<String, Vec<u64>>>>,
    written: Arc<Mutex<Vec<Written>>>,
}

impl Ledger {
    /// `builder` with an append observer that records every batch's sequence number.
    pub fn observe(&self, builder: FileStoreBuilder) -> FileStoreBuilder {
        let lsns = self.lsns.clone();
        builder.observe_appends(move |p, lsn| {
            let name = String::from_utf8_lossy(p.as_bytes()).into_owned();
            lsns.lock().entry(name).or_default().push(lsn);
        })
    }

    /// Writer `t` writes its batches `range` of `len` bytes each to `store`, one at a time,
    /// reading `calls` around each and calling `after` with the count written so far. A failed
    /// `apply` is recorded as not acknowledged.
    pub fn write(
        &self,
        store: &FileStore,
        t: usize,
        range: std::ops::Range<usize>,
        len: usize,
        calls: &Calls,
        mut after: impl FnMut(usize),
    ) {
        let mut nth: HashMap<String, usize> = HashMap::new();
        for i in 0..range.start {
            *nth.entry(partition(t, i)).or_default() += 1;
        }
        for (done, i) in range.enumerate() {
            let (name, key) = (partition(t, i), key(i));
            let p = Partition::new(&name).unwrap();
            let batch = portcullis::store::Batch::new().put(key.clone(), value(&name, &key, len));
            let before = calls.now();
            let outcome = store.apply(&p, &batch);
            let acked = matches!(outcome, Ok(o) if o.is_committed()).then(|| calls.now());
            let n = nth.entry(name.clone()).or_default();
            self.written.lock().push(Written {
                partition: name,
                key,
                len,
                nth: *n,
                before,
                acked,
            });
            *n += 1;
            after(done + 1);
        }
    }

    /// The sequence number of a batch, if it was appended.
    pub fn lsn(&self, w: &Written) -> Option<u64> {
        self.lsns.lock().get(&w.partition)?.get(w.nth).copied()
    }

    pub fn written(&self) -> Vec<Written> {
        self.written.lock().clone()
    }

    /// What is wrong with `copy`, the store a backup made as call number `call` (from 0) with
    /// `report`: it must hold exactly the batches numbered below the point, each with its
    /// whole value, and nothing else of the writers'; every batch acknowledged before the call
    /// started must be below the point, and every batch started after it returned above.
    pub fn check(&self, copy: &FileStore, call: u64, report: &BackupReport) -> Vec<String> {
        let mut wrong = Vec::new();
        let mut held = 0usize;
        for w in self.written() {
            let lsn = self.lsn(&w);
            let below = lsn.is_some_and(|l| l < report.next_lsn);
            let what = format!(
                "{}/{} (lsn {lsn:?}, point {})",
                w.partition, w.key, report.next_lsn
            );
            if w.acked.is_some_and(|a| a < 2 * call + 1) && !below {
                wrong.push(format!(
                    "{what}: acknowledged before the backup, past its point"
                ));
            }
            if w.before >= 2 * call + 2 && below {
                wrong.push(format!(
                    "{what}: started after the backup, before its point"
                ));
            }
            let p = Partition::new(&w.partition).unwrap();
            match (copy.get(&p, w.key.as_bytes()), below) {
                (Ok(Some(v)), true) if v == value(&w.partition, &w.key, w.len) => held += 1,
                (Ok(None), false) => {}
                (got, _) => wrong.push(format!(
                    "{what}: the backup reads {:?}, expected {}",
                    got.map(|v| v.map(|v| v.len())),
                    if below { "the value" } else { "nothing" }
                )),
            }
        }
        let mut rows = 0usize;
        for p in copy.list_partitions(b"w").unwrap_or_default() {
            rows += copy.entries(&p, portcullis::store::KeyRange::all()).count();
        }
        if rows != held {
            wrong.push(format!(
                "the backup holds {rows} rows of the writers, {held} of them expected"
            ));
        }
        wrong
    }
}
