//! Runs the hand-over example (SPEC F11): two owners, a take-over while one is writing, a clean
//! hand-back, a take-over from a dead owner. The example checks every claim it prints.

#[cfg(feature = "etcd")]
mod common;
#[path = "../examples/handover.rs"]
mod handover;

#[test]
fn the_handover_example_tells_a_true_story() {
    handover::run().unwrap();
}

/// The same story on a throwaway etcd, each owner with its own client (SPEC S11, F11).
#[cfg(feature = "etcd")]
#[test]
fn the_handover_example_tells_a_true_story_on_etcd() {
    let server = common::etcd::EtcdServer::start();
    handover::run_on_etcd(&server.endpoint()).unwrap();
}
