//! Latencies as a count, a sum, a maximum and a small fixed histogram (SPEC E8), recorded with
//! a few relaxed atomic adds (the journal records every sync this way).
//!
//! Owns [`LatencyStats`] (the snapshot) and `Latency` (the counters).

use crate::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds of the histogram's buckets, in microseconds; a last bucket counts
/// everything slower than the last bound.
pub const LATENCY_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// How long something took, over every time it was done (SPEC E8).
///
/// ```
/// use portcullis::store::{Batch, FileStore, Partition, Store};
///
/// # fn main() -> portcullis::Result<()> {
/// let dir = tempfile::tempdir().expect("a temporary directory");
/// let store = FileStore::open(dir.path())?;
/// store.apply(&Partition::new("p")?, &Batch::new().put("k", "v"))?;
/// let syncs = store.stats().sync_latency;
/// assert!(syncs.count >= 1);
/// assert!(syncs.max >= syncs.mean());
/// assert_eq!(syncs.buckets.iter().sum::<u64>(), syncs.count);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatencyStats {
    /// How many times.
    pub count: u64,
    /// The time of all of them together.
    pub total: Duration,
    /// The longest.
    pub max: Duration,
    /// How many took at most each of [`LATENCY_BUCKETS_US`] (and more than the bound before
    /// it); the last counts those slower than every bound.
    pub buckets: [u64; 13],
}

impl LatencyStats {
    /// The mean (zero when nothing was timed).
    pub fn mean(&self) -> Duration {
        if self.count == 0 {
            return Duration::ZERO;
        }
        self.total / u32::try_from(self.count).unwrap_or(u32::MAX).max(1)
    }
}

/// The counters behind a [`LatencyStats`].
#[derive(Debug, Default)]
pub(crate) struct Latency {
    count: AtomicU64,
    total_nanos: AtomicU64,
    max_nanos: AtomicU64,
    buckets: [AtomicU64; 13],
}

impl Latency {
    /// Counts one that took `nanos`.
    #[inline]
    pub(crate) fn record(&self, nanos: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.max_nanos.fetch_max(nanos, Ordering::Relaxed);
        let micros = nanos / 1_000;
        let bucket = LATENCY_BUCKETS_US
            .iter()
            .position(|&bound| micros <= bound)
            .unwrap_or(LATENCY_BUCKETS_US.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LatencyStats {
        LatencyStats {
            count: self.count.load(Ordering::Relaxed),
            total: Duration::from_nanos(self.total_nanos.load(Ordering::Relaxed)),
            max: Duration::from_nanos(self.max_nanos.load(Ordering::Relaxed)),
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{LATENCY_BUCKETS_US, Latency};

    #[test]
    fn a_latency_lands_in_the_first_bucket_whose_bound_holds_it() {
        let l = Latency::default();
        l.record(50_000); // 50 us
        l.record(100_000); // 100 us: at the first bound
        l.record(100_001_000); // 100.001 ms
        l.record(5_000_000_000); // 5 s: past every bound
        let s = l.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], 2);
        assert_eq!(s.buckets[LATENCY_BUCKETS_US.len()], 1);
        assert_eq!(
            s.buckets[10], 1,
            "100.001 ms is above 100 ms, at most 250 ms"
        );
        assert_eq!(s.max, Duration::from_secs(5));
        assert_eq!(s.buckets.iter().sum::<u64>(), 4);
    }
}
