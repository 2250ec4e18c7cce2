//! Epoch fencing and owners through C (SPEC F1, F4-F7, F9, F11): adopt and release a
//! namespace, read and bump its epoch, revoke a slice or to completion, mark the lease table
//! recovered.
//!
//! Owns: the fencing functions of `pc_engine` and `pc_revoke_progress`.

use std::ffi::c_char;
use std::time::Duration;

use portcullis::Error;
use portcullis::fence::{DriverLimits, RevokeBudget, RevokeProgress};

use crate::boundary::{Fail, boundary, out_ptr};
use crate::engine::{live, namespace, pc_engine};
use crate::error::pc_error;

/// What a revocation slice found (SPEC F5). This struct never grows.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_revoke_progress {
    /// True once no write planned under an older epoch can commit any more (SPEC F7).
    pub complete: bool,
    /// When not complete: a lower bound on the rows or hold-offs still in the way (>= 1).
    pub remaining: u64,
}

/// Adopts namespace `ns` (SPEC F11): from now on this engine's writes to it are fenced under
/// `*grant`, the epoch it adopted.
///
/// # Safety
/// `engine` live; `ns` NUL-terminated; `grant` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_own(
    engine: *const pc_engine,
    ns: *const c_char,
    grant: *mut u64,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let grant = unsafe { out_ptr(grant, "grant") }?;
        grant.set(live(engine)?.own(&namespace(ns)?)?);
        Ok::<(), Fail>(())
    })
}

/// Hands namespace `ns` over cleanly: this engine stops serving it, and the next owner runs
/// no unclean-restart repair for it.
///
/// # Safety
/// `engine` live; `ns` NUL-terminated. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_release_namespace(
    engine: *const pc_engine,
    ns: *const c_char,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        Ok::<(), Fail>(live(engine)?.release_namespace(&namespace(ns)?)?)
    })
}

/// The namespace's current epoch (0 if it was never bumped).
///
/// # Safety
/// `engine` live; `ns` NUL-terminated; `epoch` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_current_epoch(
    engine: *const pc_engine,
    ns: *const c_char,
    epoch: *mut u64,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let epoch = unsafe { out_ptr(epoch, "epoch") }?;
        epoch.set(live(engine)?.current_epoch(&namespace(ns)?)?);
        Ok::<(), Fail>(())
    })
}

/// Advances the namespace's epoch to `new_epoch` (SPEC F1): 1 to 1,024 above the current one.
/// Writes planned under older epochs stop committing once revocation completes.
///
/// # Safety
/// `engine` live; `ns` NUL-terminated. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_bump_epoch(
    engine: *const pc_engine,
    ns: *const c_char,
    new_epoch: u64,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        Ok::<(), Fail>(live(engine)?.bump_epoch(&namespace(ns)?, new_epoch)?)
    })
}

/// Runs one bounded revocation slice (SPEC F4) with a time budget of `budget_ms` (at least 1).
///
/// # Safety
/// `engine` live; `ns` NUL-terminated; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_revoke_step(
    engine: *const pc_engine,
    ns: *const c_char,
    budget_ms: u64,
    out: *mut pc_revoke_progress,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let budget = RevokeBudget::default().with_time_ms(budget_ms);
        out.set(match live(engine)?.revoke_step(&namespace(ns)?, budget)? {
            RevokeProgress::Complete => pc_revoke_progress {
                complete: true,
                remaining: 0,
            },
            RevokeProgress::Pending { remaining } => pc_revoke_progress {
                complete: false,
                remaining,
            },
        });
        Ok::<(), Fail>(())
    })
}

/// Revokes until complete (SPEC F9): slices run on the engine's pool while this waits, at
/// most `timeout_ms`; then the revocation is cancelled and `PC_UNAVAILABLE` answered. A frozen
/// clock with a recovery hold-off pending also ends in `PC_UNAVAILABLE` (SPEC F8). `*slices`
/// receives the slices run.
///
/// # Safety
/// `engine` live; `ns` NUL-terminated; `slices` writable. Any thread except a callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_revoke_to_completion(
    engine: *const pc_engine,
    ns: *const c_char,
    timeout_ms: u64,
    slices: *mut u64,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let slices = unsafe { out_ptr(slices, "slices") }?;
        let e = live(engine)?;
        let handle = e
            .fence()
            .revoke_in_background(&namespace(ns)?, DriverLimits::default());
        let report = match handle.wait(Duration::from_millis(timeout_ms)) {
            Some(report) => report?,
            None => {
                handle.cancel();
                return Err(Fail::from(Error::Unavailable {
                    reason: format!(
                        "revocation did not complete within {timeout_ms} ms and was cancelled"
                    ),
                    retry_after_ms: timeout_ms.max(1),
                }));
            }
        };
        if !report.complete {
            return Err(Fail::from(Error::Unavailable {
                reason: "revocation was cancelled before it completed".to_owned(),
                retry_after_ms: 1,
            }));
        }
        slices.set(report.slices);
        Ok::<(), Fail>(())
    })
}

/// Declares that the namespace's lease table was restored or rebuilt (SPEC F6): revocation
/// cannot complete until a full lease plus margin has passed on the clock.
///
/// # Safety
/// `engine` live; `ns` NUL-terminated. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_mark_recovered(
    engine: *const pc_engine,
    ns: *const c_char,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        Ok::<(), Fail>(live(engine)?.mark_lease_table_recovered(&namespace(ns)?)?)
    })
}
