//! The C test programs (SPEC E3): each `tests/c/*.c` is compiled with the system C compiler
//! against `include/portcullis.h` and the static library, then run twice: built with
//! `-fsanitize=address,undefined` (any report fails it), and under
//! `valgrind --error-exitcode=1 --leak-check=full` (any error or leak fails it).
//!
//! Each program gets a fresh directory as its only argument.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cargo put `libportcullis_ffi.a`: the profile directory above this test's binary.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let lib = profile.join("libportcullis_ffi.a");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

fn compile(program: &str, out: &Path, sanitize: bool) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_owned()));
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-pthread"])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c").join(format!("{program}.c")));
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

fn run(program: &str, mut cmd: Command, how: &str) {
    let data = tempfile::tempdir().expect("a data directory");
    let output = cmd.arg(data.path()).output().expect("run the program");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{program} {how} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains(&format!("{program}: ok")),
        "{program} {how} did not finish:\n{stdout}\n{stderr}"
    );
}

/// Builds `program` twice and runs it under AddressSanitizer/UBSan and under valgrind.
fn check(program: &str) {
    let build = tempfile::tempdir().expect("a build directory");
    let asan = build.path().join(format!("{program}-asan"));
    compile(program, &asan, true);
    let mut cmd = Command::new(&asan);
    cmd.env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0:exitcode=1")
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1");
    run(program, cmd, "under AddressSanitizer/UBSan");

    let plain = build.path().join(format!("{program}-plain"));
    compile(program, &plain, false);
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--quiet",
        "--error-exitcode=1",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,possible",
    ])
    .arg(&plain);
    run(program, cmd, "under valgrind");
}

#[test]
fn e3_c_store() {
    check("store");
}
