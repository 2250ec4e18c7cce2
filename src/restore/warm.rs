//! The background warm (SPEC R6): restores every pending entity of the namespaces the caller
//! asks for (the engine: those it serves, SPEC F12), or a list of entities, on the rayon pool
//! with bounded parallelism, reports progress, and can be waited on or stopped.
//!
//! Each worker catches panics per entity: a panic escaping a task spawned on a rayon pool
//! would abort the process. Between entities a worker yields to other work queued on the pool
//! (`rayon::yield_now`), so a background revocation started meanwhile does not wait for the
//! whole warm even when the warm occupies every thread of the pool.
//!
//! A [`Warm`] handle holds the restorer only weakly: a handle kept after its engine is dropped
//! keeps neither the state machine nor any state alive (the workers hold it while they run,
//! and closing the engine stops them).

use crate::sync::HashMap;
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::clock::{self, SharedClock};
use crate::spawn::Spawner;
use crate::sync::{Condvar, Mutex};

use super::machine::StateMachine;
use super::registry::Restorer;
use super::telemetry;
use crate::entity::{EntityId, Namespace};
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
    /// The engine's clock (SPEC E9), held weakly: the engine's clock reads its store, and a
    /// handle kept after the engine must not keep the store open.
    clock: std::sync::Weak<dyn crate::clock::Clock>,
    stop: AtomicBool,
    finished: Mutex<Option<Duration>>,
    finished_cv: Condvar,
    end_stop: Box<dyn Fn() + Send + Sync>,
    begin_stop: Box<dyn Fn() + Send + Sync>,
    /// What the calling thread is inside that the warm may need (a restore unit, or a closure
    /// holding an entity), if anything: waiting for the warm from there could wait for itself.
    inside: Box<dyn Fn() -> Option<&'static str> + Send + Sync>,
    /// Called once the warm has finished (with no lock held).
    on_finish: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Shared {
    /// The engine's clock, or the system's once the engine is gone.
    fn clock(&self) -> SharedClock {
        self.clock
            .upgrade()
            .unwrap_or_else(|| Arc::new(crate::clock::SystemClock))
    }
}

/// How a warm runs (see [`start`]).
pub(crate) struct WarmPlan {
    /// At most this many entities restored at once (at least 1).
    pub(crate) parallelism: usize,
    /// Whether a worker yields to other work queued on the pool between entities (off only in
    /// a negative control).
    pub(crate) yields: bool,
    /// Called once the warm has finished.
    pub(crate) on_finish: Option<Box<dyn Fn() + Send + Sync>>,
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
        self.wait_ended_by(clock::deadline_after(&*self.shared.clock(), timeout))
    }

    /// Waits at most `timeout` for the warm to end, like [`wait_timeout`](Self::wait_timeout),
    /// but first refuses with [`Error::WouldDeadlock`] when called from inside the engine (a
    /// restore unit, or a closure that holds an entity), as [`wait`](Self::wait) does: the warm
    /// may be waiting for the caller, so the wait would last its whole timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Typed, TypedMachine};
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
    /// let ten = std::time::Duration::from_secs(10);
    /// let inside = engine.read(&clicks, |_| warm.wait_for(ten))?; // holding an entity
    /// assert!(matches!(inside, Err(Error::WouldDeadlock { .. })));
    /// assert!(warm.wait_for(ten)?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait_for(&self, timeout: Duration) -> crate::error::Result<bool> {
        let deadline = clock::deadline_after(&*self.shared.clock(), timeout);
        if let Some(kind) = (self.shared.inside)() {
            return Err(Error::WouldDeadlock {
                entity: String::new(),
                detail: format!(
                    "Warm::wait_for waits for the warm, and was called from inside {kind}"
                ),
            });
        }
        Ok(self.wait_ended_by(deadline))
    }

    fn wait_ended_by(&self, deadline: Instant) -> bool {
        let shared = &self.shared;
        let clock = shared.clock();
        let mut finished = shared.finished.lock();
        while finished.is_none() {
            if clock::wait_until(&*clock, &shared.finished_cv, &mut finished, deadline) {
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
        elapsed: finished
            .unwrap_or_else(|| s.clock().instant().saturating_duration_since(s.started)),
        finished: finished.is_some(),
        stopped: s.stop.load(Ordering::Acquire),
    }
}

/// The entities pending now whose namespace `keep` accepts (asked once per namespace).
pub(crate) fn pending_in<M: StateMachine>(
    restorer: &Restorer<M>,
    keep: &mut dyn FnMut(&Namespace) -> bool,
) -> crate::error::Result<Vec<EntityId>> {
    let mut kept: HashMap<Namespace, bool> = HashMap::default();
    Ok(restorer
        .pending()?
        .into_iter()
        .filter(|e| {
            *kept
                .entry(e.namespace().clone())
                .or_insert_with(|| keep(e.namespace()))
        })
        .collect())
}

/// Starts a warm over the entities not restored now (pending, or being restored by another
/// thread, such as the background warm: the warm waits for those) whose namespace `keep`
/// accepts (asked once per namespace), with at most `parallelism` workers started by `spawner`.
pub(crate) fn start<M: StateMachine>(
    restorer: &Arc<Restorer<M>>,
    spawner: &Spawner,
    parallelism: usize,
    keep: &mut dyn FnMut(&Namespace) -> bool,
) -> crate::error::Result<Warm> {
    let mut kept: HashMap<Namespace, bool> = HashMap::default();
    let ids: Vec<EntityId> = restorer
        .not_restored()?
        .into_iter()
        .filter(|e| {
            *kept
                .entry(e.namespace().clone())
                .or_insert_with(|| keep(e.namespace()))
        })
        .collect();
    let plan = WarmPlan {
        parallelism,
        yields: !restorer.config.guards.warm_never_yields,
        on_finish: None,
    };
    Ok(start_over(restorer, spawner, ids, plan))
}

/// Starts a warm over `ids` (entities that are, or were, pending), its workers started by `spawner`.
pub(crate) fn start_over<M: StateMachine>(
    restorer: &Arc<Restorer<M>>,
    spawner: &Spawner,
    ids: Vec<EntityId>,
    plan: WarmPlan,
) -> Warm {
    let WarmPlan {
        parallelism,
        yields,
        on_finish,
    } = plan;
    let clock = restorer.clock().clone();
    let ids = Arc::new(ids);
    // Weak: the handle must not keep the machine and the states alive after the engine.
    let (begin, end, inside) = (
        Arc::downgrade(restorer),
        Arc::downgrade(restorer),
        Arc::downgrade(restorer),
    );
    let shared = Arc::new(Shared {
        total: ids.len() as u64,
        done: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        refused_named: Mutex::new(Vec::new()),
        started: clock.instant(),
        clock: Arc::downgrade(&clock),
        stop: AtomicBool::new(false),
        finished: Mutex::new(None),
        finished_cv: Condvar::new(),
        begin_stop: Box::new(move || begin.upgrade().map_or((), |r| r.begin_stop())),
        end_stop: Box::new(move || end.upgrade().map_or((), |r| r.end_stop())),
        inside: Box::new(move || inside.upgrade().and_then(|r| r.holding_or_restoring())),
        on_finish,
    });
    ::log::info!(
        "warm started: {} pending entities, {} workers",
        ids.len(),
        parallelism
    );
    let workers = parallelism.max(1).min(ids.len());
    if workers == 0 {
        finish(&Arc::downgrade(restorer), &shared);
        return Warm { shared };
    }
    let next = Arc::new(AtomicUsize::new(0));
    let left = Arc::new(AtomicUsize::new(workers));
    for _ in 0..workers {
        // Weak, and every strong reference is dropped before the warm is marked finished: a
        // close that waited for the warm returns with nothing of the engine's left on the pool,
        // so dropping the engine right after runs `destroy` and frees every state there and
        // then (SPEC R11, E3), never later on a pool thread.
        let restorer = Arc::downgrade(restorer);
        let shared = Arc::clone(&shared);
        let ids = Arc::clone(&ids);
        let next = Arc::clone(&next);
        let left = Arc::clone(&left);
        spawner.spawn(move || {
            if let Some(restorer) = restorer.upgrade() {
                work(&restorer, &shared, &ids, (&next, yields));
            }
            if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                finish(&restorer, &shared);
            }
        });
    }
    Warm { shared }
}

fn work<M: StateMachine>(
    restorer: &Restorer<M>,
    shared: &Shared,
    ids: &[EntityId],
    (next, yields): (&AtomicUsize, bool),
) {
    // Entities another thread is restoring (the other warm, a touch) are visited last, so
    // this worker restores what nobody else does instead of waiting on their gates, and two
    // warms over the same entities (the background warm and an explicit one) share the work
    // instead of taking turns (SPEC R6).
    let mut later = Vec::new();
    let mut first = true;
    while !shared.stop.load(Ordering::Acquire) {
        if yields && !std::mem::take(&mut first) {
            // Other work queued on the pool (a background revocation) runs before the next
            // entity, so it never waits for the whole warm (SPEC F9, R6).
            let _ = rayon::yield_now();
        }
        let i = next.fetch_add(1, Ordering::AcqRel);
        let Some(entity) = ids.get(i) else { break };
        if restorer.is_being_restored(entity) {
            later.push(entity);
            continue;
        }
        if !visit(restorer, shared, entity) {
            return;
        }
    }
    for entity in later {
        if shared.stop.load(Ordering::Acquire) || !visit(restorer, shared, entity) {
            return;
        }
    }
}

/// Restores one entity (or waits for the thread restoring it) and counts it; false when the
/// warm is stopping.
fn visit<M: StateMachine>(restorer: &Restorer<M>, shared: &Shared, entity: &EntityId) -> bool {
    let outcome = catch_unwind(AssertUnwindSafe(|| restorer.touch_listed(entity)));
    let failed = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(Error::Unavailable { .. })) if shared.stop.load(Ordering::Acquire) => return false,
        // A partition only the fence wrote (no entity): nothing to restore, nothing refused.
        Ok(Err(Error::UnknownEntity(_))) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => {
            ::log::warn!("warm: a panic escaped while restoring {entity}; it is refused");
            Some("a panic escaped while restoring it".to_owned())
        }
    };
    let refused = failed.is_some();
    if let Some(error) = failed {
        // A containment is told by the unit itself; this is the warm's own view (SPEC E8).
        restorer
            .config
            .events
            .emit(|| crate::observe::Event::WarmFailed {
                entity: entity.clone(),
                error,
            });
    }
    // This worker holds no lock between entities.
    restorer.config.events.deliver();
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
    true
}

fn finish<M: StateMachine>(restorer: &Weak<Restorer<M>>, shared: &Shared) {
    let elapsed = shared
        .clock()
        .instant()
        .saturating_duration_since(shared.started);
    let mut summary = progress_of(shared);
    summary.elapsed = elapsed;
    summary.finished = true;
    telemetry::log_warm_finished(&summary);
    // The hook and the events run before the warm is marked finished, while the engine
    // (which waits for it at close) is alive, and the strong reference is gone before a waiter
    // wakes.
    if let Some(restorer) = restorer.upgrade() {
        // A panicking hook must not unwind out of a rayon task (that would abort the process).
        let hook = restorer.metrics();
        if catch_unwind(AssertUnwindSafe(|| {
            telemetry::warm_finished(hook, &summary)
        }))
        .is_err()
        {
            ::log::warn!("warm: the metrics hook panicked while reporting the summary");
        }
        restorer.config.events.deliver();
    }
    let mut finished = shared.finished.lock();
    *finished = Some(elapsed);
    if shared.stop.load(Ordering::Acquire) {
        (shared.end_stop)();
    }
    drop(finished);
    shared.finished_cv.notify_all();
    // After: the end's report may start another warm, which must find this one finished. It
    // holds no reference to the engine.
    if let Some(on_finish) = &shared.on_finish
        && catch_unwind(AssertUnwindSafe(on_finish)).is_err()
    {
        ::log::warn!("warm: reporting its end panicked");
    }
}
