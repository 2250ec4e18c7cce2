//! Namespaces the engine serves unfenced (SPEC F11): `Engine::own_unfenced` declares the
//! namespace unfenced in the store, so no engine or fence handle over that store can bump it;
//! its writes take no lease and leave no leased-shard row, for this owner and every later one.

mod common;

use std::sync::Arc;

use common::engine::{TestMachine, TestStore, builder, entity, ns, owner_builder, payloads, recs};
use portcullis::engine::Deferred;
use portcullis::fence::{Fence, FenceConfig};
use portcullis::store::{Batch, Partition, Precondition, Store};
use portcullis::{Error, SystemClock};

const LEASE_KEY: &[u8] = b"\0fence.epoch.lease";

/// A second fence handle over the same store, as another process would hold.
fn other_fence(store: &Arc<TestStore>) -> Fence {
    Fence::new(
        Arc::clone(store) as Arc<dyn Store>,
        Arc::new(SystemClock),
        FenceConfig::default(),
    )
}

fn assert_bump_refused(result: portcullis::Result<()>, via: &str) {
    let err = result.expect_err(via);
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("unfenced"),
        "{via}: {err}"
    );
}

/// Leased-shard rows in the namespace's coordinator, and entity partitions holding a lease.
fn lease_state(store: &Arc<TestStore>, entities: &[portcullis::EntityId]) -> (usize, usize) {
    let rows = store
        .inner
        .scan(
            &ns().coordinator_partition(),
            &other_fence(store).keys().shard_range(),
            None,
            1_000,
        )
        .unwrap()
        .entries
        .len();
    let leases = entities
        .iter()
        .filter(|e| {
            store
                .inner
                .get(&e.partition(), LEASE_KEY)
                .unwrap()
                .is_some()
        })
        .count();
    (rows, leases)
}

/// No recorded entity batch carries a lease guard, a lease write or a deadline.
fn assert_unleased(batches: &[(Partition, Batch)], what: &str) {
    assert!(!batches.is_empty(), "{what}: nothing was written");
    for (p, batch) in batches {
        let leased = batch.guards().iter().any(|g| match g {
            Precondition::Equals(k, _) | Precondition::Absent(k) => k.as_slice() == LEASE_KEY,
            Precondition::NotAfter(_) => true,
            _ => false,
        }) || batch.ops().iter().any(|op| match op {
            portcullis::store::Op::Put(k, _) => k.as_slice() == LEASE_KEY,
            _ => false,
        });
        assert!(!leased, "{what}: a batch on {p} took a lease: {batch:?}");
    }
}

#[test]
fn f11_an_unfenced_namespace_cannot_be_bumped_through_another_engine_or_a_fence() {
    // Before the fix `own_unfenced` only changed this engine's memory: a second engine over
    // the same store (or any fence handle) bumped the namespace's epoch.
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    a.own_unfenced(&ns()).unwrap();
    assert_bump_refused(b.bump_epoch(&ns(), 1), "a second engine");
    assert_bump_refused(other_fence(&store).bump_epoch(&ns(), 1), "a fence handle");
    assert_bump_refused(a.bump_epoch(&ns(), 1), "the owner itself");
    assert_eq!(other_fence(&store).current_epoch(&ns()).unwrap(), 0);
    assert!(other_fence(&store).is_unfenced(&ns()).unwrap());
    // The owner serves on, unaffected.
    a.register(&entity(1)).unwrap();
    a.append(&entity(1), recs(&["a1"])).unwrap();
    assert_eq!(payloads(&a, &entity(1)).unwrap(), recs(&["a1"]));
}

#[test]
fn f11_the_builders_unfenced_option_declares_the_namespace() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a")
        .own_unfenced(ns())
        .open()
        .unwrap();
    assert_eq!(a.grant(&ns()), Some(0));
    assert_bump_refused(other_fence(&store).bump_epoch(&ns(), 1), "a fence handle");
}

#[test]
fn f11_unfenced_writes_take_no_lease_for_this_owner_and_the_next() {
    // Before the fix the next owner adopted the namespace fenced on first use (it was not
    // declared), and its writes took leases and left leased-shard rows.
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let all: Vec<_> = (1..=4).map(entity).collect();
    {
        let a = owner_builder(&machine, &store, "a").open().unwrap();
        a.own_unfenced(&ns()).unwrap();
        store.record_entity_batches();
        for e in &all[..2] {
            a.register(e).unwrap();
        }
        a.append(&all[0], recs(&["a1"])).unwrap();
        assert_eq!(a.defer(&all[1], b"d".to_vec()).unwrap(), Deferred::Queued);
        assert_eq!(payloads(&a, &all[1]).unwrap(), recs(&["d"])); // the drain
        a.checkpoint(&all[0]).unwrap();
        assert_unleased(&store.take_entity_batches(), "the unfenced owner");
        assert_eq!(lease_state(&store, &all), (0, 0));
        a.close().unwrap(); // releases the namespace
    }
    // The next owner adopts on first use, and serves the namespace unfenced too.
    let b = builder(&machine, &store).owner("b").open().unwrap();
    for e in &all[2..] {
        b.register(e).unwrap();
        b.append(e, recs(&["b1"])).unwrap();
    }
    b.append(&all[0], recs(&["b2"])).unwrap();
    assert_unleased(&store.take_entity_batches(), "the next owner");
    assert_eq!(
        lease_state(&store, &all),
        (0, 0),
        "no lease, no leased-shard row"
    );
    assert_eq!(b.grant(&ns()), Some(0));
    assert_bump_refused(b.bump_epoch(&ns(), 1), "the next owner");
    assert_eq!(payloads(&b, &all[0]).unwrap(), recs(&["a1", "b2"]));
}

#[test]
fn f11_an_explicit_fenced_own_of_an_unfenced_namespace_is_refused() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    a.own_unfenced(&ns()).unwrap();
    let err = a.own(&ns()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    a.release_namespace(&ns()).unwrap();
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    let err = b.own(&ns()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("own_unfenced"),
        "{err}"
    );
    b.own_unfenced(&ns()).unwrap();
    assert_eq!(b.grant(&ns()), Some(0));
}

#[test]
fn f11_own_unfenced_is_refused_while_another_owner_holds_it_and_declares_nothing() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    a.own(&ns()).unwrap();
    let err = b.own_unfenced(&ns()).unwrap_err();
    assert!(matches!(err, Error::NotServed { .. }), "{err}");
    assert!(!other_fence(&store).is_unfenced(&ns()).unwrap());
    // a's namespace is still fenced: it can be handed over.
    a.bump_epoch(&ns(), 1).unwrap();
}

#[test]
fn f11_own_unfenced_of_a_bumped_namespace_is_refused() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    a.bump_epoch(&ns(), 1).unwrap();
    let err = a.own_unfenced(&ns()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(!other_fence(&store).is_unfenced(&ns()).unwrap());
}

#[test]
fn f11_a_bump_between_the_owner_row_and_the_declaration_undoes_the_adoption() {
    // The owner row commits first, then the declaration (guarded on the epoch being 0). A bump
    // that lands between them makes the declaration fail: the adoption is refused and the
    // owner row put back, so nobody holds the namespace and it is still fenced.
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let coordinator = ns().coordinator_partition();
    let bumper = other_fence(&store);
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (hook_store, hook_fired) = (Arc::clone(&store), Arc::clone(&fired));
    store.set_after_apply(move |p, batch| {
        let owner_row = batch.ops().iter().any(|op| match op {
            portcullis::store::Op::Put(k, _) => k.as_slice() == b"engine.owner",
            _ => false,
        });
        if *p == coordinator
            && owner_row
            && !hook_fired.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            hook_store.clear_hooks();
            bumper.bump_epoch(&ns(), 1).unwrap();
        }
    });
    let err = a.own_unfenced(&ns()).unwrap_err();
    assert!(fired.load(std::sync::atomic::Ordering::SeqCst));
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(a.grant(&ns()), None);
    assert_eq!(
        store
            .inner
            .get(&ns().coordinator_partition(), b"engine.owner")
            .unwrap(),
        None,
        "the owner row was put back"
    );
    assert!(!other_fence(&store).is_unfenced(&ns()).unwrap());
    // The namespace is free and fenced: another owner adopts it at the new epoch.
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    assert_eq!(b.own(&ns()).unwrap(), 1);
}

#[test]
fn negative_control_unfenced_without_the_declaration_lets_another_engine_bump() {
    // With the declaration switched off (the engine's behaviour before the fix), the bump
    // through a second engine gets through: the test above has teeth.
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let a = owner_builder(&machine, &store, "a").open().unwrap();
    let b = owner_builder(&machine, &store, "b").open().unwrap();
    a.set_skip_unfenced_declaration_for_test(true);
    a.own_unfenced(&ns()).unwrap();
    b.bump_epoch(&ns(), 1)
        .expect("without the declaration, another engine bumps the namespace (the violation)");
    assert_eq!(other_fence(&store).current_epoch(&ns()).unwrap(), 1);
}
