//! The C test programs (SPEC E3): each `tests/c/*.c` is compiled with the system C compiler
//! against `include/portcullis.h` and the static library, then run twice: built with
//! `-fsanitize=address,undefined` (any report fails it), and under
//! `valgrind --error-exitcode=1 --leak-check=full` (any error or leak fails it).
//! `tests/cpp/header.cpp` compiles the header as C++ (`c++ -std=c++17 -pedantic`) and runs
//! the same two ways.
//!
//! Each program gets a fresh directory as its only argument.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The static library cargo built for this test run: beside this test's binary in
/// `target/<profile>/deps` (cargo builds every crate type of the library for its tests, but
/// copies them up to `target/<profile>` only on `cargo build`, so that copy may be stale).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    let lib = deps.join("libportcullis_ffi.a");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

/// The source of `program`: `tests/c/<program>.c`, `tests/cpp/<name>.cpp` for `cpp/<name>`,
/// or for `readme` the README's C example, written into `build`.
fn source(program: &str, build: &Path) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(name) = program.strip_prefix("cpp/") {
        return crate_dir.join("tests/cpp").join(format!("{name}.cpp"));
    }
    if program != "readme" {
        return crate_dir.join("tests/c").join(format!("{program}.c"));
    }
    let readme = std::fs::read_to_string(crate_dir.join("../README.md")).expect("README.md");
    let section = readme
        .split_once("## From C")
        .expect("README.md has a section \"From C\"")
        .1;
    let code = section
        .split_once("```c\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the section has a ```c block")
        .0;
    let path = build.join("readme.c");
    std::fs::write(&path, code).expect("write the README's example");
    path
}

fn compile(program: &str, out: &Path, sanitize: bool) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cpp = program.starts_with("cpp/");
    let (compiler, default, standard) = if cpp {
        ("CXX", "c++", "-std=c++17")
    } else {
        ("CC", "cc", "-std=c11")
    };
    let mut cc = Command::new(std::env::var(compiler).unwrap_or_else(|_| default.to_owned()));
    cc.args([standard, "-Wall", "-Wextra", "-Werror", "-g", "-pthread"]);
    if cpp {
        cc.arg("-pedantic");
    }
    cc.arg("-I")
        .arg(crate_dir.join("include"))
        .arg(source(program, out.parent().expect("a build directory")));
    if sanitize {
        cc.args([
            "-O1",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ]);
    } else {
        cc.arg("-O0");
    }
    cc.arg(library())
        .args(["-lpthread", "-ldl", "-lm"])
        .arg("-o")
        .arg(out);
    let status = cc.status().expect("run the C compiler `cc`");
    assert!(status.success(), "compiling {program}.c failed");
}

/// Runs a built program on a fresh directory; `Err` with its output unless it exits 0 and
/// prints `<name>: ok`.
fn run(program: &str, mut cmd: Command) -> Result<(), String> {
    let name = program.rsplit('/').next().unwrap_or(program);
    let data = tempfile::tempdir().expect("a data directory");
    let output = cmd.arg(data.path()).output().expect("run the program");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let finished = name == "readme" || stdout.contains(&format!("{name}: ok"));
    if output.status.success() && finished {
        Ok(())
    } else {
        Err(format!(
            "{} :\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            output.status
        ))
    }
}

/// Builds `program` with AddressSanitizer and UBSan (leak detection on) and runs it.
fn under_sanitizers(program: &str) -> Result<(), String> {
    let build = tempfile::tempdir().expect("a build directory");
    let exe = build.path().join("asan");
    compile(program, &exe, true);
    let mut cmd = Command::new(&exe);
    cmd.env("ASAN_OPTIONS", "detect_leaks=1:exitcode=1")
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1");
    run(program, cmd)
}

/// Builds `program` plainly and runs it under valgrind: any memory error or leak (definite
/// or possible, less the suppressions in `tests/c/valgrind.supp`, each of which says why it
/// is not one) fails it.
fn under_valgrind(program: &str) -> Result<(), String> {
    let build = tempfile::tempdir().expect("a build directory");
    let exe = build.path().join("plain");
    compile(program, &exe, false);
    let supp = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/valgrind.supp");
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--quiet",
        "--error-exitcode=1",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,possible",
    ])
    .arg(format!("--suppressions={}", supp.display()));
    if program == "fork" {
        // The forked child forgets the engine and store it inherited (by design: freeing them
        // would close them for the parent), so its exit reports them as lost; the parent is
        // checked in full, and the child under the sanitizers.
        cmd.arg("--child-silent-after-fork=yes");
    }
    cmd.arg(&exe);
    run(program, cmd)
}

/// Runs `program` in both lanes; fails on any report.
fn check(program: &str) {
    if let Err(e) = under_sanitizers(program) {
        panic!("{program} failed under AddressSanitizer/UBSan: {e}");
    }
    if let Err(e) = under_valgrind(program) {
        panic!("{program} failed under valgrind: {e}");
    }
}

#[test]
fn e3_c_store() {
    check("store");
}

#[test]
fn e3_c_engine_with_a_c_state_machine() {
    check("engine");
}

#[test]
fn e3_c_fencing_hand_over() {
    check("fencing");
}

#[test]
fn e3_c_revocation_to_completion() {
    check("revoke");
}

#[test]
fn e3_c_errors_and_misuse() {
    check("misuse");
}

#[test]
fn e3_c_many_threads_while_callbacks_run_on_the_pool() {
    check("threads");
}

/// Lifetimes: a warm handle outliving its engine, waits and closes from a callback, null
/// buffers with lengths, aliased outputs, a call during thread teardown.
#[test]
fn e3_c_lifetimes_and_holes() {
    check("lifetimes");
}

/// A forked child never writes on behalf of a store or engine its parent opened.
#[test]
fn e3_c_a_forked_child_never_writes_for_its_parent() {
    check("fork");
}

/// Versions, struct sizes, constant families, error objects, the log callback.
#[test]
fn e3_c_a_boundary_that_can_evolve() {
    check("evolve");
}

/// Versioned records and checkpoints (SPEC E7): the envelope on what a machine with a version
/// writes, upcasts of older versions (and of bytes stored before versions), newer versions and
/// older ones without an upcast refused naming both, version 0 and an older struct unchanged.
#[test]
fn e7_c_versioned_records_and_checkpoints() {
    check("versions");
}

/// Observability (SPEC E8): an engine's listener hears a refusal before the call returns and
/// calls back into the engine; a store's listener hears the torn tail its open truncated; the
/// stats and degraded reasons of both.
#[test]
fn e8_c_events_stats_and_degraded() {
    check("observe");
}

/// Listing, history, containment, visits, resident bound; every callback's refusal.
#[test]
fn e3_c_the_other_calls_and_every_refusal() {
    check("calls");
}

/// The header compiles as C++ and a C++ program runs against the library.
#[test]
fn e3_the_header_compiles_as_cpp() {
    check("cpp/header");
}

/// The README's C example compiles and does what it says, with the default options (the lease
/// sweeper on).
#[test]
fn e3_the_readme_c_example_runs() {
    check("readme");
}

/// The negative control of both lanes: a program that leaks a returned buffer, and one that
/// reads a byte past one, are each caught by the sanitizers and by valgrind.
#[test]
fn e3_both_lanes_catch_a_leak_and_an_overflow() {
    let cases = [
        ("controls/leak", "LeakSanitizer", "definitely lost"),
        (
            "controls/overflow",
            "AddressSanitizer: heap-buffer-overflow",
            "Invalid read",
        ),
    ];
    for (program, sanitizer_says, valgrind_says) in cases {
        match under_sanitizers(program) {
            Ok(()) => panic!("{program} passed under AddressSanitizer/UBSan"),
            Err(e) => assert!(e.contains(sanitizer_says), "{program}: {e}"),
        }
        match under_valgrind(program) {
            Ok(()) => panic!("{program} passed under valgrind"),
            Err(e) => assert!(e.contains(valgrind_says), "{program}: {e}"),
        }
    }
}
