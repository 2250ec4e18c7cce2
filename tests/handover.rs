//! Runs the hand-over example (SPEC F11): two owners, a take-over while one is writing, a clean
//! hand-back, a take-over from a dead owner. The example checks every claim it prints.

#[path = "../examples/handover.rs"]
mod handover;

#[test]
fn the_handover_example_tells_a_true_story() {
    handover::run().unwrap();
}
