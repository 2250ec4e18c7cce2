//! The wait-for graph between restore units (SPEC R2, R11): which thread waits on which
//! entity's gate, and which thread runs that entity's unit. A unit of A that touches B while a
//! unit of B touches A would wait forever; the touch that would close such a cycle is refused
//! with [`Error::WouldDeadlock`] instead.
//!
//! Edges are added under the graph's mutex after checking for a cycle, so of two threads
//! closing a cycle at the same time exactly one sees the other's edge and is refused. An edge
//! stays in the map until its waiter wakes; it counts only while the entity is still run by the
//! thread the edge names (the gate's `runner`), so a finished unit never causes a refusal.
//!
//! Lock order: a waiter holds its target's gate mutex while it takes the graph's mutex (a
//! leaf); the graph reads other gates only through their atomic `runner`.

use crate::sync::HashMap;
use std::sync::Arc;

use crate::sync::Mutex;

use super::gate::Gate;
use crate::entity::EntityId;
use crate::error::Error;

struct Edge {
    entity: EntityId,
    gate: Arc<dyn RunnerOf>,
    runner: u64,
}

/// Anything that can say which thread runs its unit (a slot).
pub(crate) trait RunnerOf: Send + Sync {
    fn gate(&self) -> &Gate;
}

/// Who waits for whom, keyed by the waiting thread's token.
#[derive(Default)]
pub(crate) struct WaitGraph {
    edges: Mutex<HashMap<u64, Edge>>,
}

impl WaitGraph {
    /// Records that thread `me` is about to wait on `entity`, run by thread `runner`, unless
    /// that would close a cycle back to `me`: then the wait is refused. The returned guard
    /// removes the edge when the wait ends.
    pub(crate) fn enter(
        &self,
        me: u64,
        entity: &EntityId,
        target: Arc<dyn RunnerOf>,
        runner: u64,
    ) -> Result<Waiting<'_>, Error> {
        let mut edges = self.edges.lock();
        let mut next = runner;
        let mut path = vec![entity.to_string()];
        // At most one hop per waiting thread: a longer walk has met a cycle that does not
        // include `me` (impossible while every waiter checks first, but never loop on it).
        for _ in 0..=edges.len() {
            if next == me {
                return Err(Error::WouldDeadlock {
                    entity: entity.to_string(),
                    detail: format!(
                        "restore units wait for each other in a cycle ({} -> back to this unit)",
                        path.join(" -> ")
                    ),
                });
            }
            match edges.get(&next) {
                Some(edge) if edge.gate.gate().runner() == edge.runner => {
                    path.push(edge.entity.to_string());
                    next = edge.runner;
                }
                _ => break,
            }
        }
        edges.insert(
            me,
            Edge {
                entity: entity.clone(),
                gate: target,
                runner,
            },
        );
        Ok(Waiting { graph: self, me })
    }
}

/// Removes a waiter's edge when dropped.
pub(crate) struct Waiting<'a> {
    graph: &'a WaitGraph,
    me: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.graph.edges.lock().remove(&self.me);
    }
}
