//! The engine workload's take-back: after owner `b` took the namespace over, it writes, and
//! then `a` takes the namespace back (forced: `b` is live). A restore unit `a` started under
//! its first holding may end after this re-adoption; it must install nothing restored under
//! the old holding (SPEC F11), or `a` serves state without `b`'s records and the repair it
//! owes, and the next write finds the log moved.
//!
//! Checked beyond the workload's other checks: `a` owns the namespace after, every record `b`
//! acknowledged is in the history, and the state `a` serves at the end is the state a fresh
//! restore of the store's history gives.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use portcullis::EntityId;
use portcullis::engine::TakeOver;

use super::engine_load::{Records, note};
use super::owners::Owner;
use super::{Rng, Trace};

/// What the take-back has reached, for the other tasks' checks.
#[derive(Default)]
pub struct TakeBack {
    /// Set before `a`'s take-over starts: from then on an append `a` started after `b`'s
    /// revocation completed may commit (under the new holding).
    pub retaking: AtomicBool,
    /// `a` holds the namespace again.
    pub back: AtomicBool,
}

/// `b` appends a few records (acknowledged ones go to `acked`), then `a` takes the namespace
/// back.
pub fn run(
    a: &Owner,
    b: &Owner,
    entities: &[EntityId],
    acked: &Records,
    state: &TakeBack,
    rng: &mut Rng,
    trace: &Trace,
) {
    for i in 0..1 + rng.below(3) {
        let e = &entities[rng.below(entities.len() as u64) as usize];
        let record = 7 << 32 | i;
        let outcome = b.engine.append(e, vec![record.to_le_bytes().to_vec()]);
        trace.push(format!("b appends {e} {record}: {outcome:?}"));
        if outcome.is_ok() {
            note(acked, e, record);
        }
    }
    let ns = entities[0].namespace();
    state.retaking.store(true, Ordering::SeqCst);
    let taken = a.engine.take_over(ns, TakeOver::new().force(true));
    trace.push(format!("a takes the namespace back: {taken:?}"));
    if taken.is_ok() {
        state.back.store(true, Ordering::SeqCst);
    }
}

/// Whether `a`'s append, started after `b`'s revocation completed, may have committed: only
/// if `a` had begun taking the namespace back before the append returned.
pub fn may_commit_after_completion(state: Option<&Arc<TakeBack>>) -> bool {
    state.is_some_and(|s| s.retaking.load(Ordering::SeqCst))
}
