//! Slots under a memory budget (SPEC R10, F11): the registry holds only the resident entities,
//! and an entity passivated on request, released, or whose namespace was adopted anew leaves
//! the registry at once, its entry taken out of the budget's ring of resident entities, while
//! the budget still holds for the others. Negative controls leave the ring entries in place and
//! find the slots kept. Slots leaving the registry without a budget, and what keeps a slot,
//! are in tests/engine_slots.rs.

mod common;

use std::sync::Arc;

use common::engine::{
    TestEngine, TestMachine, TestStore, builder, entity, owner_builder, payloads, recs,
    revoke_to_complete, slots,
};
use portcullis::Error;

#[test]
fn r10_under_a_budget_the_registry_holds_only_the_resident_entities() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .max_resident_entities(4)
        .register_on_first_write(true)
        .open()
        .unwrap();
    for round in 0..2 {
        for i in 0..50 {
            if round == 0 {
                engine.append(&entity(i), recs(&["a"])).unwrap();
            } else {
                assert_eq!(payloads(&engine, &entity(i)).unwrap(), recs(&["a"]));
            }
            let stats = engine.stats().passivation;
            assert!(stats.resident <= 4, "round {round}, entity {i}: {stats:?}");
            assert_eq!(stats.slots, stats.resident, "round {round}, entity {i}");
        }
    }
    assert!(engine.stats().passivation.retired >= 2 * 50 - 4);
}

/// An engine with a budget of 4 resident entities (`Engine::set_unlist_skipped_for_test` set as
/// asked) and entities 0..4 restored, each holding the record "a".
fn four_restored_under_a_budget_of_four(unlist_skipped: bool) -> (Arc<TestMachine>, TestEngine) {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .max_resident_entities(4)
        .register_on_first_write(true)
        .open()
        .unwrap();
    engine.set_unlist_skipped_for_test(unlist_skipped);
    for i in 0..4 {
        engine.append(&entity(i), recs(&["a"])).unwrap();
    }
    (machine, engine)
}

/// Writes entities 4..12 and reads every one of 0..12 but `except`, checking after each step
/// that the budget of 4 holds (the ring lost no resident entry) and every history reads back.
fn eight_more_keep_at_most_four_resident(engine: &TestEngine, except: Option<usize>) {
    for i in 4..12 {
        engine.append(&entity(i), recs(&["b"])).unwrap();
        assert!(engine.stats().passivation.resident <= 4, "after entity {i}");
    }
    for i in (0..12).filter(|&i| Some(i) != except) {
        let want = if i < 4 { recs(&["a"]) } else { recs(&["b"]) };
        assert_eq!(payloads(engine, &entity(i)).unwrap(), want, "entity {i}");
        assert!(
            engine.stats().passivation.resident <= 4,
            "reading entity {i}"
        );
    }
}

/// Under a budget, `budget` entities are restored and `Engine::passivate` drops one; answers
/// the slots in the registry right after, then checks the entity restores again and the budget
/// still passivates the others (the ring lost none of its resident entries).
fn slots_after_a_passivation_under_a_budget(unlist_skipped: bool) -> u64 {
    let (machine, engine) = four_restored_under_a_budget_of_four(unlist_skipped);
    assert_eq!(slots(&engine), 4);
    assert!(engine.passivate(&entity(1)).unwrap());
    let after = slots(&engine);
    // Restored again on its next touch, and counted by the budget again: touching more
    // entities keeps at most 4 resident, the passivated one among those the ring can drop.
    assert_eq!(payloads(&engine, &entity(1)).unwrap(), recs(&["a"]));
    assert_eq!(machine.units_of(&entity(1)), 2);
    eight_more_keep_at_most_four_resident(&engine, None);
    after
}

/// SPEC R10: an entity passivated on request leaves the registry at once, also under a budget
/// (whose ring of resident entities used to keep a reference to its slot until the ring's next
/// walk or compaction reached it, so its memory stayed when the application asked to free it).
#[test]
fn r10_an_explicit_passivation_under_a_budget_frees_the_slot_at_once() {
    assert_eq!(slots_after_a_passivation_under_a_budget(false), 3);
}

/// Negative control: with the ring's entry left in place the slot stays in the registry.
#[test]
fn r10_negative_control_a_ring_entry_left_in_place_keeps_the_slot() {
    assert_eq!(slots_after_a_passivation_under_a_budget(true), 4);
}

/// Under a budget of 4, four entities restored and one of them contained (its write refused):
/// answers the slots in the registry right after its release, then checks the budget still
/// keeps at most 4 resident as more entities are touched (the ring lost no resident entry).
fn slots_after_a_release_under_a_budget(unlist_skipped: bool) -> u64 {
    let (machine, engine) = four_restored_under_a_budget_of_four(unlist_skipped);
    let err = engine.append(&entity(1), recs(&["!refuse"])).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    assert_eq!(slots(&engine), 4);
    assert!(engine.release(&entity(1)).unwrap());
    let after = slots(&engine);
    // Its next unit meets the refused record again and contains it again (SPEC R4).
    let err = engine.read(&entity(1), |_| ()).unwrap_err();
    assert!(matches!(err, Error::Contained { .. }), "{err}");
    assert_eq!(machine.units_of(&entity(1)), 2);
    eight_more_keep_at_most_four_resident(&engine, Some(1));
    after
}

/// SPEC R4, R10: a released entity is pending and idle, so its slot leaves the registry at
/// once, also under a budget (whose ring used to keep a reference to the slot of a contained
/// entity until a walk or the ring's compaction reached its entry).
#[test]
fn r10_a_release_under_a_budget_frees_the_slot_at_once() {
    assert_eq!(slots_after_a_release_under_a_budget(false), 3);
}

/// Negative control: with the ring's entry left in place the released slot stays.
#[test]
fn r10_negative_control_a_released_entry_left_in_the_ring_keeps_the_slot() {
    assert_eq!(slots_after_a_release_under_a_budget(true), 4);
}

/// Under a budget of 4, an owner restores four entities of one namespace, bumps its epoch and
/// adopts it again (so their state may be stale and is dropped): answers the slots in the
/// registry right after, then checks each restores afresh and the budget still holds.
fn slots_after_a_readoption_under_a_budget(unlist_skipped: bool) -> u64 {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = owner_builder(&machine, &store, "a")
        .max_resident_entities(4)
        .open()
        .unwrap();
    engine.set_unlist_skipped_for_test(unlist_skipped);
    let ns = entity(0).namespace().clone();
    assert_eq!(engine.own(&ns).unwrap(), 0);
    for i in 0..4 {
        engine.register(&entity(i)).unwrap();
        engine.append(&entity(i), recs(&["a"])).unwrap();
    }
    assert_eq!(slots(&engine), 4);
    engine.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&engine, &ns);
    assert_eq!(engine.own(&ns).unwrap(), 1);
    let after = slots(&engine);
    for i in 0..4 {
        assert_eq!(payloads(&engine, &entity(i)).unwrap(), recs(&["a"]), "{i}");
        assert_eq!(machine.units_of(&entity(i)), 2, "restored afresh: {i}");
    }
    for i in 4..12 {
        engine.register(&entity(i)).unwrap();
        engine.append(&entity(i), recs(&["b"])).unwrap();
        assert!(engine.stats().passivation.resident <= 4, "after entity {i}");
    }
    after
}

/// SPEC R10, F11: entities whose namespace was adopted anew are pending and idle, so their
/// slots leave the registry at once, also under a budget (whose ring used to keep a reference
/// to each until a walk or the ring's compaction reached its entry).
#[test]
fn r10_a_namespace_adopted_anew_under_a_budget_frees_its_slots_at_once() {
    assert_eq!(slots_after_a_readoption_under_a_budget(false), 0);
}

/// Negative control: with the ring's entries left in place the slots stay.
#[test]
fn r10_negative_control_readopted_entries_left_in_the_ring_keep_the_slots() {
    assert_eq!(slots_after_a_readoption_under_a_budget(true), 4);
}
