//! The thread-local "restoring" mark: which entities this thread is restoring right now, so
//! code inside a restore unit that touches its own entity is answered at once instead of
//! waiting on its own gate forever (SPEC R3).

use std::cell::RefCell;

use crate::entity::EntityId;

thread_local! {
    static RESTORING: RefCell<Vec<EntityId>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread is inside `entity`'s restore unit.
pub(crate) fn is_restoring(entity: &EntityId) -> bool {
    RESTORING.with(|r| r.borrow().iter().any(|e| e == entity))
}

/// Marks this thread as restoring `entity` until the returned guard drops (also on unwind).
pub(crate) fn mark(entity: &EntityId) -> Mark {
    RESTORING.with(|r| r.borrow_mut().push(entity.clone()));
    Mark(())
}

/// Removes the innermost mark when dropped.
pub(crate) struct Mark(());

impl Drop for Mark {
    fn drop(&mut self) {
        RESTORING.with(|r| {
            r.borrow_mut().pop();
        });
    }
}
