//! The simulation's numbering of per-task values (`sim.rs`).

use super::{generation, next_generation};

/// Simulations run at once on several threads (the simulator's lanes in one test process):
/// one starting elsewhere must not renumber this one's per-task values mid-run.
#[test]
fn a_simulation_started_on_another_thread_keeps_this_threads_number() {
    next_generation();
    let mine = generation();
    let theirs = std::thread::spawn(|| {
        next_generation();
        generation()
    })
    .join()
    .unwrap();
    assert_ne!(theirs, mine, "two simulations share a number");
    assert_eq!(generation(), mine);
}

/// A timed wait registers its timer with the simulated clock, and registering lets the clock's
/// task run: it may fire the timer before the waiting task waits. The wait must not then wait
/// for a wake-up that already came (the simulator reported a deadlock of a group-commit
/// leader gathering commits, seed 1011065 of its long lane, that no real clock can make).
#[test]
fn a_timer_fired_before_its_waiter_waits_is_not_lost() {
    use std::time::Duration;

    use crate::clock::{Clock, SimClock};
    use crate::sync::{Condvar, Mutex};

    shuttle::check_random(
        || {
            let clock = SimClock::new(0, Duration::from_secs(10));
            let ticker = {
                let clock = clock.clone();
                shuttle::thread::spawn(move || clock.run_timers())
            };
            let lock = Mutex::new(());
            let cv = Condvar::new();
            let deadline = clock.instant() + Duration::from_millis(1);
            let mut held = lock.lock();
            while !crate::clock::wait_until(&clock, &cv, &mut held, deadline) {}
            drop(held);
            clock.stop();
            ticker.join().unwrap();
        },
        2_000,
    );
}
