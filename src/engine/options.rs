//! Conveniences the builder switches on: registration on first write, and a checkpoint every
//! N records. Both go through the public calls ([`Engine::register`], [`Engine::checkpoint`]),
//! so they are fenced and logged exactly like a call the application makes itself.

use super::Engine;
use crate::entity::EntityId;
use crate::error::{Error, Result};
use crate::log::LogHead;
use crate::restore::{self, StateMachine};

impl<M: StateMachine> Engine<M> {
    /// Touches an entity for a write; with
    /// [`register_on_first_write`](super::EngineBuilder::register_on_first_write), registers an
    /// unknown one first.
    pub(super) fn touch_for_write(&self, entity: &EntityId) -> Result<restore::Pinned<M::State>> {
        match self.touch(entity) {
            Err(Error::UnknownEntity(_)) if self.inner.register_on_first_write => {
                self.register(entity)?;
                self.touch(entity)
            }
            other => other,
        }
    }

    /// Runs `f`, and if it answers `UnknownEntity` while registration on first write is on,
    /// registers the entity and runs `f` once more.
    pub(super) fn registering<T>(&self, entity: &EntityId, f: impl Fn() -> Result<T>) -> Result<T> {
        match f() {
            Err(Error::UnknownEntity(_)) if self.inner.register_on_first_write => {
                self.register(entity)?;
                f()
            }
            other => other,
        }
    }

    /// Whether a log at `head` has folded enough records since its newest checkpoint that
    /// [`checkpoint_every`](super::EngineBuilder::checkpoint_every) owes one.
    pub(super) fn checkpoint_due(&self, head: &LogHead) -> bool {
        self.inner.checkpoint_every.is_some_and(|every| {
            let since = head.last_seq() - head.checkpoint.as_ref().map_or(0, |c| c.seq);
            since >= every
        })
    }

    /// Publishes an owed checkpoint after a write. The write has committed either way, so a
    /// failed checkpoint is logged, not returned: the next write or restore owes it again.
    pub(super) fn checkpoint_after_write(&self, entity: &EntityId) {
        if let Err(e) = self.checkpoint(entity) {
            ::log::warn!("the checkpoint owed after a write to {entity} failed: {e}");
        }
    }
}
