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
    /// "The network": batches whose answer was lost and that have not arrived yet, oldest
    /// first, each with the owner that sent it and the grant it was planned under (a delayed
    /// copy, as etcd can commit after the request timed out, SPEC S2, F12).
    pub network: Mutex<Vec<Held>>,
    /// Set when an answer was lost during the current step.
    pub lost: AtomicBool,
}

/// A batch held in the network.
pub struct Held {
    pub owner: usize,
    pub partition: Partition,
    pub batch: Batch,
    pub grant: Option<(u64, Option<u64>)>,
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
    /// The grant of a namespace the engine adopted on first use (no step recorded it).
    grant_of: Mutex<Option<GrantOf>>,
    /// Armed by [`OwnerStore::lose_next`]: the next batch that appends log records loses its
    /// answer (`OutcomeUnknown`), after committing (`Some(true)`) or held in the network
    /// (`Some(false)`).
    lose: Mutex<Option<bool>>,
    pub shared: Arc<Shared>,
}

/// Asks the owner's engine which grant it serves a namespace under.
pub type GrantOf = Box<dyn Fn(&Namespace) -> Option<u64> + Send + Sync>;

impl OwnerStore {
    pub fn new(base: Arc<dyn Store>, owner: usize, skew_ms: i64, shared: Arc<Shared>) -> Self {
        OwnerStore {
            base,
            owner,
            skew_ms: AtomicI64::new(skew_ms),
            dead: AtomicBool::new(false),
            grants: Mutex::new(HashMap::new()),
            grant_of: Mutex::new(None),
            lose: Mutex::new(None),
            shared,
        }
    }

    /// Where a commit finds the grant of a namespace adopted on first use.
    pub fn set_grant_of(&self, grant_of: GrantOf) {
        *self.grant_of.lock() = Some(grant_of);
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

    /// Arms the loss of the next answer to a batch that appends log records: it commits and
    /// then answers `OutcomeUnknown` (`commit`), or it is held in the network (see
    /// [`Shared::network`]) and answers `OutcomeUnknown`, to arrive at a later
    /// [`Shared::deliver`].
    pub fn lose_next(&self, commit: bool) {
        *self.lose.lock() = Some(commit);
    }

    /// Disarms [`OwnerStore::lose_next`].
    pub fn keep_answers(&self) {
        *self.lose.lock() = None;
    }

    /// The grant a write to `p` is planned under, as far as the test knows: the application's
    /// own call, else the grant the engine serves the namespace under.
    fn grant_for(&self, p: &Partition) -> Option<(u64, Option<u64>)> {
        let entity = EntityId::from_partition(p)?;
        let ns = entity.namespace();
        let call = self.shared.calls.lock().get(&self.owner).cloned();
        let call = call.filter(|c| &c.ns == ns);
        match call {
            Some(c) => Some((c.epoch, c.authority)),
            None => {
                let recorded = self.grants.lock().get(ns).copied();
                let adopted = || self.grant_of.lock().as_ref().and_then(|f| f(ns));
                recorded.or_else(adopted).map(|g| (g, None))
            }
        }
    }

    /// Checks a committed batch on an entity partition and records its log records.
    fn committed(&self, p: &Partition, batch: &Batch) {
        let grant = self.grant_for(p);
        self.shared
            .committed(&*self.base, self.owner, p, batch, grant, "");
    }
}

impl Shared {
    /// Delivers the oldest batch of `owner` still in the network; answers whether there was
    /// one and what the store answered.
    pub fn deliver(&self, base: &dyn Store, owner: usize) -> Option<portcullis::Result<Outcome>> {
        let held = {
            let mut network = self.network.lock();
            let i = network.iter().position(|h| h.owner == owner)?;
            network.remove(i)
        };
        let outcome = base.apply(&held.partition, &held.batch);
        if let Ok(Outcome::Committed) = outcome {
            let late = " (a delayed copy of a write whose answer was lost)";
            self.committed(base, owner, &held.partition, &held.batch, held.grant, late);
        }
        Some(outcome)
    }

    /// Checks a batch of `owner` that committed on an entity partition, planned under `grant`
    /// (epoch, authority), and records its log records.
    fn committed(
        &self,
        base: &dyn Store,
        owner: usize,
        p: &Partition,
        batch: &Batch,
        grant: Option<(u64, Option<u64>)>,
        late: &str,
    ) {
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
        let (epoch, authority) = match grant {
            Some((e, a)) => (Some(e), a),
            None => (None, None),
        };
        let Some(epoch) = epoch else {
            self.violation(format!(
                "owner {} wrote to {entity} without serving {ns}{late}",
                owner
            ));
            return;
        };
        let done = self.completed(FenceKind::Epoch, ns);
        if epoch < done {
            self.violation(format!(
                "F7 violated: owner {} committed a write to {entity} planned under epoch {epoch} after Complete for {done}{late}",
                owner
            ));
        }
        if let Some(g) = authority {
            let done = self.completed(FenceKind::Authority, ns);
            if g < done {
                self.violation(format!(
                    "F7 violated (authority): owner {} committed a write to {entity} planned under generation {g} after Complete for {done}",
                    owner
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
        let page = portcullis::log::read_log(base, p, first, seqs.len())
            .expect("reading records that just committed");
        let mut ghost = self.ghost.lock();
        let log = ghost.entry(entity.clone()).or_default();
        for record in page.records {
            if let Some(old) = log.get(&record.seq) {
                let what = format!(
                    "record {} of {entity} was overwritten ({:?} then {:?})",
                    record.seq,
                    String::from_utf8_lossy(old),
                    String::from_utf8_lossy(&record.payload)
                );
                self.violation(what);
            } else if log.values().any(|p| *p == record.payload) {
                let what = format!(
                    "{:?} was applied twice to {entity} (again at {})",
                    String::from_utf8_lossy(&record.payload),
                    record.seq
                );
                self.violation(what);
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
        let appends = || {
            batch.ops().iter().any(|op| match op {
                Op::Put(k, _) => record_seq(k).is_some(),
                _ => false,
            })
        };
        if self.lose.lock().is_some() && EntityId::from_partition(p).is_some() && appends() {
            let commit = self.lose.lock().take().expect("armed");
            self.shared.lost.store(true, Ordering::SeqCst);
            let detail = if commit {
                let outcome = self.base.apply(p, batch)?;
                if outcome == Outcome::Committed {
                    self.committed(p, batch);
                }
                "the answer was lost after the batch reached the store"
            } else {
                self.shared.network.lock().push(Held {
                    owner: self.owner,
                    partition: p.clone(),
                    batch: batch.clone(),
                    grant: self.grant_for(p),
                });
                "the request timed out; a copy may still arrive"
            };
            return Err(portcullis::Error::OutcomeUnknown {
                partition: format!("{p:?}"),
                detail: detail.into(),
            });
        }
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

    fn encode_checkpoint(&self, s: &Log) -> Result<Vec<u8>, Rejection> {
        postcard::to_allocvec(&s.records).map_err(|e| Rejection::new(e.to_string()))
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

/// Counts successful restore units per entity and namespace holding (its term) and collects
/// containments (SPEC R2, R4).
#[derive(Default)]
pub struct UnitCounter {
    pub restored: Mutex<HashMap<(EntityId, u64), u64>>,
    pub contained: Mutex<Vec<String>>,
}

impl UnitCounter {
    /// Forgets the counts of `ns`'s entities: a new adoption restores them afresh.
    pub fn forget(&self, ns: &Namespace) {
        self.restored.lock().retain(|(e, _), _| e.namespace() != ns);
    }

    /// Entities whose unit succeeded more than once under one holding of their namespace.
    pub fn repeated(&self) -> Vec<(EntityId, u64)> {
        let restored = self.restored.lock();
        let mut out: Vec<_> = restored
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|((e, _), n)| (e.clone(), *n))
            .collect();
        out.sort_by_key(|(e, _)| e.to_string());
        out
    }
}

impl Metrics for UnitCounter {
    fn entity_restored(&self, entity: &EntityId, report: &UnitReport) {
        *self
            .restored
            .lock()
            .entry((entity.clone(), report.term))
            .or_default() += 1;
    }

    fn entity_contained(&self, entity: &EntityId, reason: &Containment, _: Duration) {
        self.contained.lock().push(format!("{entity}: {reason:?}"));
    }
}

/// The distinct payloads of a list of records, for duplicate checks.
pub fn payload_set(records: &[(u64, Vec<u8>)]) -> HashSet<Vec<u8>> {
    records.iter().map(|(_, p)| p.clone()).collect()
}
