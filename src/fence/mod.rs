//! Epoch fencing (SPEC F1-F10).
//!
//! Owns: a namespace's epoch (and, as a second fence kind, its authority generation), the
//! leases entities write under, fenced writes, bounded revocation slices, the background
//! revocation driver and the expired-lease sweeper. It calls only the store (through the
//! [`Store`] trait, so it runs on every backend) and the planner's clock; nothing above it.
//!
//! One file per job: [`config`](FenceConfig) (parameters), `rows` (keys and encodings),
//! `epoch` (F1), `write` (F2, F3: the write path), `lease` (F2, F3: a lease read,
//! renewed and guarded), `revoke` (F4-F6), `completion` (F5, F12: the proof that revocation
//! completed, read for a take-over), `driver` (F9, background), `sweep` (F9,
//! sweeper scheduling), `sweep_rows` (F8, F9, the sweep over a namespace's rows),
//! `deadline_less` (the rule on stores that cannot evaluate `NotAfter`), `stats` (store-call
//! counters), `hooks` (test-only fault hooks, behind the cargo feature `test-hooks`).
//!
//! Two clocks are involved: the planner's clock given to [`Fence::new`] (lease expiries,
//! revocation hold-offs) and the store's own clock, against which `NotAfter` deadlines are
//! checked inside the commit. Safety assumes their skew stays below `lease_margin_ms`;
//! that is documented, not checked. On a store without server-side deadlines
//! ([`Store::evaluates_deadlines`] is `false`, e.g. etcd) fenced writes carry no `NotAfter`,
//! and revocation and the sweeper push to an entity before they treat its expired row as
//! done (docs/fencing.md).
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

mod completion;
mod config;
mod deadline_less;
mod driver;
mod epoch;
mod hooks;
mod lease;
mod revoke;
/// Row layouts; the inspect tool reads them (SPEC E5).
pub(crate) mod rows;
mod stats;
mod sweep;
mod sweep_drive;
mod sweep_rows;
mod told;
mod unfenced;
mod write;

use crate::sync::HashSet;
use crate::sync::atomic::{AtomicU64, Ordering};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use crate::sync::RwLock;

use crate::clock::SharedClock;
use crate::store::{Batch, Store};

pub(crate) use completion::CoordinatorView;
pub use config::{FenceConfig, FenceConfigBuilder};
pub use driver::{DriverLimits, DriverReport, RevocationHandle};
pub use revoke::{RevokeBudget, RevokeProgress};
pub use rows::FenceKind;
pub use stats::FenceStats;
pub(crate) use sweep::Waker as SweepWaker;
pub use sweep::{SweepNamespaces, SweepPass, SweeperHandle};
pub(crate) use sweep_drive::SweepDuty;
pub use sweep_rows::SweepReport;
pub use write::{FenceGrant, WriteOutcome, WritePlan, write_under};

// Test-only surface (cargo feature `test-hooks`, which the crate's own tests enable): pause
// points, guard switches, the half-steps of a write and of a push, and the row codecs. Without
// the feature none of it is public, and the hooks and switches compile to nothing.
#[cfg(feature = "test-hooks")]
pub use hooks::{FenceHooks, GuardSwitches, HookPoint, NoHooks};
#[cfg(not(feature = "test-hooks"))]
use hooks::{GuardSwitches, HookPoint};
#[cfg(feature = "test-hooks")]
pub use revoke::PendingAck;
#[cfg(not(feature = "test-hooks"))]
use rows::Keys;
#[cfg(feature = "test-hooks")]
pub use rows::{CheckpointRow, Keys, LeaseRow, RecoveryRow, ScanPosition, ShardRow};
#[cfg(feature = "test-hooks")]
pub use rows::{decode as decode_row, encode as encode_row};
#[cfg(feature = "test-hooks")]
pub use write::PlannedWrite;

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
    /// Whether the store checks `NotAfter` at commit; `false` selects the deadline-less rule.
    server_deadlines: bool,
    keys: Keys,
    counters: Arc<Counters>,
    #[cfg(feature = "test-hooks")]
    hooks: RwLock<Arc<dyn FenceHooks>>,
    #[cfg(feature = "test-hooks")]
    switches: RwLock<GuardSwitches>,
    grant_seed: u64,
    grant_counter: AtomicU64,
    /// Namespaces this fence has seen declared unfenced (permanent, so never forgotten).
    unfenced: RwLock<HashSet<crate::entity::Namespace>>,
    /// Told before revocation pushes a lease to an entity (see `Fence::set_push_observer`).
    push_observer: RwLock<Option<PushObserver>>,
    /// Where background drivers run, and the ones running now (see [`Fence::set_pool`]).
    drivers: Arc<driver::Drivers>,
    /// The engine's event hub, if one is set (SPEC E8).
    watch: told::FenceWatch,
}

/// Called with an entity just before revocation pushes a lease to it.
pub(crate) type PushObserver = Arc<dyn Fn(&crate::entity::EntityId) + Send + Sync>;

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
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// let outcome = fence.write(&job, 0, Batch::new().put("state", "queued"))?;
    /// assert_eq!(outcome, WriteOutcome::Committed { epochs: vec![0] });
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(store: Arc<dyn Store>, clock: SharedClock, config: FenceConfig) -> Fence {
        Fence::with_kind(store, clock, config, FenceKind::Epoch)
    }

    /// A fence of the given kind; [`FenceKind::Authority`] is the second fence of SPEC F10,
    /// with its own rows, sharing this machinery.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    /// use portcullis::fence::{FenceGrant, FenceKind, write_under};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// // A second fence on the same store, for an authority that grants its own generations.
    /// let authority = Fence::with_kind(fence.store().clone(), clock, FenceConfig::default(), FenceKind::Authority);
    /// let grants = [FenceGrant { fence: &fence, grant: 0 }, FenceGrant { fence: &authority, grant: 0 }];
    /// let outcome = write_under(&grants, &job, |_| Some(Batch::new().put("state", "queued")))?;
    /// assert!(matches!(outcome, WriteOutcome::Committed { .. }));
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_kind(
        store: Arc<dyn Store>,
        clock: SharedClock,
        config: FenceConfig,
        kind: FenceKind,
    ) -> Fence {
        let counters = Arc::new(Counters::default());
        let server_deadlines = store.evaluates_deadlines();
        let mut seed = RandomState::new().build_hasher();
        seed.write_u64(clock.now_ms());
        Fence {
            inner: Arc::new(Inner {
                store: CountedStore::new(store.clone(), counters.clone()),
                raw_store: store,
                clock,
                config,
                kind,
                server_deadlines,
                keys: Keys::new(kind),
                counters,
                #[cfg(feature = "test-hooks")]
                hooks: RwLock::new(Arc::new(NoHooks)),
                #[cfg(feature = "test-hooks")]
                switches: RwLock::new(GuardSwitches::default()),
                grant_seed: crate::sync::simulated_unique().unwrap_or_else(|| seed.finish()),
                grant_counter: AtomicU64::new(0),
                unfenced: RwLock::new(HashSet::default()),
                push_observer: RwLock::new(None),
                drivers: Arc::default(),
                watch: Default::default(),
            }),
        }
    }

    /// Installs a function called with each entity just before revocation pushes a lease to
    /// it. The engine uses it so that a push counts as a touch of the entity (SPEC R2): the
    /// entity is restored first, exactly once, like on any other path. The function must not
    /// call back into this fence's revocation. Crate-internal: only the engine installs one.
    pub(crate) fn set_push_observer(&self, observer: PushObserver) {
        *self.inner.push_observer.write() = Some(observer);
    }

    /// Which fence this is.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// assert_eq!(fence.kind(), portcullis::fence::FenceKind::Epoch);
    /// # Ok(())
    /// # }
    /// ```
    pub fn kind(&self) -> FenceKind {
        self.inner.kind
    }

    /// The parameters.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// assert_eq!(fence.config(), FenceConfig::default());
    /// println!("leases last {} ms", fence.config().epoch_lease_ms());
    /// # Ok(())
    /// # }
    /// ```
    pub fn config(&self) -> FenceConfig {
        self.inner.config
    }

    /// Counters of store calls and protocol steps since the fence was created.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// let _ = fence.write(&job, 0, Batch::new().put("state", "queued"))?;
    /// assert!(fence.stats().store_calls > 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> FenceStats {
        self.inner.counters.snapshot()
    }

    /// Test-only (feature `test-hooks`): installs fault hooks called at every [`HookPoint`].
    #[cfg(feature = "test-hooks")]
    pub fn set_hooks(&self, hooks: Arc<dyn FenceHooks>) {
        *self.inner.hooks.write() = hooks;
    }

    /// Test-only (feature `test-hooks`): removes guards, for negative controls and teeth
    /// checks.
    #[cfg(feature = "test-hooks")]
    pub fn set_guard_switches(&self, switches: GuardSwitches) {
        *self.inner.switches.write() = switches;
    }

    /// Test-only (feature `test-hooks`): the keys of this fence's rows.
    #[cfg(feature = "test-hooks")]
    pub fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    /// The store this fence writes to (uncounted).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    /// use portcullis::store::Store;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// let _ = fence.write(&job, 0, Batch::new().put("state", "queued"))?;
    /// assert_eq!(fence.store().get(&job.partition(), b"state")?, Some(b"queued".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.raw_store
    }

    fn now(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// Calls the test hooks at `point`; nothing without the `test-hooks` feature.
    #[cfg_attr(not(feature = "test-hooks"), inline(always))]
    fn hook(&self, point: HookPoint, entity: Option<&crate::entity::EntityId>) {
        #[cfg(feature = "test-hooks")]
        {
            let hooks = self.inner.hooks.read().clone();
            hooks.at(point, entity);
        }
        #[cfg(not(feature = "test-hooks"))]
        let _ = (point, entity);
    }

    /// Whether the test-only switch `drop_deadline` is on: the engine then drops its own
    /// deadline from fenced writes too (the owner lease's, SPEC F12).
    pub(crate) fn deadlines_dropped(&self) -> bool {
        self.switches().drop_deadline
    }

    /// The guard switches: all guards in place without the `test-hooks` feature.
    #[cfg_attr(not(feature = "test-hooks"), inline(always))]
    fn switches(&self) -> GuardSwitches {
        #[cfg(feature = "test-hooks")]
        {
            *self.inner.switches.read()
        }
        #[cfg(not(feature = "test-hooks"))]
        GuardSwitches::default()
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
