//! # portcullis-ffi: the C ABI of Portcullis (SPEC E3)
//!
//! The only crate of Portcullis with `unsafe` code. `include/portcullis.h` is generated from
//! this crate by cbindgen and checked in (`tests/header.rs` fails when it is stale). Every
//! exported function follows these conventions:
//!
//! - **Opaque handles.** `pc_store`, `pc_batch`, `pc_scan_page`, `pc_engine`,
//!   `pc_engine_options`, `pc_warm`, `pc_clock`, `pc_entity_list`, `pc_history_page` and
//!   `pc_error` are created by `pc_*_new` / `pc_*_open` functions and freed by their
//!   `pc_*_free` function, which accepts null. A closed engine or store answers `PC_CLOSED`;
//!   closing twice is harmless. A freed handle must not be used again (that cannot be
//!   detected).
//! - **Codes.** Every fallible function returns the stable numeric code of
//!   `portcullis::Error` (SPEC E1): `PC_OK` (0) for success, `PC_INVALID_ARGUMENT` ...
//!   `PC_OWNER_LIVE`, and `PC_PANIC` when an internal panic was caught. Results are written
//!   through out-parameters, and only when the call returns `PC_OK`; two out-parameters that
//!   overlap are refused.
//! - **Errors.** Every fallible function takes a last argument `pc_error *err` (null: none):
//!   a caller-owned object the call fills when it fails (code, message, retry hint, the code
//!   of the callback that refused), so the error comes back within the call in runtimes whose
//!   calls move between threads. The calling thread's last error is also kept
//!   (`pc_last_error_message`, `pc_error_last`).
//! - **No unwinding across the boundary.** Every body runs inside one boundary function
//!   (`boundary::boundary`) that catches a panic and answers `PC_PANIC`. Null pointers, bad
//!   lengths and malformed UTF-8 answer `PC_INVALID_ARGUMENT` before anything is changed.
//! - **Buffers.** Bytes go in as `(const uint8_t *ptr, size_t len)` (null allowed only with
//!   length 0; for an optional buffer `NULL, 0` means absent) and are copied before the call
//!   returns. Bytes come out as a `pc_bytes` the library allocates and the caller frees with
//!   `pc_bytes_free`, or as borrowed pointers into a handle (valid until that handle is
//!   freed). Nothing is freed across allocators: the state machine hands bytes back through
//!   `pc_sink_write` and `pc_records_push`.
//! - **Strings.** Paths, namespaces and owner ids are NUL-terminated UTF-8; entity ids,
//!   partitions, keys, values and records are byte buffers.
//! - **Constants.** Each family (codes, sync policies, flags, number options, outcome kinds,
//!   deferral kinds, origins, log levels) has its own `typedef` and values that overlap no
//!   other family's; a function refuses a value from another family.
//! - **Versions.** `pc_abi_version()` and `pc_version()` say what was linked. Structs that
//!   may grow (`pc_machine`, `pc_engine_stats`, `pc_store_stats`, `pc_warm_progress`) start
//!   with `struct_size`, which the caller sets to `sizeof` the struct; the library reads or
//!   writes only that many bytes, and adds fields only at their end. `pc_event`, lent to a
//!   listener, carries the library's own `sizeof`: a caller reads only fields within it. The
//!   other structs never grow.
//! - **Events** (SPEC E8, [`observe`]): a listener (`pc_event_fn`, set with
//!   `pc_engine_options_listener` or `pc_store_open_file_listened`) is called with no lock of
//!   the library held and may call back into the engine or store; `pc_engine_get_stats`,
//!   `pc_store_get_stats`, `pc_engine_degraded` and `pc_store_degraded` say whether it is
//!   degraded and why.
//! - **Threads.** Store and engine handles may be shared by any number of threads; options,
//!   batches, pages, lists, error objects and buffers are used by one thread at a time. A
//!   `pc_*_free` must not race with any other call on the same handle.
//! - **Fork.** A forked child never uses, closes or writes for a store, engine or warm its
//!   parent opened: every call on one answers `PC_CLOSED`, and freeing one only forgets it.
//! - **The state machine in C** (`pc_machine`): function pointers plus `user_data`, called
//!   from the pool's threads and from any thread that touches an entity, possibly at once
//!   for different entities (one entity's state is used by one thread at a time). `destroy`
//!   runs exactly once, after the last callback and every state was freed, also when opening
//!   fails. A callback's non-zero return is a refusal, with a reason given by `pc_refuse`:
//!   during a restore it contains the entity (SPEC R4); `check` and a write's decision
//!   (`pc_records_refuse`) refuse a write (`PC_REFUSED`, nothing written, SPEC R12); `encode`
//!   refuses a checkpoint (nothing published). A machine with a `version` has every record and
//!   checkpoint stored behind the version envelope and reads older ones through
//!   `upcast_record` and `upcast_checkpoint` (SPEC E7, [`envelope`]).

#![allow(non_camel_case_types)]
#![deny(missing_docs)]

pub mod batch;
pub mod boundary;
pub mod context;
pub mod engine;
pub mod envelope;
pub mod error;
pub mod fencing;
pub mod fork;
pub mod inspect;
pub mod machine;
pub mod observe;
pub mod options;
pub mod outputs;

pub mod stats;
pub mod store;
pub mod version;
pub mod warm;

pub use boundary::{pc_bytes, pc_bytes_free, pc_error_name, pc_last_error_message};

/// A code a fallible function returns (`PC_OK`, `PC_INVALID_ARGUMENT` ... `PC_PANIC`).
pub type pc_code = u32;

/// Success.
pub const PC_OK: pc_code = 0;
/// An argument was malformed (a null pointer, a bad length, invalid UTF-8, an invalid name);
/// nothing was changed.
pub const PC_INVALID_ARGUMENT: pc_code = 1;
/// A key, value, batch or record exceeds a documented limit; nothing was changed.
pub const PC_TOO_LARGE: pc_code = 2;
/// Another open store holds the directory.
pub const PC_LOCKED: pc_code = 3;
/// A file has a format version this build does not read.
pub const PC_UNSUPPORTED_VERSION: pc_code = 4;
/// Stored data failed verification.
pub const PC_CORRUPT: pc_code = 5;
/// An earlier sync failed; writes are refused until the store is reopened.
pub const PC_SYNC_FAILED: pc_code = 6;
/// An operating-system I/O error.
pub const PC_IO: pc_code = 7;
/// The handle was closed.
pub const PC_CLOSED: pc_code = 8;
/// The write was planned under an older epoch: stop serving the namespace.
pub const PC_FENCED: pc_code = 9;
/// Not possible now; retry later.
pub const PC_UNAVAILABLE: pc_code = 10;
/// The entity could not be restored and is contained; release it after fixing the cause.
pub const PC_CONTAINED: pc_code = 11;
/// The entity is not registered.
pub const PC_UNKNOWN_ENTITY: pc_code = 12;
/// The call would deadlock (for example a callback touching its own entity); nothing changed.
pub const PC_WOULD_DEADLOCK: pc_code = 13;
/// A remote batch's outcome is unknown; it committed at most once.
pub const PC_OUTCOME_UNKNOWN: pc_code = 14;
/// This engine does not serve the entity's namespace.
pub const PC_NOT_SERVED: pc_code = 15;
/// The store used up numbers its format bounds (journal segment numbers); copy its partitions
/// into a new store. Nothing changed; reads still work.
pub const PC_EXHAUSTED: pc_code = 16;
/// The state machine refused the write (a decision that called `pc_records_refuse`): nothing
/// was written and the entity keeps serving; the message has the reason (SPEC R12).
pub const PC_REFUSED: pc_code = 17;
/// Another incarnation of the owner is live (it renews its lease): do not take it for a crash.
pub const PC_OWNER_LIVE: pc_code = 18;
/// An internal panic was caught at the boundary; the call did not complete. Close the handle.
pub const PC_PANIC: pc_code = 100;

/// Which constant family a value belongs to, for messages that refuse a value of the wrong
/// family.
pub(crate) fn family_of(value: u32) -> &'static str {
    match value >> 8 {
        0 => "an error code",
        1 => "a PC_SYNC_* policy",
        2 => "a PC_* flag",
        3 => "a PC_* number option",
        4 => "a PC_OUTCOME_* kind",
        5 => "a PC_DEFERRED_* kind",
        6 => "a PC_ORIGIN_* value",
        7 => "a PC_LOG_* level",
        9 => "a PC_EVENT_* kind",
        10 => "a PC_DEGRADED_* cause",
        _ => "no family",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis::Error;

    /// Every family of constants, with the values it holds.
    fn families() -> Vec<(&'static str, Vec<u32>)> {
        use crate::context::*;
        use crate::engine::*;
        use crate::observe::*;
        use crate::options::*;
        use crate::store::*;
        use crate::version::*;
        vec![
            ("codes", (0..=18).chain([PC_PANIC]).collect()),
            (
                "sync",
                vec![
                    PC_SYNC_EVERY_COMMIT,
                    PC_SYNC_PERIODIC_MAY_LOSE_RECENT,
                    PC_SYNC_NEVER_MAY_LOSE_RECENT,
                ],
            ),
            (
                "flags",
                vec![
                    PC_ADOPT_ON_FIRST_USE,
                    PC_REGISTER_ON_FIRST_WRITE,
                    PC_TRUNCATE_AFTER_CHECKPOINT,
                    PC_WARM_ON_OPEN,
                    PC_SWEEP_EXPIRED_LEASES,
                    PC_BACKGROUND_WARM,
                ],
            ),
            (
                "numbers",
                vec![
                    PC_POOL_THREADS,
                    PC_WARM_PARALLELISM,
                    PC_CHECKPOINT_EVERY,
                    PC_CHECKPOINT_TAIL_BOUND,
                    PC_CLOSE_TIMEOUT_MS,
                    PC_SWEEP_INTERVAL_MS,
                    PC_MAX_RESIDENT_ENTITIES,
                    PC_POOL_STACK_SIZE,
                ],
            ),
            (
                "outcomes",
                vec![
                    PC_OUTCOME_COMMITTED,
                    PC_OUTCOME_PRECONDITION_FAILED,
                    PC_OUTCOME_DEADLINE_PASSED,
                ],
            ),
            (
                "deferred",
                vec![
                    PC_DEFERRED_QUEUED,
                    PC_DEFERRED_ALREADY_ACCEPTED,
                    PC_DEFERRED_APPLIED,
                ],
            ),
            (
                "origins",
                vec![
                    PC_ORIGIN_REPLAY,
                    PC_ORIGIN_DEFERRED,
                    PC_ORIGIN_REPAIR,
                    PC_ORIGIN_LIVE,
                    PC_ORIGIN_UNKNOWN,
                ],
            ),
            (
                "log levels",
                vec![
                    PC_LOG_ERROR,
                    PC_LOG_WARN,
                    PC_LOG_INFO,
                    PC_LOG_DEBUG,
                    PC_LOG_TRACE,
                ],
            ),
            ("events", (0x0901..=0x0916).collect()),
            (
                "degraded causes",
                vec![
                    PC_DEGRADED_SYNC_FAILED,
                    PC_DEGRADED_BACKGROUND_THREAD_ENDED,
                    PC_DEGRADED_SNAPSHOTS_STOPPED,
                    PC_DEGRADED_SNAPSHOT_FAILED,
                    PC_DEGRADED_COMPACTION_FAILED,
                    PC_DEGRADED_OWNER_LEASE_NOT_RENEWED,
                ],
            ),
        ]
    }

    /// No value belongs to two families, and each family sits in its own range (so
    /// `family_of` names it).
    #[test]
    fn constant_families_do_not_overlap() {
        let mut seen = std::collections::HashMap::new();
        for (family, values) in families() {
            for v in values {
                if let Some(other) = seen.insert(v, family) {
                    panic!("{v:#x} is in {family} and in {other}");
                }
            }
        }
        let ranges: std::collections::HashSet<_> = families()
            .iter()
            .map(|(_, values)| {
                let r: std::collections::HashSet<_> = values
                    .iter()
                    .filter(|v| **v != PC_PANIC)
                    .map(|v| family_of(*v))
                    .collect();
                assert_eq!(r.len(), 1, "{values:?}");
                r.into_iter().next()
            })
            .collect();
        assert_eq!(ranges.len(), families().len());
    }

    /// A setter refuses every value of every other family (what `pc_engine_options_flag(o,
    /// PC_POOL_THREADS, ...)` once silently accepted as another flag).
    #[test]
    fn each_setter_refuses_the_other_families() {
        use crate::options::*;
        let none = std::ptr::null_mut();
        let mut o = std::ptr::null_mut();
        // SAFETY: a local out-pointer; the options are freed below.
        unsafe {
            assert_eq!(pc_engine_options_new(&mut o, none), PC_OK);
            for (family, values) in families() {
                for v in values {
                    let flag = pc_engine_options_flag(o, v, true, none);
                    let number = pc_engine_options_number(o, v, 1, none);
                    let sync = pc_engine_options_sync_policy(o, v, 1, none);
                    assert_eq!(flag == PC_OK, family == "flags", "flag {v:#x}");
                    assert_eq!(number == PC_OK, family == "numbers", "number {v:#x}");
                    assert_eq!(sync == PC_OK, family == "sync", "sync {v:#x}");
                }
            }
            pc_engine_options_free(o);
        }
    }

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
            (
                Error::Exhausted {
                    what: "w".into(),
                    detail: "d".into(),
                },
                PC_EXHAUSTED,
            ),
            (
                Error::Refused {
                    entity: "e".into(),
                    reason: "r".into(),
                },
                PC_REFUSED,
            ),
            (
                Error::OwnerLive {
                    owner: "o".into(),
                    incarnation: 1,
                    expires_in_ms: 1,
                    detail: "d".into(),
                },
                PC_OWNER_LIVE,
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
