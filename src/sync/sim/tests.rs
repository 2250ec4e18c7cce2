//! The simulation's numbering of per-task values (`sim.rs`).

use super::{generation, next_generation};

/// Simulations run at once on several threads (the simulator's lanes in one test process):
/// one starting elsewhere must not renumber this one's per-task values mid-run.
#[test]
fn a_simulation_started_on_another_thread_keeps_this_threads_number() {
    next_generation();
    let mine = generation();
    let theirs = std::thread::spawn(|| {
        next_generation();
        generation()
    })
    .join()
    .unwrap();
    assert_ne!(theirs, mine, "two simulations share a number");
    assert_eq!(generation(), mine);
}
