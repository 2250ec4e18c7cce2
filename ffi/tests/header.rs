//! `include/portcullis.h` is generated from the code by cbindgen and checked in (SPEC E3).
//! This test regenerates it and fails when the checked-in header differs.

use std::path::Path;

#[test]
fn e3_the_checked_in_header_is_what_the_code_generates() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = crate_dir.join("include/portcullis.h");
    if std::env::var_os("PORTCULLIS_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "ffi/include/portcullis.h is stale: it differs from what the code generates. Regenerate \
         it with `PORTCULLIS_BLESS_HEADER=1 cargo test -p portcullis-ffi --test header` and \
         commit it."
    );
}
