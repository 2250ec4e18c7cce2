//! The engine's lifecycle (SPEC R11): every public call is counted while it runs; `close` stops
//! new calls, stops the warm and every background driver, waits for calls in flight, all
//! within one bound ([`EngineBuilder::close_timeout`](super::EngineBuilder::close_timeout)),
//! and only then records a clean shutdown and closes the store. Dropping the last handle does
//! the same, logging any error.
//!
//! `close` from inside a call, closure, hook or restore unit of the same engine would wait for
//! itself: it is refused with [`Error::WouldDeadlock`].

use std::sync::Arc;

use crate::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::sync::{Condvar, Mutex};

use super::{Engine, Inner, incarnation};
use crate::clock::{self, Clock};
use crate::error::{Error, Result};
use crate::restore::StateMachine;

/// The top bit of the call counter: set once close has begun.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Calls in flight, and whether close has begun.
#[derive(Default)]
pub(super) struct Lifecycle {
    /// In-flight calls in the low bits, [`CLOSED`] in the top bit.
    calls: AtomicUsize,
    /// Woken when the last call in flight ends after close began.
    idle: Mutex<()>,
    idle_cv: Condvar,
    /// Whether a close ran (or runs): later closes answer at once.
    closing: Mutex<bool>,
}

/// One public call in flight; ends it when dropped.
pub(super) struct Call<'a> {
    lifecycle: &'a Lifecycle,
    /// Set for the outermost call of this engine on this thread when a listener is set: its
    /// end delivers the events (SPEC E8), every lock of the call released by then.
    events: Option<&'a crate::observe::Events>,
    _mark: crate::restore::CallMark,
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        // Still counted as in flight, and still marked: a listener that closes the engine
        // from here is refused instead of waiting for itself.
        if let Some(events) = self.events {
            events.deliver();
        }
        let before = self.lifecycle.calls.fetch_sub(1, Ordering::AcqRel);
        if before == CLOSED | 1 {
            let _idle = self.lifecycle.idle.lock();
            self.lifecycle.idle_cv.notify_all();
        }
    }
}

impl Lifecycle {
    pub(super) fn is_closed(&self) -> bool {
        self.calls.load(Ordering::Acquire) & CLOSED != 0
    }

    fn in_flight(&self) -> usize {
        self.calls.load(Ordering::Acquire) & !CLOSED
    }

    /// Waits until no call is in flight, or `deadline`; returns whether none is.
    fn wait_idle(&self, clock: &dyn Clock, deadline: Instant) -> bool {
        let mut idle = self.idle.lock();
        while self.in_flight() != 0 {
            if clock::wait_until(clock, &self.idle_cv, &mut idle, deadline) {
                return self.in_flight() == 0;
            }
        }
        true
    }
}

impl<M: StateMachine> Engine<M> {
    /// Counts one public call until the guard drops, or answers [`Error::Closed`].
    pub(super) fn enter(&self) -> Result<Call<'_>> {
        let lifecycle = &self.inner.lifecycle;
        // A background thread that died is started again (one atomic load when it is alive).
        self.inner.background.watch();
        let before = lifecycle.calls.fetch_add(1, Ordering::AcqRel);
        let events = &self.inner.watch.events;
        // Looked at before this call's own mark is set.
        let outermost = events.is_on() && !self.inner.restorer.inside_engine();
        let call = Call {
            lifecycle,
            events: outermost.then_some(events),
            _mark: self.inner.restorer.in_call(),
        };
        if before & CLOSED != 0 {
            return Err(Error::Closed);
        }
        Ok(call)
    }

    /// Closes the engine (SPEC R11): later calls answer [`Error::Closed`]; the warm and every
    /// background driver are stopped; calls in flight are waited for; then a clean shutdown
    /// is recorded, every namespace this engine serves is released (SPEC F11), and the store
    /// is closed if this engine opened it from a directory (a store handed in with
    /// [`EngineBuilder::store`](super::EngineBuilder::store) belongs to the caller and stays
    /// open for other engines). Closing twice is harmless (the second close answers
    /// `Ok` at once). Dropping the last handle closes the same way, logging any error: call
    /// `close` to get the error.
    ///
    /// Bounded by [`close_timeout`](super::EngineBuilder::close_timeout): if a restore unit, a
    /// driver or a call is still running when it passes, `close` answers
    /// [`Error::Unavailable`] naming what did not finish, and the incarnation is **not**
    /// marked clean (the next open runs the unclean-restart repair). Called from inside a
    /// call, closure, hook or restore unit of this engine it would wait for itself, and is
    /// refused with [`Error::WouldDeadlock`].
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
    /// let clicks = EntityId::new("counters", "clicks")?;
    /// engine.register(&clicks)?;
    /// engine.append_typed(&clicks, &[1])?;
    /// engine.close()?; // waits for calls in flight, then closes the store
    /// assert!(engine.read(&clicks, |t| *t).is_err()); // closed
    /// # Ok(())
    /// # }
    /// ```
    pub fn close(&self) -> Result<()> {
        if crate::observe::in_listener() {
            return Err(Error::WouldDeadlock {
                entity: String::new(),
                detail: "close was called from inside an event listener, which may run on a thread close waits for; close from another thread".to_owned(),
            });
        }
        if self.inner.restorer.inside_engine() {
            return Err(Error::WouldDeadlock {
                entity: String::new(),
                detail: "close was called from inside a call, closure, hook or restore unit of the same engine, which it would wait for".to_owned(),
            });
        }
        self.inner.shutdown()
    }
}

impl<M: StateMachine> Engine<M> {
    /// Test-only (feature `test-hooks`): ends the engine as a crashed process would. Later
    /// calls answer [`Error::Closed`]; the warm and every background driver and the owner lease
    /// renewer are stopped; nothing is released and no clean shutdown is recorded, so the next
    /// holder owes repairs. The owner lease is made to lapse at once, as if its time had passed
    /// since the crash, so an engine with the same owner id can open right away. Forget the
    /// handle afterwards (dropping it would close it).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn crash_for_test(&self) {
        let inner = &self.inner;
        inner.lifecycle.calls.fetch_or(CLOSED, Ordering::AcqRel);
        *inner.lifecycle.closing.lock() = true;
        for warm in [
            inner.warm.lock().clone(),
            inner.background_warm.lock().clone(),
        ]
        .into_iter()
        .flatten()
        {
            warm.stop();
        }
        let deadline =
            crate::clock::deadline_after(&*inner.clock, std::time::Duration::from_secs(10));
        inner.fence.stop_drivers(deadline);
        inner.background.stop(deadline);
        if let Err(e) = inner.owners.liveness.lapse() {
            ::log::warn!("a crashed engine's owner lease could not be made to lapse: {e}");
        }
    }
}

impl<M: StateMachine> Engine<M> {
    /// Test-only (feature `test-hooks`): the engine's background thread panics outside its
    /// guarded duties at its next wake-up, as a bug would kill it, so tests can show the death
    /// is noticed (SPEC R11).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn kill_background_for_test(&self) {
        self.inner.background.kill_for_test();
    }
}

impl<M: StateMachine> Inner<M> {
    /// Stops everything within the close bound, then records the clean shutdown.
    pub(super) fn shutdown(&self) -> Result<()> {
        let mut closing = self.lifecycle.closing.lock();
        if *closing {
            return Ok(());
        }
        *closing = true;
        self.lifecycle.calls.fetch_or(CLOSED, Ordering::AcqRel);
        let timeout = if self.owners.switches().close_waits_unbounded {
            // Past any simulation's horizon: close waits as long as what it waits for.
            std::time::Duration::from_secs(365 * 24 * 3600)
        } else {
            self.close_timeout
        };
        let deadline = crate::clock::deadline_after(&*self.clock, timeout);
        let mut unfinished = Vec::new();
        if !self.stop_warm(deadline) {
            unfinished.push("the warm (a restore unit is still running)".to_owned());
        }
        if !self.fence.stop_drivers(deadline) {
            unfinished.push("a background driver (revocation or the lease sweeper)".to_owned());
        }
        if !self.owners.switches().close_leaves_background && !self.background.stop(deadline) {
            unfinished.push(
                "the background thread (an owner lease renewal or a sweep is still running)"
                    .to_owned(),
            );
        }
        if !self.lifecycle.wait_idle(&*self.clock, deadline) {
            unfinished.push(format!("{} calls in flight", self.lifecycle.in_flight()));
        }
        // A warm started by a call that was in flight when close began.
        if unfinished.is_empty() && !self.stop_warm(deadline) {
            unfinished.push("the warm (a restore unit is still running)".to_owned());
        }
        if !unfinished.is_empty() {
            let reason = format!(
                "close gave up after {:?}: {} did not finish; the incarnation is not marked clean, so the next open runs the unclean-restart repair",
                self.close_timeout,
                unfinished.join(", ")
            );
            ::log::warn!("{reason}");
            return Err(Error::Unavailable {
                reason,
                retry_after_ms: 0,
            });
        }
        // Release every namespace this engine serves, so the next holder owes no repair for
        // this term; owed repairs pass on unless every entity of the namespace had them
        // (restored here, or its repair row says so; an error keeps them owed, SPEC F11).
        let mut first_error = None;
        for (ns, _) in self.owners.all_held() {
            // Bounded by the close deadline: past it, the repairs stay owed (SPEC R11).
            let bound = (!self.owners.switches().unbounded_repair_check).then_some(deadline);
            let all_repaired = self.restorer.all_repaired_in(&ns, bound);
            if let Err(e) = self.owners.release(&ns, all_repaired) {
                ::log::warn!("could not release namespace {ns} at close: {e}");
                first_error.get_or_insert(e);
            }
        }
        self.owners.liveness.end();
        incarnation::end_clean(&*self.store, &self.incarnation)?;
        // The store belongs to whoever opened it: only one opened from a directory is closed.
        let closed = if self.owns_store {
            self.store.close()
        } else {
            Ok(())
        };
        // What the shutdown and the store's close told (SPEC E8); no lock is held here.
        self.watch.events.deliver();
        closed?;
        first_error.map_or(Ok(()), Err)
    }

    /// Stops the current warm and the background warm and waits for them until `deadline`;
    /// returns whether they ended.
    fn stop_warm(&self, deadline: Instant) -> bool {
        let warms = [
            self.warm.lock().clone(),
            self.background_warm.lock().clone(),
        ];
        let warms: Vec<_> = warms.into_iter().flatten().collect();
        for warm in &warms {
            warm.stop();
        }
        warms
            .iter()
            .all(|w| w.wait_timeout(deadline.saturating_duration_since(self.clock.instant())))
    }
}

/// Held only by the application's handles. When the last one is dropped, the engine closes
/// there and then, on the application's thread: an engine thread that happens to hold `Inner`
/// for a moment (the background thread renewing the owner lease, a warm worker) can never end
/// up running the close, the machine's `destroy` or the states' destructors after the drop
/// returned (SPEC R11, E3).
pub(super) struct LastHandle<M: StateMachine>(pub(super) Arc<Inner<M>>);

impl<M: StateMachine> Drop for LastHandle<M> {
    fn drop(&mut self) {
        // Unwinding: `Inner`'s own drop records no clean shutdown.
        if !std::thread::panicking()
            && let Err(e) = self.0.shutdown()
        {
            ::log::error!("closing the engine when its last handle was dropped failed: {e}");
        }
    }
}

impl<M: StateMachine> Drop for Inner<M> {
    /// The last handle is gone: close cleanly, like [`Engine::close`], logging any error. A
    /// drop while the thread unwinds from a panic records no clean shutdown (the application
    /// may have been interrupted mid-operation: the next open runs the repair).
    fn drop(&mut self) {
        if std::thread::panicking() {
            ::log::warn!(
                "the engine was dropped while unwinding from a panic; it is not marked clean, so the next open runs the unclean-restart repair"
            );
            self.lifecycle.calls.fetch_or(CLOSED, Ordering::AcqRel);
            for warm in [
                self.warm.lock().clone(),
                self.background_warm.lock().clone(),
            ]
            .into_iter()
            .flatten()
            {
                warm.stop();
            }
            // Ask the drivers (revocations, the lease sweeper, the background thread) to stop;
            // wait for none. The owner lease then expires by itself.
            self.fence.stop_drivers(self.clock.instant());
            self.background.stop(self.clock.instant());
            self.owners.liveness.end();
            return;
        }
        if let Err(e) = self.shutdown() {
            ::log::error!("closing the engine when its last handle was dropped failed: {e}");
        }
    }
}
