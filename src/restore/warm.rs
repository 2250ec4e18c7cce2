//! The background warm (SPEC R6): restores every pending entity on the rayon pool with bounded
//! parallelism, reports progress, and can be waited on or stopped.
//!
//! Each worker catches panics per entity: a panic escaping a task spawned on a rayon pool
//! would abort the process.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::machine::StateMachine;
use super::registry::Restorer;
use super::telemetry;
use crate::entity::EntityId;
use crate::error::Error;

/// How far a warm has come.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WarmProgress {
    /// Entities handled (restored, found restored, or refused).
    pub done: u64,
    /// Entities pending when the warm started.
    pub total: u64,
    /// Entities that were refused (contained).
    pub refused: u64,
    /// The first refused entities, in the order they were refused: at most
    /// [`REFUSED_NAMED`] of the `refused` (SPEC R9).
    pub refused_entities: Vec<EntityId>,
    /// Time since the warm started (until it finished, once it has).
    pub elapsed: Duration,
    /// Whether every worker has ended.
    pub finished: bool,
    /// Whether the warm was stopped before it ran out of entities.
    pub stopped: bool,
}

/// At most this many refused entities are named in a warm's progress and summary.
pub const REFUSED_NAMED: usize = 16;

/// Log a debug progress line every this many entities.
const PROGRESS_EVERY: u64 = 1_000;

struct Shared {
    total: u64,
    done: AtomicU64,
    refused: AtomicU64,
    refused_named: Mutex<Vec<EntityId>>,
    started: Instant,
    stop: AtomicBool,
    finished: Mutex<Option<Duration>>,
    finished_cv: Condvar,
    end_stop: Box<dyn Fn() + Send + Sync>,
    begin_stop: Box<dyn Fn() + Send + Sync>,
    /// What the calling thread is inside that the warm may need (a restore unit, or a closure
    /// holding an entity), if anything: waiting for the warm from there could wait for itself.
    inside: Box<dyn Fn() -> Option<&'static str> + Send + Sync>,
}

/// A handle on a running (or finished) warm. Cheap to clone; clones share the warm.
#[derive(Clone)]
pub struct Warm {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm")
            .field("progress", &self.progress())
            .finish()
    }
}

impl Warm {
    /// Where the warm stands.
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
    /// let warm = engine.warm()?;
    /// let progress = warm.progress(); // a snapshot; the warm runs on
    /// assert!(progress.done <= progress.total);
    /// warm.wait()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn progress(&self) -> WarmProgress {
        progress_of(&self.shared)
    }

    /// Whether every worker has ended.
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
    /// let warm = engine.warm()?;
    /// warm.wait()?;
    /// assert!(warm.is_finished());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.shared.finished.lock().is_some()
    }

    /// Blocks until the warm has finished (or been stopped and drained), and answers its final
    /// progress.
    ///
    /// # Errors
    ///
    /// Called from inside a restore unit (`StateMachine::apply` or `repair` while an entity
    /// restores) or from a `read`/`write`/`fold_all` closure of the same engine, it would wait
    /// for the calling thread itself (a warm worker may be running that very unit, or need the
    /// entity the closure holds), so it is refused with [`Error::WouldDeadlock`] and waits for
    /// nothing (SPEC R11). Wait from outside the engine's calls instead.
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
    /// let progress = engine.warm()?.wait()?;
    /// assert!(progress.finished);
    /// assert_eq!(progress.refused, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait(&self) -> crate::error::Result<WarmProgress> {
        if let Some(kind) = (self.shared.inside)() {
            return Err(Error::WouldDeadlock {
                entity: String::new(),
                detail: format!("Warm::wait waits for the warm, and was called from inside {kind}"),
            });
        }
        let mut finished = self.shared.finished.lock();
        while finished.is_none() {
            self.shared.finished_cv.wait(&mut finished);
        }
        drop(finished);
        Ok(self.progress())
    }

    /// Blocks until the warm has finished or `timeout` passed; returns whether it finished.
    /// Unlike [`wait`](Self::wait) it is bounded, so it is allowed anywhere; from inside a
    /// restore unit the warm runs, it can only time out.
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
    /// let warm = engine.warm()?;
    /// if !warm.wait_timeout(std::time::Duration::from_secs(10)) {
    ///     warm.stop(); // not done in time: stop it and drain
    /// }
    /// warm.wait()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut finished = self.shared.finished.lock();
        while finished.is_none() {
            if self
                .shared
                .finished_cv
                .wait_until(&mut finished, deadline)
                .timed_out()
            {
                return finished.is_some();
            }
        }
        true
    }

    /// Stops the warm: no new entity is started, and until the units already running end,
    /// a touch of an entity being restored by another thread answers `Unavailable` at once
    /// (SPEC R6). Returns without waiting; call [`wait`](Self::wait) to drain.
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
    /// let warm = engine.warm()?;
    /// warm.stop(); // no new entity starts; the rest restore on first touch
    /// let progress = warm.wait()?;
    /// assert!(progress.finished);
    /// assert_eq!(engine.read(&clicks, |t| *t)?, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stop(&self) {
        let finished = self.shared.finished.lock();
        if finished.is_some() || self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        (self.shared.begin_stop)();
        drop(finished);
    }
}

fn progress_of(s: &Shared) -> WarmProgress {
    let finished = *s.finished.lock();
    WarmProgress {
        done: s.done.load(Ordering::Acquire),
        total: s.total,
        refused: s.refused.load(Ordering::Acquire),
        refused_entities: s.refused_named.lock().clone(),
        elapsed: finished.unwrap_or_else(|| s.started.elapsed()),
        finished: finished.is_some(),
        stopped: s.stop.load(Ordering::Acquire),
    }
}

/// Starts a warm over the entities pending now, with at most `parallelism` workers on `pool`.
pub(crate) fn start<M: StateMachine>(
    restorer: &Arc<Restorer<M>>,
    pool: &rayon::ThreadPool,
    parallelism: usize,
) -> crate::error::Result<Warm> {
    let ids: Arc<Vec<EntityId>> = Arc::new(restorer.pending()?);
    let begin = Arc::clone(restorer);
    let end = Arc::clone(restorer);
    let inside = Arc::clone(restorer);
    let shared = Arc::new(Shared {
        total: ids.len() as u64,
        done: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        refused_named: Mutex::new(Vec::new()),
        started: Instant::now(),
        stop: AtomicBool::new(false),
        finished: Mutex::new(None),
        finished_cv: Condvar::new(),
        begin_stop: Box::new(move || begin.begin_stop()),
        end_stop: Box::new(move || end.end_stop()),
        inside: Box::new(move || inside.holding_or_restoring()),
    });
    ::log::info!(
        "warm started: {} pending entities, {} workers",
        ids.len(),
        parallelism
    );
    let workers = parallelism.max(1).min(ids.len());
    if workers == 0 {
        finish(restorer, &shared);
        return Ok(Warm { shared });
    }
    let next = Arc::new(AtomicUsize::new(0));
    let left = Arc::new(AtomicUsize::new(workers));
    for _ in 0..workers {
        let restorer = Arc::clone(restorer);
        let shared = Arc::clone(&shared);
        let ids = Arc::clone(&ids);
        let next = Arc::clone(&next);
        let left = Arc::clone(&left);
        pool.spawn(move || {
            work(&restorer, &shared, &ids, &next);
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                finish(&restorer, &shared);
            }
        });
    }
    Ok(Warm { shared })
}

fn work<M: StateMachine>(
    restorer: &Restorer<M>,
    shared: &Shared,
    ids: &[EntityId],
    next: &AtomicUsize,
) {
    while !shared.stop.load(Ordering::Acquire) {
        let i = next.fetch_add(1, Ordering::AcqRel);
        let Some(entity) = ids.get(i) else { return };
        let outcome = catch_unwind(AssertUnwindSafe(|| restorer.touch_listed(entity)));
        let refused = match outcome {
            Ok(Ok(())) => false,
            Ok(Err(Error::Unavailable { .. })) if shared.stop.load(Ordering::Acquire) => return,
            Ok(Err(_)) => true,
            Err(_) => {
                ::log::warn!("warm: a panic escaped while restoring {entity}; it is refused");
                true
            }
        };
        if refused {
            let mut named = shared.refused_named.lock();
            if named.len() < REFUSED_NAMED {
                named.push(entity.clone());
            }
            drop(named);
            shared.refused.fetch_add(1, Ordering::AcqRel);
        }
        let done = shared.done.fetch_add(1, Ordering::AcqRel) + 1;
        if done.is_multiple_of(PROGRESS_EVERY) {
            ::log::debug!("warm: {done} of {} entities", shared.total);
        }
    }
}

fn finish<M: StateMachine>(restorer: &Restorer<M>, shared: &Shared) {
    let elapsed = shared.started.elapsed();
    let mut summary = progress_of(shared);
    summary.elapsed = elapsed;
    summary.finished = true;
    telemetry::log_warm_finished(&summary);
    let mut finished = shared.finished.lock();
    *finished = Some(elapsed);
    if shared.stop.load(Ordering::Acquire) {
        (shared.end_stop)();
    }
    drop(finished);
    shared.finished_cv.notify_all();
    let progress = progress_of(shared);
    // A panicking hook must not unwind out of a rayon task (that would abort the process).
    let hook = restorer.metrics();
    if catch_unwind(AssertUnwindSafe(|| {
        telemetry::warm_finished(hook, &progress)
    }))
    .is_err()
    {
        ::log::warn!("warm: the metrics hook panicked while reporting the summary");
    }
}
