//! Observability (SPEC E8): one [`Listener`] for the [`Event`]s of every subsystem, the
//! [`Degraded`] flag a stats snapshot carries, sync latencies ([`LatencyStats`]), and the
//! optional `metrics` and `tracing` integrations (cargo features of the same names, off by
//! default).
//!
//! # Delivery
//!
//! An event is *emitted* where it happens, often under an internal lock: emitting only pushes
//! it onto the queue of its hub (a leaf mutex held for the push). It is *delivered*, that is
//! handed to the listener, later, by a thread that holds no lock of the store or the engine:
//!
//! - a file store opened on its own delivers at the end of each of its calls (its public
//!   methods, after every lock of the call is released), at the end of open, and at the end
//!   of each background task (a compaction run, a heads snapshot, a periodic sync);
//! - an engine delivers at the end of each outermost public call (a call made from inside a
//!   closure, a hook or a listener leaves the delivery to the call around it), after each
//!   entity its warm restores, and after each background step (a renewal of the owner lease,
//!   a sweep pass); the store it opened shares its hub and leaves the calls the engine makes
//!   to the engine, delivering only from its own background tasks.
//!
//! One thread delivers at a time, in the order the events were emitted; a thread that finds
//! another delivering leaves its events to it. A listener may call back into the store or the
//! engine: an event emitted meanwhile waits until the listener returns. A listener that
//! panics loses that event only (logged at `warn`). `Engine::close` from inside a listener
//! answers [`Error::WouldDeadlock`](crate::Error::WouldDeadlock): the listener may run on a
//! thread close waits for. Listeners should be quick, as RocksDB asks of its event listeners:
//! one runs on a thread doing the store's work (a committer, a compaction).
//!
//! Without a listener a hub is `None`: emitting and delivering cost one branch, and nothing is
//! built (events are made by closures that only run when a listener is set).
//!
//! Owns: [`Event`], [`Listener`], the hub (`Events`), [`Degraded`], [`LatencyStats`], the
//! `span!` macro for the `tracing` feature, and the `metrics` module (feature `metrics`). Calls
//! only the listener; every layer may use it, like `clock.rs` and `error.rs`.

mod event;
mod health;
mod latency;
#[cfg(feature = "metrics")]
pub mod metrics;

use crate::sync::atomic::{AtomicBool, Ordering};
use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::sync::Mutex;

pub use event::{CompactionTrigger, Event, StallPhase};
pub(crate) use health::Health;
pub use health::{Degraded, DegradedCause};
pub(crate) use latency::Latency;
pub use latency::{LATENCY_BUCKETS_US, LatencyStats};

/// Receives the [`Event`]s of a store or an engine (SPEC E8). Called with no internal lock
/// held, on the thread that did the work or on the next call's thread (see the module
/// documentation), one event at a time per store or engine. It may call back into them.
///
/// Any `Fn(&Event) + Send + Sync` is a listener.
///
/// ```
/// use std::sync::Arc;
/// use portcullis::observe::{Event, Listener};
/// use portcullis::store::{Batch, FileStore, Partition, Store};
///
/// # fn main() -> portcullis::Result<()> {
/// let dir = tempfile::tempdir().expect("a temporary directory");
/// let (tx, rx) = std::sync::mpsc::channel();
/// let listener = move |event: &Event| {
///     let _ = tx.send(event.name());
/// };
/// let store = FileStore::builder(dir.path())
///     .listener(Arc::new(listener))
///     .open()?;
/// store.compact()?; // nothing sealed yet: no compaction, no event
/// store.apply(&Partition::new("p")?, &Batch::new().put("k", "v"))?;
/// assert!(rx.try_recv().is_err(), "a healthy store says nothing");
/// # Ok(())
/// # }
/// ```
pub trait Listener: Send + Sync {
    /// One event. Keep it quick; a panic here loses this event only.
    fn on_event(&self, event: &Event);
}

impl<F: Fn(&Event) + Send + Sync> Listener for F {
    fn on_event(&self, event: &Event) {
        self(event)
    }
}

// Per thread, and per task inside a simulation, where every task runs on one thread.
crate::task_local! {
    /// How many listeners this thread is inside (a listener may call a store that delivers).
    static IN_LISTENER: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is running a listener right now.
pub(crate) fn in_listener() -> bool {
    IN_LISTENER.with(Cell::get) > 0
}

/// Where a store's or an engine's events go: `None` without a listener. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Events(Option<Arc<Hub>>);

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Events(listener)"
        } else {
            "Events(none)"
        })
    }
}

struct Hub {
    listener: Arc<dyn Listener>,
    /// Emitted and not yet delivered. A leaf: held only to push or take.
    queue: Mutex<VecDeque<Event>>,
    /// Whether `queue` may hold something (a delivery's cheap first look).
    pending: AtomicBool,
    /// Whether a thread is delivering now (only one does).
    delivering: AtomicBool,
    /// The negative control of the lock rule (feature `test-hooks`): events are handed to the
    /// listener where they are emitted, under whatever lock the emitter holds.
    at_emit: bool,
}

impl Events {
    /// No hub: nothing is told.
    pub(crate) const fn none() -> Events {
        Events(None)
    }

    /// A hub for `listener`. `at_emit` is the test-only negative control (deliver where
    /// emitted, locks held); always false outside the tests.
    pub(crate) fn new(listener: Arc<dyn Listener>, at_emit: bool) -> Events {
        Events(Some(Arc::new(Hub {
            listener,
            queue: Mutex::new(VecDeque::new()),
            pending: AtomicBool::new(false),
            delivering: AtomicBool::new(false),
            at_emit,
        })))
    }

    /// Whether a listener is set.
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Queues the event `make` builds, if a listener is set (else `make` never runs). Safe
    /// under any lock: the queue's mutex is a leaf.
    #[inline]
    pub(crate) fn emit(&self, make: impl FnOnce() -> Event) {
        if let Some(hub) = &self.0 {
            hub.push(make());
        }
    }

    /// Hands every queued event to the listener, unless another thread is doing so (it takes
    /// these too). Call only where this thread holds no lock of the store or the engine.
    #[inline]
    pub(crate) fn deliver(&self) {
        if let Some(hub) = &self.0
            && hub.pending.load(Ordering::SeqCst)
        {
            hub.drain();
        }
    }
}

impl Hub {
    fn push(&self, event: Event) {
        if self.at_emit {
            self.call(&event);
            return;
        }
        let mut queue = self.queue.lock();
        queue.push_back(event);
        self.pending.store(true, Ordering::SeqCst);
    }

    fn drain(&self) {
        loop {
            if self
                .delivering
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                // Another thread (or this one, from inside its listener) is delivering: it
                // looks at the queue again before it stops.
                return;
            }
            loop {
                let batch = {
                    let mut queue = self.queue.lock();
                    self.pending.store(false, Ordering::SeqCst);
                    std::mem::take(&mut *queue)
                };
                if batch.is_empty() {
                    break;
                }
                for event in &batch {
                    self.call(event);
                }
            }
            self.delivering.store(false, Ordering::SeqCst);
            // An event pushed after the last look, by a thread that saw this one delivering.
            if !self.pending.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    fn call(&self, event: &Event) {
        IN_LISTENER.with(|n| n.set(n.get() + 1));
        let called = catch_unwind(AssertUnwindSafe(|| self.listener.on_event(event)));
        IN_LISTENER.with(|n| n.set(n.get() - 1));
        if called.is_err() {
            ::log::warn!(
                "the event listener panicked on {}; the event is dropped",
                event.name()
            );
        }
    }
}

/// A `tracing` span entered until the guard it answers is dropped (feature `tracing`; bind it
/// to a named variable, `let _span = ...`); without the feature, a guard of no size, and the
/// field expressions are not evaluated.
macro_rules! span {
    ($name:literal $(, $field:ident = $value:expr)* $(,)?) => {{
        #[cfg(feature = "tracing")]
        let entered = ::tracing::info_span!(
            $name $(, $field = ::tracing::field::display(&$value))*
        )
        .entered();
        #[cfg(not(feature = "tracing"))]
        let entered = $crate::observe::NoSpan;
        entered
    }};
}
pub(crate) use span;

/// What [`span!`] answers without the `tracing` feature.
#[cfg(not(feature = "tracing"))]
#[must_use]
pub(crate) struct NoSpan;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::sync::Mutex;

    use super::{Event, Events};

    fn stalled(n: u64) -> Event {
        Event::CommitStall {
            phase: super::StallPhase::Sync,
            elapsed: std::time::Duration::from_millis(n),
            threshold: std::time::Duration::ZERO,
        }
    }

    fn millis(e: &Event) -> u64 {
        match e {
            Event::CommitStall { elapsed, .. } => elapsed.as_millis() as u64,
            _ => unreachable!(),
        }
    }

    /// Emitting queues; delivering hands the events over in order, once each.
    #[test]
    fn events_are_delivered_once_in_order_and_only_when_asked() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let events = Events::new(Arc::new(move |e: &Event| log.lock().push(millis(e))), false);
        events.emit(|| stalled(1));
        events.emit(|| stalled(2));
        assert!(seen.lock().is_empty(), "nothing is delivered at emit");
        events.deliver();
        events.deliver();
        assert_eq!(*seen.lock(), [1, 2]);
    }

    /// A listener that emits (as a call back into the store would) does not recurse: its
    /// event is delivered after it returns, by the same delivery.
    #[test]
    fn an_event_emitted_from_inside_the_listener_is_delivered_after_it_returns() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let slot: Arc<Mutex<Option<Events>>> = Arc::new(Mutex::new(None));
        let (log, me) = (Arc::clone(&seen), Arc::clone(&slot));
        let events = Events::new(
            Arc::new(move |e: &Event| {
                let n = millis(e);
                log.lock().push(n);
                assert!(super::in_listener());
                if n == 1 {
                    let events = me.lock().clone().expect("set");
                    events.emit(|| stalled(2));
                    events.deliver(); // delivering already: leaves it to the outer loop
                    assert_eq!(log.lock().len(), 1, "not delivered re-entrantly");
                }
            }),
            false,
        );
        *slot.lock() = Some(events.clone());
        events.emit(|| stalled(1));
        events.deliver();
        assert_eq!(*seen.lock(), [1, 2]);
        assert!(!super::in_listener());
    }

    /// A listener that panics loses that event only.
    #[test]
    fn a_panicking_listener_loses_only_its_event() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let events = Events::new(
            Arc::new(move |e: &Event| {
                let n = millis(e);
                assert!(n != 1, "the listener fails on 1");
                log.lock().push(n);
            }),
            false,
        );
        events.emit(|| stalled(1));
        events.emit(|| stalled(2));
        events.deliver();
        assert_eq!(*seen.lock(), [2]);
    }

    /// Without a listener nothing is built.
    #[test]
    fn without_a_listener_no_event_is_built() {
        let events = Events::default();
        events.emit(|| unreachable!("built without a listener"));
        events.deliver();
        assert!(!events.is_on());
    }
}
