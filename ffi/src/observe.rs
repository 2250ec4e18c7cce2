//! Observability through C (SPEC E8): a listener for the events of an engine or a file store,
//! the store's stats, and why an engine or a store is degraded. The engine's stats are in
//! [`crate::stats`].
//!
//! Owns: `pc_event`, `pc_event_fn`, the `PC_EVENT_*` and `PC_DEGRADED_*` families,
//! `pc_store_stats`, `pc_engine_options_listener`, `pc_store_open_file_listened`,
//! `pc_store_get_stats`, `pc_engine_degraded` and `pc_store_degraded`.

use std::ffi::{CString, c_char, c_void};
use std::sync::Arc;

use portcullis::Error;
use portcullis::observe::{Degraded, Event, Listener};
use portcullis::store::{FileStore, Store, StoreStats};

use crate::boundary::{Fail, arg_mut, boundary, out_ptr, pc_bytes, text};
use crate::error::pc_error;
use crate::options::pc_engine_options;
use crate::store::{pc_clock, pc_store, pc_sync_policy, sync_policy};
use crate::warm::write_sized;

/// What an event is (`pc_event.kind`): the same numbers as `portcullis::observe::Event::code`.
pub type pc_event_kind = u32;
/// Event: a commit's sync or gather took longer than the stall threshold (`elapsed_us`).
pub const PC_EVENT_COMMIT_STALL: pc_event_kind = 0x0901;
/// Event: a journal write or sync failed; commits are refused until the store is reopened.
pub const PC_EVENT_SYNC_FAILED: pc_event_kind = 0x0902;
/// Event: a compaction took its victims.
pub const PC_EVENT_COMPACTION_STARTED: pc_event_kind = 0x0903;
/// Event: a compaction finished (`elapsed_us`).
pub const PC_EVENT_COMPACTION_FINISHED: pc_event_kind = 0x0904;
/// Event: a compaction failed; its segments stay due.
pub const PC_EVENT_COMPACTION_FAILED: pc_event_kind = 0x0905;
/// Event: open truncated a torn tail.
pub const PC_EVENT_TORN_TAIL: pc_event_kind = 0x0906;
/// Event: open found damage; what it could hold is refused.
pub const PC_EVENT_DAMAGED: pc_event_kind = 0x0907;
/// Event: open rebuilt the heads by scanning the whole journal.
pub const PC_EVENT_REBUILT: pc_event_kind = 0x0908;
/// Event: a background heads snapshot failed.
pub const PC_EVENT_SNAPSHOT_FAILED: pc_event_kind = 0x0909;
/// Event: a damaged snapshot page stopped heads snapshots until the store is reopened.
pub const PC_EVENT_SNAPSHOTS_STOPPED: pc_event_kind = 0x090A;
/// Event: a background thread ended without being asked to (`subject` names it).
pub const PC_EVENT_BACKGROUND_THREAD_ENDED: pc_event_kind = 0x090B;
/// Event: the state machine refused a write (`subject`: the entity).
pub const PC_EVENT_REFUSED: pc_event_kind = 0x090C;
/// Event: a deferred record was refused and set aside (`subject`: the entity).
pub const PC_EVENT_DEFERRAL_REFUSED: pc_event_kind = 0x090D;
/// Event: an entity was contained (`subject`: the entity).
pub const PC_EVENT_CONTAINED: pc_event_kind = 0x090E;
/// Event: a warm finished or was stopped.
pub const PC_EVENT_WARM_FINISHED: pc_event_kind = 0x090F;
/// Event: the warm failed to restore an entity (`subject`: the entity).
pub const PC_EVENT_WARM_FAILED: pc_event_kind = 0x0910;
/// Event: this engine bumped a namespace's epoch (`subject`, `epoch`).
pub const PC_EVENT_REVOCATION_STARTED: pc_event_kind = 0x0911;
/// Event: revocation of a namespace completed at an epoch (`subject`, `epoch`).
pub const PC_EVENT_REVOCATION_COMPLETED: pc_event_kind = 0x0912;
/// Event: this engine took a namespace over (`subject`, `epoch`: its grant).
pub const PC_EVENT_TOOK_OVER: pc_event_kind = 0x0913;
/// Event: this engine no longer holds a namespace (`subject`, `epoch`: the epoch now).
pub const PC_EVENT_DEPOSED: pc_event_kind = 0x0914;
/// Event: a pass of the expired-lease sweeper ended.
pub const PC_EVENT_SWEPT: pc_event_kind = 0x0915;
/// Event: a renewal of the owner lease failed.
pub const PC_EVENT_RENEWAL_FAILED: pc_event_kind = 0x0916;

/// Why an engine or a store is degraded (`pc_engine_stats.degraded`, `pc_store_stats.degraded`;
/// 0 when healthy): the same numbers as `portcullis::observe::DegradedCause::code`.
pub type pc_degraded_cause = u32;
/// Degraded: a journal write or sync failed; every commit is refused until reopened.
pub const PC_DEGRADED_SYNC_FAILED: pc_degraded_cause = 0x0A01;
/// Degraded: a background thread ended without being asked to.
pub const PC_DEGRADED_BACKGROUND_THREAD_ENDED: pc_degraded_cause = 0x0A02;
/// Degraded: a damaged snapshot page stopped heads snapshots.
pub const PC_DEGRADED_SNAPSHOTS_STOPPED: pc_degraded_cause = 0x0A03;
/// Degraded: the most recent background heads snapshot failed.
pub const PC_DEGRADED_SNAPSHOT_FAILED: pc_degraded_cause = 0x0A04;
/// Degraded: the most recent compaction failed.
pub const PC_DEGRADED_COMPACTION_FAILED: pc_degraded_cause = 0x0A05;
/// Degraded: the most recent renewal of the owner lease failed.
pub const PC_DEGRADED_OWNER_LEASE_NOT_RENEWED: pc_degraded_cause = 0x0A06;

/// One event, lent to the listener for the call (every pointer is valid only until it
/// returns). `struct_size` is `sizeof(pc_event)` as the library built it: fields are added only
/// at the end, so read a field only if it lies within `struct_size`.
#[repr(C)]
#[derive(Debug)]
pub struct pc_event {
    /// `sizeof(pc_event)` as the library built it.
    pub struct_size: usize,
    /// `PC_EVENT_*`.
    pub kind: pc_event_kind,
    /// The kind's name (`"commit_stall"` ...), NUL-terminated.
    pub name: *const c_char,
    /// What it is about (an entity, a namespace, a segment, a thread), or `""`.
    pub subject: *const c_char,
    /// One line for a log or an alert.
    pub message: *const c_char,
    /// For a stall or a finished compaction: how long it took, in microseconds; else 0.
    pub elapsed_us: u64,
    /// For a revocation, a take-over or a deposition: the epoch; else 0.
    pub epoch: u64,
}

/// Receives one event (SPEC E8). Called with no lock of the library held, on the thread that
/// did the work or the next call's thread, one event at a time per engine or store; it may
/// call `pc_*` functions on the engine or store (except `pc_engine_close`, which answers
/// `PC_WOULD_DEADLOCK` from here, and the `pc_*_free` functions). Keep it quick.
pub type pc_event_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const pc_event)>;

/// A C listener: the callback and its user data (called from any thread, as documented).
struct CListener {
    call: unsafe extern "C" fn(*mut c_void, *const pc_event),
    user_data: usize,
}

fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

impl Listener for CListener {
    fn on_event(&self, event: &Event) {
        let name = c_text(event.name());
        let subject = c_text(&event.subject().unwrap_or_default());
        let message = c_text(&event.to_string());
        let (elapsed_us, epoch) = match event {
            Event::CommitStall { elapsed, .. } | Event::CompactionFinished { elapsed, .. } => {
                (u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX), 0)
            }
            Event::RevocationStarted { epoch, .. }
            | Event::RevocationCompleted { epoch, .. }
            | Event::TookOver { epoch, .. }
            | Event::Deposed { epoch, .. } => (0, *epoch),
            _ => (0, 0),
        };
        let c = pc_event {
            struct_size: std::mem::size_of::<pc_event>(),
            kind: event.code(),
            name: name.as_ptr(),
            subject: subject.as_ptr(),
            message: message.as_ptr(),
            elapsed_us,
            epoch,
        };
        // SAFETY: the caller's callback with its user data and an event valid for the call.
        unsafe { (self.call)(self.user_data as *mut c_void, &c) };
    }
}

fn listener(callback: pc_event_fn, user_data: *mut c_void) -> Option<Arc<dyn Listener>> {
    callback.map(|call| {
        Arc::new(CListener {
            call,
            user_data: user_data as usize,
        }) as Arc<dyn Listener>
    })
}

/// Tells `callback` (with `user_data`) the events of the engine these options open, and of the
/// file store it opens from a directory (SPEC E8). Null stops telling. `user_data` must stay
/// valid until `pc_engine_free` of every engine opened with these options has returned.
///
/// # Safety
/// `options` live; `callback` null or callable from any thread as documented at `pc_event_fn`.
/// One thread at a time per options handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_listener(
    options: *mut pc_engine_options,
    callback: pc_event_fn,
    user_data: *mut c_void,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let o = unsafe { arg_mut(options, "options") }?;
        o.listener = listener(callback, user_data);
        Ok::<(), Error>(())
    })
}

/// `pc_store_open_file`, telling `callback` (with `user_data`) the store's events (SPEC E8):
/// commit stalls, failed syncs, compactions, what open recovered, failed or stopped snapshots,
/// background threads that ended. `user_data` must stay valid until `pc_store_free` returns.
///
/// # Safety
/// As `pc_store_open_file`; `callback` null or callable from any thread as documented at
/// `pc_event_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_open_file_listened(
    dir: *const c_char,
    sync: pc_sync_policy,
    interval_ms: u64,
    clock: *const pc_clock,
    callback: pc_event_fn,
    user_data: *mut c_void,
    out: *mut *mut pc_store,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract, for every argument.
        let (dir, out) = unsafe { (text(dir, "dir")?, out_ptr(out, "out")?) };
        let mut builder = FileStore::builder(dir).sync_policy(sync_policy(sync, interval_ms)?);
        // SAFETY: null or a live clock.
        if let Some(clock) = unsafe { clock.as_ref() } {
            builder = builder.clock(clock.shared());
        }
        if let Some(listener) = listener(callback, user_data) {
            builder = builder.listener(listener);
        }
        let store: Arc<dyn Store> = Arc::new(builder.open()?);
        out.set(Box::into_raw(Box::new(pc_store::new(store))));
        Ok::<(), Error>(())
    })
}

/// A snapshot of a store's counters. Set `struct_size = sizeof(pc_store_stats)` before the
/// call: the library writes only that many bytes, so counters added at the end leave compiled
/// callers working.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_store_stats {
    /// `sizeof(pc_store_stats)` as the caller compiled it (left unchanged).
    pub struct_size: usize,
    /// Batches committed since open.
    pub batches: u64,
    /// Journal syncs since open.
    pub syncs: u64,
    /// Bytes appended to the journal since open.
    pub bytes_written: u64,
    /// Partitions known.
    pub partitions: u64,
    /// Partition indexes loaded now.
    pub partitions_loaded: u64,
    /// The budget of loaded indexes (0: none).
    pub max_loaded_partitions: u64,
    /// Journal segments on disk.
    pub segments: u64,
    /// Compactions completed since open.
    pub compactions: u64,
    /// Compactions failed since open.
    pub compactions_failed: u64,
    /// Estimated bytes of garbage compaction could reclaim.
    pub garbage_bytes: u64,
    /// Commit stalls since open.
    pub stalls: u64,
    /// Commit syncs timed since open.
    pub sync_count: u64,
    /// Their total time, in microseconds.
    pub sync_total_us: u64,
    /// The longest, in microseconds.
    pub sync_max_us: u64,
    /// `PC_DEGRADED_*` when the store is degraded (its reason: `pc_store_degraded`), else 0.
    pub degraded: u64,
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

pub(crate) fn degraded_code(d: &Option<Degraded>) -> u64 {
    d.as_ref().map_or(0, |d| u64::from(d.cause.code()))
}

fn store_stats(s: &StoreStats) -> pc_store_stats {
    pc_store_stats {
        struct_size: 0,
        batches: s.batches,
        syncs: s.syncs,
        bytes_written: s.bytes_written,
        partitions: s.partitions,
        partitions_loaded: s.partitions_loaded,
        max_loaded_partitions: s.max_loaded_partitions.unwrap_or(0),
        segments: s.segments,
        compactions: s.compactions,
        compactions_failed: s.compactions_failed,
        garbage_bytes: s.garbage_bytes,
        stalls: s.stalls,
        sync_count: s.sync_latency.count,
        sync_total_us: micros(s.sync_latency.total),
        sync_max_us: micros(s.sync_latency.max),
        degraded: degraded_code(&s.degraded),
    }
}

/// Fills `*out` with the store's counters (at most `out->struct_size` bytes).
///
/// # Safety
/// `store` live; `out` writable for its `struct_size`. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_get_stats(
    store: *const pc_store,
    out: *mut pc_store_stats,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let stats = store_stats(&unsafe { crate::store::live(store) }?.store.stats());
        // SAFETY: the caller's contract.
        unsafe { write_sized(out, &stats, "out") }
    })
}

/// Writes why the store is degraded (its cause to `*cause`, 0 when healthy, and the reason in
/// words to `*reason`, empty when healthy; free it with `pc_bytes_free`).
///
/// # Safety
/// `store` live; `cause` and `reason` writable and distinct. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_store_degraded(
    store: *const pc_store,
    cause: *mut pc_degraded_cause,
    reason: *mut pc_bytes,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let d = unsafe { crate::store::live(store) }?.store.stats().degraded;
        // SAFETY: the caller's contract.
        unsafe { write_degraded(&d, cause, reason) }
    })
}

/// Writes why the engine is degraded (see `pc_store_degraded`): its store's reason, a
/// background thread of the engine that ended, or an owner lease that could not be renewed.
///
/// # Safety
/// `engine` live; `cause` and `reason` writable and distinct. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_degraded(
    engine: *const crate::engine::pc_engine,
    cause: *mut pc_degraded_cause,
    reason: *mut pc_bytes,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let d = crate::engine::live(engine)?.stats().degraded;
        // SAFETY: the caller's contract.
        unsafe { write_degraded(&d, cause, reason) }
    })
}

/// # Safety
/// `cause` and `reason` writable and distinct.
unsafe fn write_degraded(
    d: &Option<Degraded>,
    cause: *mut pc_degraded_cause,
    reason: *mut pc_bytes,
) -> Result<(), Fail> {
    crate::boundary::distinct(&[
        (
            "cause",
            (cause as usize, std::mem::size_of::<pc_degraded_cause>()),
        ),
        ("reason", (reason as usize, std::mem::size_of::<pc_bytes>())),
    ])?;
    // SAFETY: the caller's contract.
    let (cause, reason) = unsafe { (out_ptr(cause, "cause")?, out_ptr(reason, "reason")?) };
    cause.set(d.as_ref().map_or(0, |d| d.cause.code()));
    reason.set(pc_bytes::from_vec(
        d.as_ref()
            .map_or_else(Vec::new, |d| d.reason.clone().into_bytes()),
    ));
    Ok(())
}
