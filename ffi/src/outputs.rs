//! What state machine callbacks hand back to the library (SPEC E3): checkpoint bytes through
//! `pc_sink_write`, records through `pc_records_push`, a write's refusal through
//! `pc_records_refuse`, and the reason of any callback's refusal through `pc_refuse`. Nothing
//! is freed across allocators: the library copies what the callback passes.
//!
//! Owns: `pc_sink`, `pc_records` and those four functions.

use std::ffi::c_char;

use portcullis::Error;

use crate::boundary::{arg_mut, boundary, bytes, invalid, set_callback_reason, text};
use crate::error::pc_error;

/// Where `encode` writes a checkpoint: append bytes with `pc_sink_write`. Valid only during
/// the callback it is passed to.
pub struct pc_sink {
    buf: Vec<u8>,
}

impl pc_sink {
    pub(crate) fn new() -> Self {
        pc_sink { buf: Vec::new() }
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Where `repair` (and a write's decision) put records: append one record per
/// `pc_records_push`. A write's decision may instead refuse the command with
/// `pc_records_refuse`. Valid only during the callback it is passed to.
pub struct pc_records {
    pub(crate) records: Vec<Vec<u8>>,
    /// Whether `pc_records_refuse` may be called (a write's decision).
    pub(crate) may_refuse: bool,
    /// The reason the decision refused the command with, if it did.
    pub(crate) refusal: Option<String>,
}

impl pc_records {
    pub(crate) fn new() -> Self {
        pc_records {
            records: Vec::new(),
            may_refuse: false,
            refusal: None,
        }
    }

    /// The list a write's decision gets: it may refuse.
    pub(crate) fn for_decision() -> Self {
        pc_records {
            may_refuse: true,
            ..Self::new()
        }
    }
}

/// Appends `len` bytes to a checkpoint being encoded.
///
/// # Safety
/// `sink` is the sink passed to the running `encode`; `data` readable for `len` bytes.
/// Thread safety: only from the callback it was passed to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_sink_write(
    sink: *mut pc_sink,
    data: *const u8,
    len: usize,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (sink, data) = unsafe { (arg_mut(sink, "sink")?, bytes(data, len, "data")?) };
        sink.buf.extend_from_slice(data);
        Ok::<(), Error>(())
    })
}

/// Appends one record (a copy of `len` bytes) to the records a callback returns.
///
/// # Safety
/// `records` is the list passed to the running callback; `data` readable for `len` bytes.
/// Thread safety: only from the callback it was passed to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_records_push(
    records: *mut pc_records,
    data: *const u8,
    len: usize,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (records, data) =
            unsafe { (arg_mut(records, "records")?, bytes(data, len, "record")?) };
        records.records.push(data.to_vec());
        Ok::<(), Error>(())
    })
}

/// From a write's decision (`pc_engine_write`): refuses the command with `reason` (SPEC R12).
/// `pc_engine_write` then answers `PC_REFUSED` with a message that carries the reason, writes
/// nothing (records pushed are dropped) and the entity keeps serving. Returns `PC_OK`, or
/// `PC_INVALID_ARGUMENT` for a null or non-UTF-8 `reason` or when `records` was not passed to
/// a write's decision (a repair refuses by returning non-zero).
///
/// # Safety
/// `records` is the list passed to the running decision; `reason` a NUL-terminated string.
/// Thread safety: only from the callback it was passed to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_records_refuse(
    records: *mut pc_records,
    reason: *const c_char,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (records, reason) = unsafe { (arg_mut(records, "records")?, text(reason, "reason")?) };
        if !records.may_refuse {
            return Err(invalid(
                "records",
                "is not a write's decision output: only a decision refuses with a reason",
            ));
        }
        records.refusal = Some(reason.to_owned());
        Ok(())
    })
}

/// From inside a state machine callback, on the thread it runs on: gives the reason of the
/// refusal the callback is about to return (a non-zero code). The reason (copied) appears in
/// the error the refusal causes: the containment's reason, or the message of `PC_REFUSED` /
/// `PC_INVALID_ARGUMENT`. The last call wins. Answers `PC_INVALID_ARGUMENT` outside a callback
/// or for a null or non-UTF-8 `reason`.
///
/// # Safety
/// `reason` a NUL-terminated string. Thread safety: the callback's own thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_refuse(reason: *const c_char, err: *mut pc_error) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let reason = unsafe { text(reason, "reason") }?;
        set_callback_reason(reason)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boundary::callback;

    /// Only a write's decision refuses with a reason; a repair's list answers
    /// `PC_INVALID_ARGUMENT` and keeps no refusal.
    #[test]
    fn only_a_decision_refuses_with_a_reason() {
        let none = std::ptr::null_mut();
        let mut repair = pc_records::new();
        // SAFETY: a live list and a static NUL-terminated string.
        let code = unsafe { pc_records_refuse(&mut repair, c"no".as_ptr(), none) };
        assert_eq!((code, repair.refusal), (crate::PC_INVALID_ARGUMENT, None));
        let mut decision = pc_records::for_decision();
        // SAFETY: as above.
        let code = unsafe { pc_records_refuse(&mut decision, c"no".as_ptr(), none) };
        assert_eq!(
            (code, decision.refusal.as_deref()),
            (crate::PC_OK, Some("no"))
        );
    }

    /// `pc_refuse` works inside a callback, on its thread, and only there.
    #[test]
    fn a_reason_is_given_only_inside_a_callback() {
        let none = std::ptr::null_mut();
        // SAFETY: a static NUL-terminated string.
        let outside = unsafe { pc_refuse(c"why".as_ptr(), none) };
        assert_eq!(outside, crate::PC_INVALID_ARGUMENT);
        // SAFETY: as above.
        let (code, reason) = callback(|| unsafe { pc_refuse(c"because".as_ptr(), none) } + 7);
        assert_eq!((code, reason.as_deref()), (7, Some("because")));
    }
}
