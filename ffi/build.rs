//! Gives the shared library a soname that follows the ABI version (`PC_ABI_VERSION`), so a
//! program linked against ABI 1 loads `libportcullis.so.1` (see `install.sh`). Linux only.

/// Must equal `PC_ABI_VERSION` (`src/version.rs`; a test checks it).
const ABI: u32 = 1;

fn main() {
    println!("cargo:rustc-env=PORTCULLIS_SONAME_ABI={ABI}");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libportcullis.so.{ABI}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
