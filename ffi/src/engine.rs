//! The engine through C (SPEC E2): open over a C state machine, register, read the state as
//! bytes or visit it, write/append, defer, checkpoint, release, close, free. Options are in
//! [`crate::options`], the warm in [`crate::warm`], listing and history in
//! [`crate::inspect`], fencing in [`crate::fencing`].
//!
//! Owns: the `pc_engine` handle, the process generation it was opened in (a forked child
//! never uses it, [`crate::fork`]), and the result structs of writes and deferrals.

use std::ffi::{c_char, c_void};

use portcullis::engine::{Deferred, Engine};
use portcullis::restore::Rejection;
use portcullis::{EntityId, Error, Namespace};

use crate::boundary::{
    Fail, arg, boundary, boundary_void, bytes, distinct, invalid, opt_bytes, out_ptr, pc_bytes,
    span, text,
};
use crate::envelope::wrap;
use crate::error::pc_error;
use crate::machine::{CMachine, CState, no_unknown_fields, pc_machine, pc_records, read_machine};
use crate::options::{open, pc_engine_options};

/// An open engine over a C state machine. Any number of threads may share it.
pub struct pc_engine {
    pub(crate) engine: Engine<CMachine>,
    /// The machine's callbacks, for what crosses the boundary outside a callback: the version
    /// envelope of records C writes and reads (declared after `engine`, so dropped after it).
    pub(crate) machine: CMachine,
    /// The process generation it was opened in.
    pub(crate) generation: u64,
}

/// What a write did. This struct never grows.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_written {
    /// Whether records were appended (false when the decision pushed none or declined).
    pub wrote: bool,
    /// The first and last sequence numbers appended, when `wrote`.
    pub first_seq: u64,
    /// See `first_seq`.
    pub last_seq: u64,
    /// What the decision callback returned.
    pub decision: u32,
}

/// Where deferred work went (`pc_deferred.kind`).
pub type pc_deferred_kind = u32;
/// Deferred work (SPEC R8): queued for a pending entity.
pub const PC_DEFERRED_QUEUED: pc_deferred_kind = 0x0501;
/// Deferred work: a deferral with the same id was accepted before; nothing was written.
pub const PC_DEFERRED_ALREADY_ACCEPTED: pc_deferred_kind = 0x0502;
/// Deferred work: the entity was restored, so the record was appended at `seq`.
pub const PC_DEFERRED_APPLIED: pc_deferred_kind = 0x0503;

/// Where deferred work went. This struct never grows.
#[repr(C)]
#[derive(Debug, Default)]
pub struct pc_deferred {
    /// `PC_DEFERRED_QUEUED`, `PC_DEFERRED_ALREADY_ACCEPTED` or `PC_DEFERRED_APPLIED`.
    pub kind: pc_deferred_kind,
    /// For `PC_DEFERRED_APPLIED`: the record's sequence number.
    pub seq: u64,
}

/// A record given to `pc_engine_append`: `len` bytes at `data`. This struct never grows.
#[repr(C)]
#[derive(Debug)]
pub struct pc_slice {
    /// The bytes (null only with `len == 0`).
    pub data: *const u8,
    /// How many.
    pub len: usize,
}

/// A write's decision: sees the entity's current state (read-only) and pushes the records to
/// append to `out` with `pc_records_push`. Returning non-zero declines the write: nothing is
/// written, and the code comes back in `pc_written.decision`. Calling
/// `pc_records_refuse(out, reason)` refuses the command: `pc_engine_write` answers
/// `PC_REFUSED` with the reason in its message, and nothing is written. Runs on the calling
/// thread while the entity is held: it must not call the engine for the same entity, wait for
/// the warm or close the engine (those answer `PC_WOULD_DEADLOCK`).
pub type pc_decide_fn = Option<
    unsafe extern "C" fn(ctx: *mut c_void, state: *const c_void, out: *mut pc_records) -> u32,
>;

/// A visit (`pc_engine_visit`): reads the entity's current state in place (read-only) and
/// returns a code that comes back in `*result`. Runs on the calling thread while the entity is
/// held, with the same rules as a decision.
pub type pc_visit_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, state: *const c_void) -> u32>;

pub(crate) fn entity(ns: *const c_char, id: *const u8, id_len: usize) -> Result<EntityId, Error> {
    // SAFETY: forwarded from the exported function's contract.
    let (ns, id) = unsafe { (text(ns, "namespace")?, bytes(id, id_len, "id")?) };
    EntityId::new(ns, id)
}

pub(crate) fn namespace(ns: *const c_char) -> Result<Namespace, Error> {
    // SAFETY: forwarded from the exported function's contract.
    Namespace::new(unsafe { text(ns, "namespace") }?)
}

/// Borrows a live engine handle of this process (one opened before a fork answers
/// `PC_CLOSED`).
pub(crate) fn live<'a>(e: *const pc_engine) -> Result<&'a Engine<CMachine>, Fail> {
    Ok(&handle(e)?.engine)
}

/// Borrows a live engine handle of this process, with its machine.
pub(crate) fn handle<'a>(e: *const pc_engine) -> Result<&'a pc_engine, Fail> {
    // SAFETY: every exported function's contract: `engine` null or live.
    let handle = unsafe { arg(e, "engine") }?;
    crate::fork::check(handle.generation, "engine")?;
    Ok(handle)
}

/// Opens an engine with `options` over the C state machine `machine` (copied: the library
/// reads `machine->struct_size` bytes; its `user_data` now belongs to the engine). Returns at
/// once: entities restore on first touch.
///
/// `machine->destroy` runs exactly once: when the engine is freed, or before this returns if
/// opening fails for any reason (including a null `options` or `out`, a missing callback, or
/// fields this library does not know). With a null `machine`, or a `struct_size` below the
/// oldest `pc_machine` (nothing in it is trusted), nothing is called.
///
/// # Safety
/// `options` live, `machine` null or readable for its `struct_size`, `out` writable.
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_open(
    options: *const pc_engine_options,
    machine: *const pc_machine,
    out: *mut *mut pc_engine,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        if machine.is_null() {
            return Err(invalid("machine", "is a null pointer").into());
        }
        // SAFETY: the caller's contract. The machine is taken first, so its destroy runs on
        // every failure below.
        let taken = CMachine::new(unsafe { read_machine(machine) }?)?;
        // SAFETY: `read_machine` accepted it.
        unsafe { no_unknown_fields(machine) }?;
        let machine = taken;
        // SAFETY: the caller's contract.
        let (options, out) = unsafe { (arg(options, "options")?, out_ptr(out, "out")?) };
        let shared = machine.clone();
        let engine = open(options, machine)?;
        out.set(Box::into_raw(Box::new(pc_engine {
            engine,
            machine: shared,
            generation: crate::fork::generation(),
        })));
        Ok::<(), Fail>(())
    })
}

/// Closes the engine (SPEC R11): stops the warm and drivers, waits for calls in flight
/// (bounded by the close timeout), records a clean shutdown and closes a store it opened.
/// Later calls answer `PC_CLOSED`; closing again answers `PC_OK`. The handle must still be
/// freed. Calling it from a callback answers `PC_WOULD_DEADLOCK`.
///
/// # Safety
/// `engine` live. Thread safety: any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_close(engine: *const pc_engine, err: *mut pc_error) -> u32 {
    boundary(err, || Ok::<(), Fail>(live(engine)?.close()?))
}

/// Frees an engine, closing it first if needed (errors are logged): every state is freed and
/// the machine's `destroy` has run when this returns, also while `pc_warm` handles of this
/// engine are alive (they then answer from what they knew and call nothing). After a close
/// that timed out, a callback still running finishes first, and `destroy` runs after it on its
/// thread. In a forked child the handle is only forgotten: nothing is closed or written. Null
/// is a no-op.
///
/// # Safety
/// `engine` null or from `pc_engine_open`, not used afterwards, no call on it running.
/// Not from a callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_free(engine: *mut pc_engine) {
    boundary_void(|| {
        if engine.is_null() {
            return;
        }
        // SAFETY: from `Box::into_raw`, freed once.
        let handle = unsafe { Box::from_raw(engine) };
        if crate::fork::ours(handle.generation) {
            drop(handle);
        } else {
            std::mem::forget(handle);
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
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let created = unsafe { out_ptr(created, "created") }?;
        created.set(live(engine)?.register(&entity(ns, id, id_len)?)?);
        Ok::<(), Fail>(())
    })
}

/// The entity's state as bytes (what the machine's `encode` writes), restoring it first if
/// it is pending (without an envelope, also for a machine with a `version`). Free `*state`
/// with `pc_bytes_free`. An `encode` that refuses answers
/// `PC_REFUSED` (to read the state without encoding it, use `pc_engine_visit`).
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
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(state, "state") }?;
        let who = entity(ns, id, id_len)?;
        let encoded = live(engine)?.read(&who, CState::encode)?;
        let bytes = encoded.map_err(|r| refused(&who, &r))?;
        out.set(pc_bytes::from_vec(bytes));
        Ok::<(), Fail>(())
    })
}

fn refused(entity: &EntityId, r: &Rejection) -> Error {
    Error::Refused {
        entity: entity.to_string(),
        reason: format!("its state could not be read as bytes ({r})"),
    }
}

/// Visits the entity's state in place (restoring it first if it is pending), without encoding
/// it: `visit(ctx, state)` runs once on this thread, and what it returns comes back in
/// `*result`. Cheaper than `pc_engine_read` when the caller only needs a field.
///
/// # Safety
/// As for `pc_engine_register`; `visit` non-null; `result` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_visit(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    visit: pc_visit_fn,
    ctx: *mut c_void,
    result: *mut u32,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let result = unsafe { out_ptr(result, "result") }?;
        let visit = visit.ok_or_else(|| invalid("visit", "is a null function pointer"))?;
        let e = live(engine)?;
        // SAFETY: the caller's visit with its context and a state valid for the call.
        let code = e.read(&entity(ns, id, id_len)?, |s: &CState| unsafe {
            visit(ctx, s.as_ptr())
        })?;
        result.set(code);
        Ok::<(), Fail>(())
    })
}

/// Appends `count` records as they are (SPEC L1; behind the version envelope when the
/// machine has a `version`, SPEC E7), durably when this returns; `*first_seq` and
/// `*last_seq` receive their sequence numbers. An empty list is refused, and so are
/// `first_seq` and `last_seq` pointing to the same place.
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
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (first, last) = unsafe {
            (
                out_ptr(first_seq, "first_seq")?,
                out_ptr(last_seq, "last_seq")?,
            )
        };
        distinct(&[("first_seq", span(&first)), ("last_seq", span(&last))])?;
        if count > isize::MAX as usize / std::mem::size_of::<pc_slice>() {
            return Err(invalid("count", &format!("{count} is an impossible length")).into());
        }
        // SAFETY: `records` is readable for `count` slices (null only with 0).
        let slices: &[pc_slice] = if count == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(arg(records, "records")?, count) }
        };
        let h = handle(engine)?;
        let version = h.machine.m().version;
        let mut owned = Vec::with_capacity(count);
        for (i, s) in slices.iter().enumerate() {
            // SAFETY: each slice's buffer as documented.
            let record = unsafe { bytes(s.data, s.len, &format!("records[{i}]")) }?;
            owned.push(wrap(version, record.to_vec()));
        }
        let seqs = h.engine.append(&entity(ns, id, id_len)?, owned)?;
        first.set(*seqs.start());
        last.set(*seqs.end());
        Ok::<(), Fail>(())
    })
}

/// Decides records from the entity's current state and appends them (SPEC E2): `decide`
/// runs once on this thread with the state, pushes records (stored behind the version envelope
/// when the machine has a `version`), and returns a code that comes
/// back in `out->decision` (non-zero: nothing is written). A decision that refuses the command
/// with `pc_records_refuse` makes this answer `PC_REFUSED` with the reason in the message,
/// and nothing is written (SPEC R12). Fenced like every write.
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
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let decide = decide.ok_or_else(|| invalid("decide", "is a null function pointer"))?;
        let h = handle(engine)?;
        let version = h.machine.m().version;
        let written = h.engine.try_write(&entity(ns, id, id_len)?, |s: &CState| {
            let mut records = pc_records::for_decision();
            // SAFETY: the caller's decide with its context, a state and an output valid for
            // the call.
            let code = unsafe { decide(ctx, s.as_ptr(), &mut records) };
            if let Some(reason) = records.refusal {
                return Err(Rejection::new(reason));
            }
            Ok(if code == 0 {
                let records = records.records.into_iter();
                (records.map(|r| wrap(version, r)).collect(), code)
            } else {
                (Vec::new(), code)
            })
        })?;
        out.set(pc_written {
            wrote: written.seqs.is_some(),
            first_seq: written.seqs.as_ref().map_or(0, |r| *r.start()),
            last_seq: written.seqs.as_ref().map_or(0, |r| *r.end()),
            decision: written.value,
        });
        Ok::<(), Fail>(())
    })
}

/// Defers `record` to the entity (SPEC R8): durable when accepted; queued without restoring
/// a pending entity, appended to a restored one (behind the version envelope when the machine
/// has a `version`). With a `dedup_id` (`NULL, 0`: none), a
/// second deferral with the same id is `PC_DEFERRED_ALREADY_ACCEPTED` and writes nothing. A
/// null `dedup_id` with a non-zero length is refused.
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
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (out, dedup, record) = unsafe {
            (
                out_ptr(out, "out")?,
                opt_bytes(dedup_id, dedup_id_len, "dedup_id")?,
                bytes(record, record_len, "record")?,
            )
        };
        let (h, ent) = (handle(engine)?, entity(ns, id, id_len)?);
        let record = wrap(h.machine.m().version, record.to_vec());
        let deferred = match dedup {
            Some(d) => h.engine.defer_once(&ent, d, record)?,
            None => h.engine.defer(&ent, record)?,
        };
        out.set(match deferred {
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
        });
        Ok::<(), Fail>(())
    })
}

/// Publishes a checkpoint of the entity (SPEC L3); `*seq` is the sequence number it covers.
/// An `encode` that refuses answers `PC_REFUSED`: nothing is published and the entity keeps
/// serving.
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
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let seq = unsafe { out_ptr(seq, "seq") }?;
        seq.set(live(engine)?.checkpoint(&entity(ns, id, id_len)?)?);
        Ok::<(), Fail>(())
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
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let released = unsafe { out_ptr(released, "released") }?;
        released.set(live(engine)?.release(&entity(ns, id, id_len)?)?);
        Ok::<(), Fail>(())
    })
}
