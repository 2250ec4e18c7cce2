//! The randomized store model test (SPEC S1, S2, S11) on `EtcdStore`. Feature `etcd`; needs the
//! `etcd` binary. One throwaway etcd serves a whole run; each case gets a fresh root prefix, so
//! it starts from an empty store. Fewer cases than in memory: each batch is a durable etcd
//! transaction.
#![cfg(feature = "etcd")]

#[macro_use]
mod conformance;
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::etcd::EtcdServer;
use conformance::Fixture;
use parking_lot::Mutex;
use portcullis::ManualClock;
use portcullis::store::EtcdStore;

/// The server of the running test; cases open stores on it. Taken back (and so stopped) when
/// the test's guard drops.
static SERVER: Mutex<Option<Arc<EtcdServer>>> = Mutex::new(None);
static CASE: AtomicU64 = AtomicU64::new(0);

fn open_etcd(clock: ManualClock) -> Fixture {
    let server = {
        let mut slot = SERVER.lock();
        slot.get_or_insert_with(|| Arc::new(EtcdServer::start()))
            .clone()
    };
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let store = EtcdStore::builder(server.endpoint())
        .prefix(format!("model/{case:08}/"))
        .clock(Arc::new(clock.clone()))
        .open()
        .expect("open the etcd store");
    Fixture::new(Arc::new(store), clock).keeping(server)
}

/// Stops the shared server when a test ends, even by a panic.
struct StopServer;

impl Drop for StopServer {
    fn drop(&mut self) {
        SERVER.lock().take();
    }
}

mod runs {
    use super::*;

    #[test]
    fn model_random_batches_and_scans() {
        let _stop = StopServer;
        conformance::model::run_model(open_etcd, 96);
    }

    #[test]
    #[ignore = "long run; use --ignored"]
    fn model_random_batches_and_scans_long() {
        let _stop = StopServer;
        conformance::model::run_model(open_etcd, 1000);
    }
}
