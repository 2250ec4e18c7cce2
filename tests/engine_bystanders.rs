//! Only a completed take-over moves a namespace (SPEC F12): engines that share a store with other
//! owners and adopt namespaces on first use (the default) never take one from another owner,
//! whatever they do (a read routed to the wrong engine, a warm, `fold_all`, an explicit `own`
//! while revocation is still pending), and a store shared with other owners does not make their
//! warm, `fold_all` or registry trip over the other owners' entities.
//!
//! Three engines over one store, default settings except their owner ids: `a` serves `bank`, `c`
//! takes it over (bump, revocation, adoption), `b` is a bystander.

mod common;

use std::sync::Arc;

use common::engine::{TestEngine, TestMachine, TestStore, builder, recs, revoke_to_complete};
use portcullis::engine::OwnerSwitches;
use portcullis::fence::{RevokeBudget, RevokeProgress};
use portcullis::store::Batch;
use portcullis::{EntityId, Error, Namespace};

const ACCOUNTS: usize = 8;

fn bank() -> Namespace {
    Namespace::new("bank").unwrap()
}

fn account(i: usize) -> EntityId {
    EntityId::in_namespace(bank(), format!("acct-{i}")).unwrap()
}

/// Three engines with default settings except their owner ids; `a` serves `bank` (adopted on
/// first use) and has written one deposit to each account.
fn three_owners() -> (Arc<TestStore>, Arc<TestMachine>, [TestEngine; 3]) {
    three_owners_with(OwnerSwitches::default())
}

/// [`three_owners`], the bystander `b` opened with `switches` (a negative control).
fn three_owners_with(
    switches: OwnerSwitches,
) -> (Arc<TestStore>, Arc<TestMachine>, [TestEngine; 3]) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let open = |owner: &str| {
        let switches = if owner == "b" {
            switches
        } else {
            OwnerSwitches::default()
        };
        builder(&machine, &store)
            .owner(owner)
            .owner_switches_for_test(switches)
            .open()
            .unwrap()
    };
    let (a, b, c) = (open("a"), open("b"), open("c"));
    for i in 0..ACCOUNTS {
        a.register(&account(i)).unwrap();
        a.append(&account(i), recs(&["a"])).unwrap();
    }
    assert_eq!(a.grant(&bank()), Some(0), "a adopted bank on first use");
    (store, machine, [a, b, c])
}

/// `c` bumps `bank` and runs one small revocation slice: the take-over is under way.
fn start_take_over(c: &TestEngine) {
    c.bump_epoch(&bank(), 1).unwrap();
    let slice = c
        .revoke_step(&bank(), RevokeBudget::default().with_max_pushes(1))
        .unwrap();
    assert!(
        matches!(slice, RevokeProgress::Pending { .. }),
        "still pending"
    );
}

/// `c` finishes its take-over: revocation to `Complete`, then `own` at the new epoch.
fn finish_take_over(c: &TestEngine) {
    revoke_to_complete(c, &bank());
    assert_eq!(c.own(&bank()).unwrap(), 1, "c adopts bank at epoch 1");
    assert_eq!(c.grant(&bank()), Some(1));
}

/// A refusal that names the holder.
fn assert_not_served_naming(err: &Error, holder: &str) {
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(err.to_string().contains(&format!("{holder:?}")), "{err}");
}

/// Before F12 this read succeeded: first-use adoption checked only that `a`'s owner row was
/// at an epoch below the current one, so `b` took `bank` over at the new epoch (running `a`'s
/// unclean-restart repair while `a` was alive) and `c`'s `own` after `Complete` was refused.
#[test]
fn f12_a_bystanders_read_during_a_take_over_does_not_take_the_namespace() {
    let (_store, machine, [a, b, c]) = three_owners();
    start_take_over(&c);
    let err = b.read(&account(0), |_| ()).unwrap_err();
    assert_not_served_naming(&err, "a");
    assert!(err.to_string().contains("first use"), "{err}");
    assert_eq!(b.grant(&bank()), None, "b holds nothing");
    assert!(machine.repairs.lock().is_empty(), "nobody was repaired");
    finish_take_over(&c);
    assert_eq!(c.read(&account(0), |s| s.records.len()).unwrap(), 1);
    // c took it from a (which never released it): c repairs, once, for a's term.
    assert_eq!(*machine.repairs.lock(), vec![(account(0), 1)]);
    assert!(matches!(
        a.append(&account(0), recs(&["late"])),
        Err(Error::Fenced { .. })
    ));
}

/// A stale router sends a write for `bank` to the bystander: refused, nothing taken.
#[test]
fn f12_a_stale_routers_write_to_a_bystander_does_not_take_the_namespace() {
    let (_store, _machine, [_a, b, c]) = three_owners();
    start_take_over(&c);
    for attempt in [
        b.append(&account(1), recs(&["b"])).map(|_| ()),
        b.register(&account(ACCOUNTS)).map(|_| ()),
        b.defer(&account(2), b"d".to_vec()).map(|_| ()),
    ] {
        assert_not_served_naming(&attempt.unwrap_err(), "a");
    }
    assert_eq!(b.grant(&bank()), None);
    finish_take_over(&c);
}

/// Negative control: with first-use adoption taking a namespace from another owner at an older
/// epoch (as before F12), the bystander's read takes `bank` in the middle of `c`'s take-over.
#[test]
fn negative_control_first_use_that_takes_over_is_caught() {
    let switches = OwnerSwitches {
        first_use_takes_over: true,
        ..OwnerSwitches::default()
    };
    let (_store, _machine, [_a, b, c]) = three_owners_with(switches);
    start_take_over(&c);
    assert!(
        b.read(&account(0), |_| ()).is_ok(),
        "the read hijacked bank"
    );
    assert_eq!(b.grant(&bank()), Some(1));
    revoke_to_complete(&c, &bank());
    assert!(matches!(c.own(&bank()), Err(Error::NotServed { .. })));
}

/// An explicit `own` while revocation is still pending proves nothing: refused. Before F12 it
/// adopted the namespace while `a` could still commit writes under epoch 0.
#[test]
fn f12_own_while_revocation_is_pending_is_refused() {
    let (_store, _machine, [a, b, c]) = three_owners();
    start_take_over(&c);
    let err = b.own(&bank()).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(err.to_string().contains("revocation"), "{err}");
    let err = c.own(&bank()).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert_eq!((b.grant(&bank()), c.grant(&bank())), (None, None));
    // a still holds it (its next write is fenced once revocation reached its lease).
    assert_eq!(a.grant(&bank()), Some(0));
    finish_take_over(&c);
}

/// The bystander's warm during the take-over restores only what it serves: `bank`'s entities
/// are neither restored, nor refused, nor given registry slots, and `bank` is not adopted.
#[test]
fn f12_a_bystanders_warm_leaves_other_owners_namespaces_alone() {
    let (_store, _machine, [_a, b, c]) = three_owners();
    let mine = EntityId::new("mine", "x").unwrap();
    b.register(&mine).unwrap();
    b.append(&mine, recs(&["b"])).unwrap();
    b.passivate(&mine).unwrap();
    start_take_over(&c);
    let progress = b.warm().unwrap().wait().unwrap();
    assert_eq!(progress.refused, 0, "{progress:?}");
    assert!(progress.refused_entities.is_empty(), "{progress:?}");
    assert_eq!(b.grant(&bank()), None, "the warm adopted nothing");
    assert_eq!(
        b.stats().passivation.slots,
        1,
        "a slot for its own entity only"
    );
    finish_take_over(&c);
}

/// `fold_all` of an engine sharing the store folds the namespaces it serves and does not fail
/// on another owner's (before F12 it answered the other owner's `NotServed`, or, during a
/// take-over, adopted the namespace).
#[test]
fn f12_fold_all_folds_what_the_engine_serves_and_skips_other_owners() {
    let (_store, _machine, [a, b, c]) = three_owners();
    let mine = EntityId::new("mine", "x").unwrap();
    b.register(&mine).unwrap();
    b.append(&mine, recs(&["b1", "b2"])).unwrap();
    let (records, contained) = b.fold_all(0, |n, _, s| n + s.records.len()).unwrap();
    assert_eq!((records, contained), (2, 0), "b's own entity only");
    start_take_over(&c);
    let (records, _) = b.fold_all(0, |n, _, s| n + s.records.len()).unwrap();
    assert_eq!(records, 2);
    assert_eq!(b.grant(&bank()), None, "fold_all adopted nothing");
    // The owner folds its own namespace as before.
    let (records, _) = a
        .fold_all(0, |n, e, s| {
            n + usize::from(e.namespace() == &bank()) * s.records.len()
        })
        .unwrap();
    assert_eq!(records, ACCOUNTS);
    finish_take_over(&c);
}

/// Revocation touches (SPEC R2) restore only entities of namespaces the engine holds: `c`'s
/// slices, and a bystander's, make no slot and run no unit for `bank`.
#[test]
fn f12_revocation_touches_only_namespaces_the_engine_holds() {
    let (_store, machine, [_a, b, c]) = three_owners();
    let units_before = (0..ACCOUNTS)
        .map(|i| machine.units_of(&account(i)))
        .sum::<u64>();
    c.bump_epoch(&bank(), 1).unwrap();
    // The bystander runs slices too (any engine over the store may).
    while b.revoke_step(&bank(), RevokeBudget::default()).unwrap() != RevokeProgress::Complete {}
    let units_after = (0..ACCOUNTS)
        .map(|i| machine.units_of(&account(i)))
        .sum::<u64>();
    assert_eq!(units_after, units_before, "no unit ran for bank's entities");
    assert_eq!(b.stats().passivation.slots, 0);
    assert_eq!(c.stats().passivation.slots, 0);
    assert_eq!((b.grant(&bank()), c.grant(&bank())), (None, None));
    finish_take_over(&c);
}

/// The holder itself may not take its namespace back at the new epoch while another owner's
/// take-over is under way: before F12 its `own` re-adopted its own row at the bumped epoch, and
/// the taking owner's `own` after `Complete` was refused.
#[test]
fn f12_the_holders_own_during_a_take_over_is_refused() {
    let (_store, _machine, [a, _b, c]) = three_owners();
    start_take_over(&c);
    let err = a.own(&bank()).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(err.to_string().contains("revocation to epoch 1"), "{err}");
    assert_eq!(a.grant(&bank()), None, "deposed: its grant was stale");
    finish_take_over(&c);
}

#[test]
fn negative_control_own_without_the_completion_proof_is_caught() {
    let switches = OwnerSwitches {
        adopt_without_completion: true,
        ..OwnerSwitches::default()
    };
    let (_store, _machine, [_a, b, c]) = three_owners_with(switches);
    start_take_over(&c);
    assert_eq!(
        b.own(&bank()).unwrap(),
        1,
        "adopted while revocation was pending"
    );
}

/// The adoption commits guarded on the rows its proof was read from: a bump that lands between
/// the read and the commit (here, just before the owner row's write) makes the proof stale,
/// and the adoption is refused instead of taking the namespace at a grant already fenced.
fn adoption_racing_a_bump(switches: OwnerSwitches) -> Result<u64, Error> {
    let (store, _machine, [_a, b, c]) = three_owners_with(switches);
    c.bump_epoch(&bank(), 1).unwrap();
    revoke_to_complete(&c, &bank());
    let fence = c.fence().clone();
    let once = std::sync::atomic::AtomicBool::new(false);
    store.set_before_apply(move |p, batch: &Batch| {
        let owner_row = batch
            .ops()
            .iter()
            .any(|op| matches!(op, portcullis::store::Op::Put(k, _) if k == b"engine.owner"));
        if p == &bank().coordinator_partition()
            && owner_row
            && !once.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            fence.bump_epoch(&bank(), 2).unwrap();
        }
    });
    let adopted = b.own(&bank());
    store.clear_hooks();
    adopted
}

#[test]
fn f12_an_adoption_racing_a_bump_is_refused() {
    let err = adoption_racing_a_bump(OwnerSwitches::default()).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(err.to_string().contains("revocation to epoch 2"), "{err}");
}

#[test]
fn negative_control_an_adoption_not_guarded_on_its_proof_is_caught() {
    let switches = OwnerSwitches {
        unguarded_proof: true,
        ..OwnerSwitches::default()
    };
    assert_eq!(
        adoption_racing_a_bump(switches).unwrap(),
        1,
        "adopted at a grant a bump had already made stale"
    );
}

#[test]
fn negative_control_a_warm_that_touches_other_owners_namespaces_is_caught() {
    let switches = OwnerSwitches {
        touch_foreign_namespaces: true,
        ..OwnerSwitches::default()
    };
    let (_store, _machine, [_a, b, _c]) = three_owners_with(switches);
    let progress = b.warm().unwrap().wait().unwrap();
    assert_eq!(progress.refused, ACCOUNTS as u64, "{progress:?}");
    assert!(b.fold_all((), |(), _, _| ()).is_err());
}
