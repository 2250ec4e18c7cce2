//! The engine workload's checks once its tasks ended: the current owner owns the namespace;
//! each entity's history (restored afresh from the store) holds every acknowledged record and
//! accepted deferral once and no write settled as never committing, and is what the owner
//! served; no healthy entity is contained; each activation restored once. Then the owners
//! close.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use portcullis::clock::SimClock;
use portcullis::fence::{RevokeBudget, RevokeProgress};
use portcullis::{EntityId, Namespace};

use super::engine_load::Records;
use super::net::Net;
use super::owners::Owner;
use super::{Trace, pause};

/// What the run left for the checks.
pub struct Finished<'a> {
    pub a: &'a Arc<Owner>,
    /// The second engine that opened with `a`'s owner id, if one did (then it serves `a`'s
    /// namespace: there is no take-over in such a seed).
    pub second: Option<&'a Arc<Owner>>,
    pub b: Option<&'a Arc<Owner>>,
    pub net: Option<&'a Arc<Net>>,
    /// `b`'s revocation completed (set here too, when the checks finish it).
    pub complete: &'a AtomicBool,
    /// `a` took the namespace back.
    pub back: bool,
    pub clock: &'a SimClock,
    pub ns: &'a Namespace,
    pub entities: &'a [EntityId],
    /// Acknowledged records and accepted deferrals, by entity.
    pub acked: &'a Records,
    /// Appends answered as settled, never to commit, by entity.
    pub refused: &'a Records,
    pub trace: &'a Trace,
    /// How long a close may take in virtual time (its timeout and one read in flight), when
    /// closes are held to a bound: in quiet time (docs/SIMULATION.md, "Bounded waits").
    pub close_bound: Option<Duration>,
    /// Whether `a` passivates its entities and starts a warm just before it closes, so its
    /// close meets a warm reading from a slow network.
    pub warm_at_close: bool,
}

/// Runs the checks, then closes the owners.
pub fn after_run(f: &Finished<'_>) {
    let Finished {
        a,
        second,
        b,
        net,
        complete,
        back,
        clock,
        ns,
        entities,
        acked,
        refused,
        trace,
        close_bound,
        warm_at_close,
    } = *f;
    // The final word on each entity: the current owner's (b's after a take-over, which is
    // finished here if the run left it unfinished: leases expire as the wall clock moves).
    let reader = match &b {
        None if second.is_some() => {
            let second = second.expect("checked");
            if let Err(e) = second.engine.own(ns) {
                panic!("F12: the engine that replaced a does not own the namespace: {e}");
            }
            Arc::clone(second)
        }
        Some(_) if back => {
            if let Err(e) = a.engine.own(ns) {
                panic!("F12: a does not own the namespace after taking it back: {e}");
            }
            Arc::clone(a)
        }
        Some(b) => {
            for step in 0..400 {
                if let Ok(RevokeProgress::Complete) =
                    b.engine.revoke_step(ns, RevokeBudget::default())
                {
                    complete.store(true, Ordering::SeqCst);
                    break;
                }
                if step % 8 == 7 {
                    clock.wall().advance(31_000);
                }
                pause(1);
            }
            if let Err(e) = b.engine.own(ns) {
                panic!("F12: b does not own the namespace after its take-over: {e}");
            }
            Arc::clone(b)
        }
        None => a.clone(),
    };
    let acked = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let refused = refused.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for e in entities {
        // What the reader serves now must be what a restore of the store's history gives
        // (unless the network left a write's outcome unknown: the next write settles it).
        let served = reader.engine.read(e, |s| s.clone());
        // Restored afresh from the store, so the history checked is the store's.
        let passivated = reader.engine.passivate(e);
        trace.push(format!("final passivation of {e}: {passivated:?}"));
        let state = reader
            .engine
            .read(e, |s| s.clone())
            .unwrap_or_else(|err| panic!("R4: {e} is not served after the run: {err}"));
        if net.is_none() {
            assert_eq!(
                served.as_ref().ok(),
                Some(&state),
                "R2/F11: {} served {e} as {served:?}, a fresh restore gives {state:?}",
                reader.name
            );
        }
        let mut seen = BTreeMap::new();
        for r in &state {
            *seen.entry(*r).or_insert(0u32) += 1;
        }
        for (r, n) in &seen {
            assert_eq!(*n, 1, "R2/R8: record {r} is in {e}'s history {n} times");
        }
        for r in refused.get(&e.to_string()).into_iter().flatten() {
            assert!(
                !seen.contains_key(r),
                "F12/S2: record {r}, answered as settled never to commit, is in {e}'s history {state:?}"
            );
        }
        for r in acked.get(&e.to_string()).into_iter().flatten() {
            assert!(
                seen.contains_key(r),
                "S3/R8: acknowledged record {r} is missing from {e}'s history {state:?}"
            );
        }
        trace.push(format!("{e}: {} records", state.len()));
    }
    for owner in [Some(&a), b.as_ref(), second.as_ref()]
        .into_iter()
        .flatten()
    {
        let stats = owner.engine.stats();
        assert_eq!(
            stats.phases.contained, 0,
            "R4: {} contained a healthy entity",
            owner.name
        );
        // Each activation restores once: the first touch, and one after each passivation
        // (explicit or under the budget); `fresh` runs in a unit without a checkpoint.
        // A unit whose batch lost its answer runs again (R4): one more per batch the network
        // disturbed on the entity's partition.
        // Taking the namespace back forgets what was restored under the old holding.
        let readoptions = u64::from(back && owner.name == "a");
        let allowed =
            1 + stats.passivation.passivations + stats.passivation.reactivations + readoptions;
        for (e, units) in owner
            .machine
            .units
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let retries = net.as_ref().map_or(0, |net| {
                entities
                    .iter()
                    .find(|id| id.to_string() == *e)
                    .map_or(0, |id| {
                        net.disturbed(&id.partition()) + net.read_failures(&id.partition())
                    })
            });
            let allowed = allowed + retries;
            assert!(
                *units <= allowed,
                "R2/R10: {} ran {e}'s restore unit {units} times for at most {allowed} activations",
                owner.name
            );
        }
    }
    // Close both; a deposed owner may answer that it no longer serves.
    // The engine's own schedule runs on virtual time: its sweeps fall due as the simulated
    // clock moves (the simulator's `engine_time_is_virtual` reads this line).
    trace.push(format!(
        "a's background sweeps: {} in {:?} virtual",
        a.sweeps.load(Ordering::SeqCst),
        clock.elapsed()
    ));
    let warm = warm_at_close
        .then(|| {
            for e in entities {
                let _ = a.engine.passivate(e);
            }
            a.engine.warm().ok()
        })
        .flatten();
    close(a, "a", close_bound, f);
    if let Some(warm) = warm {
        // Stopped by the close: it ends after the unit it was running.
        let _ = warm.wait();
    }
    if let Some(hook) = &a.hook {
        hook.detach();
        trace.push(format!(
            "a's deferred hook read {} times",
            hook.reads.load(Ordering::SeqCst)
        ));
    }
    if let Some(b) = &b {
        close(b, "b", close_bound, f);
    }
    if let Some(second) = second {
        close(second, "the second engine", close_bound, f);
    }
}

/// Closes `owner`, holding the close to `bound` of virtual time (SPEC R11) when there is one.
fn close(owner: &Owner, name: &str, bound: Option<Duration>, f: &Finished<'_>) {
    let started = f.clock.elapsed();
    let closed = owner.engine.close();
    let took = f.clock.elapsed() - started;
    f.trace
        .push(format!("{name} closes: {} ({took:?})", closed.is_ok()));
    if let Some(bound) = bound {
        assert!(
            took <= bound,
            "R11: {name}'s close took {took:?} of virtual time, over its bound of {bound:?} (close_timeout and one read in flight): {closed:?}"
        );
    }
}
