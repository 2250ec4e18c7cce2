//! The simulated clock (feature `simulation`, SPEC E9): virtual monotonic time that moves only
//! when a timed wait is due, and a [`ManualClock`] for the wall clock that moves with it (and
//! jumps when the simulation says so).
//!
//! A timed wait on a simulated condvar registers a timer here ([`Clock::wake_at`]) and waits
//! untimed; [`SimClock::run_timers`], run by one task of the simulation, fires the earliest
//! timer: it lets the other tasks run a few steps (more for a longer wait), then moves the
//! clock to the timer's deadline and wakes its waiters. So a wait times out at any point of
//! the schedule the scheduler picks, never because real time passed, and a seed replays it.
//! Under [`QuietTime`](super::QuietTime) the clock's task runs only when no other task can, so
//! time moves only while every task waits, and [`SimClock::latest_return`] tells whether a
//! timed wait returned later than its deadline.
//! Past a horizon of virtual time the timers stop firing: whatever still waits then waits for
//! ever, and the scheduler reports the waiting tasks as deadlocked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Clock, CondvarWaker, ManualClock};
use crate::sync::{Condvar, Mutex};

/// A simulated clock (see the module documentation). Clones share the same time. Make it
/// inside the simulation (its lock and condvar are the simulation's).
#[derive(Clone, Debug)]
pub struct SimClock {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    wall: ManualClock,
    base: Instant,
    mono_ns: AtomicU64,
    timers: Mutex<Timers>,
    changed: Condvar,
    horizon: Duration,
}

#[derive(Debug, Default)]
struct Timers {
    pending: Vec<(Instant, CondvarWaker)>,
    stopped: bool,
    fired: u64,
    past_horizon: bool,
    /// The timed wait that returned latest after its deadline: by how much, and which task.
    latest_return: Option<(Duration, String)>,
}

impl SimClock {
    /// A clock whose wall clock stands at `wall_ms`, with timers firing up to `horizon` of
    /// virtual time.
    pub fn new(wall_ms: u64, horizon: Duration) -> Self {
        // Per-task values of an earlier simulation on this thread are not this one's.
        crate::sync::next_generation();
        SimClock {
            shared: Arc::new(Shared {
                wall: ManualClock::new(wall_ms),
                base: Instant::now(),
                mono_ns: AtomicU64::new(0),
                timers: Mutex::new(Timers::default()),
                changed: Condvar::new(),
                horizon,
            }),
        }
    }

    /// The wall clock, to jump it (forward to expire leases, backward to model skew).
    pub fn wall(&self) -> &ManualClock {
        &self.shared.wall
    }

    /// Virtual monotonic time since the clock was made.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.shared.mono_ns.load(Ordering::SeqCst))
    }

    /// Timers fired so far.
    pub fn fired(&self) -> u64 {
        self.shared.timers.lock().fired
    }

    /// Whether virtual time reached the horizon (timers no longer fire).
    pub fn past_horizon(&self) -> bool {
        self.shared.timers.lock().past_horizon
    }

    /// The timed wait that returned latest after its deadline so far: by how much, and the
    /// name of the task that waited. `None` if none returned late.
    ///
    /// A timed wait returns once its lock is free again. When time moves only while every
    /// other task waits (the simulator's quiet-time schedules), a late return means the lock
    /// was held by a task that was itself waiting for time to pass: a wait longer than its
    /// bound.
    pub fn latest_return(&self) -> Option<(Duration, String)> {
        self.shared.timers.lock().latest_return.clone()
    }

    /// Sleeps `duration` of virtual time (a simulated device or network that is slow).
    pub fn sleep(&self, duration: Duration) {
        super::sleep(self, duration);
    }

    /// Moves virtual time (and the wall clock with it) forward by `by`.
    fn advance(&self, by: Duration) {
        let before = self.shared.mono_ns.load(Ordering::SeqCst);
        let after = before.saturating_add(by.as_nanos().min(u64::MAX as u128) as u64);
        self.shared.mono_ns.store(after, Ordering::SeqCst);
        let ms = after / 1_000_000 - before / 1_000_000;
        if ms > 0 {
            self.shared.wall.advance(ms);
        }
    }

    /// Fires timers until [`stop`](Self::stop): run this in one task of the simulation.
    pub fn run_timers(&self) {
        // Fired timers whose wait has not returned: woken again until it does. A wake-up can
        // reach the condvar in the instant before its waiter waits (the waiter's release of its
        // lock inside the wait is a point where this task may run), and would be lost.
        let mut unanswered: Vec<CondvarWaker> = Vec::new();
        loop {
            unanswered.retain(CondvarWaker::awaited);
            for waker in &unanswered {
                waker.wake();
            }
            let mut timers = self.shared.timers.lock();
            if timers.stopped {
                return;
            }
            if timers.pending.is_empty() {
                if unanswered.is_empty() {
                    self.shared.changed.wait(&mut timers);
                } else {
                    drop(timers);
                    shuttle::thread::yield_now();
                }
                continue;
            }
            let next = earliest(&timers.pending);
            drop(timers);
            // The others get some steps before time moves, more for a longer wait.
            let ahead = next.saturating_duration_since(self.instant());
            let yields = (ahead.as_millis() / 5).clamp(1, 64);
            for _ in 0..yields {
                shuttle::thread::yield_now();
            }
            let mut timers = self.shared.timers.lock();
            if timers.stopped {
                return;
            }
            if timers.pending.is_empty() {
                continue;
            }
            let next = earliest(&timers.pending);
            let now = self.instant();
            if next > now {
                if self.elapsed() + (next - now) > self.shared.horizon {
                    // Nothing more fires: a task still waiting waits for ever.
                    timers.past_horizon = true;
                    log::warn!(
                        "simulated time reached its horizon ({:?}); timers stop",
                        self.shared.horizon
                    );
                    while !timers.stopped {
                        self.shared.changed.wait(&mut timers);
                    }
                    return;
                }
                self.advance(next - now);
            }
            let now = self.instant();
            let mut due = Vec::new();
            timers.pending.retain(|(at, waker)| {
                let keep = *at > now;
                if !keep {
                    due.push(waker.clone());
                }
                keep
            });
            timers.fired += due.len() as u64;
            drop(timers);
            for waker in &due {
                waker.wake();
            }
            unanswered.extend(due);
        }
    }

    /// Stops [`run_timers`](Self::run_timers).
    pub fn stop(&self) {
        self.shared.timers.lock().stopped = true;
        self.shared.changed.notify_all();
    }
}

fn earliest(pending: &[(Instant, CondvarWaker)]) -> Instant {
    pending
        .iter()
        .map(|(at, _)| *at)
        .min()
        .expect("timers are pending")
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        self.shared.wall.now_ms()
    }

    fn instant(&self) -> Instant {
        self.shared.base + Duration::from_nanos(self.shared.mono_ns.load(Ordering::SeqCst))
    }

    fn wake_at(&self, deadline: Instant, waker: CondvarWaker) {
        self.shared.timers.lock().pending.push((deadline, waker));
        self.shared.changed.notify_all();
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn timed_wait_returned(&self, deadline: Instant) {
        let late = self.instant().saturating_duration_since(deadline);
        if late.is_zero() {
            return;
        }
        let mut timers = self.shared.timers.lock();
        if timers.latest_return.as_ref().is_none_or(|(l, _)| late > *l) {
            let me = shuttle::current::me();
            let name = shuttle::current::get_name_for_task(me)
                .map_or_else(|| format!("{me:?}"), String::from);
            timers.latest_return = Some((late, name));
        }
    }
}

#[cfg(test)]
mod tests;
