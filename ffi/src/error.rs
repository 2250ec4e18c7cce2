//! The error object a caller owns (SPEC E1, E3): every fallible function takes a trailing
//! `pc_error *err` (null: none) and fills it when it fails, so the error comes back inside the
//! same call. That works in runtimes whose calls move between threads (Go, Java virtual
//! threads, .NET async), where a thread-local last error read by a second call may be another
//! call's. The thread-local last error is kept beside it (`pc_last_error_message`,
//! `pc_error_last`).
//!
//! Owns: `pc_error`, its accessors, and the record both kinds of error hold.

use std::ffi::{CString, c_char};

use crate::boundary::{boundary, boundary_void, last_error, out_ptr};

/// What a failed call left: its code, message, retry hint and the refusing callback's code.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub(crate) code: u32,
    pub(crate) message: CString,
    pub(crate) retry_after_ms: u64,
    pub(crate) callback_code: u32,
}

impl Record {
    pub(crate) fn ok() -> Record {
        Record {
            code: crate::PC_OK,
            message: CString::default(),
            retry_after_ms: 0,
            callback_code: 0,
        }
    }

    pub(crate) fn new(code: u32, message: String, retry_after_ms: u64, callback_code: u32) -> Self {
        // A message never holds a NUL; if one did, the text stops there rather than failing.
        let message = CString::new(message).unwrap_or_else(|e| {
            let end = e.nul_position();
            CString::new(&e.into_vec()[..end]).unwrap_or_default()
        });
        Record {
            code,
            message,
            retry_after_ms,
            callback_code,
        }
    }
}

/// An error object the caller owns: create it with `pc_error_new`, pass it as the last argument
/// of any fallible call, read it with `pc_error_code`, `pc_error_message`,
/// `pc_error_retry_after_ms` and `pc_error_callback_code`, free it with `pc_error_free`. A call
/// that succeeds resets it to `PC_OK`. One thread at a time per object; it may move between
/// threads.
pub struct pc_error {
    pub(crate) record: Record,
}

/// Creates an error object holding `PC_OK`.
///
/// # Safety
/// `out` writable. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_error_new(out: *mut *mut pc_error) -> u32 {
    boundary(std::ptr::null_mut(), || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        out.set(Box::into_raw(Box::new(pc_error {
            record: Record::ok(),
        })));
        Ok::<(), portcullis::Error>(())
    })
}

/// Frees an error object. Null is a no-op.
///
/// # Safety
/// `err` null or from `pc_error_new`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_error_free(err: *mut pc_error) {
    boundary_void(|| {
        if !err.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(err) });
        }
    });
}

fn read<T>(err: *const pc_error, f: impl FnOnce(&Record) -> T, none: T) -> T {
    // SAFETY: every accessor's contract: null or a live object.
    unsafe { err.as_ref() }.map_or(none, |e| f(&e.record))
}

/// The code of the failed call that filled `err` (`PC_OK` after a success; `PC_OK` for null).
///
/// # Safety
/// `err` null or live. One thread at a time per object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_error_code(err: *const pc_error) -> u32 {
    read(err, |r| r.code, crate::PC_OK)
}

/// The message of the failed call that filled `err`, NUL-terminated UTF-8 ("" after a success
/// or for null). Borrowed: valid until `err` is passed to another call or freed.
///
/// # Safety
/// `err` null or live. One thread at a time per object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_error_message(err: *const pc_error) -> *const c_char {
    read(err, |r| r.message.as_ptr(), c"".as_ptr())
}

/// For `PC_UNAVAILABLE`: how long to wait before retrying, in ms (0 otherwise).
///
/// # Safety
/// `err` null or live. One thread at a time per object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_error_retry_after_ms(err: *const pc_error) -> u64 {
    read(err, |r| r.retry_after_ms, 0)
}

/// The code a state machine callback (or a write's decision) refused with during the call, on
/// the calling thread (0 if none did; a callback that refused on another thread, during a
/// restore the call waited for, is named with its code in the message instead).
///
/// # Safety
/// `err` null or live. One thread at a time per object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_error_callback_code(err: *const pc_error) -> u32 {
    read(err, |r| r.callback_code, 0)
}

/// Copies the calling thread's last error (code, message, retry hint, callback code) into
/// `err`. A thread that made no failed call yet copies `PC_OK`.
///
/// # Safety
/// `err` live. Thread safety: any thread; each thread has its own last error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_error_last(err: *mut pc_error) -> u32 {
    // Not through `boundary`: that would reset the record being copied.
    // SAFETY: the caller's contract.
    match unsafe { err.as_mut() } {
        Some(e) => {
            e.record = last_error();
            crate::PC_OK
        }
        None => crate::PC_INVALID_ARGUMENT,
    }
}

/// The code a live error object holds (for tests in this crate).
#[cfg(test)]
pub(crate) fn code_of(err: *const pc_error) -> u32 {
    // SAFETY: the tests pass live objects.
    unsafe { pc_error_code(err) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boundary::boundary;
    use portcullis::Error;

    #[test]
    fn the_object_holds_what_the_call_left_and_resets_on_success() {
        let mut err = std::ptr::null_mut();
        // SAFETY: a local out-pointer; the object is freed below.
        unsafe {
            assert_eq!(pc_error_new(&mut err), crate::PC_OK);
            let code = boundary(err, || {
                Err(Error::Unavailable {
                    reason: "busy".into(),
                    retry_after_ms: 25,
                })
            });
            assert_eq!((code, code_of(err)), (10, 10));
            assert_eq!(pc_error_retry_after_ms(err), 25);
            let message = std::ffi::CStr::from_ptr(pc_error_message(err));
            assert!(message.to_str().unwrap().contains("busy"));
            assert_eq!(boundary(err, || Ok::<(), Error>(())), crate::PC_OK);
            assert_eq!((pc_error_code(err), pc_error_retry_after_ms(err)), (0, 0));
            // The thread's last error is the same failure.
            assert_eq!(pc_error_last(err), crate::PC_OK);
            assert_eq!(pc_error_code(err), 10);
            pc_error_free(err);
            assert_eq!(pc_error_code(std::ptr::null()), 0);
        }
    }
}
