//! The expired-lease sweeper (SPEC F9): deletes leased-shard rows whose lease has expired,
//! each guarded on the row as read, so a renewal that races the sweep always wins. On a store
//! without deadlines it first retires the entity's lease (`deadline_less.rs`).
//!
//! [`Fence::sweep_step`] is one bounded step over one namespace. [`Fence::sweep_in_background`]
//! runs passes over a changing list of namespaces every interval (the engine starts one by
//! default, so rows never pile up). Every background sweeper of the process is served by one
//! thread, started with the first: a sweeper lives as long as its owner, so on a pool it would
//! hold a pool thread for ever, and a thread of its own per sweeper would cost every engine a
//! thread start. A sweeper is enlisted with its fence's drivers (see `driver.rs`), so
//! [`Fence::stop_drivers`] stops it, bounded (SPEC R11); it stops as well when every
//! [`SweeperHandle`] is dropped. Each pass is bounded by pages per namespace (SPEC F8) and
//! resumes a longer table where the previous pass stopped. Passes of different sweepers run one
//! after another.
//!
//! Stopping waits only for a pass under way (it ends after the row it is deleting): once
//! stopped, a sweeper starts no pass and touches no store.
//!
//! This file owns the scheduling (the handle, the shared thread, stopping); the step and the
//! pass over a namespace's rows are in `sweep_rows.rs`.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Sender};
use parking_lot::{Condvar, Mutex, MutexGuard};

use super::Fence;
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::store::Cursor;

/// What one pass of the background sweeper did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepPass {
    /// Namespaces swept.
    pub namespaces: u64,
    /// Expired rows deleted.
    pub deleted: u64,
    /// Expired rows that changed (were renewed) before they could be deleted.
    pub raced: u64,
    /// Namespaces whose table this pass did not reach the end of (the next pass resumes them).
    pub unfinished: u64,
    /// Namespaces whose sweep failed (a store error, logged); the next pass tries again.
    pub failed: u64,
}

/// The namespaces a background sweeper sweeps, asked at the start of every pass.
pub type SweepNamespaces = Box<dyn Fn() -> Vec<Namespace> + Send>;

/// A running background sweeper (see [`Fence::sweep_in_background`]). Clones share it; the
/// sweeper stops when it is stopped, when the fence's drivers are stopped, or when every
/// handle is dropped.
#[derive(Clone, Debug)]
pub struct SweeperHandle {
    shared: Arc<Shared>,
}

/// Owned by the handles: dropping the last one stops the sweeper.
#[derive(Debug)]
struct Shared {
    sweeper: Arc<Sweeper>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.sweeper.status.stop(Instant::now());
        HUB.nudge();
        let id = self.sweeper.stopper.load(Ordering::Relaxed);
        if id != 0 {
            self.sweeper.fence.forget_stopper(id);
        }
    }
}

#[derive(Debug, Default)]
struct Status {
    state: Mutex<State>,
    changed: Condvar,
    /// Set by a stop: a pass under way ends after the row it is deleting.
    stop_requested: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    passes: u64,
    last: Option<SweepPass>,
    /// No pass starts any more (stopped, or the thread ended).
    ended: bool,
    /// A pass is under way.
    busy: bool,
}

impl Status {
    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock());
        self.changed.notify_all();
    }

    fn is_running(&self) -> bool {
        !self.state.lock().ended
    }

    /// Marks a pass under way; false (and no pass may start) once stopped.
    fn begin_pass(&self) -> bool {
        let mut state = self.state.lock();
        if state.ended {
            return false;
        }
        state.busy = true;
        true
    }

    /// Stops the sweeper: no pass starts from now on, and a pass under way is waited for until
    /// `deadline`. Answers whether none is under way.
    fn stop(&self, deadline: Instant) -> bool {
        self.stop_requested.store(true, Ordering::Relaxed);
        let mut state = self.state.lock();
        state.ended = true;
        self.changed.notify_all();
        while state.busy {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                return !state.busy;
            }
        }
        true
    }

    /// Waits until `done` holds or `timeout` passed; answers whether it holds.
    fn wait(&self, timeout: Duration, done: impl Fn(&State) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock();
        while !done(&state) {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                return done(&state);
            }
        }
        true
    }
}

/// One background sweeper, as the process's sweeper thread runs it.
struct Sweeper {
    fence: Fence,
    namespaces: Mutex<SweepNamespaces>,
    cursors: Mutex<HashMap<Namespace, Cursor>>,
    interval: Duration,
    next_due: Mutex<Instant>,
    /// Waiting for the next pass: each is sent its report.
    kicks: Mutex<Vec<Sender<SweepPass>>>,
    status: Arc<Status>,
    /// Its id among the fence's drivers (0 before it is enlisted).
    stopper: AtomicU64,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("interval", &self.interval)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl Sweeper {
    fn is_due(&self, now: Instant) -> bool {
        !self.kicks.lock().is_empty() || now >= *self.next_due.lock()
    }

    /// Runs one pass, unless stopped, and answers whoever asked for one.
    fn run(&self) {
        let replies = std::mem::take(&mut *self.kicks.lock());
        *self.next_due.lock() = Instant::now() + self.interval;
        if !self.status.begin_pass() {
            return; // stopped: touch nothing more
        }
        let status = &self.status;
        let stop = || status.stop_requested.load(Ordering::Relaxed);
        let pass = catch_unwind(AssertUnwindSafe(|| {
            let namespaces = self.namespaces.lock();
            self.fence
                .sweep_pass(&**namespaces, &mut self.cursors.lock(), &stop)
        }))
        .unwrap_or_else(|_| {
            log::warn!("a lease sweep pass panicked; the sweeper carries on at the next one");
            SweepPass::default()
        });
        status.update(|s| {
            s.passes += 1;
            s.last = Some(pass);
            s.busy = false;
        });
        for reply in replies {
            let _ = reply.send(pass);
        }
    }
}

/// The process's sweeper thread and the sweepers it serves.
struct Hub {
    sweepers: Mutex<Vec<Arc<Sweeper>>>,
    wake: Condvar,
    started: Mutex<bool>,
}

static HUB: Hub = Hub {
    sweepers: Mutex::new(Vec::new()),
    wake: Condvar::new(),
    started: Mutex::new(false),
};

impl Hub {
    /// Adds a sweeper, starting the thread if it is not running yet.
    fn add(&'static self, sweeper: Arc<Sweeper>) -> Result<()> {
        let mut started = self.started.lock();
        if !*started {
            std::thread::Builder::new()
                .name("portcullis-sweeper".into())
                .spawn(move || self.run())
                .map_err(|e| Error::Io {
                    context: "starting the lease sweeper's thread".into(),
                    source: e,
                })?;
            *started = true;
        }
        drop(started);
        self.sweepers.lock().push(sweeper);
        self.nudge();
        Ok(())
    }

    /// Wakes the thread to look again (a kick, a stop, a new sweeper).
    fn nudge(&self) {
        let _sweepers = self.sweepers.lock();
        self.wake.notify_all();
    }

    fn run(&self) {
        let mut sweepers = self.sweepers.lock();
        loop {
            sweepers.retain(|s| s.status.is_running());
            let now = Instant::now();
            let due: Vec<Arc<Sweeper>> =
                sweepers.iter().filter(|s| s.is_due(now)).cloned().collect();
            if due.is_empty() {
                match sweepers.iter().map(|s| *s.next_due.lock()).min() {
                    Some(at) => {
                        self.wake.wait_until(&mut sweepers, at);
                    }
                    None => self.wake.wait(&mut sweepers),
                }
                continue;
            }
            MutexGuard::unlocked(&mut sweepers, || {
                for sweeper in due {
                    sweeper.run();
                }
            });
        }
    }
}

impl SweeperHandle {
    fn status(&self) -> &Status {
        &self.shared.sweeper.status
    }

    /// The time between passes.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// assert_eq!(sweeper.interval(), Duration::from_secs(60));
    /// # Ok(())
    /// # }
    /// ```
    pub fn interval(&self) -> Duration {
        self.shared.sweeper.interval
    }

    /// Passes completed so far.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// let before = sweeper.passes();
    /// sweeper.sweep_now(Duration::from_secs(10));
    /// assert!(sweeper.passes() > before);
    /// # Ok(())
    /// # }
    /// ```
    pub fn passes(&self) -> u64 {
        self.status().state.lock().passes
    }

    /// What the last completed pass did, if one completed.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// sweeper.sweep_now(Duration::from_secs(10));
    /// let pass = sweeper.last_pass().expect("one pass ran");
    /// assert_eq!((pass.namespaces, pass.failed), (1, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn last_pass(&self) -> Option<SweepPass> {
        self.status().state.lock().last
    }

    /// Whether the sweeper still runs.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// assert!(sweeper.is_running());
    /// sweeper.stop(Duration::from_secs(10));
    /// assert!(!sweeper.is_running());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_running(&self) -> bool {
        self.status().is_running()
    }

    /// Runs a pass now (without waiting for the interval) and waits up to `timeout` for it;
    /// `None` if the sweeper has ended or the pass did not finish in time.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// clock.advance(30_000); // the lease expires
    /// let pass = sweeper.sweep_now(Duration::from_secs(10)).expect("a pass within 10 s");
    /// assert_eq!(pass.deleted, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sweep_now(&self, timeout: Duration) -> Option<SweepPass> {
        if !self.is_running() {
            return None;
        }
        let (reply, answer) = channel::bounded(1);
        self.shared.sweeper.kicks.lock().push(reply);
        HUB.nudge();
        answer.recv_timeout(timeout).ok()
    }

    /// Waits up to `timeout` until at least `passes` passes have completed; answers whether
    /// they have. Returns early (false) if the sweeper ends first.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// sweeper.sweep_now(Duration::from_secs(10));
    /// assert!(sweeper.wait_for_passes(1, Duration::from_secs(10)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_for_passes(&self, passes: u64, timeout: Duration) -> bool {
        self.status()
            .wait(timeout, |s| s.passes >= passes || s.ended);
        self.passes() >= passes
    }

    /// Stops the sweeper after the row it is deleting and waits up to `timeout` for it to end;
    /// answers whether it ended.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// assert!(sweeper.stop(Duration::from_secs(10))); // stopped within 10 s
    /// # Ok(())
    /// # }
    /// ```
    pub fn stop(&self, timeout: Duration) -> bool {
        let stopped = self.status().stop(Instant::now() + timeout);
        HUB.nudge();
        stopped
    }
}

impl Fence {
    /// Starts a background sweeper (SPEC F9): every `interval` (real time), and whenever
    /// [`SweeperHandle::sweep_now`] asks, it sweeps every namespace `namespaces` lists, at
    /// most 1,024 pages of 64 rows each per pass, resuming a longer table at the next pass.
    /// A failed sweep is logged and retried at the next pass. Refused with `InvalidArgument`
    /// for a zero interval; answers [`Error::Closed`] once the fence's drivers were stopped.
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
    /// let _ = fence.write(&job, 0, Batch::new())?; // leaves a leased-shard row
    /// let sweep = ns.clone();
    /// let sweeper = fence.sweep_in_background(Duration::from_secs(60), Box::new(move || vec![sweep.clone()]))?;
    /// clock.advance(30_000); // the lease expires
    /// assert_eq!(sweeper.sweep_now(Duration::from_secs(10)).expect("swept").deleted, 1);
    /// assert!(sweeper.stop(Duration::from_secs(10)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn sweep_in_background(
        &self,
        interval: Duration,
        namespaces: SweepNamespaces,
    ) -> Result<SweeperHandle> {
        if interval.is_zero() {
            return Err(Error::invalid("the sweep interval must be above zero"));
        }
        let status = Arc::new(Status::default());
        let sweeper = Arc::new(Sweeper {
            fence: self.clone(),
            namespaces: Mutex::new(namespaces),
            cursors: Mutex::new(HashMap::new()),
            interval,
            next_due: Mutex::new(Instant::now() + interval),
            kicks: Mutex::new(Vec::new()),
            status: Arc::clone(&status),
            stopper: AtomicU64::new(0),
        });
        let stopper = Arc::new(move |deadline: Instant| {
            let stopped = status.stop(deadline);
            HUB.nudge();
            stopped
        });
        let Some(id) = self.enlist_stopper(stopper) else {
            return Err(Error::Closed);
        };
        sweeper.stopper.store(id, Ordering::Relaxed);
        let handle = SweeperHandle {
            shared: Arc::new(Shared {
                sweeper: Arc::clone(&sweeper),
            }),
        };
        HUB.add(sweeper)?; // on failure, dropping the handle stops and discharges it
        log::debug!("lease sweeper started (every {interval:?})");
        Ok(handle)
    }
}
