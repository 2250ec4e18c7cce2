//! The in-memory store: the reference backend for tests (SPEC S9). Nothing survives the process.

use crate::sync::HashMap;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::sync::{Mutex, RwLock};

use super::{
    Batch, Cursor, KeyRange, Op, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
    check_guards, check_key_within, check_limit, refuse_deadlines,
};
use crate::clock::{SharedClock, SystemClock};
use crate::error::{Error, Result};

type Rows = BTreeMap<Vec<u8>, Vec<u8>>;

/// A store that keeps every partition in a `BTreeMap` in memory.
///
/// ```
/// use std::sync::Arc;
/// use portcullis::{ManualClock, store::{Batch, MemoryStore, Outcome, Partition, Store}};
/// let clock = ManualClock::new(100);
/// let store = MemoryStore::with_clock(Arc::new(clock.clone()));
/// let p = Partition::new("p").unwrap();
/// clock.advance(50);
/// assert_eq!(store.apply(&p, &Batch::new().not_after(120)).unwrap(), Outcome::DeadlinePassed { now_ms: 150 });
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    partitions: RwLock<HashMap<Partition, Arc<Mutex<Rows>>>>,
    clock: SharedClock,
    limits: StoreLimits,
    deadlines: bool,
    batches: AtomicU64,
    closed: AtomicBool,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let store = MemoryStore::new();
    /// let p = Partition::new("accounts")?;
    /// store.apply(&p, &Batch::new().put("alice", "10"))?;
    /// assert_eq!(store.get(&p, b"alice")?, Some(b"10".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store whose `NotAfter` preconditions read `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::ManualClock;
    /// use portcullis::store::{Batch, MemoryStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(1_000));
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let p = Partition::new("accounts")?;
    /// let late = Batch::new().not_after(1_500).put("alice", "0");
    /// clock.advance(1_000); // the store's clock now reads 2,000
    /// assert!(!store.apply(&p, &late)?.is_committed()); // the deadline passed
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_clock(clock: SharedClock) -> Self {
        MemoryStore {
            partitions: RwLock::new(HashMap::default()),
            clock,
            limits: StoreLimits::DEFAULT,
            deadlines: true,
            batches: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// This store with other limits (SPEC S11), e.g. a distributed backend's, so code that
    /// must respect them can be tested in memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{Error, store::{Batch, MemoryStore, Partition, Store, StoreLimits}};
    /// let store = MemoryStore::new().with_limits(StoreLimits::DEFAULT.with_max_batch_ops(1));
    /// let p = Partition::new("p").unwrap();
    /// let two = Batch::new().put(b"a".to_vec(), b"1".to_vec()).put(b"b".to_vec(), b"2".to_vec());
    /// assert!(matches!(store.apply(&p, &two), Err(Error::TooLarge { .. })));
    /// ```
    pub fn with_limits(mut self, limits: StoreLimits) -> Self {
        self.limits = limits;
        self
    }

    /// This store without server-side deadlines (SPEC S11): it answers `false` to
    /// [`Store::evaluates_deadlines`] and refuses every batch that carries a `NotAfter`, as
    /// the etcd backend does, so code that must cope with such a backend can be tested in
    /// memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{Error, store::{Batch, MemoryStore, Partition, Store}};
    /// let store = MemoryStore::new().without_deadlines();
    /// assert!(!store.evaluates_deadlines());
    /// let p = Partition::new("p").unwrap();
    /// let batch = Batch::new().not_after(u64::MAX).put(b"a".to_vec(), b"1".to_vec());
    /// assert!(matches!(store.apply(&p, &batch), Err(Error::InvalidArgument(_))));
    /// ```
    pub fn without_deadlines(mut self) -> Self {
        self.deadlines = false;
        self
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    fn rows(&self, p: &Partition) -> Option<Arc<Mutex<Rows>>> {
        self.partitions.read().get(p).cloned()
    }
}

impl Store for MemoryStore {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        check_key_within(key, &self.limits)?;
        Ok(self.rows(p).and_then(|rows| rows.lock().get(key).cloned()))
    }

    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.check_open()?;
        for key in keys {
            check_key_within(key, &self.limits)?;
        }
        let Some(rows) = self.rows(p) else {
            return Ok(vec![None; keys.len()]);
        };
        let rows = rows.lock();
        Ok(keys.iter().map(|k| rows.get(*k).cloned()).collect())
    }

    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        self.check_open()?;
        check_limit(limit)?;
        let range = range.resuming(cursor);
        let Some(rows) = self.rows(p) else {
            return Ok(ScanPage::default());
        };
        if range.is_empty() {
            return Ok(ScanPage::default());
        }
        let rows = rows.lock();
        let mut iter = rows.range::<[u8], _>(range.as_bounds());
        let entries: Vec<_> = iter
            .by_ref()
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let next = match (entries.last(), iter.next()) {
            (Some((last, _)), Some(_)) => Some(Cursor(last.clone())),
            _ => None,
        };
        Ok(ScanPage { entries, next })
    }

    /// Copies the page into one buffer under the lock, then lends its entries with the lock
    /// released (so `visit` may call the store): a few allocations per page, none per entry.
    #[allow(clippy::type_complexity)]
    fn scan_visit(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<Option<Cursor>> {
        self.check_open()?;
        check_limit(limit)?;
        let range = range.resuming(cursor);
        let Some(rows) = self.rows(p) else {
            return Ok(None);
        };
        if range.is_empty() {
            return Ok(None);
        }
        // Keys and values end to end; each entry's key end and value end.
        let (mut bytes, mut ends) = (Vec::new(), Vec::new());
        let more = {
            let rows = rows.lock();
            let mut iter = rows.range::<[u8], _>(range.as_bounds());
            for (k, v) in iter.by_ref().take(limit) {
                bytes.extend_from_slice(k);
                let key_end = bytes.len();
                bytes.extend_from_slice(v);
                ends.push((key_end, bytes.len()));
            }
            iter.next().is_some()
        };
        let mut start = 0;
        let mut last_key = 0..0;
        for &(key_end, end) in &ends {
            visit(&bytes[start..key_end], &bytes[key_end..end])?;
            last_key = start..key_end;
            start = end;
        }
        Ok(match more && !ends.is_empty() {
            true => Some(Cursor(bytes[last_key].to_vec())),
            false => None,
        })
    }

    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        self.check_open()?;
        batch.validate_within(&self.limits)?;
        if !self.deadlines {
            refuse_deadlines(batch, "this in-memory store")?;
        }
        let now_ms = || self.clock.now_ms();
        let rows = match self.rows(p) {
            Some(rows) => rows,
            None => {
                // A partition comes into being with its first committed batch: a refused batch
                // must not leave an empty partition behind (SPEC S2: it changes nothing). The
                // map's write lock keeps the check and the insertion atomic.
                let mut partitions = self.partitions.write();
                match partitions.get(p) {
                    Some(rows) => rows.clone(),
                    None => {
                        if let Some(refused) = check_guards(batch.guards(), now_ms, |_| Ok(None))? {
                            return Ok(refused);
                        }
                        let mut rows = Rows::new();
                        apply_ops(&mut rows, batch);
                        partitions.insert(p.clone(), Arc::new(Mutex::new(rows)));
                        self.batches.fetch_add(1, Ordering::Relaxed);
                        return Ok(Outcome::Committed);
                    }
                }
            }
        };
        let mut rows = rows.lock();
        if let Some(refused) = check_guards(batch.guards(), now_ms, |k| Ok(rows.get(k).cloned()))? {
            return Ok(refused);
        }
        apply_ops(&mut rows, batch);
        self.batches.fetch_add(1, Ordering::Relaxed);
        Ok(Outcome::Committed)
    }

    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        self.check_open()?;
        let mut names: Vec<Partition> = self
            .partitions
            .read()
            .keys()
            .filter(|p| p.as_bytes().starts_with(prefix))
            .cloned()
            .collect();
        names.sort();
        Ok(names)
    }

    fn contains_partition(&self, p: &Partition) -> Result<bool> {
        self.check_open()?;
        Ok(self.partitions.read().contains_key(p))
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn limits(&self) -> StoreLimits {
        self.limits
    }

    fn evaluates_deadlines(&self) -> bool {
        self.deadlines
    }

    fn stats(&self) -> StoreStats {
        let partitions = self.partitions.read().len() as u64;
        StoreStats {
            batches: self.batches.load(Ordering::Relaxed),
            partitions,
            partitions_loaded: partitions,
            ..StoreStats::default()
        }
    }

    fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        Ok(())
    }

    fn backup(&self, dest: &std::path::Path) -> Result<super::BackupReport> {
        Err(Error::invalid(format!(
            "the in-memory store keeps nothing on disk, so there is nothing to back up to {}; to keep its data, copy its partitions into a FileStore (list_partitions, entries, apply)",
            dest.display()
        )))
    }
}

/// Applies a batch's operations, in order, to a partition's rows.
fn apply_ops(rows: &mut Rows, batch: &Batch) {
    for op in batch.ops() {
        match op {
            Op::Put(k, v) => {
                rows.insert(k.clone(), v.clone());
            }
            Op::Delete(k) => {
                rows.remove(k);
            }
            Op::DeleteRange(r) => {
                if !r.is_empty() {
                    let doomed: Vec<Vec<u8>> = rows
                        .range::<[u8], _>(r.as_bounds())
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in doomed {
                        rows.remove(&k);
                    }
                }
            }
        }
    }
}
