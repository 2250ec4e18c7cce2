#!/bin/sh
# Installs the C library of Portcullis for C and C++ programs: the header, a shared library
# with a versioned soname, a static library and a pkg-config file, then compile and link with
#   cc app.c $(pkg-config --cflags --libs portcullis)
#   cc app.c $(pkg-config --cflags portcullis) -Wl,-Bstatic -lportcullis -Wl,-Bdynamic \
#       $(pkg-config --static --libs-only-other --libs-only-l portcullis | sed 's/-lportcullis//')
#
# Usage: ffi/install.sh [PREFIX]   (default /usr/local; DESTDIR is honoured for packaging)
# Environment: PROFILE=release (default) or debug; CARGO_TARGET_DIR as cargo reads it.
# Supported: Linux (x86_64 and aarch64; tested on x86_64). Elsewhere the build works where
# Rust does, but this script installs Linux file names.
set -eu

prefix=${1:-${PREFIX:-/usr/local}}
profile=${PROFILE:-release}
root=$(cd "$(dirname "$0")/.." && pwd)
case "$profile" in
release) cargo build --release -p portcullis-ffi --manifest-path "$root/Cargo.toml" ;;
debug) cargo build -p portcullis-ffi --manifest-path "$root/Cargo.toml" ;;
*) echo "PROFILE must be release or debug, not $profile" >&2; exit 2 ;;
esac
built=${CARGO_TARGET_DIR:-$root/target}/$profile

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/ffi/Cargo.toml" | head -n 1)
# The soname follows the ABI version (PC_ABI_VERSION), set at link time by ffi/build.rs.
abi=$(sed -n 's/^#define PC_ABI_VERSION \([0-9]*\)$/\1/p' "$root/ffi/include/portcullis.h")
[ -n "$version" ] && [ -n "$abi" ] || { echo "cannot read the version or the ABI" >&2; exit 1; }

libdir=$prefix/lib
includedir=$prefix/include
dest_lib=${DESTDIR:-}$libdir
dest_include=${DESTDIR:-}$includedir
mkdir -p "$dest_lib/pkgconfig" "$dest_include"

cp "$root/ffi/include/portcullis.h" "$dest_include/portcullis.h"
cp "$built/libportcullis_ffi.a" "$dest_lib/libportcullis.a"
cp "$built/libportcullis_ffi.so" "$dest_lib/libportcullis.so.$version"
ln -sf "libportcullis.so.$version" "$dest_lib/libportcullis.so.$abi"
ln -sf "libportcullis.so.$abi" "$dest_lib/libportcullis.so"
chmod 644 "$dest_include/portcullis.h" "$dest_lib/libportcullis.a"
chmod 755 "$dest_lib/libportcullis.so.$version"

cat >"$dest_lib/pkgconfig/portcullis.pc" <<PC
prefix=$prefix
libdir=$libdir
includedir=$includedir

Name: portcullis
Description: Durable entities: a crash-safe append-only store, lazy exactly-once restore, epoch fencing (C ABI $abi)
Version: $version
Libs: -L\${libdir} -lportcullis
Libs.private: -lpthread -ldl -lm
Cflags: -I\${includedir}
PC
echo "installed portcullis $version (ABI $abi) under ${DESTDIR:-}$prefix"
