//! The engine's background thread (SPEC F9, F12, R6, R11): one thread per engine
//! (`portcullis-engine`) renews the owner lease every `(owner_lease - lease_margin) / 2` of real
//! time, drives the expired-lease sweeper every `sweep_interval`, and starts the background
//! warm when work is owed (`duty.rs`). A slow store delays only its own engine. The thread is
//! started through the engine's spawner and keeps time by the engine's clock (SPEC E9).
//!
//! The renewal comes first: a sweep pass yields (after the row it is deleting) as soon as a
//! renewal is due, and resumes right after it, so a long sweep never lets the owner lease lapse.
//! The warm itself runs on the engine's pool; this thread only starts it.
//!
//! Close stops the thread and joins it, bounded by the close deadline, so once `close` returns
//! nothing of the engine's holds its fence, store or pool on this thread. A thread that dies
//! (a panic outside the guarded duties) is noticed: it is marked dead at once, a log line says
//! so, `EngineStats::background` shows it, and the engine's next call starts it again.
//!
//! Calls the duties given at start (the owners' renewal, the sweeper, the warm duty); holds no
//! lock of its own while it runs them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::clock::{self, SharedClock, deadline_after};
use crate::error::{Error, Result};
use crate::fence::{SweepDuty, SweepWaker};
use crate::spawn::{Joiner, Spawner};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// A renewal of the owner lease.
pub(crate) type Renew = Box<dyn Fn() -> Result<()> + Send + Sync>;

/// Starts the background warm of what is owed, if anything is.
pub(crate) type WarmDuty = Box<dyn Fn() + Send + Sync>;

/// What the thread does.
pub(crate) struct Duties {
    /// The owner lease renewal and its interval, unless renewal is off.
    pub(crate) renew: Option<(Duration, Renew)>,
    /// The background warm, unless it is off; set once the engine exists.
    pub(crate) warm: OnceLock<WarmDuty>,
    /// Whether the background warm is on.
    pub(crate) warm_on: bool,
}

/// Counters of the engine's background thread.
///
/// # Examples
///
/// ```
/// use portcullis::{ApplyContext, Engine, EntityId, Rejection, Typed, TypedMachine};
///
/// struct Total; // the sum of the numbers written
/// impl TypedMachine for Total {
///     type Record = u64;
///     type State = u64;
///     fn fresh(&self, _: &EntityId) -> u64 { 0 }
///     fn apply(&self, t: &mut u64, _: &ApplyContext, n: u64) -> Result<(), Rejection> { *t += n; Ok(()) }
/// }
/// # fn main() -> portcullis::Result<()> {
/// let store = std::sync::Arc::new(portcullis::store::MemoryStore::new());
/// let engine = Engine::builder(Typed(Total)).store(store).open()?;
/// let background = engine.stats().background;
/// assert!(background.running);
/// assert_eq!(background.restarts, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackgroundStats {
    /// Whether the thread runs (false once closed, when it has nothing to do, or when it died
    /// and the engine has not been called since).
    pub running: bool,
    /// Times it died and was started again.
    pub restarts: u64,
    /// Why it last died, if it did.
    pub last_death: Option<String>,
    /// The background warm's progress, if one was started.
    pub warm: Option<crate::restore::WarmProgress>,
}

#[derive(Default)]
struct State {
    stop: bool,
    /// The thread has ended (stopped, or died).
    ended: bool,
    warm_due: bool,
    sweeper: Option<SweepDuty>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stopping: AtomicBool,
    /// The thread ended without being stopped.
    died: AtomicBool,
    restarts: AtomicU64,
    last_death: Mutex<Option<String>>,
    /// Test-only: the thread panics outside its guarded duties at its next wake-up.
    kill: AtomicBool,
    /// The engine's clock: the schedule and the waits read it (SPEC E9).
    clock: SharedClock,
    /// The engine's event hub (SPEC E8): a death is told, and events are delivered after each
    /// round of duties.
    events: crate::observe::Events,
}

/// The engine's background thread and its duties.
pub(crate) struct Background {
    shared: Arc<Shared>,
    duties: Arc<Duties>,
    thread: Mutex<Option<Joiner>>,
    /// Test-only negative control: a thread that died is not started again.
    unwatched: bool,
    /// Starts the thread (SPEC E9).
    spawner: Spawner,
}

impl Background {
    /// The background of an engine with these duties; the thread starts with [`start`].
    ///
    /// [`start`]: Self::start
    pub(crate) fn new(
        duties: Duties,
        unwatched: bool,
        clock: SharedClock,
        spawner: Spawner,
        events: crate::observe::Events,
    ) -> Self {
        Background {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                changed: Condvar::new(),
                stopping: AtomicBool::new(false),
                died: AtomicBool::new(false),
                restarts: AtomicU64::new(0),
                last_death: Mutex::new(None),
                kill: AtomicBool::new(false),
                clock,
                events,
            }),
            duties: Arc::new(duties),
            thread: Mutex::new(None),
            unwatched,
            spawner,
        }
    }

    pub(crate) fn duties(&self) -> &Duties {
        &self.duties
    }

    /// Starts the thread.
    pub(crate) fn start(&self) -> Result<()> {
        let mut thread = self.thread.lock();
        {
            let mut state = self.shared.state.lock();
            if state.stop {
                return Ok(());
            }
            state.ended = false;
        }
        self.shared.died.store(false, Ordering::Release);
        let (shared, duties) = (Arc::clone(&self.shared), Arc::clone(&self.duties));
        let spawned = self
            .spawner
            .thread("portcullis-engine", move || run(&shared, &duties))
            .map_err(|e| Error::io("starting the engine's background thread", e))?;
        *thread = Some(spawned);
        Ok(())
    }

    /// Wakes the thread: a duty became due.
    fn nudge(&self) {
        let _state = self.shared.state.lock();
        self.shared.changed.notify_all();
    }

    /// A waker for the sweeper this thread drives (it holds no reference to the thread).
    pub(crate) fn waker(&self) -> SweepWaker {
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        Arc::new(move || {
            if let Some(shared) = shared.upgrade() {
                let _state = shared.state.lock();
                shared.changed.notify_all();
            }
        })
    }

    /// Hands the sweeper to the thread.
    pub(crate) fn set_sweeper(&self, duty: SweepDuty) {
        self.shared.state.lock().sweeper = Some(duty);
        self.nudge();
    }

    /// A call that tells the thread the background warm has something to do, holding no
    /// reference to the engine (a warm's end runs it on a pool thread).
    pub(crate) fn warm_due_waker(&self) -> Box<dyn Fn() + Send + Sync> {
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        let warm_on = self.duties.warm_on;
        Box::new(move || {
            if let Some(shared) = shared.upgrade().filter(|_| warm_on) {
                shared.state.lock().warm_due = true;
                shared.changed.notify_all();
            }
        })
    }

    /// The background warm has something to do.
    pub(crate) fn warm_due(&self) {
        if !self.duties.warm_on {
            return;
        }
        self.shared.state.lock().warm_due = true;
        self.nudge();
    }

    /// Starts the thread again if it died (its duties are guarded, so only a bug outside them
    /// kills it); called at the start of every engine call, so it costs one atomic load.
    #[inline]
    pub(crate) fn watch(&self) {
        if self.shared.died.load(Ordering::Acquire) && !self.unwatched {
            self.restart();
        }
    }

    #[cold]
    fn restart(&self) {
        if !self.shared.died.swap(false, Ordering::AcqRel) {
            return; // another call restarted it
        }
        if let Some(dead) = self.thread.lock().take() {
            let _ = dead.join();
        }
        self.shared.restarts.fetch_add(1, Ordering::Relaxed);
        match self.start() {
            Ok(()) => ::log::warn!("the engine's background thread was started again"),
            Err(e) => {
                self.shared.died.store(true, Ordering::Release);
                ::log::error!("the engine's background thread could not be started again: {e}");
            }
        }
    }

    /// Stops the thread and waits for it until `deadline` (a duty under way finishes first);
    /// answers whether it ended. Once it has, nothing of the engine's is held on it.
    pub(crate) fn stop(&self, deadline: Instant) -> bool {
        // Lock order: the thread's handle, then the state.
        let (started, on_it) = {
            let thread = self.thread.lock();
            let on_it = thread.as_ref().is_some_and(Joiner::is_current);
            (thread.is_some(), on_it)
        };
        if on_it {
            // The engine's last handle went on this thread (a duty held it): it ends after
            // that duty returns.
            self.shared.state.lock().stop = true;
            self.shared.stopping.store(true, Ordering::Release);
            return true;
        }
        let mut state = self.shared.state.lock();
        state.stop = true;
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.changed.notify_all();
        while started && !state.ended {
            let shared = &self.shared;
            if clock::wait_until(&*shared.clock, &shared.changed, &mut state, deadline) {
                return state.ended;
            }
        }
        // The sweeper (and through it the fence, store and pool) goes now.
        let sweeper = state.sweeper.take();
        drop(state);
        drop(sweeper);
        if let Some(thread) = self.thread.lock().take()
            && !thread.is_current()
        {
            let _ = thread.join();
        }
        true
    }

    /// Why the thread is dead now, if it died and was not started again (SPEC E8): until the
    /// engine's next call, for ever if starting it again failed (or deaths are unwatched).
    pub(crate) fn dead(&self) -> Option<String> {
        if !self.shared.died.load(Ordering::Acquire) {
            return None;
        }
        Some(
            self.shared
                .last_death
                .lock()
                .clone()
                .unwrap_or_else(|| "it died".to_owned()),
        )
    }

    pub(crate) fn stats(&self) -> (bool, u64, Option<String>) {
        let running = self.thread.lock().is_some() && !self.shared.state.lock().ended;
        (
            running,
            self.shared.restarts.load(Ordering::Relaxed),
            self.shared.last_death.lock().clone(),
        )
    }

    /// Test-only: the thread panics outside its guarded duties at its next wake-up (a bug that
    /// kills it), so tests can show the death is noticed.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn kill_for_test(&self) {
        self.shared.kill.store(true, Ordering::Release);
        self.nudge();
    }
}

/// Marks the thread ended when it returns or unwinds; an unwind is a death, logged and told to
/// the listener (SPEC E8; the thread holds no lock when the watch drops).
struct Watch<'a>(&'a Shared);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.ended = true;
        let mut died = None;
        if !state.stop {
            let why = if std::thread::panicking() {
                "it panicked outside its guarded duties"
            } else {
                "it returned without being stopped"
            };
            ::log::error!(
                "the engine's background thread died ({why}); owner lease renewals, lease sweeps \
                 and the background warm wait until the engine's next call starts it again"
            );
            *self.0.last_death.lock() = Some(why.to_owned());
            self.0.died.store(true, Ordering::Release);
            died = Some(why);
        }
        drop(state);
        self.0.changed.notify_all();
        if let Some(why) = died {
            let events = &self.0.events;
            events.emit(|| crate::observe::Event::BackgroundThreadEnded {
                thread: "portcullis-engine".to_owned(),
                reason: format!(
                    "{why}; owner lease renewals, lease sweeps and the background warm wait until \
                     the engine's next call starts it again"
                ),
            });
            events.deliver();
        }
    }
}

/// Runs `f`, catching a panic so one failed duty does not end the thread.
fn guarded(what: &str, f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        ::log::warn!("the engine's background {what} panicked; the next one runs as usual");
    }
}

fn run(shared: &Shared, duties: &Duties) {
    let _watch = Watch(shared);
    let mut next_renewal = duties
        .renew
        .as_ref()
        .map(|(i, _)| deadline_after(&*shared.clock, *i));
    let mut state = shared.state.lock();
    loop {
        if shared.kill.swap(false, Ordering::AcqRel) {
            panic!("the engine's background thread was killed for a test");
        }
        if state.stop {
            return;
        }
        // Read before `now`: a pass asked for is due "now" as of this read.
        let sweep_at = state.sweeper.as_ref().and_then(SweepDuty::next_due);
        let now = shared.clock.instant();
        let renew_due = next_renewal.is_some_and(|at| now >= at);
        let warm_due = std::mem::take(&mut state.warm_due);
        let sweeper = state
            .sweeper
            .as_ref()
            .filter(|_| sweep_at.is_some_and(|at| now >= at))
            .cloned();
        if !renew_due && !warm_due && sweeper.is_none() {
            match [next_renewal, sweep_at].into_iter().flatten().min() {
                Some(at) => {
                    clock::wait_until(&*shared.clock, &shared.changed, &mut state, at);
                }
                None => shared.changed.wait(&mut state),
            }
            continue;
        }
        MutexGuard::unlocked(&mut state, || {
            if renew_due && let Some((interval, renew)) = &duties.renew {
                next_renewal = Some(deadline_after(&*shared.clock, *interval));
                guarded("owner lease renewal", || match renew() {
                    Ok(()) => ::log::debug!("owner lease renewed"),
                    Err(e) => ::log::warn!("the owner lease was not renewed: {e}"),
                });
            }
            if warm_due && let Some(warm) = duties.warm.get() {
                guarded("warm", warm);
            }
            if let Some(sweeper) = sweeper {
                // A renewal due (or a stop) cuts the pass short; it resumes right after.
                let yield_now = || {
                    shared.stopping.load(Ordering::Acquire)
                        || next_renewal.is_some_and(|at| shared.clock.instant() >= at)
                };
                guarded("lease sweep", || sweeper.run(&yield_now));
            }
            // This thread holds no lock here (SPEC E8): what the duties told (a failed
            // renewal, a sweep pass, a deposition) reaches the listener now.
            shared.events.deliver();
        });
    }
}
