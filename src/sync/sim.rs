//! The locks, condvar and one-time cell of [`crate::sync`] under the feature `simulation`:
//! parking_lot's API over parking_lot (created outside a simulation) or shuttle (created
//! inside one). Which one is fixed when the value is made; a condvar and the guard it waits
//! with must be of the same kind (a mix is a bug in the simulator and panics).
//!
//! Shuttle's locks report poisoning; parking_lot's do not, so a poisoned shuttle lock is taken
//! as it is. Shuttle's read-write lock cannot downgrade a write guard: under a simulation
//! [`RwLockWriteGuard::downgrade`] releases the write lock and takes a read lock, so another
//! writer may come in between (the simulation explores more schedules than the real lock
//! allows there, never fewer).

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use shuttle::sync as sh;

/// The last simulation number handed out, process-wide: each simulation gets a number no other
/// has, so per-task values of simulations running at once on other threads never share keys.
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// The number of the simulation running on this thread (a simulation runs every task on
    /// the thread that started it). Per thread, so a simulation starting on another thread
    /// does not renumber this one's per-task values in the middle of its run.
    static GENERATION: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The number of the simulation under way on this thread.
pub(crate) fn generation() -> u64 {
    GENERATION.with(|g| g.get()) & 0xffff_ffff
}

/// Starts a new simulation's numbering of per-task values, on this thread.
pub(crate) fn next_generation() {
    let next = GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1;
    GENERATION.with(|g| g.set(next));
}

fn ok<G>(r: Result<G, std::sync::PoisonError<G>>) -> G {
    r.unwrap_or_else(std::sync::PoisonError::into_inner)
}

const MIXED: &str = "a lock made outside the simulation was used with a condvar made inside it \
                     (or the reverse)";

// ---------------------------------------------------------------------------------------------
// Mutex

/// A mutex with parking_lot's API (see the module documentation).
pub struct Mutex<T> {
    kind: MutexKind<T>,
}

enum MutexKind<T> {
    Real(parking_lot::Mutex<T>),
    Sim(Box<sh::Mutex<T>>),
}

/// A held [`Mutex`].
pub struct MutexGuard<'a, T> {
    lock: &'a Mutex<T>,
    kind: GuardKind<'a, T>,
}

enum GuardKind<'a, T> {
    Real(parking_lot::MutexGuard<'a, T>),
    /// `None` only while a wait has given the lock back.
    Sim(Option<sh::MutexGuard<'a, T>>),
}

impl<T> Mutex<T> {
    /// A mutex holding `value`.
    pub fn new(value: T) -> Self {
        let kind = if super::simulating() {
            MutexKind::Sim(Box::new(sh::Mutex::new(value)))
        } else {
            MutexKind::Real(parking_lot::Mutex::new(value))
        };
        Mutex { kind }
    }

    /// Takes the lock, waiting for it.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let kind = match &self.kind {
            MutexKind::Real(m) => GuardKind::Real(m.lock()),
            MutexKind::Sim(m) => GuardKind::Sim(Some(ok(m.lock()))),
        };
        MutexGuard { lock: self, kind }
    }

    /// Takes the lock if it is free.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let kind = match &self.kind {
            MutexKind::Real(m) => GuardKind::Real(m.try_lock()?),
            MutexKind::Sim(m) => match m.try_lock() {
                Ok(g) => GuardKind::Sim(Some(g)),
                Err(std::sync::TryLockError::Poisoned(p)) => GuardKind::Sim(Some(p.into_inner())),
                Err(std::sync::TryLockError::WouldBlock) => return None,
            },
        };
        Some(MutexGuard { lock: self, kind })
    }

    /// The value, through exclusive access.
    pub fn get_mut(&mut self) -> &mut T {
        match &mut self.kind {
            MutexKind::Real(m) => m.get_mut(),
            MutexKind::Sim(m) => ok(m.get_mut()),
        }
    }

    /// The value.
    pub fn into_inner(self) -> T {
        match self.kind {
            MutexKind::Real(m) => m.into_inner(),
            MutexKind::Sim(m) => ok((*m).into_inner()),
        }
    }

    fn relock(&self) -> sh::MutexGuard<'_, T> {
        match &self.kind {
            MutexKind::Sim(m) => ok(m.lock()),
            MutexKind::Real(_) => unreachable!("a real mutex is never relocked here"),
        }
    }
}

impl<'a, T> MutexGuard<'a, T> {
    /// Gives the lock back while `f` runs, then takes it again (parking_lot's
    /// `MutexGuard::unlocked`).
    pub fn unlocked<U>(guard: &mut Self, f: impl FnOnce() -> U) -> U {
        match &mut guard.kind {
            GuardKind::Real(g) => parking_lot::MutexGuard::unlocked(g, f),
            GuardKind::Sim(g) => {
                drop(g.take());
                let out = f();
                *g = Some(guard.lock.relock());
                out
            }
        }
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.kind {
            GuardKind::Real(g) => g,
            GuardKind::Sim(g) => g.as_ref().expect("the guard holds its lock"),
        }
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.kind {
            GuardKind::Real(g) => g,
            GuardKind::Sim(g) => g.as_mut().expect("the guard holds its lock"),
        }
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.try_lock() {
            Some(g) => f.debug_struct("Mutex").field("data", &*g).finish(),
            None => f.write_str("Mutex { <locked> }"),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

// ---------------------------------------------------------------------------------------------
// Condvar

/// A condition variable with parking_lot's API (see the module documentation). Timed waits go
/// through the clock (`crate::clock::wait_until`).
pub struct Condvar {
    kind: CondvarKind,
}

enum CondvarKind {
    Real(parking_lot::Condvar),
    Sim(Arc<sh::Condvar>),
}

/// Whether a timed wait ended because its time ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// Whether the wait timed out.
    pub fn timed_out(self) -> bool {
        self.0
    }
}

/// Wakes a simulated condvar's waiters when a simulated timer fires (see `SimClock`), one per
/// timed wait. A wake-up can come before the waiter waits (registering the timer, and
/// releasing the waiter's lock inside the wait, are points where the clock's task may run),
/// and a condvar forgets a notification nobody waits for: so the clock wakes a fired timer's
/// waker again until its wait returned ([`CondvarWaker::awaited`]).
#[derive(Clone)]
pub struct CondvarWaker {
    cv: Arc<sh::Condvar>,
    /// Held by the timed wait too, until it returns (see [`CondvarWaker::awaited`]).
    wait: Arc<()>,
}

impl CondvarWaker {
    /// Wakes every waiter of the condvar (they re-check their deadline).
    pub fn wake(&self) {
        self.cv.notify_all();
    }

    /// Whether the timed wait this waker was made for has not returned yet (it holds the
    /// other handle on `wait`).
    pub fn awaited(&self) -> bool {
        Arc::strong_count(&self.wait) > 1
    }
}

impl fmt::Debug for CondvarWaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CondvarWaker")
    }
}

impl Condvar {
    /// A condvar nobody waits on.
    pub fn new() -> Self {
        let kind = if super::simulating() {
            CondvarKind::Sim(Arc::new(sh::Condvar::new()))
        } else {
            CondvarKind::Real(parking_lot::Condvar::new())
        };
        Condvar { kind }
    }

    /// Gives `guard`'s lock back and waits for a notification, then takes the lock again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        match (&self.kind, &mut guard.kind) {
            (CondvarKind::Real(c), GuardKind::Real(g)) => c.wait(g),
            (CondvarKind::Sim(c), GuardKind::Sim(g)) => {
                let held = g.take().expect("the guard holds its lock");
                *g = Some(ok(c.wait(held)));
            }
            _ => panic!("{MIXED}"),
        }
    }

    /// As parking_lot's `wait_until` on a real condvar. Library code waits with a deadline
    /// through [`crate::clock::wait_until`], which handles simulated condvars.
    pub(crate) fn wait_until<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        match (&self.kind, &mut guard.kind) {
            (CondvarKind::Real(c), GuardKind::Real(g)) => {
                WaitTimeoutResult(c.wait_until(g, deadline).timed_out())
            }
            _ => panic!("a simulated condvar waits with a deadline only through the clock"),
        }
    }

    /// The waker a simulated timer uses, if this condvar is simulated.
    pub(crate) fn sim_waker(&self) -> Option<CondvarWaker> {
        match &self.kind {
            CondvarKind::Sim(c) => Some(CondvarWaker {
                cv: c.clone(),
                wait: Arc::default(),
            }),
            CondvarKind::Real(_) => None,
        }
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        match &self.kind {
            CondvarKind::Real(c) => {
                c.notify_one();
            }
            CondvarKind::Sim(c) => c.notify_one(),
        }
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        match &self.kind {
            CondvarKind::Real(c) => {
                c.notify_all();
            }
            CondvarKind::Sim(c) => c.notify_all(),
        }
    }
}

impl Default for Condvar {
    fn default() -> Self {
        Condvar::new()
    }
}

impl fmt::Debug for Condvar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Condvar { .. }")
    }
}

// ---------------------------------------------------------------------------------------------
// RwLock

/// A read-write lock with parking_lot's API (see the module documentation).
pub struct RwLock<T> {
    kind: RwKind<T>,
}

enum RwKind<T> {
    Real(parking_lot::RwLock<T>),
    Sim(Box<sh::RwLock<T>>),
}

/// A read-held [`RwLock`].
pub struct RwLockReadGuard<'a, T> {
    kind: ReadKind<'a, T>,
}

enum ReadKind<'a, T> {
    Real(parking_lot::RwLockReadGuard<'a, T>),
    Sim(sh::RwLockReadGuard<'a, T>),
}

/// A write-held [`RwLock`].
pub struct RwLockWriteGuard<'a, T> {
    lock: &'a RwLock<T>,
    kind: WriteKind<'a, T>,
}

enum WriteKind<'a, T> {
    Real(parking_lot::RwLockWriteGuard<'a, T>),
    Sim(sh::RwLockWriteGuard<'a, T>),
}

impl<T> RwLock<T> {
    /// A lock holding `value`.
    pub fn new(value: T) -> Self {
        let kind = if super::simulating() {
            RwKind::Sim(Box::new(sh::RwLock::new(value)))
        } else {
            RwKind::Real(parking_lot::RwLock::new(value))
        };
        RwLock { kind }
    }

    /// Takes the lock for reading.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let kind = match &self.kind {
            RwKind::Real(l) => ReadKind::Real(l.read()),
            RwKind::Sim(l) => ReadKind::Sim(ok(l.read())),
        };
        RwLockReadGuard { kind }
    }

    /// Takes the lock for writing.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let kind = match &self.kind {
            RwKind::Real(l) => WriteKind::Real(l.write()),
            RwKind::Sim(l) => WriteKind::Sim(ok(l.write())),
        };
        RwLockWriteGuard { lock: self, kind }
    }

    /// Takes the lock for reading if no writer holds it.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let kind = match &self.kind {
            RwKind::Real(l) => ReadKind::Real(l.try_read()?),
            RwKind::Sim(l) => match l.try_read() {
                Ok(g) => ReadKind::Sim(g),
                Err(std::sync::TryLockError::Poisoned(p)) => ReadKind::Sim(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => return None,
            },
        };
        Some(RwLockReadGuard { kind })
    }

    /// Takes the lock for writing if nobody holds it.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let kind = match &self.kind {
            RwKind::Real(l) => WriteKind::Real(l.try_write()?),
            RwKind::Sim(l) => match l.try_write() {
                Ok(g) => WriteKind::Sim(g),
                Err(std::sync::TryLockError::Poisoned(p)) => WriteKind::Sim(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => return None,
            },
        };
        Some(RwLockWriteGuard { lock: self, kind })
    }

    /// The value, through exclusive access.
    pub fn get_mut(&mut self) -> &mut T {
        match &mut self.kind {
            RwKind::Real(l) => l.get_mut(),
            RwKind::Sim(l) => ok(l.get_mut()),
        }
    }

    /// The value.
    pub fn into_inner(self) -> T {
        match self.kind {
            RwKind::Real(l) => l.into_inner(),
            RwKind::Sim(l) => ok((*l).into_inner()),
        }
    }
}

impl<'a, T> RwLockWriteGuard<'a, T> {
    /// Turns a write hold into a read hold (see the module documentation for the simulated
    /// lock).
    pub fn downgrade(guard: Self) -> RwLockReadGuard<'a, T> {
        let RwLockWriteGuard { lock, kind } = guard;
        match kind {
            WriteKind::Real(g) => RwLockReadGuard {
                kind: ReadKind::Real(parking_lot::RwLockWriteGuard::downgrade(g)),
            },
            WriteKind::Sim(g) => {
                drop(g);
                lock.read()
            }
        }
    }
}

impl<T> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.kind {
            ReadKind::Real(g) => g,
            ReadKind::Sim(g) => g,
        }
    }
}

impl<T> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.kind {
            WriteKind::Real(g) => g,
            WriteKind::Sim(g) => g,
        }
    }
}

impl<T> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.kind {
            WriteKind::Real(g) => g,
            WriteKind::Sim(g) => g,
        }
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        RwLock::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.try_read() {
            Some(g) => f.debug_struct("RwLock").field("data", &*g).finish(),
            None => f.write_str("RwLock { <locked> }"),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: fmt::Debug> fmt::Debug for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

// ---------------------------------------------------------------------------------------------
// OnceLock

/// std's `OnceLock`, whose first initialisation is serialised by a [`Mutex`]: inside a
/// simulation an initialiser that reaches a scheduling point lets another task in, which must
/// wait on the simulation's lock, not on std's (that would block every task at once).
pub struct OnceLock<T> {
    cell: std::sync::OnceLock<T>,
    init: Mutex<()>,
}

impl<T> OnceLock<T> {
    /// An empty cell.
    pub fn new() -> Self {
        OnceLock {
            cell: std::sync::OnceLock::new(),
            init: Mutex::new(()),
        }
    }

    /// The value, if set.
    pub fn get(&self) -> Option<&T> {
        self.cell.get()
    }

    /// Sets the value unless it is set; gives `value` back if it was.
    pub fn set(&self, value: T) -> Result<(), T> {
        let _one = self.init.lock();
        self.cell.set(value)
    }

    /// The value, set by `f` if it was not.
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        if let Some(v) = self.cell.get() {
            return v;
        }
        let _one = self.init.lock();
        self.cell.get_or_init(f)
    }
}

impl<T> Default for OnceLock<T> {
    fn default() -> Self {
        OnceLock::new()
    }
}

impl<T: fmt::Debug> fmt::Debug for OnceLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OnceLock").field(&self.cell.get()).finish()
    }
}

#[cfg(test)]
mod tests;
