//! A state machine and store wrappers for the engine tests.

use std::sync::Arc;

use portcullis::store::{MemoryStore, Store};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use portcullis::engine::{Engine, EngineBuilder};
use portcullis::restore::{ApplyContext, Origin, Rejection, StateMachine};
use portcullis::store::{
    Batch, Cursor, KeyRange, Outcome, Partition, ScanPage, StoreLimits, StoreStats,
};
use portcullis::{EntityId, Namespace};

/// The folded state: the records seen, in order, with their sequence numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    pub records: Vec<(u64, Vec<u8>)>,
}

type Hook = Arc<dyn Fn(&EntityId) + Send + Sync>;

/// A test state machine. Records are opaque bytes, except:
/// `!refuse` is refused by `apply`, `!panic` panics in `apply`, `!bad` fails `validate`.
/// Every restore unit calls `fresh` or `decode_checkpoint` exactly once, which is counted per
/// entity; an optional hook runs there (to block a unit, or call back into the engine).
#[derive(Default)]
pub struct TestMachine {
    pub units: Mutex<HashMap<EntityId, u64>>,
    pub repairs: Mutex<Vec<(EntityId, u64)>>,
    pub repair_records: Mutex<Vec<Vec<u8>>>,
    pub on_unit_start: Mutex<Option<Hook>>,
    /// Runs inside `repair` (to call back into the engine from the repair step).
    pub on_repair: Mutex<Option<Hook>>,
    pub panic_in_repair: AtomicBool,
    pub panic_in_encode: AtomicBool,
    /// `encode_checkpoint` refuses every state (SPEC L3: nothing is published).
    pub refuse_in_encode: AtomicBool,
    /// Every record `apply` folded: entity, seq, origin (SPEC R3).
    pub applied: Mutex<Vec<(EntityId, u64, Origin)>>,
}

impl TestMachine {
    pub fn units_of(&self, e: &EntityId) -> u64 {
        self.units.lock().get(e).copied().unwrap_or(0)
    }

    pub fn set_hook(&self, hook: impl Fn(&EntityId) + Send + Sync + 'static) {
        *self.on_unit_start.lock() = Some(Arc::new(hook));
    }

    fn unit_started(&self, e: &EntityId) {
        *self.units.lock().entry(e.clone()).or_default() += 1;
        // Cloned out first: the hook may restore other entities, which calls back in here.
        let hook = self.on_unit_start.lock().clone();
        if let Some(hook) = hook {
            hook(e);
        }
    }
}

impl StateMachine for TestMachine {
    type State = Folded;

    fn fresh(&self, e: &EntityId) -> Folded {
        self.unit_started(e);
        Folded::default()
    }

    fn apply(
        &self,
        s: &mut Folded,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        match record {
            b"!refuse" => Err(Rejection::new("this record is refused")),
            b"!panic" => panic!("apply met a poisonous record"),
            _ => {
                self.applied
                    .lock()
                    .push((ctx.entity.clone(), ctx.seq, ctx.origin));
                s.records.push((ctx.seq, record.to_vec()));
                Ok(())
            }
        }
    }

    fn encode_checkpoint(&self, s: &Folded) -> Result<Vec<u8>, Rejection> {
        if self.panic_in_encode.load(Ordering::SeqCst) {
            panic!("encode crashed");
        }
        if self.refuse_in_encode.load(Ordering::SeqCst) {
            return Err(Rejection::new("this state does not encode"));
        }
        let mut out = Vec::new();
        for (seq, r) in &s.records {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&(r.len() as u32).to_le_bytes());
            out.extend_from_slice(r);
        }
        Ok(out)
    }

    fn decode_checkpoint(&self, e: &EntityId, mut b: &[u8]) -> Result<Folded, Rejection> {
        self.unit_started(e);
        let mut s = Folded::default();
        while !b.is_empty() {
            if b.len() < 12 {
                return Err(Rejection::new("truncated checkpoint"));
            }
            let seq = u64::from_le_bytes(b[..8].try_into().unwrap());
            let len = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
            if b.len() < 12 + len {
                return Err(Rejection::new("truncated checkpoint record"));
            }
            s.records.push((seq, b[12..12 + len].to_vec()));
            b = &b[12 + len..];
        }
        Ok(s)
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        if record == b"!bad" {
            return Err(Rejection::new("not a valid record"));
        }
        Ok(())
    }

    fn repair(&self, e: &EntityId, _: &Folded, unclean: u64) -> Result<Vec<Vec<u8>>, Rejection> {
        self.repairs.lock().push((e.clone(), unclean));
        let hook = self.on_repair.lock().clone();
        if let Some(hook) = hook {
            hook(e);
        }
        if self.panic_in_repair.load(Ordering::SeqCst) {
            panic!("repair crashed");
        }
        Ok(self.repair_records.lock().clone())
    }
}

type StoreHook = Arc<dyn Fn(&Partition, &Batch) + Send + Sync>;
type ScanHook = Arc<dyn Fn(&Partition, &KeyRange) + Send + Sync>;

/// A store wrapper that survives `close` (so a test can reopen an engine over the same data),
/// and can fail reads or writes of one partition on demand (an I/O error). Optional hooks run
/// before a batch is applied, after it committed, and before a scan (to pause a step with a
/// channel, or to change rows under a reader); each is taken out of its lock before it runs.
pub struct TestStore {
    pub inner: MemoryStore,
    pub fail_reads_of: Mutex<Option<Partition>>,
    pub fail_writes_of: Mutex<Option<Partition>>,
    /// Batches on this partition commit, then answer an error as if the answer was lost on the
    /// way back (`OutcomeUnknown`, as a timed-out etcd request does).
    pub lose_answers_of: Mutex<Option<Partition>>,
    /// Batches on this partition that write log records are held, as a request delayed in the
    /// network: the call answers `OutcomeUnknown` at once and the batch is applied only when
    /// [`TestStore::release_held`] lets it arrive (a delayed copy, SPEC F12).
    pub hold_record_writes_of: Mutex<Option<Partition>>,
    pub held: Mutex<Vec<(Partition, Batch)>>,
    pub entity_reads: AtomicU64,
    /// Every call of any kind (reads, batches, listings).
    pub calls: AtomicU64,
    /// When set, listing partitions fails (an I/O error).
    pub fail_lists: AtomicBool,
    /// When set, every batch on an entity partition is recorded here.
    pub entity_batches: Mutex<Option<Vec<(Partition, Batch)>>>,
    pub before_apply: Mutex<Option<StoreHook>>,
    pub after_apply: Mutex<Option<StoreHook>>,
    pub before_scan: Mutex<Option<ScanHook>>,
    /// Runs before every single-row read (`get`), with the partition and key.
    pub before_get: Mutex<Option<GetHook>>,
}

type GetHook = Arc<dyn Fn(&Partition, &[u8]) + Send + Sync>;

impl TestStore {
    pub fn new() -> Arc<Self> {
        Self::over(MemoryStore::new())
    }

    /// A test store on `clock` (one clock for store, fence and engine, SPEC E4).
    pub fn with_clock(clock: portcullis::SharedClock) -> Arc<Self> {
        Self::over(MemoryStore::with_clock(clock))
    }

    /// A test store over `inner` (its limits and deadline support are the wrapper's too).
    pub fn over(inner: MemoryStore) -> Arc<Self> {
        Arc::new(TestStore {
            inner,
            fail_reads_of: Mutex::new(None),
            fail_writes_of: Mutex::new(None),
            lose_answers_of: Mutex::new(None),
            hold_record_writes_of: Mutex::new(None),
            held: Mutex::new(Vec::new()),
            entity_reads: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            fail_lists: AtomicBool::new(false),
            entity_batches: Mutex::new(None),
            before_apply: Mutex::new(None),
            after_apply: Mutex::new(None),
            before_scan: Mutex::new(None),
            before_get: Mutex::new(None),
        })
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Lets every held batch arrive now, in order; answers what each got.
    pub fn release_held(&self) -> Vec<Outcome> {
        let held = std::mem::take(&mut *self.held.lock());
        held.iter()
            .map(|(p, batch)| self.inner.apply(p, batch).unwrap())
            .collect()
    }

    /// Starts recording batches on entity partitions.
    pub fn record_entity_batches(&self) {
        *self.entity_batches.lock() = Some(Vec::new());
    }

    /// The recorded batches (recording continues).
    pub fn take_entity_batches(&self) -> Vec<(Partition, Batch)> {
        self.entity_batches
            .lock()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn set_before_apply(&self, hook: impl Fn(&Partition, &Batch) + Send + Sync + 'static) {
        *self.before_apply.lock() = Some(Arc::new(hook));
    }

    pub fn set_after_apply(&self, hook: impl Fn(&Partition, &Batch) + Send + Sync + 'static) {
        *self.after_apply.lock() = Some(Arc::new(hook));
    }

    pub fn set_before_get(&self, hook: impl Fn(&Partition, &[u8]) + Send + Sync + 'static) {
        *self.before_get.lock() = Some(Arc::new(hook));
    }

    pub fn set_before_scan(&self, hook: impl Fn(&Partition, &KeyRange) + Send + Sync + 'static) {
        *self.before_scan.lock() = Some(Arc::new(hook));
    }

    pub fn clear_hooks(&self) {
        *self.before_get.lock() = None;
        *self.before_apply.lock() = None;
        *self.after_apply.lock() = None;
        *self.before_scan.lock() = None;
    }

    fn read(&self, p: &Partition) -> portcullis::Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if p.as_bytes().starts_with(b"e/") {
            self.entity_reads.fetch_add(1, Ordering::SeqCst);
        }
        if self.fail_reads_of.lock().as_ref() == Some(p) {
            return Err(portcullis::Error::Io {
                context: format!("reading {p}"),
                source: std::io::Error::other("injected read failure"),
            });
        }
        Ok(())
    }
}

impl Store for TestStore {
    fn get(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.read(p)?;
        let hook = self.before_get.lock().clone();
        if let Some(hook) = hook {
            hook(p, key);
        }
        self.inner.get(p, key)
    }
    fn get_for_update(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.read(p)?;
        self.inner.get_for_update(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> portcullis::Result<Vec<Option<Vec<u8>>>> {
        self.read(p)?;
        self.inner.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> portcullis::Result<ScanPage> {
        self.read(p)?;
        let hook = self.before_scan.lock().clone();
        if let Some(hook) = hook {
            hook(p, range);
        }
        self.inner.scan(p, range, cursor, limit)
    }
    fn apply(&self, p: &Partition, batch: &Batch) -> portcullis::Result<Outcome> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if p.as_bytes().starts_with(b"e/")
            && let Some(recorded) = self.entity_batches.lock().as_mut()
        {
            recorded.push((p.clone(), batch.clone()));
        }
        if self.fail_writes_of.lock().as_ref() == Some(p) {
            return Err(portcullis::Error::Io {
                context: format!("writing {p}"),
                source: std::io::Error::other("injected write failure"),
            });
        }
        if self.hold_record_writes_of.lock().as_ref() == Some(p) && writes_records(batch) {
            self.held.lock().push((p.clone(), batch.clone()));
            return Err(portcullis::Error::OutcomeUnknown {
                partition: p.to_string(),
                detail: "injected: the request is held in the network".into(),
            });
        }
        let hook = self.before_apply.lock().clone();
        if let Some(hook) = hook {
            hook(p, batch);
        }
        let outcome = self.inner.apply(p, batch)?;
        if self.lose_answers_of.lock().as_ref() == Some(p) {
            return Err(portcullis::Error::OutcomeUnknown {
                partition: p.to_string(),
                detail: "injected: the answer was lost after the batch committed".into(),
            });
        }
        let hook = self.after_apply.lock().clone();
        if let Some(hook) = hook
            && outcome == Outcome::Committed
        {
            hook(p, batch);
        }
        Ok(outcome)
    }
    fn list_partitions(&self, prefix: &[u8]) -> portcullis::Result<Vec<Partition>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_lists.load(Ordering::SeqCst) {
            return Err(portcullis::Error::Io {
                context: "listing partitions".into(),
                source: std::io::Error::other("injected listing failure"),
            });
        }
        self.inner.list_partitions(prefix)
    }
    fn contains_partition(&self, p: &Partition) -> portcullis::Result<bool> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.contains_partition(p)
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    // The wrapped store's answers, not the trait's defaults (SPEC S11).
    fn limits(&self) -> StoreLimits {
        self.inner.limits()
    }
    fn evaluates_deadlines(&self) -> bool {
        self.inner.evaluates_deadlines()
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
    fn close(&self) -> portcullis::Result<()> {
        Ok(())
    }
}

pub type TestEngine = Engine<Arc<TestMachine>>;

/// A builder over `store` with a small pool, ready for `.open()`. The background warm is off:
/// these tests count restore units and read entities' phases, so every restore must come from
/// the test's own calls (tests of the background warm turn it on).
pub fn builder(
    machine: &Arc<TestMachine>,
    store: &Arc<TestStore>,
) -> EngineBuilder<Arc<TestMachine>> {
    Engine::builder(Arc::clone(machine))
        .store(Arc::clone(store) as Arc<dyn Store>)
        .pool_threads(2)
        .warm_parallelism(2)
        .background_warm(false)
}

pub fn entity(i: usize) -> EntityId {
    EntityId::new("test", format!("e{i}")).unwrap()
}

/// The namespace every [`entity`] is in.
pub fn ns() -> Namespace {
    entity(1).namespace().clone()
}

/// A test store holding entities `0..n`, each registered and holding `records`, written by an
/// engine that then closed cleanly, so they reopen pending and owe no repair.
pub fn closed_with(n: usize, records: &[&str]) -> Arc<TestStore> {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    for i in 0..n {
        engine.register(&entity(i)).unwrap();
        engine.append(&entity(i), recs(records)).unwrap();
    }
    engine.close().unwrap();
    store
}

/// The records an entity folded, without sequence numbers.
pub fn payloads(engine: &TestEngine, e: &EntityId) -> portcullis::Result<Vec<Vec<u8>>> {
    engine.read(e, |s| s.records.iter().map(|(_, r)| r.clone()).collect())
}

/// Runs revocation slices until `Complete` (bounded).
pub fn revoke_to_complete(engine: &TestEngine, ns: &portcullis::Namespace) {
    use portcullis::fence::{RevokeBudget, RevokeProgress};
    for _ in 0..100 {
        if engine.revoke_step(ns, RevokeBudget::default()).unwrap() == RevokeProgress::Complete {
            return;
        }
    }
    panic!("revocation of {ns} did not complete in 100 slices");
}

/// An engine with its own owner id over `store`, adopting namespaces only when told.
pub fn owner_builder(
    machine: &Arc<TestMachine>,
    store: &Arc<TestStore>,
    owner: &str,
) -> EngineBuilder<Arc<TestMachine>> {
    builder(machine, store)
        .owner(owner)
        .adopt_on_first_use(false)
}

/// Records from their text.
pub fn recs(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}

/// Slots in the engine's registry now.
pub fn slots(engine: &TestEngine) -> u64 {
    engine.stats().passivation.slots
}

/// A fresh store, machine and engine (the default [`builder`]), with entity `i` registered and
/// holding `records`.
pub fn one_entity(
    i: usize,
    records: &[&str],
) -> (Arc<TestStore>, Arc<TestMachine>, TestEngine, EntityId) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store).open().unwrap();
    let e = entity(i);
    engine.register(&e).unwrap();
    engine.append(&e, recs(records)).unwrap();
    (store, machine, engine, e)
}

/// An engine over `store` in which entity 1 is contained: its written record `ok` was applied,
/// then `apply` refused `!refuse`.
pub fn contained(machine: &Arc<TestMachine>, store: &Arc<TestStore>) -> (TestEngine, EntityId) {
    let engine = builder(machine, store).open().unwrap();
    let e = entity(1);
    engine.register(&e).unwrap();
    engine.append(&e, recs(&["ok"])).unwrap();
    let err = engine.append(&e, recs(&["!refuse"])).unwrap_err();
    assert!(matches!(err, portcullis::Error::Contained { .. }), "{err}");
    (engine, e)
}

/// `entities` registered and holding `records` each, written by an engine that then crashes
/// (so the next holder of their namespace owes a repair).
pub fn crashed_with(
    machine: &Arc<TestMachine>,
    store: &Arc<TestStore>,
    entities: &[EntityId],
    records: &[&str],
) {
    crash({
        let engine = builder(machine, store).open().unwrap();
        for e in entities {
            engine.register(e).unwrap();
            engine.append(e, recs(records)).unwrap();
        }
        engine
    });
}

/// Two owners over one store (a test store, ids "a" and "b"): `a` adopted the namespace of
/// entities 1 and 2, registered both and wrote `a1` to entity 1; then `b` bumped the epoch to 1,
/// revoked to `Complete` and adopted it.
pub fn taken_over() -> (Arc<TestStore>, Arc<TestMachine>, TestEngine, TestEngine) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    let ns = entity(1).namespace().clone();
    assert_eq!(a.own(&ns).unwrap(), 0);
    a.register(&entity(1)).unwrap();
    a.register(&entity(2)).unwrap();
    a.append(&entity(1), recs(&["a1"])).unwrap();
    // b may not adopt while a holds the namespace at the current epoch.
    assert!(matches!(
        b.own(&ns).unwrap_err(),
        portcullis::Error::NotServed { .. }
    ));
    b.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&b, &ns);
    assert_eq!(b.own(&ns).unwrap(), 1);
    (store, machine, a, b)
}

/// Ends an engine the way a crash would: no clean shutdown is recorded (dropping it would
/// close it cleanly, SPEC R11), and its owner lease lapses as if its time had passed since the
/// crash (SPEC F12), so the next engine with its owner id opens at once. The store wrapper
/// keeps the data for the next open. (tests/engine_liveness.rs lets leases expire on a manual
/// clock instead.)
pub fn crash(engine: TestEngine) {
    engine.crash_for_test();
    std::mem::forget(engine);
}

/// Runs `f` on its own thread and returns its result, failing the test if it has not finished
/// within ten seconds. This bounds a hang (a deadlock the test is checking for); it is never
/// used to wait for time to pass.
pub fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = crossbeam::channel::bounded(1);
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(10)) {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within 10 s: it is deadlocked"),
    }
}

/// The negative control of a lock rule: `f` must still be blocked after five seconds (it is
/// left running, deadlocked, on its own thread). Panics if it finished (or failed) in time:
/// then the test cannot see a lock held.
pub fn stays_deadlocked(f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = crossbeam::channel::bounded(1);
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    assert!(
        matches!(
            rx.recv_timeout(std::time::Duration::from_secs(5)),
            Err(crossbeam::channel::RecvTimeoutError::Timeout)
        ),
        "the workload finished (or failed) even with the rule turned off: the test cannot see a lock held"
    );
}

/// Spins (yielding) until `done` holds, for at most ten seconds. Used only to wait for a state
/// the engine reports (threads parked on a gate, a count reached), never for time to pass.
pub fn until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not reached in 10 s"
        );
        std::thread::yield_now();
    }
}

/// Whether a batch writes a log record (`\0log.rec...`).
pub fn writes_records(batch: &Batch) -> bool {
    batch.ops().iter().any(|op| match op {
        portcullis::store::Op::Put(k, _) => k.starts_with(b"\0log.rec"),
        _ => false,
    })
}

/// Appends `record` to `e` so that the write's answer is lost and, from its commit on, the
/// entity's partition cannot be read either (a store unreachable for a while); the append ends
/// `OutcomeUnknown` and the faults are then cleared, leaving the write unsettled.
pub fn leave_an_unsettled_write(
    engine: &TestEngine,
    store: &Arc<TestStore>,
    e: &EntityId,
    record: &[u8],
) {
    *store.lose_answers_of.lock() = Some(e.partition());
    let weak = Arc::downgrade(store);
    store.set_before_apply(move |p, batch| {
        if writes_records(batch)
            && let Some(store) = weak.upgrade()
        {
            *store.fail_reads_of.lock() = Some(p.clone());
        }
    });
    let err = engine.append(e, vec![record.to_vec()]).unwrap_err();
    assert!(
        matches!(err, portcullis::Error::OutcomeUnknown { .. }),
        "{err}"
    );
    store.clear_hooks();
    *store.lose_answers_of.lock() = None;
    *store.fail_reads_of.lock() = None;
}

/// Whether a batch writes a deferred row (`\0defer.`).
pub fn writes_deferral(batch: &Batch) -> bool {
    batch.ops().iter().any(|op| match op {
        portcullis::store::Op::Put(k, _) => k.starts_with(b"\0defer."),
        _ => false,
    })
}
