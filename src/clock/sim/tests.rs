//! How late timed waits return (`SimClock::latest_return`), the measure behind the
//! simulator's bounded-wait check.

use std::sync::Arc;
use std::time::Duration;

use shuttle::Runner;
use shuttle::scheduler::RandomScheduler;

use crate::clock::{CLOCK_TASK, Clock, QuietTime, SimClock};
use crate::sync::{Condvar, Mutex};

/// Task `waiter` waits on `cv` for 1 ms of virtual time; task `holder` then takes the lock and
/// sleeps 10 ms, holding it only if `hold_across_sleep`. Answers the clock's latest return.
fn waiter_and_sleeper(hold_across_sleep: bool) -> Option<(Duration, String)> {
    let clock = SimClock::new(0, Duration::from_secs(10));
    let ticker = {
        let clock = clock.clone();
        shuttle::thread::Builder::new()
            .name(CLOCK_TASK.into())
            .spawn(move || clock.run_timers())
            .unwrap()
    };
    let shared = Arc::new((Mutex::new(false), Condvar::new()));
    let waiter = {
        let (clock, shared) = (clock.clone(), shared.clone());
        shuttle::thread::Builder::new()
            .name("waiter".into())
            .spawn(move || {
                let (lock, cv) = &*shared;
                let mut waiting = lock.lock();
                *waiting = true;
                let deadline = clock.instant() + Duration::from_millis(1);
                while !crate::clock::wait_until(&clock, cv, &mut waiting, deadline) {}
            })
            .unwrap()
    };
    let holder = {
        let (clock, shared) = (clock.clone(), shared.clone());
        shuttle::thread::spawn(move || {
            // Only once the waiter waits (it gave the lock back inside its wait).
            loop {
                let held = shared.0.lock();
                if *held {
                    if hold_across_sleep {
                        clock.sleep(Duration::from_millis(10));
                    } else {
                        drop(held);
                        clock.sleep(Duration::from_millis(10));
                    }
                    break;
                }
                drop(held);
                shuttle::thread::yield_now();
            }
        })
    };
    waiter.join().unwrap();
    holder.join().unwrap();
    clock.stop();
    ticker.join().unwrap();
    clock.latest_return()
}

/// Runs `f` under 200 random schedules in which time moves only while every other task waits.
fn in_quiet_time(f: impl Fn() + Send + Sync + 'static) {
    let scheduler = QuietTime::new(RandomScheduler::new_from_seed(7, 200), true);
    Runner::new(scheduler, Default::default()).run(f);
}

/// A wait whose lock is held by a task sleeping on the clock returns late, and the clock names
/// the waiting task; the same wait returns on time when the sleeper gives the lock back first.
#[test]
fn a_wait_held_up_by_a_lock_kept_across_a_sleep_is_reported_late() {
    in_quiet_time(|| {
        let (late, task) = waiter_and_sleeper(true).expect("the wait returned late");
        assert!(late >= Duration::from_millis(9), "late by {late:?} only");
        assert_eq!(task, "waiter");
    });
    in_quiet_time(|| assert_eq!(waiter_and_sleeper(false), None));
}
