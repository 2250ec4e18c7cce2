//! The engine through C (SPEC E2): options, open over a C state machine, register, read the
//! state as bytes, write/append, defer, checkpoint, warm with progress, release, stats, close.
//! Fencing calls are in [`crate::fencing`].
//!
//! Owns: the `pc_engine`, `pc_engine_options` and `pc_warm` handles.

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use portcullis::engine::{Deferred, Engine};
use portcullis::fence::FenceConfig;
use portcullis::restore::{Warm, WarmProgress};
use portcullis::store::SyncPolicy;
use portcullis::{EntityId, Error, Namespace, SharedClock};

use crate::boundary::{
    arg, arg_mut, boundary, boundary_void, bytes, invalid, out_ptr, pc_bytes, text,
};
use crate::machine::{CMachine, CState, pc_machine, pc_records};
use crate::store::{pc_clock, pc_store, sync_policy};

/// An open engine over a C state machine. Any number of threads may share it.
pub struct pc_engine {
    pub(crate) engine: Engine<CMachine>,
}

/// Options for `pc_engine_open`, reusable for several opens. One thread at a time.
#[derive(Default)]
pub struct pc_engine_options {
    directory: Option<String>,
    store: Option<Arc<dyn portcullis::store::Store>>,
    clock: Option<SharedClock>,
    sync: Option<SyncPolicy>,
    owner: Option<String>,
    own: Vec<(Namespace, bool)>,
    adopt_on_first_use: Option<bool>,
    register_on_first_write: Option<bool>,
    pool_threads: Option<usize>,
    warm_parallelism: Option<usize>,
    checkpoint_every: Option<u64>,
    checkpoint_tail_bound: Option<u64>,
    truncate_after_checkpoint: Option<bool>,
    warm_on_open: Option<bool>,
    close_timeout_ms: Option<u64>,
    fence: Option<FenceConfig>,
}

/// A running (or finished) warm: wait for it, stop it, read its progress. Any thread.
pub struct pc_warm {
    warm: Warm,
}

/// Where a warm stands (SPEC R6).
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_warm_progress {
    /// Entities restored (or found refused) so far.
    pub done: u64,
    /// Entities the warm set out to restore.
    pub total: u64,
    /// Entities whose restore was refused (contained).
    pub refused: u64,
    /// Milliseconds since the warm started.
    pub elapsed_ms: u64,
    /// Whether it ended.
    pub finished: bool,
    /// Whether it was stopped before the end.
    pub stopped: bool,
}

/// What a write did.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_written {
    /// Whether records were appended (false when the decision pushed none or refused).
    pub wrote: bool,
    /// The first and last sequence numbers appended, when `wrote`.
    pub first_seq: u64,
    /// See `first_seq`.
    pub last_seq: u64,
    /// What the decision callback returned.
    pub decision: u32,
}

/// Deferred work (SPEC R8): queued for a pending entity.
pub const PC_DEFERRED_QUEUED: u32 = 0;
/// Deferred work: a deferral with the same id was accepted before; nothing was written.
pub const PC_DEFERRED_ALREADY_ACCEPTED: u32 = 1;
/// Deferred work: the entity was restored, so the record was appended at `seq`.
pub const PC_DEFERRED_APPLIED: u32 = 2;

/// Where deferred work went.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_deferred {
    /// `PC_DEFERRED_QUEUED`, `PC_DEFERRED_ALREADY_ACCEPTED` or `PC_DEFERRED_APPLIED`.
    pub kind: u32,
    /// For `PC_DEFERRED_APPLIED`: the record's sequence number.
    pub seq: u64,
}

/// A record given to `pc_engine_append`: `len` bytes at `data`.
#[repr(C)]
#[derive(Debug)]
pub struct pc_slice {
    /// The bytes (null only with `len == 0`).
    pub data: *const u8,
    /// How many.
    pub len: usize,
}

/// A write's decision: sees the entity's current state (read-only) and pushes the records to
/// append to `out` with `pc_records_push`. Returning non-zero refuses the write: nothing is
/// written, and the code comes back in `pc_written.decision`. Runs on the calling thread while
/// the entity is held: it must not call the engine for the same entity.
pub type pc_decide_fn = Option<
    unsafe extern "C" fn(ctx: *mut c_void, state: *const c_void, out: *mut pc_records) -> u32,
>;

pub(crate) fn entity(ns: *const c_char, id: *const u8, id_len: usize) -> Result<EntityId, Error> {
    // SAFETY: forwarded from the exported function's contract.
    let (ns, id) = unsafe { (text(ns, "namespace")?, bytes(id, id_len, "id")?) };
    EntityId::new(ns, id)
}

pub(crate) fn namespace(ns: *const c_char) -> Result<Namespace, Error> {
    // SAFETY: forwarded from the exported function's contract.
    Namespace::new(unsafe { text(ns, "namespace") }?)
}

/// Creates options with every default (no directory and no store yet: set one).
///
/// # Safety
/// `out` writable. Thread safety: any thread; the options are then one thread's at a time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_new(out: *mut *mut pc_engine_options) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        *out = Box::into_raw(Box::default());
        Ok(())
    })
}

/// Frees options. Null is a no-op.
///
/// # Safety
/// `options` null or from `pc_engine_options_new`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_free(options: *mut pc_engine_options) {
    boundary_void(|| {
        if !options.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(options) });
        }
    });
}

fn set(
    options: *mut pc_engine_options,
    f: impl FnOnce(&mut pc_engine_options) -> Result<(), Error>,
) -> u32 {
    boundary(|| {
        // SAFETY: every setter's contract: `options` live, one thread at a time.
        f(unsafe { arg_mut(options, "options") }?)
    })
}

/// Opens the file store in `dir` (created if missing). Either this or `pc_engine_options_store`.
///
/// # Safety
/// `options` live; `dir` NUL-terminated. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_directory(
    options: *mut pc_engine_options,
    dir: *const c_char,
) -> u32 {
    // SAFETY: the caller's contract.
    set(options, |o| {
        o.directory = Some(unsafe { text(dir, "dir") }?.to_owned());
        Ok(())
    })
}

/// Opens over an already open store (shared: several engines may share one, as owners).
/// The engine keeps its own reference; the store handle may be freed before the engine.
///
/// # Safety
/// `options`, `store` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_store(
    options: *mut pc_engine_options,
    store: *const pc_store,
) -> u32 {
    // SAFETY: the caller's contract.
    set(options, |o| {
        o.store = Some(Arc::clone(&unsafe { arg(store, "store") }?.store));
        Ok(())
    })
}

/// The engine's clock (with a directory the store runs on it too; with a store it must be
/// the store's clock).
///
/// # Safety
/// `options`, `clock` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_clock(
    options: *mut pc_engine_options,
    clock: *const pc_clock,
) -> u32 {
    // SAFETY: the caller's contract.
    set(options, |o| {
        o.clock = Some(unsafe { arg(clock, "clock") }?.shared());
        Ok(())
    })
}

/// The file store's sync policy (`PC_SYNC_*`), with a directory only.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_sync_policy(
    options: *mut pc_engine_options,
    policy: u32,
    interval_ms: u64,
) -> u32 {
    set(options, |o| {
        o.sync = Some(sync_policy(policy, interval_ms)?);
        Ok(())
    })
}

/// The owner id (SPEC F11; engines sharing a store need distinct ids). Default `"default"`.
///
/// # Safety
/// `options` live; `owner` NUL-terminated. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_owner(
    options: *mut pc_engine_options,
    owner: *const c_char,
) -> u32 {
    // SAFETY: the caller's contract.
    set(options, |o| {
        o.owner = Some(unsafe { text(owner, "owner") }?.to_owned());
        Ok(())
    })
}

/// Adopts namespace `ns` at open, fenced (`unfenced` false) or unfenced. May be repeated.
///
/// # Safety
/// `options` live; `ns` NUL-terminated. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_own(
    options: *mut pc_engine_options,
    ns: *const c_char,
    unfenced: bool,
) -> u32 {
    set(options, |o| {
        o.own.push((namespace(ns)?, unfenced));
        Ok(())
    })
}

/// Flag (`pc_engine_options_flag`): the first call on a namespace nobody holds adopts it
/// (default true).
pub const PC_ADOPT_ON_FIRST_USE: u32 = 0;
/// Flag: a write to an unregistered entity registers it (default false).
pub const PC_REGISTER_ON_FIRST_WRITE: u32 = 1;
/// Flag: `pc_engine_checkpoint` also truncates the history it covers (default false).
pub const PC_TRUNCATE_AFTER_CHECKPOINT: u32 = 2;
/// Flag: opening starts a background warm (default false).
pub const PC_WARM_ON_OPEN: u32 = 3;

/// Sets a boolean option (`PC_ADOPT_ON_FIRST_USE` ...); an unknown flag answers `PC_INVALID_ARGUMENT`.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_flag(
    options: *mut pc_engine_options,
    flag: u32,
    on: bool,
) -> u32 {
    set(options, |o| {
        let slot = match flag {
            PC_ADOPT_ON_FIRST_USE => &mut o.adopt_on_first_use,
            PC_REGISTER_ON_FIRST_WRITE => &mut o.register_on_first_write,
            PC_TRUNCATE_AFTER_CHECKPOINT => &mut o.truncate_after_checkpoint,
            PC_WARM_ON_OPEN => &mut o.warm_on_open,
            other => return Err(invalid("flag", &format!("{other} is not a PC_* flag"))),
        };
        *slot = Some(on);
        Ok(())
    })
}

/// Number (`pc_engine_options_number`): threads in the engine's pool (default: the cores
/// available).
pub const PC_POOL_THREADS: u32 = 0;
/// Number: entities a warm restores at once (default 4).
pub const PC_WARM_PARALLELISM: u32 = 1;
/// Number: a checkpoint whenever a write leaves this many records after the newest (default
/// none).
pub const PC_CHECKPOINT_EVERY: u32 = 2;
/// Number: a restore that folds more records than this publishes a checkpoint (default 10,000).
pub const PC_CHECKPOINT_TAIL_BOUND: u32 = 3;
/// Number: how long close waits for the warm, drivers and calls in flight, in ms (default
/// 30,000).
pub const PC_CLOSE_TIMEOUT_MS: u32 = 4;

/// Sets a numeric option (`PC_POOL_THREADS` ...); zero where at least 1 is needed is refused by
/// `pc_engine_open`; an unknown option answers `PC_INVALID_ARGUMENT`.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_number(
    options: *mut pc_engine_options,
    option: u32,
    value: u64,
) -> u32 {
    set(options, |o| {
        let size = || usize::try_from(value).map_err(|_| invalid("value", "does not fit a size_t"));
        match option {
            PC_POOL_THREADS => o.pool_threads = Some(size()?),
            PC_WARM_PARALLELISM => o.warm_parallelism = Some(size()?),
            PC_CHECKPOINT_EVERY => o.checkpoint_every = Some(value),
            PC_CHECKPOINT_TAIL_BOUND => o.checkpoint_tail_bound = Some(value),
            PC_CLOSE_TIMEOUT_MS => o.close_timeout_ms = Some(value),
            other => {
                return Err(invalid(
                    "option",
                    &format!("{other} is not a PC_* number option"),
                ));
            }
        }
        Ok(())
    })
}

/// Epoch fencing parameters (SPEC F), in ms. Refused (`PC_INVALID_ARGUMENT`) unless
/// `lease_margin_ms > 0` and `epoch_lease_ms > lease_margin_ms + min_lease_budget_ms`.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_fence(
    options: *mut pc_engine_options,
    epoch_lease_ms: u64,
    lease_margin_ms: u64,
    min_lease_budget_ms: u64,
    max_apply_window_ms: u64,
) -> u32 {
    set(options, |o| {
        let config = FenceConfig::builder()
            .epoch_lease_ms(epoch_lease_ms)
            .lease_margin_ms(lease_margin_ms)
            .min_lease_budget_ms(min_lease_budget_ms)
            .max_apply_window_ms(max_apply_window_ms)
            .build()?;
        o.fence = Some(config);
        Ok(())
    })
}

fn open(o: &pc_engine_options, machine: CMachine) -> Result<Engine<CMachine>, Error> {
    let mut b = Engine::builder(machine);
    if let Some(dir) = &o.directory {
        b = b.directory(dir);
    }
    if let Some(store) = &o.store {
        b = b.store(Arc::clone(store));
    }
    if let Some(clock) = &o.clock {
        b = b.clock(Arc::clone(clock));
    }
    if let Some(policy) = o.sync {
        b = b.sync_policy(policy);
    }
    if let Some(owner) = &o.owner {
        b = b.owner(owner.clone());
    }
    for (ns, unfenced) in &o.own {
        b = if *unfenced {
            b.own_unfenced(ns.clone())
        } else {
            b.own(ns.clone())
        };
    }
    if let Some(v) = o.adopt_on_first_use {
        b = b.adopt_on_first_use(v);
    }
    if let Some(v) = o.register_on_first_write {
        b = b.register_on_first_write(v);
    }
    if let Some(v) = o.truncate_after_checkpoint {
        b = b.truncate_after_checkpoint(v);
    }
    if let Some(v) = o.warm_on_open {
        b = b.warm_on_open(v);
    }
    if let Some(v) = o.pool_threads {
        b = b.pool_threads(v);
    }
    if let Some(v) = o.warm_parallelism {
        b = b.warm_parallelism(v);
    }
    if let Some(v) = o.checkpoint_every {
        b = b.checkpoint_every(v);
    }
    if let Some(v) = o.checkpoint_tail_bound {
        b = b.checkpoint_tail_bound(v);
    }
    if let Some(ms) = o.close_timeout_ms {
        b = b.close_timeout(Duration::from_millis(ms));
    }
    if let Some(config) = o.fence {
        b = b.fence_config(config);
    }
    b.open()
}

/// Opens an engine with `options` over the C state machine `machine` (copied; its
/// `user_data` now belongs to the engine). Returns at once: entities restore on first touch.
///
/// `machine->destroy` runs exactly once: when the engine is freed, or before this returns if
/// opening fails for any reason (including a null `options` or `out`). With a null `machine`
/// nothing is called.
///
/// # Safety
/// `options` and `machine` live, `out` writable. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_open(
    options: *const pc_engine_options,
    machine: *const pc_machine,
    out: *mut *mut pc_engine,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract. The machine is taken first, so its destroy runs on
        // every failure below.
        let machine = CMachine::new(*unsafe { arg(machine, "machine") }?)?;
        // SAFETY: the caller's contract.
        let (options, out) = unsafe { (arg(options, "options")?, out_ptr(out, "out")?) };
        let engine = open(options, machine)?;
        *out = Box::into_raw(Box::new(pc_engine { engine }));
        Ok(())
    })
}

/// Borrows a live engine handle.
pub(crate) fn live<'a>(e: *const pc_engine) -> Result<&'a Engine<CMachine>, Error> {
    // SAFETY: every exported function's contract: `engine` null or live.
    Ok(&unsafe { arg(e, "engine") }?.engine)
}

/// Closes the engine (SPEC R11): stops the warm and drivers, waits for calls in flight
/// (bounded by the close timeout), records a clean shutdown and closes a store it opened.
/// Later calls answer `PC_CLOSED`; closing again answers `PC_OK`. The handle must still be
/// freed. Calling it from a callback answers `PC_WOULD_DEADLOCK`.
///
/// # Safety
/// `engine` live. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_close(engine: *const pc_engine) -> u32 {
    boundary(|| live(engine)?.close())
}

/// Frees an engine, closing it first if needed (errors are logged), then frees every state
/// and runs the machine's `destroy`. Null is a no-op.
///
/// # Safety
/// `engine` null or from `pc_engine_open`, not used afterwards, no call on it running.
/// Not from a callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_free(engine: *mut pc_engine) {
    boundary_void(|| {
        if !engine.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(engine) });
        }
    });
}

/// Registers entity `(ns, id)`; `*created` is false if it was already registered.
///
/// # Safety
/// `engine` live; `ns` NUL-terminated; `id` readable; `created` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_register(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    created: *mut bool,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let created = unsafe { out_ptr(created, "created") }?;
        *created = live(engine)?.register(&entity(ns, id, id_len)?)?;
        Ok(())
    })
}

/// The entity's state as bytes (what the machine's `encode` writes), restoring it first if
/// it is pending. Free `*state` with `pc_bytes_free`.
///
/// # Safety
/// As for `pc_engine_register`; `state` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_read(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    state: *mut pc_bytes,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(state, "state") }?;
        let bytes = live(engine)?.read(&entity(ns, id, id_len)?, CState::encode)?;
        *out = pc_bytes::from_vec(bytes);
        Ok(())
    })
}

/// Appends `count` records as they are (SPEC L1), durably when this returns; `*first_seq` and
/// `*last_seq` receive their sequence numbers. An empty list is refused.
///
/// # Safety
/// As for `pc_engine_register`; `records` readable for `count` slices. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_append(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    records: *const pc_slice,
    count: usize,
    first_seq: *mut u64,
    last_seq: *mut u64,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let (first, last) = unsafe {
            (
                out_ptr(first_seq, "first_seq")?,
                out_ptr(last_seq, "last_seq")?,
            )
        };
        if count > isize::MAX as usize / std::mem::size_of::<pc_slice>() {
            return Err(invalid(
                "count",
                &format!("{count} is an impossible length"),
            ));
        }
        // SAFETY: `records` is readable for `count` slices (null only with 0).
        let slices: &[pc_slice] = if count == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(arg(records, "records")?, count) }
        };
        let mut owned = Vec::with_capacity(count);
        for (i, s) in slices.iter().enumerate() {
            // SAFETY: each slice's buffer as documented.
            owned.push(unsafe { bytes(s.data, s.len, &format!("records[{i}]")) }?.to_vec());
        }
        let seqs = live(engine)?.append(&entity(ns, id, id_len)?, owned)?;
        (*first, *last) = (*seqs.start(), *seqs.end());
        Ok(())
    })
}

/// Decides records from the entity's current state and appends them (SPEC E2): `decide`
/// runs once on this thread with the state, pushes records, and returns a code that comes
/// back in `out->decision` (non-zero: nothing is written). Fenced like every write.
///
/// # Safety
/// As for `pc_engine_register`; `decide` non-null; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_write(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    decide: pc_decide_fn,
    ctx: *mut c_void,
    out: *mut pc_written,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let decide = decide.ok_or_else(|| invalid("decide", "is a null function pointer"))?;
        let written = live(engine)?.write(&entity(ns, id, id_len)?, |s: &CState| {
            let mut records = pc_records::new();
            // SAFETY: the caller's decide with its context, a state and an output valid for
            // the call.
            let code = unsafe { decide(ctx, s.as_ptr(), &mut records) };
            if code == 0 {
                (records.records, code)
            } else {
                (Vec::new(), code)
            }
        })?;
        *out = pc_written {
            wrote: written.seqs.is_some(),
            first_seq: written.seqs.as_ref().map_or(0, |r| *r.start()),
            last_seq: written.seqs.as_ref().map_or(0, |r| *r.end()),
            decision: written.value,
        };
        Ok(())
    })
}

/// Defers `record` to the entity (SPEC R8): durable when accepted; queued without restoring
/// a pending entity, appended to a restored one. With a non-null `dedup_id`, a second deferral
/// with the same id is `PC_DEFERRED_ALREADY_ACCEPTED` and writes nothing.
///
/// # Safety
/// As for `pc_engine_register`; buffers as documented; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_defer(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    dedup_id: *const u8,
    dedup_id_len: usize,
    record: *const u8,
    record_len: usize,
    out: *mut pc_deferred,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let (out, dedup, record) = unsafe {
            (
                out_ptr(out, "out")?,
                crate::boundary::opt_bytes(dedup_id, dedup_id_len, "dedup_id")?,
                bytes(record, record_len, "record")?,
            )
        };
        let (e, ent) = (live(engine)?, entity(ns, id, id_len)?);
        let deferred = match dedup {
            Some(d) => e.defer_once(&ent, d, record.to_vec())?,
            None => e.defer(&ent, record.to_vec())?,
        };
        *out = match deferred {
            Deferred::Queued => pc_deferred {
                kind: PC_DEFERRED_QUEUED,
                seq: 0,
            },
            Deferred::AlreadyAccepted => pc_deferred {
                kind: PC_DEFERRED_ALREADY_ACCEPTED,
                seq: 0,
            },
            Deferred::Applied { seq } => pc_deferred {
                kind: PC_DEFERRED_APPLIED,
                seq,
            },
        };
        Ok(())
    })
}

/// Publishes a checkpoint of the entity (SPEC L3); `*seq` is the sequence number it covers.
///
/// # Safety
/// As for `pc_engine_register`; `seq` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_checkpoint(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    seq: *mut u64,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let seq = unsafe { out_ptr(seq, "seq") }?;
        *seq = live(engine)?.checkpoint(&entity(ns, id, id_len)?)?;
        Ok(())
    })
}

/// Releases a contained entity so its next touch runs the whole restore again (SPEC R4);
/// `*released` is false if it was not contained.
///
/// # Safety
/// As for `pc_engine_register`; `released` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_release(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    released: *mut bool,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let released = unsafe { out_ptr(released, "released") }?;
        *released = live(engine)?.release(&entity(ns, id, id_len)?)?;
        Ok(())
    })
}

/// Starts (or joins) a background warm that restores every pending entity on the pool
/// (SPEC R6). Free the handle with `pc_warm_free` (that does not stop the warm).
///
/// # Safety
/// `engine` live; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_warm(engine: *const pc_engine, out: *mut *mut pc_warm) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let warm = live(engine)?.warm()?;
        *out = Box::into_raw(Box::new(pc_warm { warm }));
        Ok(())
    })
}

fn progress(p: WarmProgress) -> pc_warm_progress {
    pc_warm_progress {
        done: p.done,
        total: p.total,
        refused: p.refused,
        elapsed_ms: u64::try_from(p.elapsed.as_millis()).unwrap_or(u64::MAX),
        finished: p.finished,
        stopped: p.stopped,
    }
}

/// Where the warm stands now.
///
/// # Safety
/// `warm` live; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_get_progress(
    warm: *const pc_warm,
    out: *mut pc_warm_progress,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let (warm, out) = unsafe { (arg(warm, "warm")?, out_ptr(out, "out")?) };
        *out = progress(warm.warm.progress());
        Ok(())
    })
}

/// Waits until the warm ends, at most `timeout_ms`; `*finished` says whether it did. Never
/// wait from a state machine callback: the warm may be waiting for it.
///
/// # Safety
/// `warm` live; `finished` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_wait(
    warm: *const pc_warm,
    timeout_ms: u64,
    finished: *mut bool,
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let (warm, finished) = unsafe { (arg(warm, "warm")?, out_ptr(finished, "finished")?) };
        *finished = warm.warm.wait_timeout(Duration::from_millis(timeout_ms));
        Ok(())
    })
}

/// Asks the warm to stop after the restores it is running.
///
/// # Safety
/// `warm` live. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_stop(warm: *const pc_warm) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        unsafe { arg(warm, "warm") }?.warm.stop();
        Ok(())
    })
}

/// Frees a warm handle (the warm itself runs on). Null is a no-op.
///
/// # Safety
/// `warm` null or from `pc_engine_warm`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_warm_free(warm: *mut pc_warm) {
    boundary_void(|| {
        if !warm.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(warm) });
        }
    });
}
