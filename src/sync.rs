//! Controlled synchronisation (SPEC E9): the locks, condition variables, atomics, channels,
//! one-time cells and per-thread marks the library uses, in one place.
//!
//! In production this module *is* parking_lot (locks, condvars), std (atomics, `OnceLock`) and
//! crossbeam (channels), re-exported as they are: no wrapper, no cost. With the test-only cargo
//! feature `simulation`, each type becomes a thin wrapper with the same API that uses shuttle's
//! primitive when it is created inside a simulation (a shuttle execution, which then schedules
//! every lock, wait, notification and atomic access) and parking_lot's or std's otherwise, so
//! every other test runs as before in the same build (docs/SIMULATION.md).
//!
//! Timed waits do not belong here: they go through the clock ([`crate::clock::wait_until`],
//! [`crate::clock::recv_timeout`]), so a simulation can move time itself. Starting threads and
//! background tasks goes through [`crate::spawn::Spawner`].
//!
//! This module may call only std, parking_lot, crossbeam and (under the feature) shuttle.

#[cfg(not(feature = "simulation"))]
pub use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(feature = "simulation"))]
pub use std::sync::OnceLock;

/// Atomics: std's in production; under the feature `simulation`, wrappers whose every access
/// is a scheduling point inside a simulation.
#[cfg(not(feature = "simulation"))]
pub mod atomic {
    pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
}

/// Channels: crossbeam's in production; under the feature `simulation`, a small channel over
/// this module's mutex and condvar with the API the library uses.
#[cfg(not(feature = "simulation"))]
pub mod channel {
    pub use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, bounded};
}

// The wrappers keep parking_lot's whole API that the library might use, not only what it uses
// today, so moving code onto them stays mechanical.
#[cfg(feature = "simulation")]
#[allow(dead_code)]
mod sim;
#[cfg(feature = "simulation")]
#[allow(dead_code)]
pub mod sim_atomic;
#[cfg(feature = "simulation")]
#[allow(dead_code)]
pub mod sim_channel;
#[cfg(feature = "simulation")]
pub(crate) use sim::next_generation;
#[cfg(feature = "simulation")]
pub use sim::{
    Condvar, CondvarWaker, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
#[cfg(feature = "simulation")]
pub use sim_atomic as atomic;
#[cfg(feature = "simulation")]
pub use sim_channel as channel;

/// The hasher of the library's hash maps: std's random one in production; under the feature
/// `simulation` a fixed one, so that iteration order (which entity a loop visits first, which
/// driver a stop cancels first) is the same in two runs of a seed.
#[cfg(not(feature = "simulation"))]
pub type RandomState = std::collections::hash_map::RandomState;
/// The hasher of the library's hash maps (see the production definition).
#[cfg(feature = "simulation")]
pub type RandomState = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
/// std's `HashMap` with [`RandomState`].
pub type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
/// std's `HashSet` with [`RandomState`].
pub type HashSet<K> = std::collections::HashSet<K, RandomState>;

/// Inside a simulation, a number in place of a random one (a grant seed, a segment's salt, a
/// handle's number): distinct for each call within the simulation, and the same in two runs of
/// a seed. `None` outside a simulation, where the caller draws a random one as before.
#[inline]
pub(crate) fn simulated_unique() -> Option<u64> {
    #[cfg(feature = "simulation")]
    if simulating() {
        std::thread_local! {
            // Per thread: a simulation runs on one thread, and one running at once on another
            // thread must not take numbers from this one's count (its trace would change).
            static NEXT: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((u64::MAX, 0)) };
        }
        let generation = sim::generation();
        let count = NEXT.with(|next| {
            let (seen, count) = next.get();
            let count = if seen == generation { count + 1 } else { 1 };
            next.set((generation, count));
            count
        });
        // An odd multiplier is a bijection on u64: distinct counts give distinct numbers.
        return Some(count.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    }
    None
}

/// Whether the calling thread runs inside a simulation (always false without the feature
/// `simulation`).
#[inline]
pub fn simulating() -> bool {
    #[cfg(feature = "simulation")]
    {
        shuttle::current::try_get_current_task().is_some()
    }
    #[cfg(not(feature = "simulation"))]
    {
        false
    }
}

/// A number naming the running task among the simulation's tasks (0 outside a simulation,
/// where a thread is a task), with the simulation's number in its high bits. Per-thread state
/// keyed by it stays per task when a simulation runs every task on one thread.
#[cfg(feature = "simulation")]
pub(crate) fn task_key() -> u64 {
    match shuttle::current::try_get_current_task() {
        Some(id) => sim::generation() << 32 | (usize::from(id) as u64 + 1),
        None => 0,
    }
}

/// A per-thread value that stays per *task* inside a simulation, where every task runs on the
/// same thread. Declared with [`task_local!`](crate::task_local); read with
/// [`with`](TaskLocal::with). Without the feature `simulation` the macro declares a plain
/// `thread_local!` instead, with the same `with`.
#[cfg(feature = "simulation")]
pub(crate) struct TaskLocal<T: 'static> {
    cells: &'static TaskCells<T>,
    init: fn() -> T,
}

/// Each task's value of a [`TaskLocal`], by task.
#[cfg(feature = "simulation")]
pub(crate) type TaskCells<T> =
    std::thread::LocalKey<std::cell::RefCell<Vec<(u64, std::rc::Rc<T>)>>>;

#[cfg(feature = "simulation")]
impl<T: 'static> TaskLocal<T> {
    #[doc(hidden)]
    pub(crate) const fn new(cells: &'static TaskCells<T>, init: fn() -> T) -> Self {
        TaskLocal { cells, init }
    }

    /// Calls `f` with this task's value (made on first use). Values of the tasks of an earlier
    /// simulation are dropped when the first task of a later one asks.
    pub(crate) fn with<R>(&'static self, f: impl FnOnce(&T) -> R) -> R {
        let key = task_key();
        let value = self.cells.with(|cells| {
            let found = cells
                .borrow()
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone());
            match found {
                Some(v) => v,
                None => {
                    let v = std::rc::Rc::new((self.init)());
                    let mut cells = cells.borrow_mut();
                    cells.retain(|(k, _)| *k >> 32 == key >> 32);
                    cells.push((key, v.clone()));
                    v
                }
            }
        });
        f(&value)
    }
}

/// Declares per-thread values that stay per task inside a simulation (see `TaskLocal`).
#[cfg(feature = "simulation")]
#[macro_export]
#[doc(hidden)]
macro_rules! task_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = const { $init:expr };) => {
        $crate::task_local! { $(#[$attr])* static $name: $t = $init; }
    };
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        $(#[$attr])*
        static $name: $crate::sync::TaskLocal<$t> = {
            ::std::thread_local! {
                static CELLS: ::std::cell::RefCell<::std::vec::Vec<(u64, ::std::rc::Rc<$t>)>> =
                    const { ::std::cell::RefCell::new(::std::vec::Vec::new()) };
            }
            fn init() -> $t {
                $init
            }
            $crate::sync::TaskLocal::new(&CELLS, init)
        };
    };
}

/// Declares per-thread values: `thread_local!` (with the feature `simulation`, values that stay
/// per task inside a simulation).
#[cfg(not(feature = "simulation"))]
#[macro_export]
#[doc(hidden)]
macro_rules! task_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = const { $init:expr };) => {
        ::std::thread_local! {
            $(#[$attr])*
            static $name: $t = const { $init };
        }
    };
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        ::std::thread_local! {
            $(#[$attr])*
            static $name: $t = $init;
        }
    };
}
