//! Counters of the fence's store calls and protocol steps, so the costs promised by the
//! benchmarks (store calls per write, per push, slices per revocation) can be measured.
//!
//! Every store call the fence makes goes through [`CountedStore`], so nothing is missed.

use crate::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::Result;
use crate::store::{Batch, Cursor, KeyRange, Outcome, Partition, ScanPage, Store};

/// A snapshot of a fence's counters (all since the fence was created).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceStats {
    /// Store calls of every kind.
    pub store_calls: u64,
    /// `get` and `get_many` calls.
    pub reads: u64,
    /// `scan` calls.
    pub scans: u64,
    /// `apply` calls.
    pub applies: u64,
    /// Revocation slices run.
    pub slices: u64,
    /// Pushes that committed the entity's lease (on a store without deadlines, also the
    /// sweeper's retirements of a lease).
    pub pushes: u64,
    /// Acknowledgements that committed.
    pub acks: u64,
    /// Renewals whose leased-shard row committed.
    pub renewals: u64,
    /// Fenced writes that committed.
    pub writes_committed: u64,
    /// Leased-shard rows deleted by the sweeper.
    pub swept: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    reads: AtomicU64,
    scans: AtomicU64,
    applies: AtomicU64,
    pub(crate) slices: AtomicU64,
    pub(crate) pushes: AtomicU64,
    pub(crate) acks: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) writes_committed: AtomicU64,
    pub(crate) swept: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> FenceStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (reads, scans, applies) = (load(&self.reads), load(&self.scans), load(&self.applies));
        FenceStats {
            store_calls: reads + scans + applies,
            reads,
            scans,
            applies,
            slices: load(&self.slices),
            pushes: load(&self.pushes),
            acks: load(&self.acks),
            renewals: load(&self.renewals),
            writes_committed: load(&self.writes_committed),
            swept: load(&self.swept),
        }
    }
}

/// The store as the fence sees it: every call counted.
#[derive(Clone)]
pub(crate) struct CountedStore {
    store: Arc<dyn Store>,
    counters: Arc<Counters>,
}

impl CountedStore {
    pub(crate) fn new(store: Arc<dyn Store>, counters: Arc<Counters>) -> Self {
        CountedStore { store, counters }
    }

    pub(crate) fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Counters::bump(&self.counters.reads);
        self.store.get(p, key)
    }

    pub(crate) fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        Counters::bump(&self.counters.reads);
        self.store.get_many(p, keys)
    }

    pub(crate) fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        Counters::bump(&self.counters.scans);
        self.store.scan(p, range, cursor, limit)
    }

    pub(crate) fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        Counters::bump(&self.counters.applies);
        self.store.apply(p, batch)
    }
}
