//! The store through C (SPEC S1, S2): open a file or memory store, point reads, scans with a
//! cursor, and guarded batches; plus the manual clock tests inject (SPEC E4).
//!
//! Owns: the `pc_store`, `pc_scan_page` and `pc_clock` handles (batches are built in
//! [`crate::batch`]). A store handle
//! records the process generation it was opened in: a forked child never uses it
//! ([`crate::fork`]).

use std::ffi::c_char;
use std::ops::Bound;
use std::sync::Arc;

use portcullis::store::{
    Cursor, FileStore, KeyRange, MemoryStore, Outcome, Partition, ScanPage, Store, SyncPolicy,
};
use portcullis::{Error, ManualClock, SharedClock};

use crate::batch::pc_batch;
use crate::boundary::{
    Fail, arg, boundary, boundary_void, bytes, distinct, invalid, opt_bytes, out_ptr, pc_bytes,
    span, text,
};
use crate::error::pc_error;

/// A sync policy (`pc_store_open_file`, `pc_engine_options_sync_policy`).
pub type pc_sync_policy = u32;
/// Sync policy: a commit returns once it is on stable storage (the default, SPEC S3).
pub const PC_SYNC_EVERY_COMMIT: pc_sync_policy = 0x0101;
/// Sync policy: synced every `interval_ms`; a machine crash may lose that much.
pub const PC_SYNC_PERIODIC_MAY_LOSE_RECENT: pc_sync_policy = 0x0102;
/// Sync policy: synced only at close and snapshots; a machine crash may lose anything since.
pub const PC_SYNC_NEVER_MAY_LOSE_RECENT: pc_sync_policy = 0x0103;

/// What became of a batch (`pc_outcome.kind`).
pub type pc_outcome_kind = u32;
/// Outcome kind: the batch committed.
pub const PC_OUTCOME_COMMITTED: pc_outcome_kind = 0x0401;
/// Outcome kind: the precondition at `index` did not hold; nothing changed.
pub const PC_OUTCOME_PRECONDITION_FAILED: pc_outcome_kind = 0x0402;
/// Outcome kind: a `not_after` deadline had passed at `now_ms`; nothing changed.
pub const PC_OUTCOME_DEADLINE_PASSED: pc_outcome_kind = 0x0403;

/// A manual clock (SPEC E4): time moves only when told, so time-dependent rules are tested
/// without sleeping. Share it with a store or an engine; free it with `pc_clock_free` (they
/// keep their own reference).
pub struct pc_clock {
    clock: Arc<ManualClock>,
}

impl pc_clock {
    pub(crate) fn shared(&self) -> SharedClock {
        self.clock.clone()
    }
}

/// An open store: a handle any number of threads may share.
pub struct pc_store {
    pub(crate) store: Arc<dyn Store>,
    /// The process generation it was opened in.
    pub(crate) generation: u64,
}

impl pc_store {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        pc_store {
            store,
            generation: crate::fork::generation(),
        }
    }
}

/// Borrows a live store handle of this process (one opened before a fork answers `PC_CLOSED`).
///
/// # Safety
/// `s` null or live.
pub(crate) unsafe fn live<'a>(s: *const pc_store) -> Result<&'a pc_store, Fail> {
    // SAFETY: the caller's contract.
    let store = unsafe { arg(s, "store") }?;
    crate::fork::check(store.generation, "store")?;
    Ok(store)
}

/// One page of a scan: entries in key order and where the next page starts.
pub struct pc_scan_page {
    page: ScanPage,
}

/// What became of a batch. This struct never grows.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_outcome {
    /// `PC_OUTCOME_COMMITTED`, `PC_OUTCOME_PRECONDITION_FAILED` or `PC_OUTCOME_DEADLINE_PASSED`.
    pub kind: pc_outcome_kind,
    /// For a failed precondition: its index, in the order the preconditions were added.
    pub index: u64,
    /// For a passed deadline: the store's clock when the batch was refused.
    pub now_ms: u64,
}

fn policy(kind: pc_sync_policy, interval_ms: u64) -> Result<SyncPolicy, Error> {
    match kind {
        PC_SYNC_EVERY_COMMIT => Ok(SyncPolicy::SyncEveryCommit),
        PC_SYNC_PERIODIC_MAY_LOSE_RECENT => Ok(SyncPolicy::PeriodicMayLoseRecent { interval_ms }),
        PC_SYNC_NEVER_MAY_LOSE_RECENT => Ok(SyncPolicy::NeverSyncMayLoseRecent),
        other => Err(invalid(
            "sync_policy",
            &format!(
                "{other:#x} is not a PC_SYNC_* value ({})",
                crate::family_of(other)
            ),
        )),
    }
}

pub(crate) fn sync_policy(kind: pc_sync_policy, interval_ms: u64) -> Result<SyncPolicy, Error> {
    policy(kind, interval_ms)
}

fn partition(ptr: *const u8, len: usize) -> Result<Partition, Error> {
    // SAFETY: forwarded from the exported function's contract.
    Partition::new(unsafe { bytes(ptr, len, "partition") }?)
}

/// Creates a manual clock reading `now_ms`.
///
/// # Safety
/// `out` is null or writable. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_clock_new_manual(
    now_ms: u64,
    out: *mut *mut pc_clock,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let clock = Arc::new(ManualClock::new(now_ms));
        out.set(Box::into_raw(Box::new(pc_clock { clock })));
        Ok::<(), Error>(())
    })
}

/// Moves a manual clock forward by `ms`.
///
/// # Safety
/// `clock` is null or a live clock. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_clock_advance(
    clock: *const pc_clock,
    ms: u64,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        unsafe { arg(clock, "clock") }?.clock.advance(ms);
        Ok::<(), Error>(())
    })
}

/// Frees a clock handle (stores and engines using it keep it alive). Null is a no-op.
///
/// # Safety
/// `clock` is null or a clock from `pc_clock_new_manual`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_clock_free(clock: *mut pc_clock) {
    boundary_void(|| {
        if !clock.is_null() {
            // SAFETY: a handle from `Box::into_raw`, freed once by the caller's contract.
            drop(unsafe { Box::from_raw(clock) });
        }
    });
}

/// Opens (creating if missing) the file store in directory `dir` with a sync policy
/// (`PC_SYNC_*`; `interval_ms` is used by the periodic policy) and an optional manual clock
/// (null: the system clock). A second open of the same directory answers `PC_LOCKED`.
///
/// # Safety
/// `dir` is a NUL-terminated path, `clock` null or live, `out` writable.
/// Thread safety: any thread; the store handle it returns may be shared by all threads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_open_file(
    dir: *const c_char,
    sync_policy: pc_sync_policy,
    interval_ms: u64,
    clock: *const pc_clock,
    out: *mut *mut pc_store,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract, for every argument.
        let (dir, out) = unsafe { (text(dir, "dir")?, out_ptr(out, "out")?) };
        let mut builder = FileStore::builder(dir).sync_policy(policy(sync_policy, interval_ms)?);
        // SAFETY: null or a live clock.
        if let Some(clock) = unsafe { clock.as_ref() } {
            builder = builder.clock(clock.shared());
        }
        let store: Arc<dyn Store> = Arc::new(builder.open()?);
        out.set(Box::into_raw(Box::new(pc_store::new(store))));
        Ok::<(), Error>(())
    })
}

/// Opens an empty in-memory store (for tests), on a manual clock or (null) the system clock.
///
/// # Safety
/// `clock` null or live, `out` writable. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_open_memory(
    clock: *const pc_clock,
    out: *mut *mut pc_store,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        // SAFETY: null or a live clock.
        let store = match unsafe { clock.as_ref() } {
            Some(clock) => MemoryStore::with_clock(clock.shared()),
            None => MemoryStore::new(),
        };
        out.set(Box::into_raw(Box::new(pc_store::new(Arc::new(store)))));
        Ok::<(), Error>(())
    })
}

/// Reads `key` of `partition`. When the key holds a value, `*found` is true and `*value`
/// receives a copy (free it with `pc_bytes_free`); otherwise `*found` is false and `*value`
/// is `{NULL, 0}`.
///
/// # Safety
/// Buffers as documented in the header's conventions; `store` live; out-pointers writable.
/// Thread safety: any thread, concurrently with other calls on the store.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_get(
    store: *const pc_store,
    partition_ptr: *const u8,
    partition_len: usize,
    key: *const u8,
    key_len: usize,
    value: *mut pc_bytes,
    found: *mut bool,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract, for every argument.
        let (store, key, value, found) = unsafe {
            (
                live(store)?,
                bytes(key, key_len, "key")?,
                out_ptr(value, "value")?,
                out_ptr(found, "found")?,
            )
        };
        distinct(&[("value", span(&value)), ("found", span(&found))])?;
        let p = partition(partition_ptr, partition_len)?;
        let got = store.store.get(&p, key)?;
        found.set(got.is_some());
        value.set(pc_bytes::from_vec(got.unwrap_or_default()));
        Ok::<(), Fail>(())
    })
}

/// Scans `partition` for keys `start <= k < end` (`NULL, 0` for `start` or `end`: unbounded),
/// at most `limit` (at least 1) entries, resuming strictly after `cursor` (`NULL, 0`: from the
/// start of the range). A null pointer with a non-zero length is refused. The page is freed
/// with `pc_scan_page_free`.
///
/// # Safety
/// Buffers as documented; `store` live; `out` writable. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_scan(
    store: *const pc_store,
    partition_ptr: *const u8,
    partition_len: usize,
    start: *const u8,
    start_len: usize,
    end: *const u8,
    end_len: usize,
    cursor: *const u8,
    cursor_len: usize,
    limit: usize,
    out: *mut *mut pc_scan_page,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract, for every argument.
        let (store, start, end, cursor, out) = unsafe {
            (
                live(store)?,
                opt_bytes(start, start_len, "start")?,
                opt_bytes(end, end_len, "end")?,
                opt_bytes(cursor, cursor_len, "cursor")?,
                out_ptr(out, "out")?,
            )
        };
        let p = partition(partition_ptr, partition_len)?;
        let range = KeyRange {
            start: start.map_or(Bound::Unbounded, |s| Bound::Included(s.to_vec())),
            end: end.map_or(Bound::Unbounded, |e| Bound::Excluded(e.to_vec())),
        };
        let cursor = cursor.map(|c| Cursor::after_key(c.to_vec()));
        let page = store.store.scan(&p, &range, cursor.as_ref(), limit)?;
        out.set(Box::into_raw(Box::new(pc_scan_page { page })));
        Ok::<(), Fail>(())
    })
}

/// How many entries the page holds (0 for a null page).
///
/// # Safety
/// `page` is null or live. Thread safety: one thread at a time per page.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_scan_page_len(page: *const pc_scan_page) -> usize {
    // SAFETY: null or a live page.
    unsafe { page.as_ref() }.map_or(0, |p| p.page.entries.len())
}

/// Borrows entry `index` of the page: pointers into the page, valid until it is freed.
/// An index past the end answers `PC_INVALID_ARGUMENT`.
///
/// # Safety
/// `page` live; out-pointers writable. Thread safety: one thread at a time per page.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_scan_page_entry(
    page: *const pc_scan_page,
    index: usize,
    key: *mut *const u8,
    key_len: *mut usize,
    value: *mut *const u8,
    value_len: *mut usize,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract, for every argument.
        let (page, key, key_len, value, value_len) = unsafe {
            (
                arg(page, "page")?,
                out_ptr(key, "key")?,
                out_ptr(key_len, "key_len")?,
                out_ptr(value, "value")?,
                out_ptr(value_len, "value_len")?,
            )
        };
        distinct(&[
            ("key", span(&key)),
            ("key_len", span(&key_len)),
            ("value", span(&value)),
            ("value_len", span(&value_len)),
        ])?;
        let (k, v) = page.page.entries.get(index).ok_or_else(|| {
            invalid(
                "index",
                &format!(
                    "{index} is past the page's {} entries",
                    page.page.entries.len()
                ),
            )
        })?;
        key.set(k.as_ptr());
        key_len.set(k.len());
        value.set(v.as_ptr());
        value_len.set(v.len());
        Ok::<(), Error>(())
    })
}

/// Where the next page starts: `*more` is false at the end of the range; otherwise
/// `*cursor`/`*cursor_len` borrow the cursor (valid until the page is freed) to pass to the
/// next `pc_store_scan`.
///
/// # Safety
/// `page` live; out-pointers writable. Thread safety: one thread at a time per page.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_scan_page_next(
    page: *const pc_scan_page,
    more: *mut bool,
    cursor: *mut *const u8,
    cursor_len: *mut usize,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract, for every argument.
        let (page, more, cursor, cursor_len) = unsafe {
            (
                arg(page, "page")?,
                out_ptr(more, "more")?,
                out_ptr(cursor, "cursor")?,
                out_ptr(cursor_len, "cursor_len")?,
            )
        };
        distinct(&[
            ("more", span(&more)),
            ("cursor", span(&cursor)),
            ("cursor_len", span(&cursor_len)),
        ])?;
        let next = page.page.next.as_ref().map(|c| c.last_key());
        more.set(next.is_some());
        let (ptr, len) = next.map_or((std::ptr::null(), 0), |k| (k.as_ptr(), k.len()));
        cursor.set(ptr);
        cursor_len.set(len);
        Ok::<(), Error>(())
    })
}

/// Frees a scan page. Null is a no-op.
///
/// # Safety
/// `page` null or from `pc_store_scan`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_scan_page_free(page: *mut pc_scan_page) {
    boundary_void(|| {
        if !page.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(page) });
        }
    });
}

/// Applies `batch` to `partition` atomically (SPEC S2); under the default sync policy the
/// commit is durable when this returns. The batch is not consumed: apply it again or free it.
/// Oversize keys, values or batches answer `PC_TOO_LARGE` and change nothing.
///
/// # Safety
/// `store` and `batch` live, `out` writable. Thread safety: any thread, concurrently with
/// other calls on the store (the batch itself: one thread at a time).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_apply(
    store: *const pc_store,
    partition_ptr: *const u8,
    partition_len: usize,
    batch: *const pc_batch,
    out: *mut pc_outcome,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract, for every argument.
        let (store, batch, out) =
            unsafe { (live(store)?, arg(batch, "batch")?, out_ptr(out, "out")?) };
        let p = partition(partition_ptr, partition_len)?;
        out.set(match store.store.apply(&p, &batch.batch)? {
            Outcome::Committed => pc_outcome {
                kind: PC_OUTCOME_COMMITTED,
                index: 0,
                now_ms: 0,
            },
            Outcome::PreconditionFailed { index } => pc_outcome {
                kind: PC_OUTCOME_PRECONDITION_FAILED,
                index: index as u64,
                now_ms: 0,
            },
            Outcome::DeadlinePassed { now_ms } => pc_outcome {
                kind: PC_OUTCOME_DEADLINE_PASSED,
                index: 0,
                now_ms,
            },
        });
        Ok::<(), Fail>(())
    })
}

/// Closes the store: everything committed is made durable and the directory is unlocked.
/// Later calls answer `PC_CLOSED`; closing again is harmless. Engines opened over this store
/// stop working: close them first.
///
/// # Safety
/// `store` live. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_close(store: *const pc_store, err: *mut pc_error) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        Ok::<(), Fail>(unsafe { live(store) }?.store.close()?)
    })
}

/// Frees a store handle. The store stays open while an engine opened over it lives; when this
/// was the last user, it is closed (errors are logged). In a forked child it is only
/// forgotten: nothing is closed or written. Null is a no-op.
///
/// # Safety
/// `store` null or from `pc_store_open_*`, not used afterwards, and no call on it is running.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_free(store: *mut pc_store) {
    boundary_void(|| {
        if store.is_null() {
            return;
        }
        // SAFETY: from `Box::into_raw`, freed once.
        let handle = unsafe { Box::from_raw(store) };
        if crate::fork::ours(handle.generation) {
            drop(handle);
        } else {
            std::mem::forget(handle);
        }
    });
}
