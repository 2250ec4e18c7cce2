//! Runs `examples/schema_evolution.rs` (SPEC E7): version 2 of a chat service reads the
//! history and the checkpoint version 1 wrote, and version 1 refuses what version 2 wrote. The
//! example checks every claim it prints; this test checks what it returns.

#[path = "../examples/schema_evolution.rs"]
mod schema_evolution;

#[test]
fn e7_the_schema_evolution_example_reads_old_history_and_refuses_new_records_in_old_code() {
    let dir = tempfile::tempdir().unwrap();
    let summary = schema_evolution::run(dir.path()).unwrap();
    assert_eq!(summary.restored_title, "Front desk");
    assert_eq!(summary.messages, 3);
    assert!(
        summary.rollback_refusal.contains("record 5"),
        "{}",
        summary.rollback_refusal
    );
}
