//! The engine workload: owners over one store (the memory store with or without server-side
//! deadlines, or the file store on the fault-injecting disk), under one seed.
//!
//! The memory store may sit behind a simulated network (`super::net`, an etcd cluster as its
//! clients see it) that loses the answers of record-writing batches and delays copies of
//! them, which arrive at points of the schedule the seed picks, and times out some reads.
//!
//! Owner `a` serves a namespace of a few entities; writers append records with unique
//! numbers, a deferrer defers records to entities (restored or not), a passivator drops
//! entities under a budget, a warm runs, the wall clock jumps (leases expire, the sweeper
//! deletes rows), and on some seeds owner `b` takes the namespace over (bump, revoke to
//! `Complete`, own) while `a` still writes; on half of those `b` writes and `a` takes the
//! namespace back ([`super::take_back`]) while a reader task of `a` passivates and reads its
//! entities. The state machine may be slow to fold a record, and `a`'s `deferred` metrics
//! hook may read the entity it reports on ([`super::hooks`]). On some seeds without a
//! take-over a second engine opens with `a`'s owner id ([`super::impostor`]). Checked (the
//! checks after the run are in [`super::engine_checks`]):
//!
//! - F7: once `b`'s revocation answered `Complete`, no write `a` starts commits (until `a`
//!   begins to take the namespace back);
//! - every acknowledged record and every accepted deferral is in the entity's history exactly
//!   once, and the folded state is that history (no acknowledged batch lost or rolled back, R8
//!   deferred work applied exactly once, R2); the history is read by a fresh restore of each
//!   entity, so it is the store's, not only the engine's memory;
//! - a write answered as settled, never to commit (a lost answer, SPEC F12), is not in the
//!   history; a delayed copy `a` sent never commits once `b`'s revocation completed (F7);
//! - one restore per activation: each engine runs an entity's restore unit at most once more
//!   than its passivations and adoptions of it (R2, R10);
//! - no healthy entity is contained (R4), and memory stays within its budget at every step
//!   (R10);
//! - on some take-overs a bystander `c` (first-use adoption on) reads the namespace's
//!   entities meanwhile; it never takes the namespace, so `b` (or `a`, having taken it back)
//!   owns it after (F12);
//! - the state the current owner serves at the end is what a fresh restore gives (R2, F11);
//! - F12: no append `a` starts after a second engine opened with its owner id commits;
//! - nothing waits for ever (shuttle reports a deadlock with the waiting tasks named).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use portcullis::clock::SimClock;
use portcullis::engine::OwnerSwitches;
use portcullis::fence::{RevokeBudget, RevokeProgress};
use portcullis::store::{FaultFs, FileStore, MemoryStore, Store};
use portcullis::{EntityId, Error, Namespace};

use super::engine_checks::{self, Finished};
use super::impostor::{self, Impostor};
use super::net::{Delivery, Net};
use super::owners::{Backend, Owner, open_owner, try_open_owner};
use super::take_back::{self, TakeBack};
use super::{Control, Plan, Rng, Trace, pause, task};

/// Checks a held copy that arrived: one `a` sent must not commit once `b`'s revocation
/// completed (F7, whoever makes the write and however late it arrives).
fn arrived(delivery: Delivery, complete: &AtomicBool, trace: &Trace) {
    let completed = complete.load(Ordering::SeqCst);
    trace.push(format!(
        "network delivers {}'s copy to {}: {:?}",
        delivery.sender, delivery.partition, delivery.outcome
    ));
    if completed && delivery.sender == "a" {
        assert!(
            !matches!(delivery.outcome, Ok(portcullis::store::Outcome::Committed)),
            "F7: a delayed copy of a's batch to {} committed after b's revocation completed",
            delivery.partition
        );
    }
}

/// Whether an append's error says it was settled as never committing (its answer was lost,
/// and the log was sealed past it): the words `tests/engine_lost_answers.rs` pins down.
fn settled_not_committed(e: &Error) -> bool {
    matches!(e, Error::Unavailable { reason, .. } if reason.contains("never will"))
}

/// Records, by entity: acknowledged records and accepted deferrals, or appends answered as
/// settled, never to commit.
pub type Records = StdMutex<BTreeMap<String, Vec<u64>>>;

/// Notes `record` under `e` in `records`.
pub fn note(records: &Records, e: &EntityId, record: u64) {
    records
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(e.to_string())
        .or_default()
        .push(record);
}

/// Checks the memory budget (R10) of `owner` now.
fn within_budget(owner: &Owner) {
    if let Some(b) = owner.budget {
        let resident = owner.engine.stats().passivation.resident;
        // Entities held by a call in flight may exceed the budget by the calls under way.
        assert!(
            resident <= b as u64 + 4,
            "R10: {} holds {resident} resident entities over a budget of {b}",
            owner.name
        );
    }
}

/// How long each read of an entity partition takes behind the network: nothing in a third of
/// the network seeds, 2 or 10 ms of virtual time in the others (drawn from a generator of its
/// own).
pub fn read_latency(plan: Plan) -> Option<Duration> {
    if plan.control == Some(Control::CloseUnbounded) {
        return Some(Duration::from_millis(10));
    }
    [None, Some(2), Some(10)][Rng::new(plan.seed ^ 0x6c61_7465).below(3) as usize]
        .map(Duration::from_millis)
}

/// The owners' close bound: 5 ms behind a slow network in quiet time (where closes are held to
/// it), the default (30 s) elsewhere.
pub fn close_timeout(plan: Plan, behind_network: bool) -> Duration {
    if plan.quiet_time() && behind_network && read_latency(plan).is_some() {
        Duration::from_millis(5)
    } else {
        Duration::from_secs(30)
    }
}

pub fn run(plan: Plan, rng: &mut Rng, clock: &SimClock, trace: &Trace) {
    let backend = match plan.control {
        Some(Control::UnsealedSettlement | Control::CloseUnbounded) => 3,
        // A take-back runs only without the network.
        Some(Control::StaleHoldingServed) => rng.below(3),
        _ => rng.below(4),
    };
    let net = (backend == 3).then(|| {
        let memory = MemoryStore::with_clock(Arc::new(clock.clone()));
        // Up to one record-writing batch in four loses its answer, and as many are delayed.
        let mut net_rng = Rng::new(plan.seed ^ 0x6e65_7477_6f72_6b00);
        let (lose, hold) = (5 + net_rng.below(20), 5 + net_rng.below(20));
        // Up to 4% of the reads of entity partitions time out, in half these seeds.
        let mut read_rng = Rng::new(plan.seed ^ 0x7469_6d65_6f75_7400);
        let fail_reads = if read_rng.chance(50) {
            1 + read_rng.below(4)
        } else {
            0
        };
        let net = Net::new(memory, net_rng, lose, hold, read_rng, fail_reads);
        match read_latency(plan) {
            Some(latency) => net.with_read_latency(clock.clone(), latency),
            None => net,
        }
    });
    let store: Arc<dyn Store> = match backend {
        0 => Arc::new(MemoryStore::with_clock(Arc::new(clock.clone()))),
        1 => Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())).without_deadlines()),
        3 => net.clone().expect("the network backend"),
        _ => Arc::new(
            FileStore::builder("/sim")
                .vfs(Arc::new(FaultFs::new()))
                .clock(Arc::new(clock.clone()))
                .segment_bytes(8 << 10)
                .snapshot_every_bytes(16 << 10)
                .open()
                .expect("the store opens"),
        ),
    };
    // A slow state machine in half the seeds (drawn from a generator of its own).
    let apply_steps = [0, 0, 3, 12][Rng::new(plan.seed ^ 0x736c_6f77).below(4) as usize];
    let backend_of_owners = Backend {
        store: store.clone(),
        net: net.clone(),
        clock: clock.clone(),
        apply_steps,
        close_timeout: close_timeout(plan, net.is_some()),
    };
    let entities: Vec<EntityId> = (0..2 + rng.below(3))
        .map(|i| EntityId::new("sim", format!("e{i}")).unwrap())
        .collect();
    let ns: Namespace = entities[0].namespace().clone();
    let budget = rng.chance(40).then(|| 1 + rng.below(2) as usize);
    let takeover = rng.chance(50)
        || matches!(
            plan.control,
            Some(Control::BypassFence | Control::StaleHoldingServed)
        );
    // In half the take-over seeds (not behind the network, whose delayed copies name only
    // their sender, not the holding they were sent under) `b` writes and `a` takes the
    // namespace back. Drawn from a generator of its own.
    let take_back = (takeover
        && backend != 3
        && (Rng::new(plan.seed ^ 0x7a6b_6261).chance(50)
            || plan.control == Some(Control::StaleHoldingServed)))
    .then(|| Arc::new(TakeBack::default()));
    trace.push(format!(
        "engine: backend {backend}, {} entities, budget {budget:?}, take-over {takeover}",
        entities.len()
    ));
    let a_switches = OwnerSwitches {
        unsealed_settlement: plan.control == Some(Control::UnsealedSettlement),
        deferred_hook_under_gate: plan.control == Some(Control::DeferredHookUnderGate),
        close_leaves_background: plan.control == Some(Control::CloseLeavesBackground),
        close_waits_unbounded: plan.control == Some(Control::CloseUnbounded),
        ignore_lease_expiry: plan.control == Some(Control::IgnoreLeaseExpiry),
        unguarded_renewal: plan.control == Some(Control::UnguardedRenewal),
        stale_holding_served: plan.control == Some(Control::StaleHoldingServed),
        ..OwnerSwitches::default()
    };
    // In a third of the seeds `a`'s `deferred` metrics hook reads the entity it reports on
    // (SPEC R11). Drawn from a generator of its own, so the rest of the seed's workload is as
    // without it.
    let reads_on_deferral = Rng::new(plan.seed ^ 0xdefe_22ed).chance(33)
        || plan.control == Some(Control::DeferredHookUnderGate);
    let a = Arc::new(
        try_open_owner(
            "a",
            &backend_of_owners,
            budget,
            false,
            a_switches,
            reads_on_deferral,
        )
        .expect("a opens"),
    );
    match plan.control {
        Some(Control::BypassFence) => a.engine.set_bypass_fence_for_test(true),
        Some(Control::RetireUnguarded) => a.engine.set_retire_unguarded_for_test(true),
        Some(Control::PassivateUnguarded) => a.engine.set_passivate_unguarded_for_test(true),
        _ => {}
    }
    a.engine.own(&ns).expect("a owns the namespace");
    for e in &entities {
        a.engine.register(e).expect("registered");
    }
    let b = takeover.then(|| Arc::new(open_owner("b", &backend_of_owners, None)));
    // In a quarter of the seeds without a take-over a second engine opens with `a`'s owner id
    // (SPEC F12). Drawn from a generator of its own.
    let impostor = (!takeover
        && (Rng::new(plan.seed ^ 0x696d_706f).chance(25)
            || matches!(
                plan.control,
                Some(
                    Control::IgnoreLiveIncarnation
                        | Control::IgnoreLeaseExpiry
                        | Control::UnguardedRenewal
                )
            )))
    .then(|| Arc::new(Impostor::default()));
    // On some take-overs a bystander `c` (first-use adoption on) reads the namespace's
    // entities meanwhile: it must never take the namespace (SPEC F12). Drawn from a generator
    // of its own, so the rest of the seed's workload is as without it.
    let mut by_rng = Rng::new(plan.seed ^ 0xb1c5_7a4d);
    let bystander = (takeover
        && (by_rng.chance(50) || plan.control == Some(Control::FirstUseTakesOver)))
    .then(|| {
        let switches = OwnerSwitches {
            first_use_takes_over: plan.control == Some(Control::FirstUseTakesOver),
            ..OwnerSwitches::default()
        };
        Arc::new(
            try_open_owner("c", &backend_of_owners, None, true, switches, false).expect("c opens"),
        )
    });
    // Passivation unguarded in every engine of the seed: the final passivations are `b`'s.
    if plan.control == Some(Control::PassivateUnguarded) {
        for owner in [b.as_ref(), bystander.as_ref()].into_iter().flatten() {
            owner.engine.set_passivate_unguarded_for_test(true);
        }
    }
    if bystander.is_some() {
        trace.push("bystander c".into());
    }
    // Acknowledged records and accepted deferrals, by entity; passivations by entity.
    let acked: Arc<Records> = Arc::default();
    // Appends answered as settled, never to commit, by entity.
    let refused: Arc<Records> = Arc::default();
    let passivated: Arc<StdMutex<BTreeMap<String, u64>>> = Arc::default();
    let complete = Arc::new(AtomicBool::new(false));
    if let Some(net) = &net {
        net.start_reads_failing();
    }
    let mut tasks = Vec::new();
    for w in 0..2u64 {
        let (a, acked, refused, trace, complete, entities, take_back, impostor) = (
            a.clone(),
            acked.clone(),
            refused.clone(),
            trace.clone(),
            complete.clone(),
            entities.clone(),
            take_back.clone(),
            impostor.clone(),
        );
        let lossy = net.is_some();
        let mut rng = Rng::new(rng.next());
        tasks.push(task(format!("writer {w}"), move || {
            for i in 0..4 + rng.below(4) {
                let e = &entities[rng.below(entities.len() as u64) as usize];
                let record = (w + 1) << 32 | i;
                let started_after = complete.load(Ordering::SeqCst);
                let replaced = impostor.as_ref().is_some_and(|i| i.has_opened());
                let outcome = a.engine.append(e, vec![record.to_le_bytes().to_vec()]);
                trace.push(format!("writer {w} append {e} {record}: {outcome:?}"));
                match outcome {
                    Ok(_) => {
                        assert!(
                            !started_after
                                || take_back::may_commit_after_completion(take_back.as_ref()),
                            "F7: a's append of {record} to {e}, started after b's revocation completed, committed"
                        );
                        assert!(
                            !replaced,
                            "F12: a's append of {record} to {e}, started after a second engine opened with a's owner id, committed"
                        );
                        note(&acked, e, record);
                    }
                    Err(err) if settled_not_committed(&err) => note(&refused, e, record),
                    Err(Error::Fenced { .. } | Error::Unavailable { .. } | Error::Closed) => {}
                    // Its answer was lost and could not be settled yet: it may be in the
                    // history or not (the next write to the entity settles it).
                    Err(Error::OutcomeUnknown { .. }) if lossy => {}
                    Err(other) if takeover || impostor.is_some() => {
                        trace.push(format!("writer {w}: {other}"));
                    }
                    Err(other) => panic!("an append failed: {other}"),
                }
                within_budget(&a);
            }
        }));
    }
    {
        let (a, acked, trace, entities) =
            (a.clone(), acked.clone(), trace.clone(), entities.clone());
        let mut rng = Rng::new(rng.next());
        tasks.push(task("deferrer".into(), move || {
            for i in 0..3 + rng.below(3) {
                let e = &entities[rng.below(entities.len() as u64) as usize];
                let record = 9 << 32 | i;
                let outcome = a.engine.defer(e, record.to_le_bytes().to_vec());
                trace.push(format!("deferrer {e} {record}: {outcome:?}"));
                if outcome.is_ok() {
                    note(&acked, e, record);
                }
            }
        }));
    }
    {
        let (a, passivated, trace, entities) = (
            a.clone(),
            passivated.clone(),
            trace.clone(),
            entities.clone(),
        );
        let mut rng = Rng::new(rng.next());
        tasks.push(task("passivator".into(), move || {
            if rng.chance(50) {
                let warm = a
                    .engine
                    .warm()
                    .map(|w| w.wait_timeout(std::time::Duration::from_secs(5)));
                trace.push(format!("warm: {warm:?}"));
            }
            for _ in 0..3 {
                pause(rng.below(40));
                let e = &entities[rng.below(entities.len() as u64) as usize];
                let outcome = a.engine.passivate(e);
                trace.push(format!("passivate {e}: {outcome:?}"));
                if let Ok(true) = outcome {
                    *passivated
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(e.to_string())
                        .or_default() += 1;
                }
                within_budget(&a);
            }
        }));
    }
    // `a` passivates and reads its entities again and again until a take-back ends (or a
    // dozen times), so its restore units run through a take-over and a take-back and may span
    // them. Drawn from a generator of its own.
    {
        let (a, trace, entities, take_back) = (
            a.clone(),
            trace.clone(),
            entities.clone(),
            take_back.clone(),
        );
        let mut rng = Rng::new(plan.seed ^ 0x7265_6164);
        tasks.push(task("reader".into(), move || {
            for _ in 0..12 {
                if take_back
                    .as_ref()
                    .is_some_and(|t| t.back.load(Ordering::SeqCst))
                {
                    break;
                }
                pause(rng.below(30));
                let e = &entities[rng.below(entities.len() as u64) as usize];
                let passivated = a.engine.passivate(e);
                let read = a.engine.read(e, |s| s.len());
                trace.push(format!(
                    "a passivates {e} ({passivated:?}) and reads: {read:?}"
                ));
            }
        }));
    }
    if let Some(state) = &impostor {
        let (state, backend, entities, trace) = (
            state.clone(),
            backend_of_owners.clone(),
            entities.clone(),
            trace.clone(),
        );
        let switches = OwnerSwitches {
            ignore_live_incarnation: plan.control == Some(Control::IgnoreLiveIncarnation),
            ..OwnerSwitches::default()
        };
        let mut rng = Rng::new(plan.seed ^ 0x7769_6d70);
        tasks.push(task("second engine".into(), move || {
            impostor::run(&state, &backend, switches, &entities, &mut rng, &trace);
        }));
    }
    {
        let (clock, trace) = (clock.clone(), trace.clone());
        let mut rng = Rng::new(rng.next());
        tasks.push(task("clock jumps".into(), move || {
            for _ in 0..2 {
                pause(rng.below(60));
                let jump = rng.below(40_000);
                clock.wall().advance(jump);
                trace.push(format!("wall clock +{jump} ms"));
            }
        }));
    }
    if let Some(b) = &b {
        let (b, trace, complete, ns) = (b.clone(), trace.clone(), complete.clone(), ns.clone());
        let (a, entities, acked, take_back) = (
            a.clone(),
            entities.clone(),
            acked.clone(),
            take_back.clone(),
        );
        let mut rng = Rng::new(rng.next());
        let mut back_rng = Rng::new(plan.seed ^ 0x6261_636b);
        tasks.push(task("take-over".into(), move || {
            pause(rng.below(80));
            let epoch = b.engine.current_epoch(&ns).unwrap_or(0) + 1;
            let bumped = b.engine.bump_epoch(&ns, epoch);
            trace.push(format!("b bumps to {epoch}: {bumped:?}"));
            for step in 0..200 {
                match b.engine.revoke_step(&ns, RevokeBudget::default()) {
                    Ok(RevokeProgress::Complete) => {
                        complete.store(true, Ordering::SeqCst);
                        trace.push(format!("b's revocation complete after {step} slices"));
                        break;
                    }
                    Ok(RevokeProgress::Pending { .. }) => pause(1),
                    Err(e) => {
                        trace.push(format!("b's revocation: {e}"));
                        pause(1);
                    }
                }
            }
            let owned = b.engine.own(&ns);
            trace.push(format!("b owns: {owned:?}"));
            if let Some(state) = &take_back {
                take_back::run(&a, &b, &entities, &acked, state, &mut back_rng, &trace);
            }
        }));
    }
    if let Some(c) = &bystander {
        let (c, trace, entities) = (c.clone(), trace.clone(), entities.clone());
        tasks.push(task("bystander".into(), move || {
            for _ in 0..6 {
                pause(by_rng.below(40));
                let e = &entities[by_rng.below(entities.len() as u64) as usize];
                let read = c.engine.read(e, |s| s.len());
                trace.push(format!("bystander reads {e}: {}", read.is_ok()));
            }
        }));
    }
    if let Some(net) = &net {
        let (net, complete, trace) = (net.clone(), complete.clone(), trace.clone());
        let mut rng = Rng::new(rng.next());
        tasks.push(task("network".into(), move || {
            for _ in 0..12 {
                pause(rng.below(30));
                if let Some(delivery) = net.deliver_one() {
                    arrived(delivery, &complete, &trace);
                }
            }
        }));
    }
    for t in tasks {
        t.join().unwrap();
    }
    // The network calms down: the copies still held arrive now.
    for delivery in net.iter().flat_map(|net| net.calm()) {
        arrived(delivery, &complete, trace);
    }
    if let Some(net) = &net {
        let timed_out: u64 = entities
            .iter()
            .map(|e| net.read_failures(&e.partition()))
            .sum();
        trace.push(format!("network: {timed_out} reads timed out"));
    }
    let second = impostor.as_ref().and_then(|i| i.owner());
    let finished = Finished {
        a: &a,
        second: second.as_ref(),
        b: b.as_ref(),
        net: net.as_ref(),
        complete: &complete,
        back: take_back
            .as_ref()
            .is_some_and(|t| t.back.load(Ordering::SeqCst)),
        clock,
        ns: &ns,
        entities: &entities,
        acked: &acked,
        refused: &refused,
        trace,
        close_bound: plan.quiet_time().then(|| {
            close_timeout(plan, net.is_some())
                + net.as_ref().and(read_latency(plan)).unwrap_or_default()
        }),
        warm_at_close: plan.quiet_time() && net.is_some() && read_latency(plan).is_some(),
    };
    engine_checks::after_run(&finished);
    let _ = store.close();
}
