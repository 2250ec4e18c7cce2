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
use std::sync::atomic::{AtomicU64, Ordering};

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
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static MARKS: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
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
    MARKS.with(|m| {
        m.borrow_mut().push(Entry {
            owner,
            kind,
            entity: entity.cloned(),
        })
    });
    Mark(())
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
