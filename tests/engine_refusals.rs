//! Refusing before writing (SPEC R12, with R4, R8, E1): a record the current state refuses
//! (the state machine's `check`) or a decision that refuses (`try_write`) answers
//! `Error::Refused`, writes nothing (no record, no head, no lease row) and leaves the entity
//! serving; a deferred record the state refuses when the entity restores is set aside, kept,
//! listed and reported, never appended and never a containment, exactly once across crashes.
//! Negative controls turn `check` off (`set_skip_checks_for_test`).
//!
//! Before the change, each of these wrote the refused record: a typed append of a record
//! `apply` refused answered `Contained` with the record in the history, and a deferred record
//! the state refused answered `Ok(Queued)` and then contained the entity on its restore.

mod common;

use std::sync::Arc;

use common::engine::TestStore;
use parking_lot::Mutex;
use portcullis::engine::Deferred;
use portcullis::restore::{Metrics, Origin, RefusedDeferral};
use portcullis::store::{KeyRange, MemoryStore, Store};
use portcullis::{ApplyContext, Engine, EntityId, Error, Rejection, Typed, TypedMachine};
use serde::{Deserialize, Serialize};

/// One record of an account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Op {
    Deposit(u64),
    Withdraw(u64),
    /// `check` panics on it.
    Explode,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Ledger {
    balance: u64,
    ops: Vec<Op>,
}

/// Refuses overdrafts in `check`; `apply` only folds (and refuses an overdraft too, so a
/// refused record that reached the history shows up as a containment).
#[derive(Default)]
struct Bank {
    /// Every `check` call: the balance it saw, the seq and origin it was given, the record.
    checked: Mutex<Vec<(u64, u64, Origin, Op)>>,
}

impl TypedMachine for Bank {
    type Record = Op;
    type State = Ledger;

    fn fresh(&self, _: &EntityId) -> Ledger {
        Ledger::default()
    }

    fn check(&self, l: &Ledger, ctx: &ApplyContext<'_>, op: &Op) -> Result<(), Rejection> {
        self.checked
            .lock()
            .push((l.balance, ctx.seq, ctx.origin, op.clone()));
        match op {
            Op::Withdraw(n) if *n > l.balance => Err(Rejection::new(format!(
                "overdrawn: {n} asked, {} held",
                l.balance
            ))),
            Op::Explode => panic!("check met an exploding record"),
            _ => Ok(()),
        }
    }

    fn apply(&self, l: &mut Ledger, _: &ApplyContext<'_>, op: Op) -> Result<(), Rejection> {
        match op {
            Op::Deposit(n) => l.balance += n,
            Op::Withdraw(n) if n <= l.balance => l.balance -= n,
            Op::Withdraw(_) => return Err(Rejection::new("apply met an overdraft")),
            Op::Explode => {}
        }
        l.ops.push(op);
        Ok(())
    }
}

/// Collects refused deferrals reported to the metrics hook.
#[derive(Default)]
struct Reports(Mutex<Vec<RefusedDeferral>>);

impl Metrics for Reports {
    fn deferral_refused(&self, _: &EntityId, refused: &RefusedDeferral) {
        self.0.lock().push(refused.clone());
    }
}

/// A bank the test keeps a handle on.
struct Shared(Arc<Bank>);

impl TypedMachine for Shared {
    type Record = Op;
    type State = Ledger;
    fn fresh(&self, e: &EntityId) -> Ledger {
        self.0.fresh(e)
    }
    fn check(&self, l: &Ledger, ctx: &ApplyContext<'_>, op: &Op) -> Result<(), Rejection> {
        self.0.check(l, ctx, op)
    }
    fn apply(&self, l: &mut Ledger, ctx: &ApplyContext<'_>, op: Op) -> Result<(), Rejection> {
        self.0.apply(l, ctx, op)
    }
}

type BankEngine = Engine<Typed<Shared>>;

/// An engine over `store`. The background warm is off: these tests defer to pending entities
/// and decide when their restore unit drains the work.
fn open(store: &Arc<dyn Store>, bank: &Arc<Bank>, reports: &Arc<Reports>) -> BankEngine {
    Engine::builder(Typed(Shared(Arc::clone(bank))))
        .store(Arc::clone(store))
        .metrics(Arc::clone(reports) as Arc<dyn Metrics>)
        .pool_threads(2)
        .background_warm(false)
        .open()
        .unwrap()
}

fn alice() -> EntityId {
    EntityId::new("bank", "alice").unwrap()
}

type Rows = Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>;

/// Every row of every partition.
fn rows(store: &dyn Store) -> Rows {
    store
        .list_partitions(b"")
        .unwrap()
        .into_iter()
        .map(|p| {
            let page = store.scan(&p, &KeyRange::all(), None, 10_000).unwrap();
            (p.to_string(), page.entries)
        })
        .collect()
}

fn history(engine: &BankEngine, e: &EntityId) -> Vec<Op> {
    engine
        .history_typed(e, 1)
        .unwrap()
        .map(|r| r.unwrap().1)
        .collect()
}

fn refused_reason(answer: portcullis::Result<impl std::fmt::Debug>) -> String {
    match answer {
        Err(e @ Error::Refused { .. }) => {
            assert_eq!(e.code(), 17);
            assert!(e.to_string().contains("nothing was written"), "{e}");
            let Error::Refused { reason, .. } = e else {
                unreachable!()
            };
            reason
        }
        other => panic!("expected Refused, got {other:?}"),
    }
}

/// An engine serving `bank` in a fenced namespace, with alice holding 10.
fn funded(skip_checks: bool) -> (Arc<dyn Store>, BankEngine) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let engine = Engine::builder(Typed(Shared(Arc::default())))
        .store(Arc::clone(&store))
        .own(alice().namespace().clone())
        .open()
        .unwrap();
    engine.set_skip_checks_for_test(skip_checks);
    engine.register(&alice()).unwrap();
    engine.append_typed(&alice(), &[Op::Deposit(10)]).unwrap();
    (store, engine)
}

#[test]
fn r12_a_typed_append_the_state_refuses_writes_nothing_and_the_entity_keeps_serving() {
    let (store, engine) = funded(false);
    let before = rows(&*store);
    // The second record of the write is refused: the whole write is.
    let answer = engine.append_typed(&alice(), &[Op::Deposit(1), Op::Withdraw(50)]);
    let reason = refused_reason(answer);
    assert_eq!(
        reason,
        "record 2 of 2 (it would be 3): overdrawn: 50 asked, 10 held"
    );
    assert_eq!(
        rows(&*store),
        before,
        "no record, head or lease row changed"
    );
    assert_eq!(history(&engine, &alice()), [Op::Deposit(10)]);
    assert!(engine.containment(&alice()).unwrap().is_none());
    // The entity keeps serving: the next write gets seq 2.
    assert_eq!(
        engine.append_typed(&alice(), &[Op::Withdraw(4)]).unwrap(),
        2..=2
    );
    assert_eq!(engine.read(&alice(), |l| l.balance).unwrap(), 6);
}

/// Negative control: without the check the overdraft is written, and apply's refusal of a
/// written record contains the entity.
#[test]
fn r12_negative_control_without_check_the_refused_record_is_written_and_contains() {
    let (store, engine) = funded(true);
    let before = rows(&*store);
    let answer = engine.append_typed(&alice(), &[Op::Withdraw(50)]);
    assert!(matches!(answer, Err(Error::Contained { .. })), "{answer:?}");
    assert_ne!(rows(&*store), before);
    assert_eq!(history(&engine, &alice()).len(), 2);
}

#[test]
fn r12_check_sees_the_state_the_write_starts_from_and_the_seq_each_record_would_get() {
    let bank = Arc::new(Bank::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let engine = open(&store, &bank, &Arc::default());
    engine.register(&alice()).unwrap();
    engine.append_typed(&alice(), &[Op::Deposit(10)]).unwrap();
    bank.checked.lock().clear();
    // Both records are checked against balance 10 (the write's start), in order: the second
    // would overdraw only after the first is folded, which a check does not see. A rule
    // across records of one write belongs in the decision (below).
    engine
        .append_typed(&alice(), &[Op::Withdraw(6), Op::Withdraw(6)])
        .unwrap_err();
    // The second withdrawal contained the entity: check and apply disagreed, by design of
    // this machine. Release and restore: the history holds both.
    assert!(engine.release(&alice()).unwrap());
    let seen: Vec<_> = bank.checked.lock().drain(..).collect();
    assert_eq!(
        seen,
        [
            (10, 2, Origin::Live, Op::Withdraw(6)),
            (10, 3, Origin::Live, Op::Withdraw(6))
        ]
    );
    // The same rule in the decision sees every record it decides.
    let bob = EntityId::new("bank", "bob").unwrap();
    engine.register(&bob).unwrap();
    engine.append_typed(&bob, &[Op::Deposit(10)]).unwrap();
    let answer = engine.try_write_typed(&bob, |l| {
        let asked = [6, 6];
        if asked.iter().sum::<u64>() > l.balance {
            return Err(Rejection::new("the two withdrawals overdraw"));
        }
        Ok((asked.map(Op::Withdraw).to_vec(), ()))
    });
    assert_eq!(refused_reason(answer), "the two withdrawals overdraw");
    assert_eq!(engine.read(&bob, |l| l.balance).unwrap(), 10);
}

#[test]
fn r12_a_decision_that_refuses_writes_nothing_and_the_entity_keeps_serving() {
    let (store, engine) = funded(false);
    let before = rows(&*store);
    let typed = engine.try_write_typed(&alice(), |l| -> Result<(Vec<Op>, ()), _> {
        Err(Rejection::new(format!("frozen at {}", l.balance)))
    });
    assert_eq!(refused_reason(typed), "frozen at 10");
    let raw = engine.try_write(&alice(), |_| -> Result<(Vec<Vec<u8>>, ()), _> {
        Err(Rejection::new("no"))
    });
    assert_eq!(refused_reason(raw), "no");
    // A raw write's records are checked like typed ones.
    let encoded = portcullis::typed::encode(&Op::Withdraw(11)).unwrap();
    let raw = engine.write(&alice(), |_| (vec![encoded], ()));
    assert_eq!(refused_reason(raw), "overdrawn: 11 asked, 10 held");
    assert_eq!(rows(&*store), before);
    let ok = engine
        .try_write_typed(&alice(), |l| Ok((vec![Op::Withdraw(l.balance)], l.balance)))
        .unwrap();
    assert_eq!((ok.seqs, ok.value), (Some(2..=2), 10));
}

#[test]
fn r12_defer_to_a_restored_entity_is_checked_at_once() {
    let (store, engine) = funded(false);
    let before = rows(&*store);
    let answer = engine.defer_typed(&alice(), &Op::Withdraw(11));
    assert_eq!(refused_reason(answer), "overdrawn: 11 asked, 10 held");
    let answer = engine.defer_once(
        &alice(),
        b"req-1",
        portcullis::typed::encode(&Op::Withdraw(11)).unwrap(),
    );
    assert_eq!(refused_reason(answer), "overdrawn: 11 asked, 10 held");
    assert_eq!(rows(&*store), before, "not even the idempotency marker");
    assert_eq!(
        engine.defer_typed(&alice(), &Op::Withdraw(3)).unwrap(),
        Deferred::Applied { seq: 2 }
    );
}

#[test]
fn r4_r12_a_panic_in_check_contains_only_its_entity_and_writes_nothing() {
    let (store, engine) = funded(false);
    let bob = EntityId::new("bank", "bob").unwrap();
    engine.register(&bob).unwrap();
    let before = rows(&*store);
    let answer = engine.append_typed(&alice(), &[Op::Explode]);
    match answer {
        Err(Error::Contained { reason, .. }) => {
            assert!(
                reason.contains("panic") && reason.contains("check"),
                "{reason}"
            );
        }
        other => panic!("a panicking check contains its entity, got {other:?}"),
    }
    assert_eq!(rows(&*store), before);
    engine.append_typed(&bob, &[Op::Deposit(1)]).unwrap();
    assert!(engine.release(&alice()).unwrap());
    assert_eq!(history(&engine, &alice()), [Op::Deposit(10)]);
}

#[test]
fn r4_r12_apply_refusing_a_record_in_the_history_says_the_code_and_history_disagree() {
    let (_store, engine) = funded(true);
    engine
        .append_typed(&alice(), &[Op::Withdraw(50)])
        .unwrap_err();
    assert!(engine.release(&alice()).unwrap());
    let err = engine
        .read(&alice(), |l| l.balance)
        .unwrap_err()
        .to_string();
    assert!(err.contains("apply-refusal"), "{err}");
    assert!(
        err.contains("record 2 is in the history but apply refused it")
            && err.contains("the code and the history disagree"),
        "{err}"
    );
}

/// Alice pending with deferred work: deposit 5, withdraw 3, withdraw 3 (only 2 left: refused),
/// deposit 1, withdraw 9 (refused), withdraw 3.
fn deferred_to_pending(store: &Arc<dyn Store>) {
    let bank = Arc::new(Bank::default());
    let engine = open(store, &bank, &Arc::default());
    engine.register(&alice()).unwrap();
    engine.close().unwrap();
    let engine = open(store, &bank, &Arc::default());
    for op in [5, 3, 3, 1, 9, 3].iter().enumerate().map(|(i, &n)| {
        if i == 0 || i == 3 {
            Op::Deposit(n)
        } else {
            Op::Withdraw(n)
        }
    }) {
        assert_eq!(engine.defer_typed(&alice(), &op).unwrap(), Deferred::Queued);
    }
    engine.close().unwrap();
}

const ACCEPTED: [Op; 4] = [
    Op::Deposit(5),
    Op::Withdraw(3),
    Op::Deposit(1),
    Op::Withdraw(3),
];

fn assert_set_aside(refused: &[RefusedDeferral]) {
    let seen: Vec<_> = refused
        .iter()
        .map(|r| (r.seq, r.reason.as_str(), r.record.clone()))
        .collect();
    // As Typed stores a record: behind the envelope of its version (SPEC E7).
    let enc = |op: &Op| portcullis::typed::encode_versioned(1, op).unwrap();
    assert_eq!(
        seen,
        [
            (3, "overdrawn: 3 asked, 2 held", enc(&Op::Withdraw(3))),
            (4, "overdrawn: 9 asked, 3 held", enc(&Op::Withdraw(9))),
        ]
    );
}

#[test]
fn r8_r12_a_deferred_record_the_state_refuses_is_set_aside_kept_listed_and_reported() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    deferred_to_pending(&store);
    let bank = Arc::new(Bank::default());
    let reports = Arc::new(Reports::default());
    let engine = open(&store, &bank, &reports);
    assert!(engine.refused_deferrals(&alice()).unwrap().is_empty());
    // The first touch restores alice: each deferred record is checked against the state
    // after the ones before it.
    assert_eq!(engine.read(&alice(), |l| l.balance).unwrap(), 0);
    assert_eq!(history(&engine, &alice()), ACCEPTED);
    assert_eq!(engine.read(&alice(), |l| l.ops.clone()).unwrap(), ACCEPTED);
    let checked: Vec<_> = bank
        .checked
        .lock()
        .iter()
        .map(|(balance, _, origin, _)| (*balance, *origin))
        .collect();
    let deferred = Origin::Deferred;
    assert_eq!(
        checked,
        [
            (0, deferred),
            (5, deferred),
            (2, deferred),
            (2, deferred),
            (3, deferred),
            (3, deferred)
        ]
    );
    assert_set_aside(&engine.refused_deferrals(&alice()).unwrap());
    assert_set_aside(&reports.0.lock());
    assert!(engine.containment(&alice()).unwrap().is_none());
    assert_eq!(engine.stats().phases.contained, 0);
    engine.append_typed(&alice(), &[Op::Deposit(7)]).unwrap();
    engine.close().unwrap();
    // Kept across a restart, and reported only once.
    let reports = Arc::new(Reports::default());
    let engine = open(&store, &bank, &reports);
    assert_eq!(engine.read(&alice(), |l| l.balance).unwrap(), 7);
    assert_set_aside(&engine.refused_deferrals(&alice()).unwrap());
    assert!(reports.0.lock().is_empty());
}

/// Negative control: without the check the deferred overdraft is appended and contains the
/// entity on its restore, as before the change.
#[test]
fn r8_r12_negative_control_without_check_a_refused_deferral_is_appended_and_contains() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    deferred_to_pending(&store);
    let engine = open(&store, &Arc::default(), &Arc::default());
    engine.set_skip_checks_for_test(true);
    let err = engine.read(&alice(), |l| l.balance).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    assert!(engine.refused_deferrals(&alice()).unwrap().is_empty());
    assert_eq!(
        history(&engine, &alice()).len(),
        3,
        "the overdraft was appended"
    );
}

#[test]
fn r8_r12_a_refused_deferral_is_set_aside_exactly_once_across_a_crash() {
    // The drain's batches, in order: deposit 5; withdraw 3; refused withdraw 3 + deposit 1;
    // refused withdraw 9 + withdraw 3. A crash before or after each of them.
    for batch in 1..=4 {
        for lost_after_commit in [false, true] {
            let store = TestStore::new();
            let dyn_store: Arc<dyn Store> = Arc::clone(&store) as Arc<dyn Store>;
            deferred_to_pending(&dyn_store);
            let engine = open(&dyn_store, &Arc::default(), &Arc::default());
            // Fail the drain's `batch`-th batch: before it commits (the store refuses every
            // write to the partition from then on: set once the batch before it went through,
            // or at once for the first), or after it committed (its answer lost).
            if batch == 1 && !lost_after_commit {
                *store.fail_writes_of.lock() = Some(alice().partition());
            }
            let seen = Arc::new(Mutex::new(0));
            let weak = Arc::downgrade(&store);
            store.set_before_apply(move |p, b| {
                let drains = b.ops().iter().any(|op| {
                    matches!(op, portcullis::store::Op::Delete(k) if k.starts_with(b"\0defer."))
                });
                let Some(store) = weak.upgrade().filter(|_| drains) else {
                    return;
                };
                let mut n = seen.lock();
                *n += 1;
                if lost_after_commit && *n == batch {
                    *store.lose_answers_of.lock() = Some(p.clone());
                } else if !lost_after_commit && *n + 1 == batch {
                    *store.fail_writes_of.lock() = Some(p.clone());
                }
            });
            let answer = engine.read(&alice(), |l| l.balance);
            store.clear_hooks();
            *store.fail_writes_of.lock() = None;
            *store.lose_answers_of.lock() = None;
            let case = format!("batch {batch}, lost after commit: {lost_after_commit}");
            assert!(answer.is_err(), "{case}: the unit met the failure");
            // What the crash leaves: the batches before it (and it, if it committed).
            let committed = if lost_after_commit { batch } else { batch - 1 };
            let count = |prefix: &[u8]| {
                let p = alice().partition();
                let page = store.inner.scan(&p, &KeyRange::prefix(prefix), None, 100);
                page.unwrap().entries.len()
            };
            let (covered, set_aside) = ([0, 1, 2, 4, 6][committed], [0, 0, 0, 1, 2][committed]);
            assert_eq!(count(b"\0defer."), 6 - covered, "{case}: still deferred");
            assert_eq!(count(b"\0refused."), set_aside, "{case}: set aside");
            // A crash: no clean shutdown is recorded, and the owner lease lapses as if its time
            // had passed, so the restart opens at once (SPEC F12).
            engine.crash_for_test();
            std::mem::forget(engine);
            let engine = open(&dyn_store, &Arc::default(), &Arc::default());
            assert_eq!(engine.read(&alice(), |l| l.balance).unwrap(), 0, "{case}");
            assert_eq!(history(&engine, &alice()), ACCEPTED, "{case}");
            assert_set_aside(&engine.refused_deferrals(&alice()).unwrap());
            let left = store
                .inner
                .scan(
                    &alice().partition(),
                    &KeyRange::prefix(b"\0defer."),
                    None,
                    100,
                )
                .unwrap();
            assert!(left.entries.is_empty(), "{case}: nothing still deferred");
        }
    }
}

/// A shared machine (`Arc<M>`) forwards `check`.
#[test]
fn r12_a_shared_machine_forwards_check() {
    let engine = Engine::builder(Arc::new(Typed(Bank::default())))
        .store(Arc::new(MemoryStore::new()))
        .open()
        .unwrap();
    engine.register(&alice()).unwrap();
    let overdraft = portcullis::typed::encode(&Op::Withdraw(1)).unwrap();
    let answer = engine.append(&alice(), vec![overdraft]);
    assert_eq!(refused_reason(answer), "overdrawn: 1 asked, 0 held");
}

/// A retried `defer_once` whose first try was accepted answers `AlreadyAccepted`, even when
/// the state (changed by that first try) would now refuse the record: it was not refused.
#[test]
fn r8_r12_a_retried_idempotent_deferral_is_already_accepted_not_refused() {
    let (_store, engine) = funded(false);
    let withdraw = || portcullis::typed::encode(&Op::Withdraw(10)).unwrap();
    let first = engine.defer_once(&alice(), b"req-2", withdraw()).unwrap();
    assert_eq!(first, Deferred::Applied { seq: 2 });
    let retry = engine.defer_once(&alice(), b"req-2", withdraw()).unwrap();
    assert_eq!(retry, Deferred::AlreadyAccepted);
    assert_eq!(engine.read(&alice(), |l| l.balance).unwrap(), 0);
}

/// SPEC E8: each deferred record set aside at restore is told to the engine's listener, with
/// its sequence number and the state's reason.
#[test]
fn e8_r12_a_deferred_record_set_aside_is_told_to_the_listener() {
    use portcullis::observe::{Event, Listener};
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    deferred_to_pending(&store);
    let (tx, rx) = crossbeam::channel::unbounded();
    let listener: Arc<dyn Listener> = Arc::new(move |e: &Event| drop(tx.send(e.clone())));
    let engine = Engine::builder(Typed(Shared(Arc::default())))
        .store(Arc::clone(&store))
        .listener(listener)
        .background_warm(false)
        .open()
        .unwrap();
    assert_eq!(engine.read(&alice(), |l| l.balance).unwrap(), 0);
    let set_aside: Vec<RefusedDeferral> = rx
        .try_iter()
        .filter_map(|e| match e {
            Event::DeferralRefused {
                entity, refused, ..
            } if entity == alice() => Some(refused),
            _ => None,
        })
        .collect();
    assert_set_aside(&set_aside);
}
