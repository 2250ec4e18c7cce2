//! Reading an entity's history as an iterator (SPEC L2), without restoring the entity.

use std::collections::VecDeque;
use std::sync::Arc;

use super::Engine;
use crate::entity::EntityId;
use crate::error::Result;
use crate::log::{self, LogRecord};
use crate::restore::StateMachine;
use crate::store::{Partition, Store};

/// Records read per page by [`History`].
const HISTORY_PAGE: usize = 256;

/// An entity's records in sequence order, read page by page as the iteration goes
/// (see [`Engine::history`]).
///
/// Each page is read from one consistent view; records appended while iterating are returned
/// if the iteration has not passed them yet. An error (a damaged row, a closed engine) is
/// returned once and ends the iteration.
pub struct History {
    store: Arc<dyn Store>,
    partition: Partition,
    next_seq: Option<u64>,
    page: VecDeque<LogRecord>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("partition", &self.partition)
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

impl Iterator for History {
    type Item = Result<LogRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(record) = self.page.pop_front() {
            return Some(Ok(record));
        }
        let from = self.next_seq?;
        match log::read_log(&*self.store, &self.partition, from, HISTORY_PAGE) {
            Ok(page) => {
                self.next_seq = page.next_seq;
                self.page = page.records.into();
                let record = self.page.pop_front()?;
                Some(Ok(record))
            }
            Err(e) => {
                self.next_seq = None;
                Some(Err(e))
            }
        }
    }
}

impl<M: StateMachine> Engine<M> {
    /// An entity's history from `from_seq` on, as an iterator of records (SPEC L2). It reads
    /// the log rows only: the entity is not restored, and its state machine does not run.
    ///
    /// Records a retention policy truncated (see
    /// [`EngineBuilder::truncate_after_checkpoint`](super::EngineBuilder::truncate_after_checkpoint))
    /// are skipped: the iteration starts at the first retained record at or after `from_seq`.
    ///
    /// # Errors
    /// [`Error::UnknownEntity`](crate::Error::UnknownEntity) if the entity is not registered,
    /// [`Error::Closed`](crate::Error::Closed) after [`Engine::close`]; while iterating,
    /// [`Error::Corrupt`](crate::Error::Corrupt) for a damaged record.
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
    /// engine.append_typed(&clicks, &[10, 20, 30])?;
    /// let seqs: Vec<u64> = engine.history(&clicks, 2)?.map(|r| r.map(|r| r.seq)).collect::<Result<_, _>>()?;
    /// assert_eq!(seqs, [2, 3]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn history(&self, entity: &EntityId, from_seq: u64) -> Result<History> {
        let _open = self.enter()?;
        // Answers UnknownEntity for an entity that was never registered (makes no slot).
        self.inner.restorer.existing(entity)?;
        Ok(History {
            store: Arc::clone(&self.inner.store),
            partition: entity.partition(),
            next_seq: Some(from_seq.max(1)),
            page: VecDeque::new(),
        })
    }
}
