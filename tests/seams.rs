//! The seams a simulation needs (SPEC E9, docs/SIMULATION.md), checked in the source:
//!
//! - library code takes time only from the clock: no `Instant::now`, `SystemTime::now` or
//!   `thread::sleep`, and no timed wait on a condvar or channel (`.wait_until(`, `.wait_for(`,
//!   `.recv_timeout(`), outside the clock module (`src/clock.rs`, `src/clock/`) and the
//!   simulated primitives (`src/sync/`);
//! - library code starts background work only through the spawner: no `rayon::spawn`,
//!   `thread::spawn`, `std::thread::Builder` or pool `.spawn(` outside `src/spawn.rs`;
//! - locks, condvars, atomics and channels come from `crate::sync`: no `parking_lot::`,
//!   `crossbeam::channel` or `std::sync::atomic` outside `src/sync.rs` and `src/sync/` (a
//!   process-wide counter that is not synchronisation may say so with `seams: not shared`).
//!
//! Library code is `src/` and `ffi/src/` (the C ABI never runs in a simulation, so only the
//! first two rules apply there); unit-test files (`tests.rs`) and comments are not library
//! code. Each finding is named by file and line.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every line of library code under `dir` (not comments, not unit-test files), with its file
/// (relative to the repository) and line number.
fn library_lines(dir: &str) -> Vec<(String, usize, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join(dir), &mut files);
    files.sort();
    let mut lines = Vec::new();
    for file in files {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let name = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            lines.push((name.clone(), i + 1, line.to_owned()));
        }
    }
    assert!(
        lines.len() > 1_000,
        "found the library's source under {dir}"
    );
    lines
}

/// The lines of `dir` outside `allowed` (path prefixes) that contain any of `patterns`.
fn findings(dir: &str, patterns: &[&str], allowed: &[&str]) -> Vec<String> {
    library_lines(dir)
        .into_iter()
        .filter(|(file, _, _)| !allowed.iter().any(|a| file.starts_with(a)))
        .filter(|(_, _, line)| !line.contains("seams: not shared"))
        .filter_map(|(file, n, line)| {
            let hit = patterns.iter().find(|p| line.contains(*p))?;
            Some(format!("{file}:{n}: `{hit}` in `{}`", line.trim()))
        })
        .collect()
}

const TIME: &[&str] = &[
    "Instant::now",
    "SystemTime::now",
    "thread::sleep",
    ".wait_until(",
    ".wait_for(",
    ".recv_timeout(",
];
const TIME_ALLOWED: &[&str] = &["src/clock.rs", "src/clock/", "src/sync/"];

const SPAWN: &[&str] = &[
    "rayon::spawn",
    "thread::spawn",
    "std::thread::Builder",
    "pool.spawn(",
    "ThreadPoolBuilder",
];
const SPAWN_ALLOWED: &[&str] = &["src/spawn.rs"];

const SYNC: &[&str] = &["parking_lot::", "crossbeam::channel", "std::sync::atomic"];
// The clock's own time is not synchronisation (a simulated clock moves it from one task).
const SYNC_ALLOWED: &[&str] = &["src/sync.rs", "src/sync/", "src/clock.rs", "src/clock/"];

#[test]
fn e9_library_code_takes_time_only_from_the_clock() {
    let mut found = findings("src", TIME, TIME_ALLOWED);
    found.extend(findings("ffi/src", TIME, &[]));
    assert!(
        found.is_empty(),
        "library code reads the OS clock, sleeps or waits with a timeout outside the clock module (use `Clock::instant`, `clock::sleep`, `clock::wait_until`, `clock::recv_timeout`):\n{}",
        found.join("\n")
    );
}

#[test]
fn e9_library_code_starts_background_work_only_through_the_spawner() {
    let mut found = findings("src", SPAWN, SPAWN_ALLOWED);
    found.extend(findings("ffi/src", SPAWN, &[]));
    assert!(
        found.is_empty(),
        "library code starts a thread or a pool task outside the spawner (use `Spawner::spawn` or `Spawner::thread`):\n{}",
        found.join("\n")
    );
}

#[test]
fn e9_library_code_synchronises_only_through_the_sync_module() {
    let found = findings("src", SYNC, SYNC_ALLOWED);
    assert!(
        found.is_empty(),
        "library code uses a lock, condvar, atomic or channel outside `crate::sync` (a simulation cannot schedule it):\n{}",
        found.join("\n")
    );
}

/// The checks have teeth: each finds a forbidden call written where it is not allowed.
#[test]
fn e9_the_seam_checks_find_what_they_look_for() {
    let line = |s: &str| TIME.iter().chain(SPAWN).chain(SYNC).any(|p| s.contains(p));
    for bad in [
        "let t = Instant::now();",
        "std::thread::sleep(d);",
        "cv.wait_until(&mut g, deadline);",
        "rx.recv_timeout(d)",
        "rayon::spawn(move || {});",
        "std::thread::Builder::new()",
        "use parking_lot::Mutex;",
        "use std::sync::atomic::AtomicU64;",
    ] {
        assert!(line(bad), "{bad}");
    }
    assert!(!line("clock::wait_until(&*clock, &cv, &mut g, deadline)"));
    assert!(!line("let t = clock.instant();"));
}
