//! A store view that a test can kill: from then on every call through it fails, as when the
//! process behind it died (SPEC F12: its engine stops renewing its owner lease). Views over one
//! store share its data and its handle (`exclusive_handle` is the store's).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use portcullis::store::{
    Batch, Cursor, KeyRange, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
};

/// See the module documentation.
pub struct Killable {
    pub inner: Arc<dyn Store>,
    dead: AtomicBool,
}

impl Killable {
    pub fn over(inner: &Arc<dyn Store>) -> Arc<Killable> {
        Arc::new(Killable {
            inner: Arc::clone(inner),
            dead: AtomicBool::new(false),
        })
    }

    /// Every later call fails.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    fn alive(&self) -> portcullis::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(portcullis::Error::Io {
                context: "a killed process's store".into(),
                source: std::io::Error::other("the process died"),
            });
        }
        Ok(())
    }
}

impl Store for Killable {
    fn get(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.alive()?;
        self.inner.get(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> portcullis::Result<Vec<Option<Vec<u8>>>> {
        self.alive()?;
        self.inner.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> portcullis::Result<ScanPage> {
        self.alive()?;
        self.inner.scan(p, range, cursor, limit)
    }
    fn apply(&self, p: &Partition, batch: &Batch) -> portcullis::Result<Outcome> {
        self.alive()?;
        self.inner.apply(p, batch)
    }
    fn list_partitions(&self, prefix: &[u8]) -> portcullis::Result<Vec<Partition>> {
        self.alive()?;
        self.inner.list_partitions(prefix)
    }
    fn contains_partition(&self, p: &Partition) -> portcullis::Result<bool> {
        self.alive()?;
        self.inner.contains_partition(p)
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }
    fn evaluates_deadlines(&self) -> bool {
        self.inner.evaluates_deadlines()
    }
    fn exclusive_handle(&self) -> Option<u64> {
        self.inner.exclusive_handle()
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
    /// The data belongs to the test, never to one view.
    fn close(&self) -> portcullis::Result<()> {
        Ok(())
    }
}
