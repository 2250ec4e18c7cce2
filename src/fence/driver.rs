//! The background revocation driver (SPEC F9): runs slices on a rayon pool until
//! `Complete`, with a handle to wait (with a timeout) or cancel. Bounded by slice counts as
//! well as time (F8), so a frozen clock ends it with `Unavailable` instead of hanging it.
//!
//! Drivers start through the fence's spawner ([`Fence::set_spawner`], [`Fence::set_pool`]: the
//! engine passes its own pool), or on rayon's global pool if none was given; their waits run
//! on the fence's clock (SPEC E9). The fence keeps the cancel handle of every running
//! driver (revocations, and the background sweeper of `sweep.rs`), so [`Fence::stop_drivers`]
//! can stop them all, bounded (SPEC R11).

use crate::sync::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Fence, RevokeBudget, RevokeProgress};
use crate::clock::{self, SharedClock};
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::spawn::Spawner;
use crate::sync::atomic::Ordering;
use crate::sync::channel::{self, Receiver, RecvTimeoutError, Sender};
use crate::sync::{Condvar, Mutex, RwLock};

/// Limits of a background revocation (SPEC F8, F9).
///
/// ```
/// use std::time::Duration;
/// use portcullis::fence::DriverLimits;
/// let limits = DriverLimits::default().with_max_idle_slices(16).with_idle_pause(Duration::ZERO);
/// assert_eq!(limits.max_idle_slices, 16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverLimits {
    /// The budget of each slice.
    pub budget: RevokeBudget,
    /// The most slices the driver runs before it answers `Unavailable`. Default 1,000,000.
    pub max_slices: u64,
    /// The most consecutive slices that make no progress while the planner's clock stands
    /// still before the driver answers `Unavailable` (a frozen clock). Default 1,000.
    pub max_idle_slices: u64,
    /// How long the driver pauses (real time) after a slice that made no progress, so a
    /// recovery hold-off is waited out without spinning. Default 10 ms.
    pub idle_pause: Duration,
}

impl DriverLimits {
    /// The same limits with this budget for each slice.
    pub fn with_budget(mut self, budget: RevokeBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The same limits with at most this many slices.
    pub fn with_max_slices(mut self, slices: u64) -> Self {
        self.max_slices = slices;
        self
    }

    /// The same limits with at most this many consecutive slices without progress.
    pub fn with_max_idle_slices(mut self, slices: u64) -> Self {
        self.max_idle_slices = slices;
        self
    }

    /// The same limits with this pause after a slice that made no progress.
    pub fn with_idle_pause(mut self, pause: Duration) -> Self {
        self.idle_pause = pause;
        self
    }
}

impl Default for DriverLimits {
    fn default() -> Self {
        DriverLimits {
            budget: RevokeBudget::default(),
            max_slices: 1_000_000,
            max_idle_slices: 1_000,
            idle_pause: Duration::from_millis(10),
        }
    }
}

/// How a background revocation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverReport {
    /// Slices run.
    pub slices: u64,
    /// `true` if revocation reached `Complete`, `false` if it was cancelled first.
    pub complete: bool,
}

/// A running background revocation: wait for it, or cancel it. Dropping the handle lets the
/// revocation run on to its end.
#[derive(Debug)]
pub struct RevocationHandle {
    done: Receiver<Result<DriverReport>>,
    cancel: Sender<()>,
    taken: Mutex<bool>,
    clock: SharedClock,
}

impl RevocationHandle {
    /// Waits up to `timeout` for the driver to end. `None` if it is still running. The
    /// result is given once; later calls answer `InvalidArgument`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    /// use std::time::Duration;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// let handle = fence.revoke_in_background(&ns, Default::default());
    /// match handle.wait(Duration::from_secs(10)) {
    ///     Some(Ok(report)) => assert!(report.complete),
    ///     Some(Err(e)) => return Err(e),
    ///     None => handle.cancel(), // still running: give up on it
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait(&self, timeout: Duration) -> Option<Result<DriverReport>> {
        let mut taken = self.taken.lock();
        if *taken {
            return Some(Err(Error::invalid("the driver's result was already taken")));
        }
        match clock::recv_timeout(&*self.clock, &self.done, timeout) {
            Ok(result) => {
                *taken = true;
                Some(result)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                *taken = true;
                Some(Err(Error::Unavailable {
                    reason: "the revocation driver ended without a result".into(),
                    retry_after_ms: 0,
                }))
            }
        }
    }

    /// Asks the driver to stop after its current slice; it then reports `complete: false`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    /// use std::time::Duration;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// fence.mark_lease_table_recovered(&ns)?; // revocation must now wait out a lease
    /// let handle = fence.revoke_in_background(&ns, Default::default());
    /// handle.cancel();
    /// let report = handle.wait(Duration::from_secs(10)).expect("stopped")?;
    /// assert!(!report.complete);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cancel(&self) {
        let _ = self.cancel.try_send(());
    }
}

/// Where drivers run and which are running.
#[derive(Default)]
pub(super) struct Drivers {
    spawner: RwLock<Spawner>,
    running: Mutex<Running>,
    ended: Condvar,
}

impl Drivers {
    /// A driver enlisted as `id` has ended. A driver calls this last, after it dropped
    /// everything it held (its fence clone, so the store): `stop_drivers`, and with it an
    /// engine's `close`, returns once every driver ended, and must not leave a thread still
    /// holding the store behind.
    pub(super) fn discharge(&self, id: u64) {
        self.running.lock().cancels.remove(&id);
        self.ended.notify_all();
    }
}

#[derive(Default)]
struct Running {
    /// Set by `stop_drivers`: drivers started later end at once with `Closed`.
    stopped: bool,
    next: u64,
    cancels: HashMap<u64, Sender<()>>,
    /// Drivers that stop on a call rather than by ending their task (the sweeper): each is
    /// called with the deadline and answers whether it stopped.
    stoppers: HashMap<u64, Stopper>,
}

/// Stops a driver by the deadline given; answers whether it stopped.
pub(super) type Stopper = Arc<dyn Fn(Instant) -> bool + Send + Sync>;

impl Fence {
    /// Runs background drivers on `pool` instead of rayon's global pool. The engine passes its
    /// own pool, so that its drivers never compete with unrelated work and stop with it.
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
    /// let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a thread pool");
    /// fence.set_pool(Arc::new(pool)); // background revocations run here from now on
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_pool(&self, pool: Arc<rayon::ThreadPool>) {
        self.set_spawner(Spawner::pool(pool));
    }

    /// Starts background drivers and the sweeper through `spawner` (SPEC E9); the default is
    /// rayon's global pool and std threads.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig};
    /// use portcullis::store::MemoryStore;
    /// use portcullis::{ManualClock, Spawner};
    ///
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock, FenceConfig::default());
    /// fence.set_spawner(Spawner::global()); // rayon's global pool and std threads
    /// ```
    pub fn set_spawner(&self, spawner: Spawner) {
        *self.inner.drivers.spawner.write() = spawner;
    }

    /// The spawner background drivers and the sweeper start through.
    pub(super) fn spawner(&self) -> Spawner {
        self.inner.drivers.spawner.read().clone()
    }

    /// Cancels every running background driver and waits until they have all ended or
    /// `deadline` passed; returns whether they all ended. Drivers started afterwards end at
    /// once with [`Error::Closed`] (SPEC R11: closing stops every driver).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    /// use std::time::{Duration, Instant};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// let _driver = fence.revoke_in_background(&ns, Default::default());
    /// // Shutting down: stop every background revocation, waiting at most a second.
    /// assert!(fence.stop_drivers(Instant::now() + Duration::from_secs(1)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn stop_drivers(&self, deadline: Instant) -> bool {
        let drivers = &self.inner.drivers;
        let stoppers: Vec<Stopper> = {
            let mut running = drivers.running.lock();
            running.stopped = true;
            for cancel in running.cancels.values() {
                let _ = cancel.try_send(());
            }
            running.stoppers.values().cloned().collect()
        };
        let mut stopped = true;
        for stop in stoppers {
            stopped &= stop(deadline);
        }
        let mut running = drivers.running.lock();
        while !running.cancels.is_empty() {
            if clock::wait_until(&*self.inner.clock, &drivers.ended, &mut running, deadline) {
                return stopped && running.cancels.is_empty();
            }
        }
        stopped
    }

    /// Counts a background driver as running, so that [`Fence::stop_drivers`] sends it a
    /// message on `cancel` and waits for it. `None` once the drivers were stopped: the driver
    /// must not start. A driver that got an id calls `Drivers::discharge` when it ends, after it dropped its fence.
    pub(super) fn enlist_driver(&self, cancel: Sender<()>) -> Option<u64> {
        let mut running = self.inner.drivers.running.lock();
        if running.stopped {
            return None;
        }
        running.next += 1;
        let id = running.next;
        running.cancels.insert(id, cancel);
        Some(id)
    }

    /// Counts a driver that stops when `stop` is called (see [`Stopper`]) as running, so
    /// that [`Fence::stop_drivers`] calls it. `None` once the drivers were stopped.
    pub(super) fn enlist_stopper(&self, stop: Stopper) -> Option<u64> {
        let mut running = self.inner.drivers.running.lock();
        if running.stopped {
            return None;
        }
        running.next += 1;
        let id = running.next;
        running.stoppers.insert(id, stop);
        Some(id)
    }

    /// A driver enlisted with [`Fence::enlist_stopper`] as `id` has ended on its own.
    pub(super) fn forget_stopper(&self, id: u64) {
        self.inner.drivers.running.lock().stoppers.remove(&id);
    }

    /// The drivers' table, for a driver to report its end after it dropped its fence.
    pub(super) fn drivers(&self) -> Arc<Drivers> {
        Arc::clone(&self.inner.drivers)
    }

    /// Starts a background revocation of the namespace on the fence's pool (SPEC F9).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    /// use std::time::Duration;
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// fence.bump_epoch(&ns, 1)?;
    /// let handle = fence.revoke_in_background(&ns, Default::default());
    /// let report = handle.wait(Duration::from_secs(10)).expect("finished in time")?;
    /// assert!(report.complete);
    /// # Ok(())
    /// # }
    /// ```
    pub fn revoke_in_background(&self, ns: &Namespace, limits: DriverLimits) -> RevocationHandle {
        let (done_tx, done_rx) = channel::bounded(1);
        let (cancel_tx, cancel_rx) = channel::bounded(1);
        let handle = RevocationHandle {
            done: done_rx,
            cancel: cancel_tx.clone(),
            taken: Mutex::new(false),
            clock: self.inner.clock.clone(),
        };
        let Some(id) = self.enlist_driver(cancel_tx) else {
            let _ = done_tx.send(Err(Error::Closed));
            return handle;
        };
        let fence = self.clone();
        let ns = ns.clone();
        let task = move || {
            // A panic in a rayon task would abort the process: catch it and report it.
            let result = catch_unwind(AssertUnwindSafe(|| fence.drive(&ns, limits, &cancel_rx)))
                .unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    log::warn!("revocation driver for {ns} panicked: {what}");
                    Err(Error::Unavailable {
                        reason: format!("the revocation driver panicked: {what}"),
                        retry_after_ms: 0,
                    })
                });
            let drivers = fence.drivers();
            drop(fence);
            let _ = done_tx.send(result);
            drivers.discharge(id);
        };
        self.spawner().spawn(task);
        handle
    }

    fn drive(
        &self,
        ns: &Namespace,
        limits: DriverLimits,
        cancel: &Receiver<()>,
    ) -> Result<DriverReport> {
        let mut idle = 0u64;
        let mut last_now = self.now();
        for slice in 1..=limits.max_slices {
            if cancel.try_recv().is_ok() {
                return Ok(DriverReport {
                    slices: slice - 1,
                    complete: false,
                });
            }
            let acks_before = self.inner.counters.acks.load(Ordering::Relaxed);
            match self.revoke_step(ns, limits.budget)? {
                RevokeProgress::Complete => {
                    return Ok(DriverReport {
                        slices: slice,
                        complete: true,
                    });
                }
                RevokeProgress::Pending { remaining } => {
                    let progressed =
                        self.inner.counters.acks.load(Ordering::Relaxed) != acks_before;
                    let now = self.now();
                    if progressed || now != last_now {
                        idle = 0;
                    } else {
                        idle += 1;
                        if idle >= limits.max_idle_slices {
                            return Err(Error::Unavailable {
                                reason: format!(
                                    "revocation of {ns} made no progress in {idle} slices while the clock stood at {now} ms ({remaining} remaining)"
                                ),
                                retry_after_ms: 1_000,
                            });
                        }
                    }
                    last_now = now;
                    if !progressed {
                        match clock::recv_timeout(&*self.inner.clock, cancel, limits.idle_pause) {
                            Ok(()) => {
                                return Ok(DriverReport {
                                    slices: slice,
                                    complete: false,
                                });
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => {}
                        }
                    }
                }
            }
        }
        Err(Error::Unavailable {
            reason: format!(
                "revocation of {ns} did not complete in {} slices",
                limits.max_slices
            ),
            retry_after_ms: 1_000,
        })
    }
}
