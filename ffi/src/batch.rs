//! Guarded batches through C (SPEC S2): preconditions and operations on one partition, built
//! one call at a time and applied with `pc_store_apply`.
//!
//! Owns: the `pc_batch` handle.

use portcullis::Error;
use portcullis::store::{Batch, KeyRange};

use crate::boundary::{arg_mut, boundary, boundary_void, bytes, out_ptr};
use crate::error::pc_error;

/// A guarded batch being built: preconditions and operations on one partition (SPEC S2).
/// One thread at a time.
pub struct pc_batch {
    pub(crate) batch: Batch,
}

/// Creates an empty batch.
///
/// # Safety
/// `out` writable. Thread safety: any thread; the batch is then one thread's at a time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_new(out: *mut *mut pc_batch, err: *mut pc_error) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        out.set(Box::into_raw(Box::new(pc_batch {
            batch: Batch::new(),
        })));
        Ok::<(), Error>(())
    })
}

/// A precondition or operation added to a batch. `a`/`b` are its byte arguments.
#[derive(Clone, Copy)]
enum Step {
    Equals,
    Absent,
    Present,
    Put,
    Delete,
    DeleteRange,
}

unsafe fn add(
    batch: *mut pc_batch,
    step: Step,
    a: (*const u8, usize),
    b: (*const u8, usize),
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the exported functions' contract, for every argument.
        let (batch, a_bytes) = unsafe { (arg_mut(batch, "batch")?, bytes(a.0, a.1, "key")?) };
        // SAFETY: as above; `b` is (null, 0) for steps that take one argument.
        let b_bytes = unsafe { bytes(b.0, b.1, "value")? };
        let (a, b) = (a_bytes.to_vec(), b_bytes.to_vec());
        let old = std::mem::take(&mut batch.batch);
        batch.batch = match step {
            Step::Equals => old.equals(a, b),
            Step::Absent => old.absent(a),
            Step::Present => old.present(a),
            Step::Put => old.put(a, b),
            Step::Delete => old.delete(a),
            Step::DeleteRange => old.delete_range(KeyRange::between(a, b)),
        };
        Ok::<(), Error>(())
    })
}

const NONE: (*const u8, usize) = (std::ptr::null(), 0);

/// Adds a precondition: `key` holds exactly `value`. Sizes are checked when the batch is
/// applied.
///
/// # Safety
/// `batch` live, buffers as documented. Threads: one at a time per batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_equals(
    batch: *mut pc_batch,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    err: *mut pc_error,
) -> u32 {
    // SAFETY: forwarded.
    unsafe { add(batch, Step::Equals, (key, key_len), (value, value_len), err) }
}

/// Adds a precondition: `key` holds no value.
///
/// # Safety
/// `batch` live, buffers as documented. Threads: one at a time per batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_absent(
    batch: *mut pc_batch,
    key: *const u8,
    key_len: usize,
    err: *mut pc_error,
) -> u32 {
    // SAFETY: forwarded.
    unsafe { add(batch, Step::Absent, (key, key_len), NONE, err) }
}

/// Adds a precondition: `key` holds some value.
///
/// # Safety
/// `batch` live, buffers as documented. Threads: one at a time per batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_present(
    batch: *mut pc_batch,
    key: *const u8,
    key_len: usize,
    err: *mut pc_error,
) -> u32 {
    // SAFETY: forwarded.
    unsafe { add(batch, Step::Present, (key, key_len), NONE, err) }
}

/// Adds a precondition: the store's clock reads at most `deadline_ms` when the batch commits.
///
/// # Safety
/// `batch` live. Threads: one at a time per batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_not_after(
    batch: *mut pc_batch,
    deadline_ms: u64,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let batch = unsafe { arg_mut(batch, "batch") }?;
        batch.batch = std::mem::take(&mut batch.batch).not_after(deadline_ms);
        Ok::<(), Error>(())
    })
}

/// Adds an operation: put `value` at `key`.
///
/// # Safety
/// `batch` live, buffers as documented. Threads: one at a time per batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_put(
    batch: *mut pc_batch,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    err: *mut pc_error,
) -> u32 {
    // SAFETY: forwarded.
    unsafe { add(batch, Step::Put, (key, key_len), (value, value_len), err) }
}

/// Adds an operation: delete `key`.
///
/// # Safety
/// `batch` live, buffers as documented. Threads: one at a time per batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_delete(
    batch: *mut pc_batch,
    key: *const u8,
    key_len: usize,
    err: *mut pc_error,
) -> u32 {
    // SAFETY: forwarded.
    unsafe { add(batch, Step::Delete, (key, key_len), NONE, err) }
}

/// Adds an operation: delete every key `start <= k < end`.
///
/// # Safety
/// `batch` live, buffers as documented. Threads: one at a time per batch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_delete_range(
    batch: *mut pc_batch,
    start: *const u8,
    start_len: usize,
    end: *const u8,
    end_len: usize,
    err: *mut pc_error,
) -> u32 {
    // SAFETY: forwarded.
    unsafe {
        add(
            batch,
            Step::DeleteRange,
            (start, start_len),
            (end, end_len),
            err,
        )
    }
}

/// Frees a batch. Null is a no-op.
///
/// # Safety
/// `batch` null or from `pc_batch_new`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_batch_free(batch: *mut pc_batch) {
    boundary_void(|| {
        if !batch.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(batch) });
        }
    });
}
