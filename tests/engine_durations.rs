//! Bad input never panics (SPEC E1): `Duration::MAX` as the close timeout, the sweep interval
//! or any wait saturates instead of overflowing an `Instant`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::engine::{TestMachine, TestStore, builder, entity, ns, recs};

/// E1: an engine configured with `Duration::MAX` for its close timeout and sweep interval
/// opens, sweeps on demand, waits for warms and passes and closes; every wait given
/// `Duration::MAX` returns once its condition holds. Before, each panicked adding the duration
/// to an `Instant`.
#[test]
fn e1_duration_max_for_timeouts_intervals_and_waits_never_panics() {
    let store = TestStore::new();
    let machine = Arc::new(TestMachine::default());
    let engine = builder(&machine, &store)
        .close_timeout(Duration::MAX)
        .sweep_interval(Duration::MAX)
        .open()
        .unwrap();
    engine.register(&entity(1)).unwrap();
    engine.append(&entity(1), recs(&["r"])).unwrap();
    let sweeper = engine.sweeper().expect("the sweeper started").clone();
    assert_eq!(sweeper.interval(), Duration::MAX);
    assert!(sweeper.sweep_now(Duration::MAX).is_some());
    assert!(sweeper.wait_for_passes(1, Duration::MAX));
    let warm = engine.warm().unwrap();
    assert!(warm.wait_timeout(Duration::MAX));
    assert!(warm.wait_for(Duration::MAX).unwrap());
    engine.bump_epoch(&ns(), 1).unwrap();
    let revocation = engine
        .fence()
        .revoke_in_background(&ns(), Default::default());
    assert!(revocation.wait(Duration::MAX).is_some());
    engine.close().unwrap();
    assert!(sweeper.stop(Duration::MAX));
}
