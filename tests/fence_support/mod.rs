//! Shared helpers for the fencing tests: a backend factory (add a backend with one line),
//! manual clocks with a separately skewable store clock, pause hooks driven by channels (no
//! sleeps), and checks of what the rows say.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use parking_lot::Mutex;
use portcullis::fence::{
    Fence, FenceConfig, FenceHooks, HookPoint, LeaseRow, ShardRow, decode_row,
};
use portcullis::store::{
    Batch, Cursor, FileStore, KeyRange, MemoryStore, Outcome, Partition, ScanPage, Store,
    StoreLimits, StoreStats, SyncPolicy,
};
use portcullis::{Clock, EntityId, ManualClock, Namespace, SharedClock};

/// Builds a fresh, empty store whose `NotAfter` reads `store_clock`. The guard keeps any
/// temporary directory alive.
pub type BackendFactory = fn(SharedClock) -> (Arc<dyn Store>, Box<dyn std::any::Any>);

/// Every backend the fencing tests run on. A file-backed store is added here with one line.
/// With `PORTCULLIS_FENCE_BACKEND=etcd` (and the feature `etcd`), only a real etcd instead.
pub fn backends() -> Vec<(&'static str, BackendFactory)> {
    if on_etcd() {
        return vec![("etcd", etcd_backend)];
    }
    vec![
        ("memory", |clock| {
            (Arc::new(MemoryStore::with_clock(clock)), Box::new(()))
        }),
        // No server-side deadlines, like etcd (SPEC S11): fenced writes carry no `NotAfter`.
        ("memory-no-deadlines", |clock| {
            (
                Arc::new(MemoryStore::with_clock(clock).without_deadlines()),
                Box::new(()),
            )
        }),
        // Fencing does not test durability, so the file store skips syncs here.
        ("file", |clock| {
            let dir = tempfile::tempdir().unwrap();
            let store = FileStore::builder(dir.path())
                .clock(clock)
                .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
                .open()
                .unwrap();
            (Arc::new(store), Box::new(dir))
        }),
    ]
}

/// Whether the fencing tests run against a real etcd instead of the in-process backends:
/// `PORTCULLIS_FENCE_BACKEND=etcd` with the feature `etcd` (`.ci/run`'s etcd section). Long
/// lanes use fewer cases there.
pub fn on_etcd() -> bool {
    let etcd = std::env::var("PORTCULLIS_FENCE_BACKEND").is_ok_and(|v| v == "etcd");
    assert!(
        !etcd || cfg!(feature = "etcd"),
        "PORTCULLIS_FENCE_BACKEND=etcd needs --features etcd"
    );
    etcd
}

#[cfg(feature = "etcd")]
#[path = "../common/etcd.rs"]
pub mod etcd_server;

/// A fresh, empty `EtcdStore` (its own root prefix) on a throwaway etcd shared by the tests that
/// run at the same time; the last store of a test to go stops it.
#[cfg(feature = "etcd")]
fn etcd_backend(clock: SharedClock) -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
    use std::sync::Weak;
    use std::sync::atomic::AtomicU64;
    static SERVER: Mutex<Weak<etcd_server::EtcdServer>> = Mutex::new(Weak::new());
    static CASE: AtomicU64 = AtomicU64::new(0);
    let server = {
        let mut slot = SERVER.lock();
        slot.upgrade().unwrap_or_else(|| {
            let server = Arc::new(etcd_server::EtcdServer::start());
            *slot = Arc::downgrade(&server);
            server
        })
    };
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let store = portcullis::store::EtcdStore::builder(server.endpoint())
        .prefix(format!("fence/{case:08}/"))
        .clock(clock)
        .open()
        .expect("open the etcd store");
    (Arc::new(store), Box::new(server))
}

#[cfg(not(feature = "etcd"))]
fn etcd_backend(_clock: SharedClock) -> (Arc<dyn Store>, Box<dyn std::any::Any>) {
    unreachable!("on_etcd() refuses a build without the feature etcd")
}

/// A clock that reads a base clock plus a settable offset: the store's clock, which tests
/// skew against the planner's.
#[derive(Debug, Clone)]
pub struct SkewedClock {
    pub base: ManualClock,
    pub offset_ms: Arc<AtomicI64>,
}

impl Clock for SkewedClock {
    fn now_ms(&self) -> u64 {
        let now = self.base.now_ms() as i64 + self.offset_ms.load(Ordering::SeqCst);
        now.max(0) as u64
    }
}

/// One fence on one backend, with its clocks.
pub struct Env {
    pub name: &'static str,
    pub fence: Fence,
    pub store: Arc<dyn Store>,
    /// The planner's clock; advancing it advances the store's clock too.
    pub clock: ManualClock,
    /// The store's clock: the planner's plus `skew`.
    pub store_clock: SkewedClock,
    pub hooks: Arc<Pauses>,
    pub config: FenceConfig,
    _guard: Box<dyn std::any::Any>,
}

pub const START_MS: u64 = 1_000_000;

impl Env {
    pub fn new(name: &'static str, factory: BackendFactory, config: FenceConfig) -> Env {
        let clock = ManualClock::new(START_MS);
        let store_clock = SkewedClock {
            base: clock.clone(),
            offset_ms: Arc::new(AtomicI64::new(0)),
        };
        let (store, guard) = factory(Arc::new(store_clock.clone()));
        let fence = Fence::new(store.clone(), Arc::new(clock.clone()), config);
        let hooks = Arc::new(Pauses::default());
        fence.set_hooks(hooks.clone());
        Env {
            name,
            fence,
            store,
            clock,
            store_clock,
            hooks,
            config,
            _guard: guard,
        }
    }

    /// Whether the store checks `NotAfter` deadlines (fenced writes carry them).
    pub fn deadlines(&self) -> bool {
        self.store.evaluates_deadlines()
    }

    /// The expiry a push gives a lease for a row expiring at `row_expiry`: the row's with
    /// server-side deadlines, 0 (never usable) without.
    pub fn pushed_expiry(&self, row_expiry: u64) -> u64 {
        if self.deadlines() { row_expiry } else { 0 }
    }

    /// Sets the store clock to the planner's plus `skew_ms` (negative: behind).
    pub fn skew_store_clock(&self, skew_ms: i64) {
        self.store_clock.offset_ms.store(skew_ms, Ordering::SeqCst);
    }

    pub fn ns(&self) -> Namespace {
        Namespace::new("ns").unwrap()
    }

    pub fn entity(&self, id: &str) -> EntityId {
        EntityId::in_namespace(self.ns(), id).unwrap()
    }

    pub fn lease(&self, e: &EntityId) -> Option<LeaseRow> {
        let raw = self
            .store
            .get(&e.partition(), self.fence.keys().lease())
            .unwrap();
        raw.map(|r| decode_row("lease", &r).unwrap())
    }

    pub fn shard_row(&self, e: &EntityId) -> Option<ShardRow> {
        let raw = self
            .store
            .get(
                &e.namespace().coordinator_partition(),
                &self.fence.keys().shard(e),
            )
            .unwrap();
        raw.map(|r| decode_row("shard", &r).unwrap())
    }

    /// Whether `e`'s lease could still carry a write planned under an epoch below `epoch`:
    /// present at an older epoch and not past its deadline on the store's clock.
    pub fn lease_usable_below(&self, e: &EntityId, epoch: u64) -> bool {
        match self.lease(e) {
            Some(l) => {
                l.epoch < epoch
                    && i128::from(self.store_clock.now_ms())
                        <= i128::from(l.expires_at_ms) - i128::from(self.config.lease_margin_ms())
            }
            None => false,
        }
    }
}

/// Runs `test` once per backend that evaluates `NotAfter` on its own clock: for the rules
/// that are about deadlines (a deadline-less store has its own, `tests/fence_deadline_less.rs`).
pub fn each_backend_with_deadlines(test: impl Fn(&Env)) {
    each_backend(|env| {
        if env.deadlines() {
            test(env)
        }
    })
}

/// Runs `test` once per backend without server-side deadlines (SPEC S11).
pub fn each_deadline_less_backend(test: impl Fn(&Env)) {
    each_backend(|env| {
        if !env.deadlines() {
            test(env)
        }
    })
}

/// Runs `test` once per backend with the default configuration.
pub fn each_backend(test: impl Fn(&Env)) {
    each_backend_with(FenceConfig::default(), test)
}

/// Runs `test` once per backend.
pub fn each_backend_with(config: FenceConfig, test: impl Fn(&Env)) {
    for (name, factory) in backends() {
        let env = Env::new(name, factory, config);
        test(&env);
    }
}

/// A one-shot pause at a hook point: the paused thread reports `reached`, then blocks until
/// released.
pub struct Gate {
    reached: Receiver<()>,
    release: Sender<()>,
}

impl Gate {
    /// Blocks until a thread is paused at the point (bounded, so a broken test fails instead
    /// of hanging).
    pub fn wait_reached(&self) {
        self.reached
            .recv_timeout(Duration::from_secs(30))
            .expect("the paused step was never reached");
    }

    /// Whether a thread is already paused here.
    pub fn try_reached(&self) -> bool {
        self.reached.try_recv().is_ok()
    }

    /// Lets the paused thread go on.
    pub fn release(&self) {
        self.release.send(()).unwrap();
    }
}

/// The reported-reached sender and the release receiver of one armed pause.
type ArmedPause = (Sender<()>, Receiver<()>);

/// Fault hooks: arm a point (for any entity, or for one), and the next thread to reach it
/// pauses there.
#[derive(Debug, Default)]
pub struct Pauses {
    armed: Mutex<HashMap<(HookPoint, Option<EntityId>), ArmedPause>>,
    seen: Mutex<Vec<HookPoint>>,
}

impl Pauses {
    pub fn arm(&self, point: HookPoint) -> Gate {
        self.arm_key(point, None)
    }

    /// Pauses the next thread that reaches `point` for `entity` (not for another entity).
    pub fn arm_for(&self, point: HookPoint, entity: &EntityId) -> Gate {
        self.arm_key(point, Some(entity.clone()))
    }

    fn arm_key(&self, point: HookPoint, entity: Option<EntityId>) -> Gate {
        let (reached_tx, reached_rx) = channel::bounded(1);
        let (release_tx, release_rx) = channel::bounded(1);
        self.armed
            .lock()
            .insert((point, entity), (reached_tx, release_rx));
        Gate {
            reached: reached_rx,
            release: release_tx,
        }
    }

    pub fn seen(&self) -> Vec<HookPoint> {
        self.seen.lock().clone()
    }
}

impl FenceHooks for Pauses {
    fn at(&self, point: HookPoint, entity: Option<&EntityId>) {
        self.seen.lock().push(point);
        let armed = {
            let mut armed = self.armed.lock();
            let for_entity = entity.and_then(|e| armed.remove(&(point, Some(e.clone()))));
            for_entity.or_else(|| armed.remove(&(point, None)))
        };
        if let Some((reached, release)) = armed {
            reached.send(()).unwrap();
            release
                .recv_timeout(Duration::from_secs(30))
                .expect("the paused step was never released");
        }
    }
}

/// Key-value pairs of one partition.
pub type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// Every row of every partition, for "nothing changed" checks.
pub fn snapshot(store: &dyn Store) -> Vec<(Vec<u8>, Rows)> {
    let mut all = Vec::new();
    for p in store.list_partitions(b"").unwrap() {
        let mut rows = Vec::new();
        let mut cursor = None;
        loop {
            let page = store
                .scan(
                    &p,
                    &portcullis::store::KeyRange::all(),
                    cursor.as_ref(),
                    100,
                )
                .unwrap();
            rows.extend(page.entries);
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        all.push((p.as_bytes().to_vec(), rows));
    }
    all
}

/// Runs revocation slices until `Complete`, at most `max_slices`; answers how many ran.
pub fn revoke_to_complete(env: &Env, max_slices: usize) -> usize {
    use portcullis::fence::{RevokeBudget, RevokeProgress};
    for slice in 1..=max_slices {
        if env
            .fence
            .revoke_step(&env.ns(), RevokeBudget::default())
            .unwrap()
            == RevokeProgress::Complete
        {
            return slice;
        }
    }
    panic!(
        "revocation did not complete in {max_slices} slices on {}",
        env.name
    );
}

pub type BeforeApply = Box<dyn Fn(&dyn Store) + Send + Sync>;

/// A store that runs `before_apply` (given the wrapped store) before forwarding each apply: a
/// deterministic concurrent winner between a read and the compare-and-set that follows it.
/// Everything else is the wrapped store's, its limits and deadline support included (SPEC S11).
pub struct Interposer {
    pub inner: Arc<dyn Store>,
    pub before_apply: BeforeApply,
}

impl Store for Interposer {
    fn get(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.inner.get(p, key)
    }
    fn get_for_update(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.inner.get_for_update(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> portcullis::Result<Vec<Option<Vec<u8>>>> {
        self.inner.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        r: &KeyRange,
        c: Option<&Cursor>,
        l: usize,
    ) -> portcullis::Result<ScanPage> {
        self.inner.scan(p, r, c, l)
    }
    fn apply(&self, p: &Partition, batch: &Batch) -> portcullis::Result<Outcome> {
        (self.before_apply)(&*self.inner);
        self.inner.apply(p, batch)
    }
    fn list_partitions(&self, prefix: &[u8]) -> portcullis::Result<Vec<Partition>> {
        self.inner.list_partitions(prefix)
    }
    fn contains_partition(&self, p: &Partition) -> portcullis::Result<bool> {
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
    fn close(&self) -> portcullis::Result<()> {
        self.inner.close()
    }
}
