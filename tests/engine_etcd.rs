//! The engine as a fenced owner (SPEC F11) on a real etcd, a store without server-side deadlines
//! (SPEC S11): two owners, each with its own `EtcdStore` client on one throwaway etcd, hand a
//! namespace over; the deposed owner's writes are refused, and the take-over repairs each entity
//! exactly once. Feature `etcd`; needs the `etcd` binary (`.ci/run` installs it).
#![cfg(feature = "etcd")]

mod common;

use std::sync::Arc;

use common::engine::{TestEngine, TestMachine, entity, payloads, recs, revoke_to_complete};
use common::etcd::EtcdServer;
use portcullis::store::{EtcdStore, Store};
use portcullis::{Engine, Error};

/// An owner with its own etcd client, adopting namespaces only when told.
fn owner(server: &EtcdServer, machine: &Arc<TestMachine>, id: &str) -> TestEngine {
    let store = EtcdStore::builder(server.endpoint())
        .prefix("engine/")
        .open()
        .expect("open the etcd store");
    Engine::builder(Arc::clone(machine))
        .store(Arc::new(store) as Arc<dyn Store>)
        .owner(id)
        .adopt_on_first_use(false)
        .pool_threads(2)
        .warm_parallelism(2)
        .open()
        .expect("open the engine")
}

#[test]
fn f11_on_etcd_a_take_over_fences_the_old_owner_and_repairs_each_entity_once() {
    let server = EtcdServer::start();
    let machine = Arc::new(TestMachine::default());
    *machine.repair_records.lock() = recs(&["repaired"]);
    let ns = entity(0).namespace().clone();

    let a = owner(&server, &machine, "a");
    a.own(&ns).unwrap();
    for i in 0..3 {
        a.register(&entity(i)).unwrap();
        a.append(&entity(i), recs(&["a"])).unwrap();
    }

    let b = owner(&server, &machine, "b");
    b.bump_epoch(&ns, 1).unwrap();
    revoke_to_complete(&b, &ns);
    b.own(&ns).unwrap();
    assert_eq!(b.owed_repairs(&ns).unwrap(), vec![1]);

    // A still holds grant 0: its next write is refused, and it stops serving the namespace.
    let err = a.append(&entity(0), recs(&["late"])).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Fenced {
                grant: 0,
                current: 1
            }
        ),
        "{err}"
    );
    assert_eq!(a.grant(&ns), None);
    common::engine::crash(a);

    for i in 0..3 {
        assert_eq!(payloads(&b, &entity(i)).unwrap(), recs(&["a", "repaired"]));
        // Touched again: not repaired again.
        assert_eq!(payloads(&b, &entity(i)).unwrap(), recs(&["a", "repaired"]));
    }
    assert_eq!(machine.repairs.lock().len(), 3, "exactly once per entity");
    b.append(&entity(0), recs(&["b"])).unwrap();
    assert_eq!(
        payloads(&b, &entity(0)).unwrap(),
        recs(&["a", "repaired", "b"])
    );
    b.close().unwrap();
}

#[test]
fn s12_an_engine_on_etcd_points_to_etcds_own_snapshot_for_a_backup() {
    let server = EtcdServer::start();
    let machine = Arc::new(TestMachine::default());
    let engine = owner(&server, &machine, "a");
    let dir = tempfile::tempdir().unwrap();
    match engine.backup(dir.path().join("backup")) {
        Err(Error::InvalidArgument(why)) => {
            for says in [
                "etcdctl snapshot save",
                "docs/etcd.md",
                "mark_lease_table_recovered",
            ] {
                assert!(why.contains(says), "{why}");
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(!dir.path().join("backup").exists());
}
