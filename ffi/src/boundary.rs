//! The boundary every exported function runs inside: unwinding is caught and answered
//! [`PC_PANIC`](crate::PC_PANIC), failures become stable codes with the calling thread's last
//! error message, and raw arguments are checked (null pointers and bad lengths answer
//! `InvalidArgument`) before any of them is dereferenced.
//!
//! Owns: the thread-local last error, [`pc_bytes`] and its free function, the error-name table,
//! and the argument readers the other modules use.

use std::cell::RefCell;
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use portcullis::Error;

use crate::{PC_OK, PC_PANIC};

thread_local! {
    /// The message of the calling thread's last failed call.
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A test-only switch that turns the panic catch off, so a test can show the boundary is
/// what keeps a panic from crossing it (the negative control of [`boundary`]).
#[cfg(test)]
pub(crate) static CATCH_PANICS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(true);

fn set_last_error(message: String) {
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

/// Runs `body` as the body of an exported function: its error becomes the stable code (and
/// the thread's last error message), a panic becomes [`PC_PANIC`]. Every exported function
/// that returns a code calls this exactly once.
pub(crate) fn boundary(body: impl FnOnce() -> Result<(), Error>) -> u32 {
    #[cfg(test)]
    if !CATCH_PANICS.load(std::sync::atomic::Ordering::Relaxed) {
        return match body() {
            Ok(()) => PC_OK,
            Err(e) => fail(e),
        };
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => PC_OK,
        Ok(Err(e)) => fail(e),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            log::warn!("a panic was caught at the C boundary: {what}");
            set_last_error(format!(
                "internal panic caught at the C boundary ({what}); the call did not complete: \
                 close the handle and report the bug"
            ));
            PC_PANIC
        }
    }
}

/// Runs a `void` function's body (a free or a setter that cannot fail), swallowing a panic.
pub(crate) fn boundary_void(body: impl FnOnce()) {
    let _ = boundary(|| {
        body();
        Ok(())
    });
}

fn fail(e: Error) -> u32 {
    set_last_error(e.to_string());
    e.code()
}

/// `InvalidArgument` naming the argument.
pub(crate) fn invalid(what: &str, detail: &str) -> Error {
    Error::InvalidArgument(format!("{what} {detail}"))
}

/// Borrows a handle or struct argument, refusing null.
///
/// # Safety
/// `ptr` is null or points to a live `T` for the duration of the call.
pub(crate) unsafe fn arg<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, Error> {
    // SAFETY: the caller promises a live `T` or null; null is refused.
    unsafe { ptr.as_ref() }.ok_or_else(|| invalid(what, "is a null pointer"))
}

/// Borrows a handle mutably, refusing null.
///
/// # Safety
/// `ptr` is null or points to a live `T` that no other thread uses during the call.
pub(crate) unsafe fn arg_mut<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Error> {
    // SAFETY: as for `arg`, and the caller promises exclusive use.
    unsafe { ptr.as_mut() }.ok_or_else(|| invalid(what, "is a null pointer"))
}

/// Writes an out-parameter, refusing null. Out-parameters are written only on success, so
/// callers check every pointer (with [`out_ptr`]) before doing any work.
///
/// # Safety
/// `ptr` is null or valid for a write of `T`.
pub(crate) unsafe fn out_ptr<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T, Error> {
    // SAFETY: the caller promises a writable `T` or null; null is refused.
    unsafe { ptr.as_mut() }.ok_or_else(|| invalid(what, "is a null out-pointer"))
}

/// Borrows `(ptr, len)` as bytes. A null `ptr` is accepted only with `len == 0`; a length
/// above `isize::MAX` is refused.
///
/// # Safety
/// Unless null, `ptr` points to `len` readable bytes that stay unchanged during the call.
pub(crate) unsafe fn bytes<'a>(ptr: *const u8, len: usize, what: &str) -> Result<&'a [u8], Error> {
    if len > isize::MAX as usize {
        return Err(invalid(what, &format!("has an impossible length {len}")));
    }
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(invalid(
                what,
                &format!("is a null pointer with length {len}"),
            ))
        };
    }
    // SAFETY: non-null, the length is in range, and the caller promises `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Borrows `(ptr, len)` as bytes, or `None` when `ptr` is null (an absent optional buffer).
///
/// # Safety
/// As for [`bytes`].
pub(crate) unsafe fn opt_bytes<'a>(
    ptr: *const u8,
    len: usize,
    what: &str,
) -> Result<Option<&'a [u8]>, Error> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded.
    unsafe { bytes(ptr, len, what) }.map(Some)
}

/// Reads a NUL-terminated UTF-8 string.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string that stays unchanged during the call.
pub(crate) unsafe fn text<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, Error> {
    if ptr.is_null() {
        return Err(invalid(what, "is a null pointer"));
    }
    // SAFETY: non-null and NUL-terminated by the caller's promise.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map_err(|_| invalid(what, "is not valid UTF-8"))
}

/// A byte buffer the library allocated and hands to the caller, who frees it with
/// [`pc_bytes_free`]. `data` is null when `len` is 0.
#[repr(C)]
#[derive(Debug)]
pub struct pc_bytes {
    /// The bytes (owned by the library until freed).
    pub data: *mut u8,
    /// How many.
    pub len: usize,
}

impl pc_bytes {
    /// Hands `v` over to the caller.
    pub(crate) fn from_vec(v: Vec<u8>) -> pc_bytes {
        if v.is_empty() {
            return pc_bytes {
                data: std::ptr::null_mut(),
                len: 0,
            };
        }
        let boxed = v.into_boxed_slice();
        let len = boxed.len();
        let data = Box::into_raw(boxed).cast::<u8>();
        pc_bytes { data, len }
    }
}

/// Frees a buffer the library returned and resets it to `{NULL, 0}`, so freeing it twice is
/// harmless. `bytes` may be null, and a `{NULL, 0}` buffer is a no-op.
///
/// # Safety
/// `bytes` is null or points to a `pc_bytes` that this library filled (or that is `{NULL, 0}`).
/// Thread safety: one thread at a time per buffer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_bytes_free(bytes: *mut pc_bytes) {
    boundary_void(|| {
        // SAFETY: null or a buffer this library filled, by the caller's promise.
        let Some(b) = (unsafe { bytes.as_mut() }) else {
            return;
        };
        if !b.data.is_null() {
            let slice = std::ptr::slice_from_raw_parts_mut(b.data, b.len);
            // SAFETY: `data`/`len` came from `Box::into_raw` of a boxed slice in `from_vec`.
            drop(unsafe { Box::from_raw(slice) });
        }
        b.data = std::ptr::null_mut();
        b.len = 0;
    });
}

/// Copies the message of the calling thread's last failed call into `buf`, NUL-terminated
/// and truncated to `len - 1` bytes, and stores the message's full length (without the NUL)
/// in `*written`, so `*written >= len` means it was truncated. With `buf == NULL` and
/// `len == 0` it only reports the length. The message is empty if no call failed on this
/// thread yet. Successful calls leave it unchanged.
///
/// Returns `PC_OK`, or `PC_INVALID_ARGUMENT` when `written` is null or `buf` is null with a
/// non-zero `len` (the last error message is then unchanged).
///
/// # Safety
/// `buf` is null or valid for `len` bytes of writes; `written` is null or writable.
/// Thread safety: any thread; each thread sees its own last error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_last_error_message(
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> u32 {
    // Not through `boundary`: a refusal here must not overwrite the message being asked for.
    // SAFETY: null or writable, by the caller's promise.
    let Some(written) = (unsafe { written.as_mut() }) else {
        return crate::PC_INVALID_ARGUMENT;
    };
    if buf.is_null() && len != 0 {
        return crate::PC_INVALID_ARGUMENT;
    }
    LAST_ERROR.with(|last| {
        let last = last.borrow();
        *written = last.len();
        if len > 0 {
            let n = last.len().min(len - 1);
            // SAFETY: `buf` is valid for `len > n` bytes by the caller's promise, and the
            // message is a separate allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(last.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
    });
    PC_OK
}

/// The name of a code (`"PC_OK"`, `"PC_FENCED"`, ...), or `"PC_UNKNOWN"` for a code this
/// build does not know. The string is static: never free it.
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn pc_error_name(code: u32) -> *const c_char {
    let name: &'static CStr = match code {
        0 => c"PC_OK",
        1 => c"PC_INVALID_ARGUMENT",
        2 => c"PC_TOO_LARGE",
        3 => c"PC_LOCKED",
        4 => c"PC_UNSUPPORTED_VERSION",
        5 => c"PC_CORRUPT",
        6 => c"PC_SYNC_FAILED",
        7 => c"PC_IO",
        8 => c"PC_CLOSED",
        9 => c"PC_FENCED",
        10 => c"PC_UNAVAILABLE",
        11 => c"PC_CONTAINED",
        12 => c"PC_UNKNOWN_ENTITY",
        13 => c"PC_WOULD_DEADLOCK",
        14 => c"PC_OUTCOME_UNKNOWN",
        15 => c"PC_NOT_SERVED",
        PC_PANIC => c"PC_PANIC",
        _ => c"PC_UNKNOWN",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn last_message() -> String {
        let mut buf = [0 as c_char; 512];
        let mut written = 0usize;
        // SAFETY: a 512-byte buffer and a local out-parameter.
        let code = unsafe { pc_last_error_message(buf.as_mut_ptr(), buf.len(), &mut written) };
        assert_eq!(code, PC_OK);
        // SAFETY: the function NUL-terminates within the buffer.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_the_panic_code_with_a_message() {
        let code = boundary(|| panic!("boom"));
        assert_eq!(code, PC_PANIC);
        assert!(last_message().contains("boom"), "{}", last_message());
    }

    /// The negative control: with the catch switched off, the same panic crosses the boundary
    /// (here it reaches this test's own catch instead of becoming a code).
    #[test]
    fn without_the_catch_the_panic_escapes() {
        CATCH_PANICS.store(false, Ordering::Relaxed);
        let escaped = std::panic::catch_unwind(|| boundary(|| panic!("boom")));
        CATCH_PANICS.store(true, Ordering::Relaxed);
        assert!(escaped.is_err(), "the panic must escape without the catch");
    }

    #[test]
    fn the_message_is_truncated_and_its_full_length_reported() {
        let code = boundary(|| Err(Error::InvalidArgument("x".repeat(100))));
        assert_eq!(code, 1);
        let mut buf = [0x7f as c_char; 8];
        let mut written = 0usize;
        // SAFETY: an 8-byte buffer.
        let code = unsafe { pc_last_error_message(buf.as_mut_ptr(), buf.len(), &mut written) };
        assert_eq!(code, PC_OK);
        assert!(written > 100);
        assert_eq!(buf[7], 0, "NUL-terminated within the buffer");
        // Asking for the length only.
        let mut only = 0usize;
        // SAFETY: a null buffer of length 0 is allowed.
        let code = unsafe { pc_last_error_message(std::ptr::null_mut(), 0, &mut only) };
        assert_eq!((code, only), (PC_OK, written));
    }

    #[test]
    fn null_with_a_length_is_refused_and_empty_null_is_empty() {
        // SAFETY: null pointers are what is being tested.
        unsafe {
            assert!(bytes(std::ptr::null(), 3, "key").is_err());
            assert_eq!(bytes(std::ptr::null(), 0, "key").unwrap(), &[] as &[u8]);
            assert!(bytes(std::ptr::dangling::<u8>(), usize::MAX, "key").is_err());
        }
    }

    #[test]
    fn bytes_round_trip_and_free_twice() {
        let mut b = pc_bytes::from_vec(b"abc".to_vec());
        assert_eq!(b.len, 3);
        // SAFETY: a buffer this module filled.
        unsafe {
            pc_bytes_free(&mut b);
            assert!(b.data.is_null());
            pc_bytes_free(&mut b);
            pc_bytes_free(std::ptr::null_mut());
        }
    }
}
