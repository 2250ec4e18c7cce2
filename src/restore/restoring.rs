//! Thread-local marks: what this thread holds of an engine right now, so a call that would wait
//! for something this same thread holds is refused at once instead of deadlocking (SPEC R3,
//! R11).
//!
//! - **Restoring** an entity: the thread runs its restore unit; touching that entity again from
//!   inside the unit would wait on its own gate.
//! - **Holding** an entity: the thread holds its state lock while application code runs (a
//!   `read`/`write`/`fold_all` closure, `apply` during a write); any touch from there could
//!   wait on a gate or a state lock while holding one, so it is refused.
//! - **In a call**: the thread is inside a public engine call; `close` from there would wait
//!   for that very call to end.
//!
//! Marks name their owner (the registry's address), so two engines in one process never refuse
//! each other's calls. Each thread also has a token, a small number that names it in the
//! registry's wait-for graph (cycle detection across threads, SPEC R11).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering}; // seams: not shared (a process-wide counter)

use crate::entity::EntityId;

/// What a mark says the thread is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Restoring,
    Holding,
    Call,
}

struct Entry {
    owner: usize,
    kind: Kind,
    entity: Option<EntityId>,
    /// For a restoring or holding mark: the term of the namespace holding the state belongs
    /// to (0: not known yet). The engine's writes for that entity on this thread commit only
    /// while the namespace is still held under it (SPEC F11).
    term: u64,
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

// Per thread, and per task inside a simulation, where every task runs on one thread.
crate::task_local! {
    static MARKS: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
}
crate::task_local! {
    static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
}
crate::task_local! {
    /// Rows deferred by code inside a restore unit to that unit's own entity, on this thread.
    static SELF_DEFERRALS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Code inside a restore unit wrote a deferred row for the unit's own entity.
pub(crate) fn deferred_inside_unit() {
    SELF_DEFERRALS.with(|c| c.set(c.get().wrapping_add(1)));
}

/// How many rows code inside restore units on this thread deferred to their own entities: a
/// unit drains again before it ends if this moved since its last drain.
pub(crate) fn self_deferrals() -> u64 {
    SELF_DEFERRALS.with(std::cell::Cell::get)
}

/// This thread's token (never 0, never reused).
pub(crate) fn token() -> u64 {
    TOKEN.with(|t| *t)
}

/// Whether this thread is inside `entity`'s restore unit.
pub(crate) fn is_restoring(owner: usize, entity: &EntityId) -> bool {
    MARKS.with(|m| {
        m.borrow().iter().any(|e| {
            e.owner == owner && e.kind == Kind::Restoring && e.entity.as_ref() == Some(entity)
        })
    })
}

/// Whether this thread is inside any restore unit of this owner.
pub(crate) fn restoring_any(owner: usize) -> bool {
    MARKS.with(|m| {
        m.borrow()
            .iter()
            .any(|e| e.owner == owner && e.kind == Kind::Restoring)
    })
}

/// The first entity whose state this thread holds, if any.
pub(crate) fn held(owner: usize) -> Option<EntityId> {
    MARKS.with(|m| {
        m.borrow()
            .iter()
            .find(|e| e.owner == owner && e.kind == Kind::Holding)
            .and_then(|e| e.entity.clone())
    })
}

/// The innermost mark of this owner on this thread, if any.
pub(crate) fn innermost(owner: usize) -> Option<Kind> {
    MARKS.with(|m| {
        m.borrow()
            .iter()
            .rev()
            .find(|e| e.owner == owner)
            .map(|e| e.kind)
    })
}

/// Marks this thread until the returned guard drops (also on unwind).
pub(crate) fn mark(owner: usize, kind: Kind, entity: Option<&EntityId>) -> Mark {
    mark_under(owner, kind, entity, 0)
}

/// [`mark`], naming the term of the holding the entity's state belongs to.
pub(crate) fn mark_under(owner: usize, kind: Kind, entity: Option<&EntityId>, term: u64) -> Mark {
    MARKS.with(|m| {
        m.borrow_mut().push(Entry {
            owner,
            kind,
            entity: entity.cloned(),
            term,
        })
    });
    Mark(())
}

/// Names the term of the holding the restore unit of `entity` that this thread runs works
/// under (the innermost such mark), once the unit knows it.
pub(crate) fn set_unit_term(owner: usize, entity: &EntityId, term: u64) {
    MARKS.with(|m| {
        if let Some(e) = m.borrow_mut().iter_mut().rev().find(|e| {
            e.owner == owner && e.kind == Kind::Restoring && e.entity.as_ref() == Some(entity)
        }) {
            e.term = term;
        }
    });
}

/// The term of the holding whose state this thread works on for `entity` (its restore unit,
/// or a call holding its state), if any: the innermost such mark naming one.
pub(crate) fn planned_term(owner: usize, entity: &EntityId) -> Option<u64> {
    MARKS.with(|m| {
        m.borrow()
            .iter()
            .rev()
            .find(|e| {
                e.owner == owner
                    && matches!(e.kind, Kind::Restoring | Kind::Holding)
                    && e.entity.as_ref() == Some(entity)
            })
            .map(|e| e.term)
            .filter(|t| *t != 0)
    })
}

/// Removes the innermost mark when dropped (marks nest, so guards drop in reverse order).
#[must_use]
pub(crate) struct Mark(());

impl Drop for Mark {
    fn drop(&mut self) {
        MARKS.with(|m| {
            m.borrow_mut().pop();
        });
    }
}
