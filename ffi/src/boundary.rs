//! The boundary every exported function runs inside: unwinding is caught and answered
//! [`PC_PANIC`](crate::PC_PANIC), a failure becomes a stable code, the calling thread's last
//! error and (when the caller passed one) the caller's `pc_error`, and raw arguments are
//! checked (null pointers, bad lengths, one pointer passed for two outputs) before any of them
//! is dereferenced.
//!
//! Owns: the thread-local last error and callback context, [`Fail`], [`pc_bytes`] and its free
//! function, the error-name table, and the argument readers the other modules use.

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use portcullis::Error;

use crate::error::{Record, pc_error};
use crate::{PC_INVALID_ARGUMENT, PC_OK, PC_PANIC};

thread_local! {
    /// The calling thread's last failed call.
    static LAST_ERROR: RefCell<Record> = RefCell::new(Record::ok());
    /// How deep in exported functions this thread is (a callback calls `pc_sink_write` from
    /// inside `pc_engine_read`): only the outermost call starts and ends a call's record.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The code of the last state machine callback that refused on this thread during the
    /// outermost call (0: none).
    static CALLBACK_CODE: Cell<u32> = const { Cell::new(0) };
    /// Set while a state machine callback runs on this thread: the reason it gave with
    /// `pc_refuse`, if any.
    static CALLBACK_REASON: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// A test-only switch (per thread, so parallel tests do not see it) that turns the panic
    /// catch off, so a test can show the boundary is what keeps a panic from crossing it (the
    /// negative control of [`boundary`]).
    pub(crate) static CATCH_PANICS: Cell<bool> = const { Cell::new(true) };
}

/// A failed call: its code, message and retry hint. Built from a library [`Error`] or by the
/// boundary itself (a forked child's handle, an internal panic).
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: u32,
    pub(crate) message: String,
    pub(crate) retry_after_ms: u64,
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let retry_after_ms = match &e {
            Error::Unavailable { retry_after_ms, .. } => *retry_after_ms,
            _ => 0,
        };
        Fail {
            code: e.code(),
            message: e.to_string(),
            retry_after_ms,
        }
    }
}

/// Records `fail` as the calling thread's last error (nothing during thread teardown, when the
/// thread-local is gone) and in the caller's error object; returns its code.
fn fail(f: Fail, err: *mut pc_error) -> u32 {
    let callback_code = CALLBACK_CODE.try_with(Cell::get).unwrap_or(0);
    let record = Record::new(f.code, f.message, f.retry_after_ms, callback_code);
    // SAFETY: `err` is null or a live `pc_error` the caller owns, by every function's contract.
    if let Some(e) = unsafe { err.as_mut() } {
        e.record = record.clone();
    }
    let code = record.code;
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = record);
    code
}

/// Runs `body` as the body of an exported function: its error becomes the stable code (and the
/// thread's last error, and `*err` when `err` is not null), a panic becomes [`PC_PANIC`]. On
/// success `*err` is reset to `PC_OK`. Every exported function that returns a code calls this
/// exactly once.
pub(crate) fn boundary<E: Into<Fail>>(
    err: *mut pc_error,
    body: impl FnOnce() -> Result<(), E>,
) -> u32 {
    let depth = DEPTH.try_with(|d| d.replace(d.get() + 1)).unwrap_or(1);
    if depth == 0 {
        let _ = CALLBACK_CODE.try_with(|c| c.set(0));
    }
    let outcome = run(body);
    let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    match outcome {
        Ok(()) => {
            // SAFETY: as in `fail`.
            if let Some(e) = unsafe { err.as_mut() } {
                e.record = Record::ok();
            }
            PC_OK
        }
        Err(f) => fail(f, err),
    }
}

fn run<E: Into<Fail>>(body: impl FnOnce() -> Result<(), E>) -> Result<(), Fail> {
    #[cfg(test)]
    if !CATCH_PANICS.with(Cell::get) {
        return body().map_err(Into::into);
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(done) => done.map_err(Into::into),
        Err(payload) => {
            let what = panic_text(&*payload);
            log::warn!("a panic was caught at the C boundary: {what}");
            Err(Fail {
                code: PC_PANIC,
                message: format!(
                    "internal panic caught at the C boundary ({what}); the call did not \
                     complete: close the handle and report the bug"
                ),
                retry_after_ms: 0,
            })
        }
    }
}

/// The text of a panic's payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Runs a `void` function's body (a free or a setter that cannot fail), swallowing a panic.
pub(crate) fn boundary_void(body: impl FnOnce()) {
    let _ = boundary(std::ptr::null_mut(), || {
        body();
        Ok::<(), Error>(())
    });
}

/// Runs a state machine callback on this thread: `pc_refuse` works inside it, and a refusal
/// (a non-zero code) is remembered as the call's callback code. Returns the code and the
/// reason the callback gave, if any.
pub(crate) fn callback(call: impl FnOnce() -> u32) -> (u32, Option<String>) {
    let outer = CALLBACK_REASON
        .try_with(|r| r.borrow_mut().replace(None))
        .ok()
        .flatten();
    let code = call();
    let reason = CALLBACK_REASON
        .try_with(|r| std::mem::replace(&mut *r.borrow_mut(), outer))
        .ok()
        .flatten()
        .flatten();
    if code != 0 {
        let _ = CALLBACK_CODE.try_with(|c| c.set(code));
    }
    (code, reason)
}

/// Records `code` as the call's callback code, for a refusal the library makes on a callback's
/// behalf (bytes of a version the machine does not read).
pub(crate) fn set_callback_code(code: u32) {
    let _ = CALLBACK_CODE.try_with(|c| c.set(code));
}

/// Gives the reason of the refusal the running callback is about to return; `Err` outside a
/// callback.
pub(crate) fn set_callback_reason(reason: &str) -> Result<(), Error> {
    CALLBACK_REASON
        .try_with(|r| match r.borrow_mut().as_mut() {
            Some(slot) => {
                *slot = Some(reason.to_owned());
                Ok(())
            }
            None => Err(invalid(
                "pc_refuse",
                "was called outside a state machine callback",
            )),
        })
        .unwrap_or_else(|_| Err(invalid("pc_refuse", "was called during thread teardown")))
}

/// The calling thread's last error record (for `pc_error_last`).
pub(crate) fn last_error() -> Record {
    LAST_ERROR
        .try_with(|last| last.borrow().clone())
        .unwrap_or_else(|_| Record::ok())
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

/// An out-parameter: checked non-null, written only through [`Out::set`] (no reference to the
/// caller's memory is made), so two outputs that overlap are refused by [`distinct`] rather
/// than becoming two mutable references to one place.
pub(crate) struct Out<T> {
    ptr: *mut T,
}

impl<T> Out<T> {
    /// Writes the value (dropping nothing: the caller's memory holds no Rust value).
    pub(crate) fn set(&self, value: T) {
        // SAFETY: checked non-null in `out_ptr`; the caller promises it is writable.
        unsafe { self.ptr.write(value) }
    }

    fn span(&self) -> (usize, usize) {
        (self.ptr as usize, std::mem::size_of::<T>())
    }
}

/// Checks an out-parameter is not null. Out-parameters are written only on success, so
/// callers check every pointer before doing any work.
///
/// # Safety
/// `ptr` is null or valid for a write of `T` during the call.
pub(crate) unsafe fn out_ptr<T>(ptr: *mut T, what: &str) -> Result<Out<T>, Error> {
    if ptr.is_null() {
        return Err(invalid(what, "is a null out-pointer"));
    }
    Ok(Out { ptr })
}

/// Refuses out-parameters that overlap (one pointer passed for two outputs).
pub(crate) fn distinct(outs: &[(&str, (usize, usize))]) -> Result<(), Error> {
    for (i, (a, (pa, la))) in outs.iter().enumerate() {
        for (b, (pb, lb)) in &outs[i + 1..] {
            if pa < &(pb + lb) && pb < &(pa + la) {
                return Err(invalid(
                    &format!("{a} and {b}"),
                    "overlap: pass a separate variable for each output",
                ));
            }
        }
    }
    Ok(())
}

/// The span of an out-parameter, for [`distinct`].
pub(crate) fn span<T>(out: &Out<T>) -> (usize, usize) {
    out.span()
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

/// Borrows `(ptr, len)` as bytes, or `None` for an absent optional buffer: a null `ptr` with
/// length 0. A null `ptr` with a non-zero length is refused like any other.
///
/// # Safety
/// As for [`bytes`].
pub(crate) unsafe fn opt_bytes<'a>(
    ptr: *const u8,
    len: usize,
    what: &str,
) -> Result<Option<&'a [u8]>, Error> {
    if ptr.is_null() && len == 0 {
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
/// [`pc_bytes_free`]. `data` is null when `len` is 0. This struct never grows.
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
/// thread yet. Successful calls leave it unchanged. (A caller whose calls may move between
/// threads passes a `pc_error` to each call instead.)
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
    if written.is_null() || (buf.is_null() && len != 0) {
        return PC_INVALID_ARGUMENT;
    }
    let last = last_error();
    let message = last.message.as_bytes();
    // SAFETY: non-null and writable by the caller's promise.
    unsafe { written.write(message.len()) };
    if len > 0 {
        let n = message.len().min(len - 1);
        // SAFETY: `buf` is valid for `len > n` bytes by the caller's promise, and the message
        // is a separate allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(message.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
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
        16 => c"PC_EXHAUSTED",
        17 => c"PC_REFUSED",
        18 => c"PC_OWNER_LIVE",
        PC_PANIC => c"PC_PANIC",
        _ => c"PC_UNKNOWN",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let code = boundary(std::ptr::null_mut(), || -> Result<(), Error> {
            panic!("boom")
        });
        assert_eq!(code, PC_PANIC);
        assert!(last_message().contains("boom"), "{}", last_message());
    }

    /// The negative control: with the catch switched off, the same panic crosses the boundary
    /// (here it reaches this test's own catch instead of becoming a code).
    #[test]
    fn without_the_catch_the_panic_escapes() {
        CATCH_PANICS.with(|c| c.set(false));
        let escaped = std::panic::catch_unwind(|| {
            boundary(std::ptr::null_mut(), || -> Result<(), Error> {
                panic!("boom")
            })
        });
        CATCH_PANICS.with(|c| c.set(true));
        assert!(escaped.is_err(), "the panic must escape without the catch");
    }

    #[test]
    fn the_message_is_truncated_and_its_full_length_reported() {
        let code = boundary(std::ptr::null_mut(), || {
            Err(Error::InvalidArgument("x".repeat(100)))
        });
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
            assert!(opt_bytes(std::ptr::null(), 3, "start").is_err());
            assert_eq!(opt_bytes(std::ptr::null(), 0, "start").unwrap(), None);
        }
    }

    #[test]
    fn overlapping_outputs_are_refused() {
        let mut words = [0u64; 2];
        let base = words.as_mut_ptr();
        // SAFETY: pointers into a local array; nothing is written.
        let (a, b, c) = unsafe {
            (
                out_ptr(base, "a").unwrap(),
                out_ptr(base, "b").unwrap(),
                out_ptr(base.add(1), "c").unwrap(),
            )
        };
        assert!(distinct(&[("a", span(&a)), ("b", span(&b))]).is_err());
        assert!(distinct(&[("a", span(&a)), ("c", span(&c))]).is_ok());
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
