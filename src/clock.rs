//! Injectable clocks (SPEC E4, E9).
//!
//! Every time-dependent rule (batch deadlines, leases, revocation hold-offs) reads time through
//! a [`Clock`], so tests drive time with a [`ManualClock`] instead of sleeping. So does every
//! other use of time in library code: monotonic instants for timeouts, schedules and elapsed
//! times ([`Clock::instant`]), sleeps (`clock::sleep`) and timed waits on a condvar or a channel
//! (`clock::wait_until`, `clock::recv_timeout`). This module is the only place in the library that reads
//! the operating system's clocks or sleeps (a test, `tests/seams.rs`, fails naming any other),
//! so a simulation (feature `simulation`, `SimClock`) can move time itself.
//!
//! [`ManualClock`] moves only the wall clock (`now_ms`); its instants, sleeps and timed waits
//! are the operating system's, as [`SystemClock`]'s, so a test that freezes the wall clock
//! still sees timeouts expire.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::sync::{Condvar, MutexGuard};

#[cfg(feature = "simulation")]
mod sim;
#[cfg(feature = "simulation")]
#[doc(hidden)]
pub use crate::sync::CondvarWaker;
#[cfg(feature = "simulation")]
mod quiet;
#[cfg(feature = "simulation")]
pub use quiet::{CLOCK_TASK, QuietTime};
#[cfg(feature = "simulation")]
pub use sim::SimClock;

/// A source of wall-clock milliseconds and of monotonic time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch (or since any fixed origin shared by related clocks).
    fn now_ms(&self) -> u64;

    /// The monotonic time: for timeouts, schedules and elapsed times. The default is the
    /// operating system's monotonic clock.
    fn instant(&self) -> Instant {
        Instant::now()
    }

    /// Asks the clock to wake `waker` once its monotonic time reaches `deadline` (a simulated
    /// timed wait). Only a simulated clock keeps timers; the default does nothing.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    fn wake_at(&self, deadline: Instant, waker: CondvarWaker) {
        let _ = (deadline, waker);
    }

    /// Whether this clock keeps its own timers (a simulated clock), so sleeps and timed waits
    /// must ask it rather than the operating system.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    fn is_simulated(&self) -> bool {
        false
    }

    /// Told when a simulated timed wait with `deadline` returns, so a simulated clock can
    /// measure how late waits return. The default does nothing.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    fn timed_wait_returned(&self, deadline: Instant) {
        let _ = deadline;
    }
}

/// Waits on `cv` (giving `guard`'s lock back meanwhile) until it is notified or `clock`'s
/// monotonic time reaches `deadline`; answers whether the deadline has passed. Like any condvar
/// wait it may return early: callers re-check their condition in a loop.
pub(crate) fn wait_until<T>(
    clock: &dyn Clock,
    cv: &Condvar,
    guard: &mut MutexGuard<'_, T>,
    deadline: Instant,
) -> bool {
    #[cfg(feature = "simulation")]
    if let Some(waker) = cv.sim_waker() {
        if clock.instant() >= deadline {
            return true;
        }
        // Registering the timer lets the clock's task run, and it may fire before this waits:
        // the clock wakes a fired timer again until its wait returned (it holds `waker` until
        // then), so the wake-up is not lost.
        clock.wake_at(deadline, waker.clone());
        cv.wait(guard);
        drop(waker);
        clock.timed_wait_returned(deadline);
        return clock.instant() >= deadline;
    }
    let _ = clock;
    cv.wait_until(guard, deadline).timed_out()
}

/// Receives from `rx`, waiting at most `timeout` of `clock`'s monotonic time.
pub(crate) fn recv_timeout<T>(
    clock: &dyn Clock,
    rx: &crate::sync::channel::Receiver<T>,
    timeout: Duration,
) -> Result<T, crate::sync::channel::RecvTimeoutError> {
    #[cfg(feature = "simulation")]
    {
        rx.recv_deadline(clock, deadline_after(clock, timeout))
    }
    #[cfg(not(feature = "simulation"))]
    {
        let _ = clock;
        rx.recv_timeout(timeout)
    }
}

/// Sleeps `duration` of `clock`'s monotonic time (the operating system's sleep, unless the
/// clock is simulated).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn sleep(clock: &dyn Clock, duration: Duration) {
    #[cfg(feature = "simulation")]
    if clock.is_simulated() {
        let lock = crate::sync::Mutex::new(());
        let cv = Condvar::new();
        let deadline = deadline_after(clock, duration);
        let mut held = lock.lock();
        while !wait_until(clock, &cv, &mut held, deadline) {}
        return;
    }
    let _ = clock;
    std::thread::sleep(duration)
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// ```
/// use portcullis::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// clock.advance(500);
/// assert_eq!(clock.now_ms(), 1_500);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(now_ms)),
        }
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms` (it may move backwards, to model skew).
    pub fn set(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The instant `timeout` of `clock`'s monotonic time from now, for a timed wait. A timeout too
/// long to add (`Duration::MAX`, say) saturates about 136 years ahead instead of panicking: bad
/// input never panics (SPEC E1).
pub(crate) fn deadline_after(clock: &dyn Clock, timeout: Duration) -> Instant {
    let now = clock.instant();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}
