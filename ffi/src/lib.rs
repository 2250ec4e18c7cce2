//! # portcullis-ffi: the C ABI of Portcullis (SPEC E3)
//!
//! The only crate of Portcullis with `unsafe` code. `include/portcullis.h` is generated from
//! this crate by cbindgen and checked in (`tests/header.rs` fails when it is stale). Every
//! exported function follows these conventions:
//!
//! - **Opaque handles.** `pc_store`, `pc_batch`, `pc_scan_page`, `pc_engine`,
//!   `pc_engine_options`, `pc_warm` and `pc_clock` are created by `pc_*_new` / `pc_*_open`
//!   functions and freed by their `pc_*_free` function, which accepts null. A closed engine or
//!   store answers `PC_CLOSED`; closing twice is harmless. A freed handle must not be used
//!   again (that cannot be detected).
//! - **Codes.** Every fallible function returns the stable numeric code of
//!   `portcullis::Error` (SPEC E1): `PC_OK` (0) for success, `PC_INVALID_ARGUMENT` ...
//!   `PC_NOT_SERVED`, and `PC_PANIC` when an internal panic was caught. Results are written
//!   through out-parameters, and only when the call returns `PC_OK`.
//! - **Messages.** `pc_last_error_message(buf, len, &written)` copies the message of the
//!   calling thread's last failed call into a caller-owned buffer.
//! - **No unwinding across the boundary.** Every body runs inside one boundary function
//!   (`boundary::boundary`) that catches a panic and answers `PC_PANIC`. Null pointers, bad
//!   lengths and malformed UTF-8 answer `PC_INVALID_ARGUMENT` before anything is changed.
//! - **Buffers.** Bytes go in as `(const uint8_t *ptr, size_t len)` (null allowed only with
//!   length 0) and are copied before the call returns. Bytes come out as a `pc_bytes` the
//!   library allocates and the caller frees with `pc_bytes_free`, or as borrowed pointers into
//!   a handle (valid until that handle is freed). Nothing is freed across allocators: the
//!   state machine hands bytes back through `pc_sink_write` and `pc_records_push`.
//! - **Strings.** Paths, namespaces and owner ids are NUL-terminated UTF-8; entity ids,
//!   partitions, keys, values and records are byte buffers.
//! - **Threads.** Store and engine handles may be shared by any number of threads; options,
//!   batches, scan pages and buffers are used by one thread at a time. A `pc_*_free` must not
//!   race with any other call on the same handle.
//! - **The state machine in C** (`pc_machine`): function pointers plus `user_data`, called
//!   from the pool's threads and from any thread that touches an entity, possibly at once
//!   for different entities (one entity's state is used by one thread at a time). `destroy`
//!   runs exactly once, after every state was freed, also when opening fails. A callback's
//!   non-zero return is a refusal: during a restore it contains the entity (SPEC R4) with the
//!   code in its reason.

#![allow(non_camel_case_types)]
#![deny(missing_docs)]

pub mod boundary;
pub mod engine;
pub mod fencing;
pub mod machine;
pub mod stats;
pub mod store;

pub use boundary::{pc_bytes, pc_bytes_free, pc_error_name, pc_last_error_message};

/// Success.
pub const PC_OK: u32 = 0;
/// An argument was malformed (a null pointer, a bad length, invalid UTF-8, an invalid name);
/// nothing was changed.
pub const PC_INVALID_ARGUMENT: u32 = 1;
/// A key, value, batch or record exceeds a documented limit; nothing was changed.
pub const PC_TOO_LARGE: u32 = 2;
/// Another open store holds the directory.
pub const PC_LOCKED: u32 = 3;
/// A file has a format version this build does not read.
pub const PC_UNSUPPORTED_VERSION: u32 = 4;
/// Stored data failed verification.
pub const PC_CORRUPT: u32 = 5;
/// An earlier sync failed; writes are refused until the store is reopened.
pub const PC_SYNC_FAILED: u32 = 6;
/// An operating-system I/O error.
pub const PC_IO: u32 = 7;
/// The handle was closed.
pub const PC_CLOSED: u32 = 8;
/// The write was planned under an older epoch: stop serving the namespace.
pub const PC_FENCED: u32 = 9;
/// Not possible now; retry later.
pub const PC_UNAVAILABLE: u32 = 10;
/// The entity could not be restored and is contained; release it after fixing the cause.
pub const PC_CONTAINED: u32 = 11;
/// The entity is not registered.
pub const PC_UNKNOWN_ENTITY: u32 = 12;
/// The call would deadlock (for example a callback touching its own entity); nothing changed.
pub const PC_WOULD_DEADLOCK: u32 = 13;
/// A remote batch's outcome is unknown; it committed at most once.
pub const PC_OUTCOME_UNKNOWN: u32 = 14;
/// This engine does not serve the entity's namespace.
pub const PC_NOT_SERVED: u32 = 15;
/// An internal panic was caught at the boundary; the call did not complete. Close the handle.
pub const PC_PANIC: u32 = 100;

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis::Error;

    /// The header's constants are the library's codes (SPEC E1).
    #[test]
    fn the_constants_are_the_library_codes() {
        let pairs = [
            (Error::InvalidArgument("x".into()), PC_INVALID_ARGUMENT),
            (
                Error::TooLarge {
                    what: "key",
                    size: 2,
                    limit: 1,
                },
                PC_TOO_LARGE,
            ),
            (Error::Locked { path: "p".into() }, PC_LOCKED),
            (
                Error::UnsupportedVersion {
                    file: "f".into(),
                    found: 2,
                    supported: 1,
                },
                PC_UNSUPPORTED_VERSION,
            ),
            (
                Error::Corrupt {
                    what: "p".into(),
                    detail: "d".into(),
                },
                PC_CORRUPT,
            ),
            (Error::SyncFailed("e".into()), PC_SYNC_FAILED),
            (
                Error::Io {
                    context: "c".into(),
                    source: std::io::Error::other("e"),
                },
                PC_IO,
            ),
            (Error::Closed, PC_CLOSED),
            (
                Error::Fenced {
                    grant: 1,
                    current: 2,
                },
                PC_FENCED,
            ),
            (
                Error::Unavailable {
                    reason: "r".into(),
                    retry_after_ms: 1,
                },
                PC_UNAVAILABLE,
            ),
            (
                Error::Contained {
                    entity: "e".into(),
                    reason: "r".into(),
                },
                PC_CONTAINED,
            ),
            (Error::UnknownEntity("e".into()), PC_UNKNOWN_ENTITY),
            (
                Error::WouldDeadlock {
                    entity: "e".into(),
                    detail: "d".into(),
                },
                PC_WOULD_DEADLOCK,
            ),
            (
                Error::OutcomeUnknown {
                    partition: "p".into(),
                    detail: "d".into(),
                },
                PC_OUTCOME_UNKNOWN,
            ),
            (
                Error::NotServed {
                    namespace: "n".into(),
                    detail: "d".into(),
                },
                PC_NOT_SERVED,
            ),
        ];
        for (error, constant) in pairs {
            assert_eq!(error.code(), constant, "{error:?}");
            // SAFETY: pc_error_name returns a static NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(pc_error_name(constant)) };
            assert_ne!(name.to_bytes(), b"PC_UNKNOWN");
        }
    }
}
