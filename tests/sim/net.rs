//! A lossy network in front of the memory store, as an etcd cluster looks to its clients
//! (docs/SIMULATION.md, "What a seed chooses").
//!
//! A batch that writes log records to an entity's partition may:
//! - lose its answer after it committed (`OutcomeUnknown`, as a request that timed out on its
//!   way back does);
//! - be held in the network: the call answers `OutcomeUnknown` at once and the batch arrives
//!   later, when the simulation's network task delivers it (a delayed copy). Its guards are
//!   checked when it arrives, as an etcd transaction's compares are, so a copy guarded on a
//!   head that moved meanwhile fails.
//!
//! A read of an entity's partition may time out (`Unavailable`, as the etcd backend answers
//! when a request does not come back); an engine's restore unit that meets one contains its
//! entity (SPEC R4) until it is released. In some seeds every read of an entity's partition
//! takes a few milliseconds of virtual time, so calls spend time while tasks wait on them.
//!
//! Everything else passes through. The faults are drawn from generators of the seed's, in the
//! order the schedule makes the calls, so a seed replays them exactly.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};

use portcullis::clock::SimClock;
use portcullis::store::{
    Batch, Cursor, KeyRange, MemoryStore, Op, Outcome, Partition, ScanPage, Store, StoreLimits,
    StoreStats,
};
use portcullis::{Error, Result};

use super::Rng;

/// The memory store behind a network that loses answers and delays copies. Each owner has a
/// view of its own ([`Net::view`]), so a delivered copy names the owner that sent it.
pub struct Net {
    inner: Arc<MemoryStore>,
    faults: Arc<StdMutex<Faults>>,
    sender: &'static str,
    /// How long a read of an entity's partition takes, in the clock's virtual time.
    read_latency: Option<(SimClock, std::time::Duration)>,
}

/// A held copy that arrived: who sent it, where, and what it got.
pub struct Delivery {
    pub sender: &'static str,
    pub partition: Partition,
    pub outcome: Result<Outcome>,
}

struct Faults {
    rng: Rng,
    /// Percent of record-writing batches whose answer is lost after they commit.
    lose: u64,
    /// Percent of record-writing batches held in the network (answered at once, arrive later).
    hold: u64,
    /// Whether faults are still injected (the final check runs on a calm network).
    on: bool,
    held: VecDeque<(&'static str, Partition, Batch)>,
    /// Batches lost or held, by partition.
    disturbed: BTreeMap<Partition, u64>,
    /// Draws the reads that time out (a generator of its own, so the batches' fates are as
    /// without it).
    read_rng: Rng,
    /// Percent of reads of entity partitions that time out, once the workload's tasks start
    /// ([`Net::start_reads_failing`]; the set-up's reads all succeed).
    fail_reads: u64,
    reads_fail: bool,
    /// Reads that timed out, by partition.
    read_failures: BTreeMap<Partition, u64>,
}

/// Whether a batch writes a log record (`\0log.rec...`) to an entity's partition.
fn writes_records(p: &Partition, batch: &Batch) -> bool {
    p.as_bytes().starts_with(b"e/")
        && batch.ops().iter().any(|op| match op {
            Op::Put(k, _) => k.starts_with(b"\0log.rec"),
            _ => false,
        })
}

fn unknown(p: &Partition, detail: &str) -> Error {
    Error::OutcomeUnknown {
        partition: p.to_string(),
        detail: format!("simulated network: {detail}"),
    }
}

/// What the network did to one batch.
enum Fate {
    Answered,
    Lost,
    Held,
}

impl Net {
    /// A network over `inner` whose faults `rng` draws: each record-writing batch loses its
    /// answer with `lose` percent, and is held with `hold` percent; `read_rng` draws the reads
    /// of entity partitions that time out, `fail_reads` percent of them.
    pub fn new(
        inner: MemoryStore,
        rng: Rng,
        lose: u64,
        hold: u64,
        read_rng: Rng,
        fail_reads: u64,
    ) -> Arc<Self> {
        Arc::new(Net {
            inner: Arc::new(inner),
            faults: Arc::new(StdMutex::new(Faults {
                rng,
                lose,
                hold,
                on: true,
                held: VecDeque::new(),
                disturbed: BTreeMap::new(),
                read_rng,
                fail_reads,
                reads_fail: false,
                read_failures: BTreeMap::new(),
            })),
            sender: "-",
            read_latency: None,
        })
    }

    /// The same network, whose reads of entity partitions each take `latency` of `clock`'s
    /// virtual time.
    pub fn with_read_latency(
        self: Arc<Self>,
        clock: SimClock,
        latency: std::time::Duration,
    ) -> Arc<Self> {
        Arc::new(Net {
            inner: self.inner.clone(),
            faults: self.faults.clone(),
            sender: self.sender,
            read_latency: Some((clock, latency)),
        })
    }

    /// The same store and network, for the owner `sender`.
    pub fn view(&self, sender: &'static str) -> Arc<Self> {
        Arc::new(Net {
            inner: self.inner.clone(),
            faults: self.faults.clone(),
            sender,
            read_latency: self.read_latency.clone(),
        })
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers the oldest held copy, if any.
    pub fn deliver_one(&self) -> Option<Delivery> {
        let (sender, partition, batch) = self.faults().held.pop_front()?;
        let outcome = self.inner.apply(&partition, &batch);
        Some(Delivery {
            sender,
            partition,
            outcome,
        })
    }

    /// How many batches to `p` lost their answer or were held: each may make the engine run
    /// a restore unit again (a unit whose batch's outcome is unknown is retried, SPEC R4).
    pub fn disturbed(&self, p: &Partition) -> u64 {
        self.faults().disturbed.get(p).copied().unwrap_or(0)
    }

    /// How many reads of `p` timed out: each may have contained its entity (SPEC R4).
    pub fn read_failures(&self, p: &Partition) -> u64 {
        self.faults().read_failures.get(p).copied().unwrap_or(0)
    }

    /// From now on reads may time out (until [`Net::calm`]).
    pub fn start_reads_failing(&self) {
        self.faults().reads_fail = true;
    }

    /// A read of `p` that times out, drawn while the network injects faults.
    fn read(&self, p: &Partition) -> Result<()> {
        if !p.as_bytes().starts_with(b"e/") {
            return Ok(());
        }
        if let Some((clock, latency)) = &self.read_latency {
            clock.sleep(*latency);
        }
        let mut faults = self.faults();
        if !faults.on || !faults.reads_fail || faults.fail_reads == 0 {
            return Ok(());
        }
        if faults.read_rng.below(100) < faults.fail_reads {
            *faults.read_failures.entry(p.clone()).or_default() += 1;
            return Err(Error::Unavailable {
                reason: format!("simulated network: a read of {p} timed out"),
                retry_after_ms: 50,
            });
        }
        Ok(())
    }

    /// Stops injecting faults and delivers every held copy.
    pub fn calm(&self) -> Vec<Delivery> {
        self.faults().on = false;
        std::iter::from_fn(|| self.deliver_one()).collect()
    }

    fn fate(&self, p: &Partition, batch: &Batch) -> Fate {
        if !writes_records(p, batch) {
            return Fate::Answered;
        }
        let mut faults = self.faults();
        if !faults.on {
            return Fate::Answered;
        }
        let draw = faults.rng.below(100);
        if draw < faults.hold + faults.lose {
            *faults.disturbed.entry(p.clone()).or_default() += 1;
        }
        if draw < faults.hold {
            let sender = self.sender;
            faults.held.push_back((sender, p.clone(), batch.clone()));
            Fate::Held
        } else if draw < faults.hold + faults.lose {
            Fate::Lost
        } else {
            Fate::Answered
        }
    }
}

impl Store for Net {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(p)?;
        self.inner.get(p, key)
    }
    fn get_for_update(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(p)?;
        self.inner.get_for_update(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.read(p)?;
        self.inner.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        self.read(p)?;
        self.inner.scan(p, range, cursor, limit)
    }
    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        match self.fate(p, batch) {
            Fate::Held => Err(unknown(
                p,
                "the request is delayed; a copy may still arrive",
            )),
            Fate::Lost => {
                // Whatever it got (committed, or a guard failed), the answer is lost.
                let _lost = self.inner.apply(p, batch)?;
                Err(unknown(
                    p,
                    "the answer was lost after the batch was applied",
                ))
            }
            Fate::Answered => self.inner.apply(p, batch),
        }
    }
    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        self.inner.list_partitions(prefix)
    }
    fn contains_partition(&self, p: &Partition) -> Result<bool> {
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
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
    fn close(&self) -> Result<()> {
        self.inner.close()
    }
}
