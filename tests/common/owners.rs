//! Several owners (engines) over one shared store, for the engine-level property test: each
//! owner sees the store through its own view ([`OwnerStore`]) with its own clock skew and a
//! switch that kills it (every call fails, as after the process died), and every view reports
//! what committed into one [`Shared`] record, which checks at commit time that no write planned
//! under a grant below a completed revocation commits (SPEC F7), whoever made it, and keeps a
//! ghost of every log record ever committed (to check exactly-once application and folds).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use portcullis::fence::FenceKind;
use portcullis::log::keys::record_seq;
use portcullis::restore::{Containment, Metrics, UnitReport};
use portcullis::store::{
    Batch, Cursor, KeyRange, Op, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
};
use portcullis::{ApplyContext, Clock, EntityId, Namespace, Rejection, StateMachine};

/// The grant a write in flight was planned under, when the application (not the engine) makes
/// it directly through a fence: the epoch grant, and the authority grant if it carries one.
#[derive(Clone, Debug)]
pub struct CallGrant {
    pub ns: Namespace,
    pub epoch: u64,
    pub authority: Option<u64>,
}

/// What every owner's view reports into.
#[derive(Default)]
pub struct Shared {
    /// The highest epoch (per fence kind and namespace) a slice reported `Complete` for.
    pub completed: Mutex<HashMap<(FenceKind, Namespace), u64>>,
    /// Violations found at commit time, in order.
    pub violations: Mutex<Vec<String>>,
    /// Every log record ever committed, per entity (truncation does not remove it here).
    pub ghost: Mutex<HashMap<EntityId, BTreeMap<u64, Vec<u8>>>>,
    /// Set, per owner, while the application writes through a fence directly (see
    /// [`CallGrant`]).
    pub calls: Mutex<HashMap<usize, CallGrant>>,
}

impl Shared {
    pub fn completed(&self, kind: FenceKind, ns: &Namespace) -> u64 {
        self.completed
            .lock()
            .get(&(kind, ns.clone()))
            .copied()
            .unwrap_or(0)
    }

    pub fn complete(&self, kind: FenceKind, ns: &Namespace, epoch: u64) {
        let mut completed = self.completed.lock();
        let at = completed.entry((kind, ns.clone())).or_default();
        *at = (*at).max(epoch);
    }

    /// Runs `f` with the application's write through a fence of `owner` attributed to `grant`.
    pub fn calling<T>(&self, owner: usize, grant: CallGrant, f: impl FnOnce() -> T) -> T {
        self.calls.lock().insert(owner, grant);
        let out = f();
        self.calls.lock().remove(&owner);
        out
    }

    pub fn violation(&self, what: String) {
        self.violations.lock().push(what);
    }

    /// The records committed to `entity`, in sequence order.
    pub fn ghost_of(&self, entity: &EntityId) -> Vec<(u64, Vec<u8>)> {
        self.ghost
            .lock()
            .get(entity)
            .map(|m| m.iter().map(|(s, p)| (*s, p.clone())).collect())
            .unwrap_or_default()
    }
}

/// One owner's view of the shared store.
pub struct OwnerStore {
    pub base: Arc<dyn Store>,
    pub owner: usize,
    /// This owner's clock minus the store's, in ms.
    pub skew_ms: AtomicI64,
    /// Set when the owner died: every call fails, nothing reaches the store.
    pub dead: AtomicBool,
    /// The epoch grant this owner's engine serves each namespace under (as `own` answered).
    pub grants: Mutex<HashMap<Namespace, u64>>,
    pub shared: Arc<Shared>,
}

impl OwnerStore {
    pub fn new(base: Arc<dyn Store>, owner: usize, skew_ms: i64, shared: Arc<Shared>) -> Self {
        OwnerStore {
            base,
            owner,
            skew_ms: AtomicI64::new(skew_ms),
            dead: AtomicBool::new(false),
            grants: Mutex::new(HashMap::new()),
            shared,
        }
    }

    fn alive(&self) -> portcullis::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(portcullis::Error::Io {
                context: format!("owner {} is dead", self.owner),
                source: std::io::Error::other("the process died"),
            });
        }
        Ok(())
    }

    /// Checks a committed batch on an entity partition and records its log records.
    fn committed(&self, p: &Partition, batch: &Batch) {
        let Some(entity) = EntityId::from_partition(p) else {
            return;
        };
        // A write puts or deletes something other than a fence's lease (a push only moves a
        // lease, and is no write).
        let is_write = batch.ops().iter().any(|op| match op {
            Op::Put(k, _) | Op::Delete(k) => !k.starts_with(b"\0fence."),
            Op::DeleteRange(_) => true,
        });
        if !is_write {
            return;
        }
        let ns = entity.namespace();
        let call = self.shared.calls.lock().get(&self.owner).cloned();
        let call = call.filter(|c| &c.ns == ns);
        let (epoch, authority) = match call {
            Some(c) => (Some(c.epoch), c.authority),
            None => (self.grants.lock().get(ns).copied(), None),
        };
        let Some(epoch) = epoch else {
            self.shared.violation(format!(
                "owner {} wrote to {entity} without serving {ns}",
                self.owner
            ));
            return;
        };
        let done = self.shared.completed(FenceKind::Epoch, ns);
        if epoch < done {
            self.shared.violation(format!(
                "F7 violated: owner {} committed a write to {entity} planned under epoch {epoch} after Complete for {done}",
                self.owner
            ));
        }
        if let Some(g) = authority {
            let done = self.shared.completed(FenceKind::Authority, ns);
            if g < done {
                self.shared.violation(format!(
                    "F7 violated (authority): owner {} committed a write to {entity} planned under generation {g} after Complete for {done}",
                    self.owner
                ));
            }
        }
        let seqs: Vec<u64> = batch
            .ops()
            .iter()
            .filter_map(|op| match op {
                Op::Put(k, _) => record_seq(k),
                _ => None,
            })
            .collect();
        let Some(&first) = seqs.iter().min() else {
            return;
        };
        let page = portcullis::log::read_log(&*self.base, p, first, seqs.len())
            .expect("reading records that just committed");
        let mut ghost = self.shared.ghost.lock();
        let log = ghost.entry(entity.clone()).or_default();
        for record in page.records {
            if let Some(old) = log.get(&record.seq) {
                let what = format!(
                    "record {} of {entity} was overwritten ({:?} then {:?})",
                    record.seq,
                    String::from_utf8_lossy(old),
                    String::from_utf8_lossy(&record.payload)
                );
                self.shared.violation(what);
            } else if log.values().any(|p| *p == record.payload) {
                let what = format!(
                    "{:?} was applied twice to {entity} (again at {})",
                    String::from_utf8_lossy(&record.payload),
                    record.seq
                );
                self.shared.violation(what);
            }
            log.insert(record.seq, record.payload);
        }
    }
}

impl Store for OwnerStore {
    fn get(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.alive()?;
        self.base.get(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> portcullis::Result<Vec<Option<Vec<u8>>>> {
        self.alive()?;
        self.base.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> portcullis::Result<ScanPage> {
        self.alive()?;
        self.base.scan(p, range, cursor, limit)
    }
    fn apply(&self, p: &Partition, batch: &Batch) -> portcullis::Result<Outcome> {
        self.alive()?;
        let outcome = self.base.apply(p, batch)?;
        if outcome == Outcome::Committed {
            self.committed(p, batch);
        }
        Ok(outcome)
    }
    fn list_partitions(&self, prefix: &[u8]) -> portcullis::Result<Vec<Partition>> {
        self.alive()?;
        self.base.list_partitions(prefix)
    }
    fn contains_partition(&self, p: &Partition) -> portcullis::Result<bool> {
        self.alive()?;
        self.base.contains_partition(p)
    }
    /// The owner's clock: the store's plus this owner's skew.
    fn now_ms(&self) -> u64 {
        let now = self.base.now_ms() as i64 + self.skew_ms.load(Ordering::SeqCst);
        now.max(0) as u64
    }
    fn limits(&self) -> StoreLimits {
        self.base.limits()
    }
    fn evaluates_deadlines(&self) -> bool {
        self.base.evaluates_deadlines()
    }
    fn stats(&self) -> StoreStats {
        self.base.stats()
    }
    /// The shared store belongs to the test, never to one owner.
    fn close(&self) -> portcullis::Result<()> {
        Ok(())
    }
}

/// An owner's clock (its view's `now_ms`), for the fences the application builds itself.
#[derive(Clone)]
pub struct OwnerClock(pub Arc<OwnerStore>);

impl std::fmt::Debug for OwnerClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OwnerClock({})", self.0.owner)
    }
}

impl Clock for OwnerClock {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}

/// The folded state: every record, with its sequence number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    pub records: Vec<(u64, Vec<u8>)>,
}

/// A state machine that folds records into a list; its repair appends one record naming the
/// repaired term (so a repair applied twice shows as a duplicate record).
#[derive(Default)]
pub struct ListMachine;

impl StateMachine for ListMachine {
    type State = Log;

    fn fresh(&self, _: &EntityId) -> Log {
        Log::default()
    }

    fn apply(&self, s: &mut Log, ctx: &ApplyContext<'_>, record: &[u8]) -> Result<(), Rejection> {
        s.records.push((ctx.seq, record.to_vec()));
        Ok(())
    }

    fn encode_checkpoint(&self, s: &Log) -> Vec<u8> {
        postcard::to_allocvec(&s.records).expect("encodes")
    }

    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<Log, Rejection> {
        postcard::from_bytes(b)
            .map(|records| Log { records })
            .map_err(|e| Rejection::new(format!("bad checkpoint: {e}")))
    }

    fn repair(&self, _: &EntityId, _: &Log, unclean: u64) -> Result<Vec<Vec<u8>>, Rejection> {
        Ok(vec![format!("repair:{unclean}").into_bytes()])
    }
}

/// Counts successful restore units per entity and collects containments (SPEC R2, R4).
#[derive(Default)]
pub struct UnitCounter {
    pub restored: Mutex<HashMap<EntityId, u64>>,
    pub contained: Mutex<Vec<String>>,
}

impl UnitCounter {
    /// Forgets the counts of `ns`'s entities: a new adoption restores them afresh.
    pub fn forget(&self, ns: &Namespace) {
        self.restored.lock().retain(|e, _| e.namespace() != ns);
    }

    /// Entities whose unit succeeded more than once since their namespace was adopted.
    pub fn repeated(&self) -> Vec<(EntityId, u64)> {
        let restored = self.restored.lock();
        let mut out: Vec<_> = restored
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(e, n)| (e.clone(), *n))
            .collect();
        out.sort_by_key(|(e, _)| e.to_string());
        out
    }
}

impl Metrics for UnitCounter {
    fn entity_restored(&self, entity: &EntityId, _: &UnitReport) {
        *self.restored.lock().entry(entity.clone()).or_default() += 1;
    }

    fn entity_contained(&self, entity: &EntityId, reason: &Containment, _: Duration) {
        self.contained.lock().push(format!("{entity}: {reason:?}"));
    }
}

/// The distinct payloads of a list of records, for duplicate checks.
pub fn payload_set(records: &[(u64, Vec<u8>)]) -> HashSet<Vec<u8>> {
    records.iter().map(|(_, p)| p.clone()).collect()
}
