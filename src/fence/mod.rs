//! Epoch fencing (SPEC F1-F10).
//!
//! Owns: a namespace's epoch (and, as a second fence kind, its authority generation), the
//! leases entities write under, fenced writes, bounded revocation slices, the background
//! revocation driver and the expired-lease sweeper. It calls only the store (through the
//! [`Store`] trait, so it runs on every backend) and the planner's clock; nothing above it.
//!
//! One file per job: [`config`](FenceConfig) (parameters), `rows` (keys and encodings),
//! `epoch` (F1), `write` (F2, F3), `revoke` (F4-F6), `driver` (F9, background), `sweep` (F9,
//! sweeper), `stats` (store-call counters), `hooks` (test-only fault hooks).
//!
//! Two clocks are involved: the planner's clock given to [`Fence::new`] (lease expiries,
//! revocation hold-offs) and the store's own clock, against which `NotAfter` deadlines are
//! checked inside the commit. Safety assumes their skew stays below `lease_margin_ms`;
//! that is documented, not checked.
//!
//! ```
//! use std::sync::Arc;
//! use portcullis::{EntityId, ManualClock, Namespace, store::{Batch, MemoryStore}};
//! use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
//! let clock = ManualClock::new(1_000_000);
//! let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
//! let fence = Fence::new(store, Arc::new(clock.clone()), FenceConfig::default());
//! let ns = Namespace::new("chat").unwrap();
//! let room = EntityId::in_namespace(ns.clone(), "room-1").unwrap();
//!
//! let grant = fence.current_epoch(&ns).unwrap(); // 0: no epoch yet
//! let batch = Batch::new().put(b"greeting".to_vec(), b"hello".to_vec());
//! assert!(matches!(fence.write(&room, grant, batch.clone()).unwrap(), WriteOutcome::Committed { .. }));
//!
//! fence.bump_epoch(&ns, 1).unwrap();
//! while fence.revoke_step(&ns, RevokeBudget::default()).unwrap() != RevokeProgress::Complete {}
//! // A write planned under epoch 0 can no longer commit.
//! assert!(fence.write(&room, grant, batch).is_err());
//! ```

mod config;
mod driver;
mod epoch;
mod hooks;
mod revoke;
mod rows;
mod stats;
mod sweep;
mod write;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::clock::SharedClock;
use crate::store::{Batch, Store};

pub use config::{FenceConfig, FenceConfigBuilder};
pub use driver::{DriverLimits, DriverReport, RevocationHandle};
#[doc(hidden)]
pub use hooks::{FenceHooks, GuardSwitches, HookPoint, NoHooks};
#[doc(hidden)]
pub use revoke::PendingAck;
pub use revoke::{RevokeBudget, RevokeProgress};
pub use rows::FenceKind;
#[doc(hidden)]
pub use rows::{CheckpointRow, Keys, LeaseRow, RecoveryRow, ScanPosition, ShardRow};
#[doc(hidden)]
pub use rows::{decode as decode_row, encode as encode_row};
pub use stats::FenceStats;
pub use sweep::SweepReport;
#[doc(hidden)]
pub use write::PlannedWrite;
pub use write::{FenceGrant, WriteOutcome, WritePlan, write_under};

use stats::{CountedStore, Counters};

/// A fence over one store: epochs (or authority generations), leases, fenced writes and
/// revocation for every namespace in that store. Cheap to clone; clones share everything.
#[derive(Clone, Debug)]
pub struct Fence {
    inner: Arc<Inner>,
}

struct Inner {
    store: CountedStore,
    raw_store: Arc<dyn Store>,
    clock: SharedClock,
    config: FenceConfig,
    kind: FenceKind,
    keys: Keys,
    counters: Arc<Counters>,
    hooks: RwLock<Arc<dyn FenceHooks>>,
    switches: RwLock<GuardSwitches>,
    grant_seed: u64,
    grant_counter: AtomicU64,
    /// Told before revocation pushes a lease to an entity (see [`Fence::set_push_observer`]).
    push_observer: RwLock<Option<PushObserver>>,
    /// Where background drivers run, and the ones running now (see [`Fence::set_pool`]).
    drivers: driver::Drivers,
}

/// Called with an entity just before revocation pushes a lease to it.
pub type PushObserver = Arc<dyn Fn(&crate::entity::EntityId) + Send + Sync>;

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("kind", &self.kind)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Fence {
    /// An epoch fence (SPEC F1-F9) over `store`, reading time from the planner's `clock`.
    pub fn new(store: Arc<dyn Store>, clock: SharedClock, config: FenceConfig) -> Fence {
        Fence::with_kind(store, clock, config, FenceKind::Epoch)
    }

    /// A fence of the given kind; [`FenceKind::Authority`] is the second fence of SPEC F10,
    /// with its own rows, sharing this machinery.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::{ManualClock, Namespace, store::MemoryStore};
    /// use portcullis::fence::{Fence, FenceConfig, FenceKind};
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let epochs = Fence::new(store.clone(), clock.clone(), FenceConfig::default());
    /// let authority = Fence::with_kind(store, clock, FenceConfig::default(), FenceKind::Authority);
    /// let ns = Namespace::new("ns").unwrap();
    /// authority.bump_epoch(&ns, 1).unwrap();
    /// assert_eq!((epochs.current_epoch(&ns).unwrap(), authority.current_epoch(&ns).unwrap()), (0, 1));
    /// ```
    pub fn with_kind(
        store: Arc<dyn Store>,
        clock: SharedClock,
        config: FenceConfig,
        kind: FenceKind,
    ) -> Fence {
        let counters = Arc::new(Counters::default());
        let mut seed = RandomState::new().build_hasher();
        seed.write_u64(clock.now_ms());
        Fence {
            inner: Arc::new(Inner {
                store: CountedStore::new(store.clone(), counters.clone()),
                raw_store: store,
                clock,
                config,
                kind,
                keys: Keys::new(kind),
                counters,
                hooks: RwLock::new(Arc::new(NoHooks)),
                switches: RwLock::new(GuardSwitches::default()),
                grant_seed: seed.finish(),
                grant_counter: AtomicU64::new(0),
                push_observer: RwLock::new(None),
                drivers: driver::Drivers::default(),
            }),
        }
    }

    /// Installs a function called with each entity just before revocation pushes a lease to
    /// it. The engine uses it so that a push counts as a touch of the entity (SPEC R2): the
    /// entity is restored first, exactly once, like on any other path. The function must not
    /// call back into this fence's revocation.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::{ManualClock, store::MemoryStore};
    /// use portcullis::fence::{Fence, FenceConfig};
    /// let clock = Arc::new(ManualClock::new(0));
    /// let fence = Fence::new(Arc::new(MemoryStore::with_clock(clock.clone())), clock, FenceConfig::default());
    /// fence.set_push_observer(Arc::new(|entity| println!("about to push a lease to {entity}")));
    /// ```
    pub fn set_push_observer(&self, observer: PushObserver) {
        *self.inner.push_observer.write() = Some(observer);
    }

    /// Which fence this is.
    pub fn kind(&self) -> FenceKind {
        self.inner.kind
    }

    /// The parameters.
    pub fn config(&self) -> FenceConfig {
        self.inner.config
    }

    /// Counters of store calls and protocol steps since the fence was created.
    pub fn stats(&self) -> FenceStats {
        self.inner.counters.snapshot()
    }

    /// Test-only: installs fault hooks called at every [`HookPoint`].
    #[doc(hidden)]
    pub fn set_hooks(&self, hooks: Arc<dyn FenceHooks>) {
        *self.inner.hooks.write() = hooks;
    }

    /// Test-only: removes guards, for negative controls and teeth checks.
    #[doc(hidden)]
    pub fn set_guard_switches(&self, switches: GuardSwitches) {
        *self.inner.switches.write() = switches;
    }

    /// Test-only: the keys of this fence's rows.
    #[doc(hidden)]
    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    /// The store this fence writes to (uncounted).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.raw_store
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    fn hook(&self, point: HookPoint, entity: Option<&crate::entity::EntityId>) {
        let hooks = self.inner.hooks.read().clone();
        hooks.at(point, entity);
    }

    fn switches(&self) -> GuardSwitches {
        *self.inner.switches.read()
    }

    /// A grant id no other grant of any fence in this process, or (with overwhelming
    /// probability) any other process, carries.
    fn next_grant_id(&self) -> u128 {
        let n = self.inner.grant_counter.fetch_add(1, Ordering::Relaxed);
        (u128::from(self.inner.grant_seed) << 64) | u128::from(n)
    }
}

/// Adds "`key` is exactly as read" to `batch`: `Equals` if it held a value, `Absent` if not.
fn guard_as_read(batch: Batch, key: &[u8], raw: Option<&[u8]>) -> Batch {
    match raw {
        Some(value) => batch.equals(key.to_vec(), value.to_vec()),
        None => batch.absent(key.to_vec()),
    }
}
