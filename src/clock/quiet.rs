//! Quiet time (feature `simulation`): schedules in which virtual time moves only while every
//! other task waits, so a wait can be held to its bound (docs/SIMULATION.md, "Bounded waits").
//!
//! The simulated clock's task fires timers after letting the others run a few steps, so in
//! most schedules time also moves while tasks are busy: timeouts then fire at any point, which
//! is what explores them, but how long a call took in virtual time says nothing about its
//! bound. [`QuietTime`] wraps a scheduler and offers it the clock's task only when no other
//! task can run. Time then passes only while everyone waits: a timed wait that returns later
//! than its deadline waited for a lock held by a task that was itself waiting for time (or
//! for a slow device), and a call given a time bound that takes longer broke it.

use shuttle::scheduler::{Schedule, Scheduler, Task, TaskId};

/// The name the task running [`SimClock::run_timers`](super::SimClock::run_timers) must have
/// for [`QuietTime`] to know it.
pub const CLOCK_TASK: &str = "sim-clock";

/// A shuttle scheduler that offers `inner` the clock's task (the one named [`CLOCK_TASK`])
/// only when no other task can run, when `quiet`; otherwise it passes every choice through.
pub struct QuietTime<S> {
    inner: S,
    quiet: bool,
    clock: Option<TaskId>,
}

impl<S> std::fmt::Debug for QuietTime<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuietTime")
            .field("quiet", &self.quiet)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<S: Scheduler> QuietTime<S> {
    /// Wraps `inner`; `quiet: false` leaves its choices as they are.
    pub fn new(inner: S, quiet: bool) -> Self {
        QuietTime {
            inner,
            quiet,
            clock: None,
        }
    }
}

impl<S: Scheduler> Scheduler for QuietTime<S> {
    fn new_execution(&mut self) -> Option<Schedule> {
        self.clock = None;
        self.inner.new_execution()
    }

    fn next_task(
        &mut self,
        runnable: &[&Task],
        current: Option<TaskId>,
        is_yielding: bool,
    ) -> Option<TaskId> {
        if !self.quiet || runnable.len() < 2 {
            return self.inner.next_task(runnable, current, is_yielding);
        }
        if self.clock.is_none() {
            self.clock = runnable
                .iter()
                .find(|t| t.name().as_deref() == Some(CLOCK_TASK))
                .map(|t| t.id());
        }
        let Some(clock) = self.clock else {
            return self.inner.next_task(runnable, current, is_yielding);
        };
        if !runnable.iter().any(|t| t.id() == clock) {
            return self.inner.next_task(runnable, current, is_yielding);
        }
        let others: Vec<&Task> = runnable
            .iter()
            .copied()
            .filter(|t| t.id() != clock)
            .collect();
        self.inner.next_task(&others, current, is_yielding)
    }

    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }
}
