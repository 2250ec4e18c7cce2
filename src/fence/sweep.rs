//! The expired-lease sweeper (SPEC F9): deletes leased-shard rows whose lease has expired,
//! each guarded on the row as read, so a renewal that races the sweep always wins. On a store
//! without deadlines it first retires the entity's lease (`deadline_less.rs`).
//!
//! [`Fence::sweep_step`] is one bounded step over one namespace. [`Fence::sweep_in_background`]
//! runs passes over a changing list of namespaces every interval, on a thread of its own; the
//! engine drives its sweeper from its own background thread instead (`sweep_drive.rs`), so a
//! slow store delays only its own engine's sweeps, and a closed engine's sweeper holds nothing
//! once close returns. A sweeper is enlisted with its fence's drivers (see `driver.rs`), so
//! [`Fence::stop_drivers`] stops it, bounded (SPEC R11); it stops as well when every
//! [`SweeperHandle`] is dropped. Each pass is bounded by pages per namespace (SPEC F8) and
//! resumes a longer table where the previous pass stopped.
//!
//! Stopping waits only for a pass under way (it ends after the row it is deleting): once
//! stopped, a sweeper starts no pass and touches no store.
//!
//! This file owns the sweeper and its handle (passes, stopping); what drives its passes (its
//! own thread, or the engine's) is in `sweep_drive.rs`; the step and the pass over a
//! namespace's rows are in `sweep_rows.rs`.

use crate::sync::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{self, SharedClock};
use crate::spawn::Joiner;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::channel::{self, Sender};
use crate::sync::{Condvar, Mutex};

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
    /// The sweeper's own thread, if it has one (see `sweep_drive.rs`): joined by a stop.
    thread: Mutex<Option<Joiner>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let status = &self.sweeper.status;
        status.stop(status.clock.instant());
        self.sweeper.wake();
        let id = self.sweeper.stopper.load(Ordering::Relaxed);
        if id != 0 {
            self.sweeper.fence.forget_stopper(id);
        }
    }
}

#[derive(Debug)]
pub(super) struct Status {
    state: Mutex<State>,
    changed: Condvar,
    /// Set by a stop: a pass under way ends after the row it is deleting.
    stop_requested: AtomicBool,
    /// The fence's clock: schedules and waits read it (SPEC E9).
    clock: SharedClock,
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

    pub(super) fn is_running(&self) -> bool {
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
    pub(super) fn stop(&self, deadline: Instant) -> bool {
        self.stop_requested.store(true, Ordering::Relaxed);
        let mut state = self.state.lock();
        state.ended = true;
        self.changed.notify_all();
        while state.busy {
            if clock::wait_until(&*self.clock, &self.changed, &mut state, deadline) {
                return !state.busy;
            }
        }
        true
    }

    /// Waits until `done` holds or `timeout` passed; answers whether it holds.
    fn wait(&self, timeout: Duration, done: impl Fn(&State) -> bool) -> bool {
        let deadline = clock::deadline_after(&*self.clock, timeout);
        let mut state = self.state.lock();
        while !done(&state) {
            if clock::wait_until(&*self.clock, &self.changed, &mut state, deadline) {
                return done(&state);
            }
        }
        true
    }
}

/// Wakes whatever drives a sweeper's passes (its own thread, or the engine's background
/// thread): a pass was asked for, or the sweeper stopped.
pub(crate) type Waker = Arc<dyn Fn() + Send + Sync>;

/// One background sweeper, as the thread that drives it runs it.
pub(super) struct Sweeper {
    fence: Fence,
    namespaces: Mutex<SweepNamespaces>,
    cursors: Mutex<HashMap<Namespace, Cursor>>,
    interval: Duration,
    next_due: Mutex<Instant>,
    /// Waiting for the next pass: each is sent its report.
    kicks: Mutex<Vec<Sender<SweepPass>>>,
    pub(super) status: Arc<Status>,
    /// Its id among the fence's drivers (0 before it is enlisted).
    stopper: AtomicU64,
    wake: Waker,
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
    /// Wakes the thread that drives this sweeper.
    pub(super) fn wake(&self) {
        (self.wake)();
    }

    /// When the next pass is due (at once if one was asked for); `None` once stopped.
    pub(super) fn next_due(&self) -> Option<Instant> {
        if !self.status.is_running() {
            return None;
        }
        if !self.kicks.lock().is_empty() {
            return Some(self.status.clock.instant());
        }
        Some(*self.next_due.lock())
    }

    /// Runs one pass, unless stopped, and answers whoever asked for one. `yield_now` cuts the
    /// pass short (after the row it is deleting) when the driving thread has something more
    /// urgent to do; the pass then resumes at once, where it stopped, on the next call.
    pub(super) fn run(&self, yield_now: &dyn Fn() -> bool) {
        let replies = std::mem::take(&mut *self.kicks.lock());
        *self.next_due.lock() = clock::deadline_after(&*self.status.clock, self.interval);
        if !self.status.begin_pass() {
            return; // stopped: touch nothing more
        }
        let status = &self.status;
        let yielded = AtomicBool::new(false);
        let stop = || {
            if status.stop_requested.load(Ordering::Relaxed) {
                return true;
            }
            let urgent = yield_now();
            if urgent {
                yielded.store(true, Ordering::Relaxed);
            }
            urgent
        };
        let pass = catch_unwind(AssertUnwindSafe(|| {
            let namespaces = self.namespaces.lock();
            self.fence
                .sweep_pass(&**namespaces, &mut self.cursors.lock(), &stop)
        }))
        .unwrap_or_else(|_| {
            log::warn!("a lease sweep pass panicked; the sweeper carries on at the next one");
            SweepPass::default()
        });
        if yielded.load(Ordering::Relaxed) {
            // Cut short for something more urgent: resume right after it.
            *self.next_due.lock() = self.status.clock.instant();
        }
        status.update(|s| {
            s.passes += 1;
            s.last = Some(pass);
            s.busy = false;
        });
        // The sweeper's thread holds no lock here (SPEC E8).
        let events = self.fence.events();
        events.emit(|| crate::observe::Event::Swept { pass });
        events.deliver();
        for reply in replies {
            let _ = reply.send(pass);
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
        self.shared.sweeper.wake();
        clock::recv_timeout(&*self.status().clock, &answer, timeout).ok()
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
        let status = self.status();
        let stopped = status.stop(clock::deadline_after(&*status.clock, timeout));
        self.shared.sweeper.wake();
        if stopped {
            self.join_thread();
        }
        stopped
    }

    /// Waits for the sweeper's own thread to end, if it has one and this is not it: once
    /// stopped and idle it ends at once, dropping the fence and the store it holds.
    fn join_thread(&self) {
        let mut thread = self.shared.thread.lock();
        if thread.as_ref().is_some_and(|t| !t.is_current())
            && let Some(t) = thread.take()
        {
            drop(thread);
            let _ = t.join();
        }
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
        let bell = Arc::new(super::sweep_drive::Bell::new(self.inner.clock.clone()));
        let ring = Arc::clone(&bell);
        let (handle, sweeper) =
            self.new_sweeper(interval, namespaces, Arc::new(move || ring.ring()))?;
        // On failure, dropping the handle stops and discharges the sweeper.
        let thread = super::sweep_drive::own_thread(&self.spawner(), sweeper, bell)?;
        *handle.shared.thread.lock() = Some(thread);
        log::debug!("lease sweeper started on its own thread (every {interval:?})");
        Ok(handle)
    }

    /// A sweeper whose passes the caller drives (the engine's background thread): `wake` is
    /// called when a pass is asked for or the sweeper stops.
    pub(crate) fn sweeper_driven_by(
        &self,
        interval: Duration,
        namespaces: SweepNamespaces,
        wake: Waker,
    ) -> Result<(SweeperHandle, super::sweep_drive::SweepDuty)> {
        let (handle, sweeper) = self.new_sweeper(interval, namespaces, wake)?;
        Ok((handle, super::sweep_drive::SweepDuty::new(sweeper)))
    }

    fn new_sweeper(
        &self,
        interval: Duration,
        namespaces: SweepNamespaces,
        wake: Waker,
    ) -> Result<(SweeperHandle, Arc<Sweeper>)> {
        if interval.is_zero() {
            return Err(Error::invalid("the sweep interval must be above zero"));
        }
        let status = Arc::new(Status {
            state: Mutex::default(),
            changed: Condvar::new(),
            stop_requested: AtomicBool::new(false),
            clock: self.inner.clock.clone(),
        });
        let sweeper = Arc::new(Sweeper {
            fence: self.clone(),
            namespaces: Mutex::new(namespaces),
            cursors: Mutex::new(HashMap::default()),
            interval,
            next_due: Mutex::new(clock::deadline_after(&*status.clock, interval)),
            kicks: Mutex::new(Vec::new()),
            status: Arc::clone(&status),
            stopper: AtomicU64::new(0),
            wake: Arc::clone(&wake),
        });
        let stopper = Arc::new(move |deadline: Instant| {
            let stopped = status.stop(deadline);
            wake();
            stopped
        });
        let Some(id) = self.enlist_stopper(stopper) else {
            return Err(Error::Closed);
        };
        sweeper.stopper.store(id, Ordering::Relaxed);
        let handle = SweeperHandle {
            shared: Arc::new(Shared {
                sweeper: Arc::clone(&sweeper),
                thread: Mutex::new(None),
            }),
        };
        Ok((handle, sweeper))
    }
}
