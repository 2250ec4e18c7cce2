//! The install step (SPEC E3): `install.sh` puts the header, the libraries and a pkg-config
//! file under a prefix; a C program built with `pkg-config --cflags --libs portcullis` (the
//! README's example) links against the installed shared library, through its versioned
//! soname, and runs.

use std::path::Path;
use std::process::Command;

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn e3_install_sh_installs_a_library_pkg_config_finds() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let prefix = tempfile::tempdir().expect("a prefix");
    // The debug build the tests already made: the script builds nothing new.
    run(
        Command::new("sh")
            .arg(crate_dir.join("install.sh"))
            .arg(prefix.path())
            .env("PROFILE", "debug"),
        "install.sh",
    );
    let lib = prefix.path().join("lib");
    for file in [
        "libportcullis.a",
        "libportcullis.so",
        "libportcullis.so.1",
        "pkgconfig/portcullis.pc",
    ] {
        assert!(lib.join(file).exists(), "{file} was not installed");
    }
    assert!(prefix.path().join("include/portcullis.h").exists());

    let flags = run(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "portcullis"])
            .env("PKG_CONFIG_PATH", lib.join("pkgconfig")),
        "pkg-config",
    );
    let readme = std::fs::read_to_string(crate_dir.join("../README.md")).expect("README.md");
    let code = readme
        .split_once("## From C")
        .and_then(|(_, s)| s.split_once("```c\n"))
        .and_then(|(_, s)| s.split_once("```"))
        .expect("the README's C example")
        .0;
    let build = tempfile::tempdir().expect("a build directory");
    let source = build.path().join("app.c");
    std::fs::write(&source, code).expect("write the example");
    let app = build.path().join("app");
    run(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(&source)
            .args(flags.split_whitespace())
            .arg("-o")
            .arg(&app),
        "cc with pkg-config's flags",
    );
    let data = tempfile::tempdir().expect("a data directory");
    let said = run(
        Command::new(&app)
            .arg(data.path())
            .env("LD_LIBRARY_PATH", &lib),
        "the installed example",
    );
    assert!(said.contains("alice holds 42"), "{said}");
    let needed = run(Command::new("readelf").arg("-d").arg(&app), "readelf");
    assert!(
        needed.contains("[libportcullis.so.1]"),
        "not linked through the soname: {needed}"
    );
}
