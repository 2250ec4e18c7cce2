//! The background warm through C (SPEC R6): start it, read its progress, wait for it, stop it.
//!
//! Owns: the `pc_warm` handle and `pc_warm_progress`. A `pc_warm` holds its engine only
//! weakly: freeing the engine frees the machine and every state even while warm handles are
//! alive, and those then answer from what they knew and call nothing.

use std::time::Duration;

use portcullis::restore::{Warm, WarmProgress};

use crate::boundary::{Fail, arg, boundary, boundary_void, invalid, out_ptr};
use crate::engine::{live, pc_engine};
use crate::error::pc_error;

/// A running (or finished) warm: wait for it, stop it, read its progress. Any thread.
pub struct pc_warm {
    warm: Warm,
    generation: u64,
}

/// Where a warm stands (SPEC R6). Set `struct_size = sizeof(pc_warm_progress)` before the
/// call: the library writes only that many bytes, so fields added at the end leave compiled
/// callers working.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_warm_progress {
    /// `sizeof(pc_warm_progress)` as the caller compiled it (left unchanged).
    pub struct_size: usize,
    /// Entities restored (or found refused) so far.
    pub done: u64,
    /// Entities the warm set out to restore.
    pub total: u64,
    /// Entities whose restore was refused (contained).
    pub refused: u64,
    /// Milliseconds since the warm started (until it finished).
    pub elapsed_ms: u64,
    /// Whether it ended.
    pub finished: bool,
    /// Whether it was stopped before the end.
    pub stopped: bool,
}

/// Borrows a warm handle of this process.
fn handle_of<'a>(w: *const pc_warm) -> Result<&'a Warm, Fail> {
    // SAFETY: every function's contract: `warm` null or live.
    let handle = unsafe { arg(w, "warm") }?;
    crate::fork::check(handle.generation, "warm")?;
    Ok(&handle.warm)
}

/// Writes `value` into a caller's struct that announces its size in its first field: at most
/// that many bytes, the size field left as the caller set it.
///
/// # Safety
/// `out` is writable for the `usize` it starts with, and for the size that holds.
pub(crate) unsafe fn write_sized<T>(out: *mut T, value: &T, what: &str) -> Result<(), Fail> {
    if out.is_null() {
        return Err(invalid(what, "is a null out-pointer").into());
    }
    // SAFETY: the caller promises the size field is readable.
    let size = unsafe { out.cast::<usize>().read_unaligned() };
    let head = std::mem::size_of::<usize>();
    if size <= head {
        return Err(invalid(
            what,
            &format!("has struct_size {size}: set it to sizeof the struct before the call"),
        )
        .into());
    }
    let n = size.min(std::mem::size_of::<T>());
    let src = std::ptr::from_ref(value).cast::<u8>();
    // SAFETY: `n` bytes past the size field fit both `value` and the caller's struct.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(head), out.cast::<u8>().add(head), n - head);
    }
    Ok(())
}

/// Starts (or joins) a background warm that restores every pending entity on the pool
/// (SPEC R6). Free the handle with `pc_warm_free` (that does not stop the warm).
///
/// # Safety
/// `engine` live; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_warm(
    engine: *const pc_engine,
    out: *mut *mut pc_warm,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let warm = live(engine)?.warm()?;
        out.set(Box::into_raw(Box::new(pc_warm {
            warm,
            generation: crate::fork::generation(),
        })));
        Ok::<(), Fail>(())
    })
}

fn progress(p: WarmProgress, struct_size: usize) -> pc_warm_progress {
    pc_warm_progress {
        struct_size,
        done: p.done,
        total: p.total,
        refused: p.refused,
        elapsed_ms: u64::try_from(p.elapsed.as_millis()).unwrap_or(u64::MAX),
        finished: p.finished,
        stopped: p.stopped,
    }
}

/// Where the warm stands now (also after its engine was freed).
///
/// # Safety
/// `warm` live; `out` writable for its `struct_size`. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_get_progress(
    warm: *const pc_warm,
    out: *mut pc_warm_progress,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        let p = progress(handle_of(warm)?.progress(), 0);
        // SAFETY: the caller's contract.
        unsafe { write_sized(out, &p, "out") }
    })
}

/// Waits until the warm ends, at most `timeout_ms`; `*finished` says whether it did. From a
/// state machine callback or a write's decision (the warm may be waiting for it) it answers
/// `PC_WOULD_DEADLOCK` at once.
///
/// # Safety
/// `warm` live; `finished` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_wait(
    warm: *const pc_warm,
    timeout_ms: u64,
    finished: *mut bool,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let finished = unsafe { out_ptr(finished, "finished") }?;
        // The library's bounded wait (through its clock), not a condvar's.
        let waited = Warm::wait_for(handle_of(warm)?, Duration::from_millis(timeout_ms))?;
        finished.set(waited);
        Ok::<(), Fail>(())
    })
}

/// Asks the warm to stop after the restores it is running.
///
/// # Safety
/// `warm` live. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_stop(warm: *const pc_warm, err: *mut pc_error) -> u32 {
    boundary(err, || {
        handle_of(warm)?.stop();
        Ok::<(), Fail>(())
    })
}

/// Frees a warm handle (the warm itself runs on). In a forked child it is only forgotten.
/// Null is a no-op.
///
/// # Safety
/// `warm` null or from `pc_engine_warm`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_free(warm: *mut pc_warm) {
    boundary_void(|| {
        if warm.is_null() {
            return;
        }
        // SAFETY: from `Box::into_raw`, freed once.
        let handle = unsafe { Box::from_raw(warm) };
        if crate::fork::ours(handle.generation) {
            drop(handle);
        } else {
            std::mem::forget(handle);
        }
    });
}
