//! What drives a background sweeper's passes (SPEC F9, R11): a thread of its own (for
//! [`Fence::sweep_in_background`](super::Fence::sweep_in_background)), or the engine's
//! background thread, which runs a [`SweepDuty`] between its other duties. Either way a slow
//! store delays only the sweeper it belongs to, and once the sweeper is stopped and its thread
//! joined nothing holds its fence or store any more.
//!
//! Owns the own-thread loop and its wake-up bell. Calls only `sweep.rs`.

use std::sync::Arc;
use std::time::Instant;

use crate::clock::{self, SharedClock};
use crate::spawn::{Joiner, Spawner};
use crate::sync::{Condvar, Mutex};

use super::sweep::Sweeper;
use crate::error::{Error, Result};

/// Wakes a sweeper's own thread before its next pass is due: a pass was asked for, or the
/// sweeper stopped.
#[derive(Debug)]
pub(super) struct Bell {
    rung: Mutex<bool>,
    changed: Condvar,
    /// The fence's clock (SPEC E9).
    clock: SharedClock,
}

impl Bell {
    pub(super) fn new(clock: SharedClock) -> Self {
        Bell {
            rung: Mutex::new(false),
            changed: Condvar::new(),
            clock,
        }
    }

    pub(super) fn ring(&self) {
        *self.rung.lock() = true;
        self.changed.notify_all();
    }

    /// Waits until rung or `until`, whichever is first.
    fn wait_rung(&self, until: Instant) {
        let mut rung = self.rung.lock();
        if !*rung {
            clock::wait_until(&*self.clock, &self.changed, &mut rung, until);
        }
        *rung = false;
    }
}

/// Starts, through `spawner`, the thread that runs `sweeper`'s passes until it stops.
pub(super) fn own_thread(
    spawner: &Spawner,
    sweeper: Arc<Sweeper>,
    bell: Arc<Bell>,
) -> Result<Joiner> {
    spawner
        .thread("portcullis-sweeper", move || {
            while let Some(due) = sweeper.next_due() {
                if bell.clock.instant() < due {
                    bell.wait_rung(due);
                    continue;
                }
                sweeper.run(&|| false);
            }
        })
        .map_err(|e| Error::io("starting the lease sweeper's thread", e))
}

/// A sweeper whose passes another thread drives (the engine's background thread).
#[derive(Clone)]
pub(crate) struct SweepDuty {
    sweeper: Arc<Sweeper>,
}

impl SweepDuty {
    pub(super) fn new(sweeper: Arc<Sweeper>) -> Self {
        SweepDuty { sweeper }
    }

    /// When its next pass is due; `None` once the sweeper stopped.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.sweeper.next_due()
    }

    /// Runs a pass; `yield_now` cuts it short (after the row it is deleting) when the caller
    /// has something more urgent to do, and the pass resumes where it stopped next time.
    pub(crate) fn run(&self, yield_now: &dyn Fn() -> bool) {
        self.sweeper.run(yield_now);
    }
}
