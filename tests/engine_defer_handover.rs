//! Deferred work across owners (SPEC R8, F11): deferred rows are keyed by the namespace term
//! they were accepted under, so rows of two owners sharing a store never collide and are
//! applied exactly once, in acceptance order, after a hand-over. Rows of the earlier format
//! (keyed by the owner's incarnation) stay readable.

mod common;

use std::sync::Arc;

use common::engine::{
    TestEngine, TestMachine, TestStore, entity, ns, owner_builder, payloads, recs,
    revoke_to_complete,
};
use portcullis::EntityId;
use portcullis::engine::Deferred;
use portcullis::restore::Origin;
use portcullis::store::{Batch, Store};

/// How the namespace passes from one owner to the next.
#[derive(Clone, Copy, Debug)]
enum HandOver {
    /// The old owner releases it; the new one adopts at the same epoch.
    Clean,
    /// The new owner bumps the epoch, revokes to `Complete` and adopts.
    TakeOver,
}

fn hand_over(from: &TestEngine, to: &TestEngine, how: HandOver) {
    match how {
        HandOver::Clean => from.release_namespace(&ns()).unwrap(),
        HandOver::TakeOver => {
            let next = to.current_epoch(&ns()).unwrap() + 1;
            to.bump_epoch(&ns(), next).unwrap();
            revoke_to_complete(to, &ns());
        }
    }
    to.own(&ns()).unwrap();
}

fn defer(engine: &TestEngine, e: &EntityId, record: &str) {
    assert_eq!(
        engine.defer(e, record.as_bytes().to_vec()).unwrap(),
        Deferred::Queued,
        "{record} is deferred to a pending entity"
    );
}

/// The deferred records `machine` applied to `e`, in order.
fn applied_deferred(machine: &TestMachine, e: &EntityId) -> usize {
    machine
        .applied
        .lock()
        .iter()
        .filter(|(entity, _, origin)| entity == e && *origin == Origin::Deferred)
        .count()
}

#[test]
fn r8_deferrals_of_two_owners_never_collide_across_hand_overs() {
    // Before the fix both owners (each at its incarnation 1, arrivals from 0) keyed their
    // rows (incarnation 1, arrival n): the second owner's first deferral found the first's
    // row in its place and answered Unavailable.
    for how in [HandOver::Clean, HandOver::TakeOver] {
        let store = TestStore::new();
        let machine = Arc::new(TestMachine::default());
        let a = owner_builder(&machine, &store, "a").open().unwrap();
        let b = owner_builder(&machine, &store, "b").open().unwrap();
        let e = entity(1);
        a.own(&ns()).unwrap();
        a.register(&e).unwrap();
        defer(&a, &e, "a1");
        defer(&a, &e, "a2");
        hand_over(&a, &b, how);
        defer(&b, &e, "b1");
        hand_over(&b, &a, how);
        defer(&a, &e, "a3");
        hand_over(&a, &b, how);
        defer(&b, &e, "b2");
        assert_eq!(
            payloads(&b, &e).unwrap(),
            recs(&["a1", "a2", "b1", "a3", "b2"]),
            "{how:?}: every accepted record, once, in acceptance order"
        );
        assert_eq!(applied_deferred(&machine, &e), 5, "{how:?}");
        assert_eq!(b.stats().phases.contained, 0, "{how:?}");
    }
}

#[test]
fn r8_deferred_records_apply_in_acceptance_order_after_a_hand_over() {
    // Before the fix rows sorted by the accepting owner's incarnation: an old owner at its
    // incarnation 2 handing over to a new owner at its incarnation 1 had its earlier records
    // applied after the new owner's.
    for how in [HandOver::Clean, HandOver::TakeOver] {
        let store = TestStore::new();
        let machine = Arc::new(TestMachine::default());
        owner_builder(&machine, &store, "a")
            .open()
            .unwrap()
            .close()
            .unwrap();
        let a = owner_builder(&machine, &store, "a").open().unwrap();
        assert_eq!(a.incarnation(), 2);
        let b = owner_builder(&machine, &store, "b").open().unwrap();
        assert_eq!(b.incarnation(), 1);
        let e = entity(1);
        a.own(&ns()).unwrap();
        a.register(&e).unwrap();
        defer(&a, &e, "first");
        defer(&a, &e, "second");
        hand_over(&a, &b, how);
        defer(&b, &e, "third");
        defer(&b, &e, "fourth");
        assert_eq!(
            payloads(&b, &e).unwrap(),
            recs(&["first", "second", "third", "fourth"]),
            "{how:?}"
        );
        assert_eq!(applied_deferred(&machine, &e), 4, "{how:?}");
    }
}

#[test]
fn r8_deferred_rows_of_the_earlier_format_are_still_applied_first() {
    // A row written by an earlier version: `\0defer.` + incarnation (BE) + arrival (BE).
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let e = entity(1);
    a.own(&ns()).unwrap();
    a.register(&e).unwrap();
    let mut legacy = b"\0defer.".to_vec();
    legacy.extend_from_slice(&7u64.to_be_bytes());
    legacy.extend_from_slice(&3u64.to_be_bytes());
    let outcome = store
        .inner
        .apply(
            &e.partition(),
            &Batch::new().put(legacy.clone(), b"old".to_vec()),
        )
        .unwrap();
    assert!(outcome.is_committed());
    defer(&a, &e, "new");
    assert_eq!(payloads(&a, &e).unwrap(), recs(&["old", "new"]));
    assert_eq!(store.inner.get(&e.partition(), &legacy).unwrap(), None);
    let rows = store
        .inner
        .scan(
            &e.partition(),
            &portcullis::restore::keys::deferred_range(),
            None,
            10,
        )
        .unwrap();
    assert!(rows.entries.is_empty(), "every deferred row was drained");
}
