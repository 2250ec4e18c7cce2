//! The store conformance suite (SPEC S9, S11) on `EtcdStore`, each case against its own
//! throwaway etcd. Feature `etcd`; needs the `etcd` binary (Debian's `etcd-server`).
#![cfg(feature = "etcd")]

#[macro_use]
mod conformance;
mod common;

use std::sync::Arc;

use common::etcd::EtcdServer;
use conformance::Fixture;
use portcullis::ManualClock;
use portcullis::store::EtcdStore;

fn open_etcd(clock: ManualClock) -> Fixture {
    let server = EtcdServer::start();
    let store = EtcdStore::builder(server.endpoint())
        .prefix("conformance/")
        .clock(Arc::new(clock.clone()))
        .open()
        .expect("open the etcd store");
    Fixture::new(Arc::new(store), clock).keeping(server)
}

conformance_suite!(open_etcd);
