//! Runs the tour example's steps on a small store, including the writer child it kills: the
//! tour checks every claim it prints, so a story that stops being true fails here.

#[path = "../examples/tour.rs"]
mod tour;

use std::process::Command;

/// The writer child's test: re-executed by the tour below; a no-op as an ordinary test.
#[test]
fn tour_writer_child() {
    if let Some(dir) = std::env::var_os(tour::WRITER_ENV) {
        tour::keep_writing(std::path::Path::new(&dir)).expect("the writer child");
    }
}

#[test]
fn the_tour_tells_a_true_story_on_a_small_store() {
    let dir = tempfile::tempdir().unwrap();
    let scale = tour::Scale {
        rooms: 40,
        messages: 5,
    };
    // The child is this test binary, run for its writer test alone.
    let relaunch = || {
        let mut command = Command::new(std::env::current_exe()?);
        command.args([
            "--exact",
            "tour_writer_child",
            "--nocapture",
            "--test-threads=1",
        ]);
        Ok(command)
    };
    tour::run(dir.path(), scale, &relaunch).unwrap();
}
