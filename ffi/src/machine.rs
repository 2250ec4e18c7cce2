//! The state machine implemented in C (SPEC R, E3): a struct of function pointers and
//! `user_data`, adapted to [`StateMachine`]. An entity's state is an opaque `void *` that C
//! allocates (`fresh`, `decode`), changes in place (`apply`) and frees (`free_state`).
//!
//! Owns: `pc_machine` and its adapter [`CMachine`], the per-entity [`CState`], the
//! `pc_sink`/`pc_records` outputs callbacks write into, and `destroy` running exactly once.

use std::ffi::c_void;
use std::sync::Arc;

use portcullis::{ApplyContext, EntityId, Error, Origin, Rejection, StateMachine};

use crate::boundary::{arg_mut, boundary, bytes, invalid};

/// Origin of a record being applied: stored history folded again (suppress side effects).
pub const PC_ORIGIN_REPLAY: u32 = 0;
/// Origin: deferred work folded for the first time inside the restore unit.
pub const PC_ORIGIN_DEFERRED: u32 = 1;
/// Origin: a record the unclean-restart repair returned, folded for the first time.
pub const PC_ORIGIN_REPAIR: u32 = 2;
/// Origin: a record a write has just appended.
pub const PC_ORIGIN_LIVE: u32 = 3;

/// An entity, borrowed for the duration of a callback: its namespace (UTF-8, not
/// NUL-terminated) and its id.
#[repr(C)]
#[derive(Debug)]
pub struct pc_entity_view {
    /// The namespace's bytes.
    pub ns: *const u8,
    /// Their length.
    pub ns_len: usize,
    /// The id's bytes.
    pub id: *const u8,
    /// Their length.
    pub id_len: usize,
}

impl pc_entity_view {
    fn of(entity: &EntityId) -> Self {
        let ns = entity.namespace().as_str().as_bytes();
        pc_entity_view {
            ns: ns.as_ptr(),
            ns_len: ns.len(),
            id: entity.id().as_ptr(),
            id_len: entity.id().len(),
        }
    }
}

/// What `apply` learns about the record besides its bytes.
#[repr(C)]
#[derive(Debug)]
pub struct pc_apply_context {
    /// The entity the record belongs to.
    pub entity: pc_entity_view,
    /// The record's sequence number in the entity's log.
    pub seq: u64,
    /// `PC_ORIGIN_REPLAY`, `PC_ORIGIN_DEFERRED`, `PC_ORIGIN_REPAIR` or `PC_ORIGIN_LIVE`.
    pub origin: u32,
}

/// Where `encode` writes a checkpoint: append bytes with `pc_sink_write`. Valid only during
/// the callback it is passed to.
pub struct pc_sink {
    buf: Vec<u8>,
}

/// Where `repair` (and a write's decision) put records: append one record per
/// `pc_records_push`. Valid only during the callback it is passed to.
pub struct pc_records {
    pub(crate) records: Vec<Vec<u8>>,
}

impl pc_records {
    pub(crate) fn new() -> Self {
        pc_records {
            records: Vec::new(),
        }
    }
}

/// An entity's state machine, implemented in C. Required: `fresh`, `apply`, `encode`,
/// `decode`, `free_state`; optional (null): `validate`, `repair`, `destroy`.
///
/// Threads: callbacks run on the engine's pool threads (warm, background work) and on any
/// thread that touches an entity, concurrently for different entities; one entity's state is
/// used by one thread at a time. They must not block on a lock the caller of a `pc_engine_*`
/// function holds. A callback that calls back into the engine for the entity it is working on
/// gets `PC_WOULD_DEADLOCK`.
///
/// A non-zero return is a refusal. During a restore it contains the entity (SPEC R4) with a
/// reason that names the callback and the code; a refusing `validate` answers the write with
/// `PC_INVALID_ARGUMENT`, and nothing is written.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pc_machine {
    /// Passed as the first argument of every callback.
    pub user_data: *mut c_void,
    /// Returns the state of an entity with no history (may be null if null is a valid state).
    pub fresh: Option<
        unsafe extern "C" fn(user_data: *mut c_void, entity: *const pc_entity_view) -> *mut c_void,
    >,
    /// Folds `record` into `state` in place; non-zero refuses it (leave `state` unchanged).
    pub apply: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            state: *mut c_void,
            ctx: *const pc_apply_context,
            record: *const u8,
            record_len: usize,
        ) -> u32,
    >,
    /// Encodes `state` for a checkpoint (and for `pc_engine_read`) into `out` with
    /// `pc_sink_write`. Must not fail.
    pub encode: Option<
        unsafe extern "C" fn(user_data: *mut c_void, state: *const c_void, out: *mut pc_sink),
    >,
    /// Decodes a checkpoint `encode` wrote into a new state stored in `*state_out`; non-zero
    /// refuses it (then `*state_out` is ignored and nothing needs freeing).
    pub decode: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            entity: *const pc_entity_view,
            bytes: *const u8,
            bytes_len: usize,
            state_out: *mut *mut c_void,
        ) -> u32,
    >,
    /// Optional: checks a record before it is written or deferred; non-zero refuses it.
    pub validate: Option<
        unsafe extern "C" fn(user_data: *mut c_void, record: *const u8, record_len: usize) -> u32,
    >,
    /// Optional: records to append after incarnation `unclean` ended without a clean shutdown
    /// (SPEC R3), pushed to `out` with `pc_records_push`; non-zero refuses (contains the entity).
    pub repair: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            entity: *const pc_entity_view,
            state: *const c_void,
            unclean: u64,
            out: *mut pc_records,
        ) -> u32,
    >,
    /// Frees a state `fresh` or `decode` returned. Called exactly once per state.
    pub free_state: Option<unsafe extern "C" fn(user_data: *mut c_void, state: *mut c_void)>,
    /// Optional: runs exactly once, after every state was freed, when the engine is freed or
    /// its open failed. `user_data` is not used afterwards.
    pub destroy: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
}

/// The C struct, owned: runs `destroy` when the last reference (the engine's machine or a
/// state) goes away.
struct Callbacks(pc_machine);

// SAFETY: the header requires callbacks and `user_data` to be usable from any thread, at
// once for different entities; that is the C side's promise.
unsafe impl Send for Callbacks {}
// SAFETY: as above.
unsafe impl Sync for Callbacks {}

impl Drop for Callbacks {
    fn drop(&mut self) {
        if let Some(destroy) = self.0.destroy {
            // SAFETY: C's destroy with its own user_data, exactly once (this drop).
            unsafe { destroy(self.0.user_data) };
        }
    }
}

/// [`StateMachine`] over a C `pc_machine`.
pub struct CMachine {
    cb: Arc<Callbacks>,
}

/// One entity's state: C's pointer, freed with `free_state` when dropped.
pub struct CState {
    ptr: *mut c_void,
    cb: Arc<Callbacks>,
}

// SAFETY: a state is used by one thread at a time (the engine serialises an entity), and the
// header tells C that it may move between threads.
unsafe impl Send for CState {}

impl CState {
    /// C's pointer, for a write's decision.
    pub(crate) fn as_ptr(&self) -> *const c_void {
        self.ptr
    }

    /// The state's checkpoint bytes, as the machine's `encode` writes them.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut sink = pc_sink { buf: Vec::new() };
        let encode = self.cb.0.encode.expect("checked at construction");
        // SAFETY: C's encode with its user_data, a live state and a sink valid for the call.
        unsafe { encode(self.cb.0.user_data, self.ptr, &mut sink) };
        sink.buf
    }
}

impl Drop for CState {
    fn drop(&mut self) {
        if let Some(free) = self.cb.0.free_state {
            // SAFETY: a state this machine's fresh/decode returned, freed once (this drop).
            unsafe { free(self.cb.0.user_data, self.ptr) };
        }
    }
}

impl CMachine {
    /// Takes ownership of `m` at once, so that `destroy` runs exactly once whatever happens
    /// next; then refuses a struct that lacks a required callback.
    pub(crate) fn new(m: pc_machine) -> Result<Self, Error> {
        let cb = Arc::new(Callbacks(m));
        let missing = [
            ("fresh", m.fresh.is_none()),
            ("apply", m.apply.is_none()),
            ("encode", m.encode.is_none()),
            ("decode", m.decode.is_none()),
            ("free_state", m.free_state.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|(_, absent)| *absent) {
            return Err(invalid(
                "machine",
                &format!("lacks the required callback {name}"),
            ));
        }
        Ok(CMachine { cb })
    }

    fn m(&self) -> &pc_machine {
        &self.cb.0
    }

    fn state(&self, ptr: *mut c_void) -> CState {
        CState {
            ptr,
            cb: Arc::clone(&self.cb),
        }
    }
}

fn refused(callback: &str, code: u32, what: String) -> Rejection {
    Rejection::new(format!(
        "the C state machine's {callback} refused {what} with code {code}"
    ))
}

fn origin(o: Origin) -> u32 {
    match o {
        Origin::Replay => PC_ORIGIN_REPLAY,
        Origin::Deferred => PC_ORIGIN_DEFERRED,
        Origin::Repair => PC_ORIGIN_REPAIR,
        _ => PC_ORIGIN_LIVE,
    }
}

impl StateMachine for CMachine {
    type State = CState;

    fn fresh(&self, entity: &EntityId) -> CState {
        let view = pc_entity_view::of(entity);
        let fresh = self.m().fresh.expect("checked at construction");
        // SAFETY: C's fresh with its user_data and a view valid for the call.
        self.state(unsafe { fresh(self.m().user_data, &view) })
    }

    fn apply(
        &self,
        state: &mut CState,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        let c = pc_apply_context {
            entity: pc_entity_view::of(ctx.entity),
            seq: ctx.seq,
            origin: origin(ctx.origin),
        };
        let apply = self.m().apply.expect("checked at construction");
        // SAFETY: C's apply with its user_data, the entity's state (this thread's alone during
        // the call), a context and a record valid for the call.
        let code = unsafe {
            apply(
                self.m().user_data,
                state.ptr,
                &c,
                record.as_ptr(),
                record.len(),
            )
        };
        match code {
            0 => Ok(()),
            code => Err(refused("apply", code, format!("record {}", ctx.seq))),
        }
    }

    fn encode_checkpoint(&self, state: &CState) -> Vec<u8> {
        state.encode()
    }

    fn decode_checkpoint(&self, entity: &EntityId, bytes: &[u8]) -> Result<CState, Rejection> {
        let view = pc_entity_view::of(entity);
        let decode = self.m().decode.expect("checked at construction");
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: C's decode with its user_data, and a view, bytes and out-pointer valid for
        // the call.
        let code = unsafe {
            decode(
                self.m().user_data,
                &view,
                bytes.as_ptr(),
                bytes.len(),
                &mut out,
            )
        };
        match code {
            0 => Ok(self.state(out)),
            code => Err(refused("decode", code, "the checkpoint".to_owned())),
        }
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        let Some(validate) = self.m().validate else {
            return Ok(());
        };
        // SAFETY: C's validate with its user_data and a record valid for the call.
        match unsafe { validate(self.m().user_data, record.as_ptr(), record.len()) } {
            0 => Ok(()),
            code => Err(refused("validate", code, "the record".to_owned())),
        }
    }

    fn repair(
        &self,
        entity: &EntityId,
        state: &CState,
        unclean: u64,
    ) -> Result<Vec<Vec<u8>>, Rejection> {
        let Some(repair) = self.m().repair else {
            return Ok(Vec::new());
        };
        let view = pc_entity_view::of(entity);
        let mut out = pc_records::new();
        // SAFETY: C's repair with its user_data, and a view, state and output valid for the
        // call.
        match unsafe { repair(self.m().user_data, &view, state.ptr, unclean, &mut out) } {
            0 => Ok(out.records),
            code => Err(refused("repair", code, format!("incarnation {unclean}"))),
        }
    }
}

/// Appends `len` bytes to a checkpoint being encoded.
///
/// # Safety
/// `sink` is the sink passed to the running `encode`; `data` readable for `len` bytes.
/// Thread safety: only from the callback it was passed to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_sink_write(sink: *mut pc_sink, data: *const u8, len: usize) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let (sink, data) = unsafe { (arg_mut(sink, "sink")?, bytes(data, len, "data")?) };
        sink.buf.extend_from_slice(data);
        Ok(())
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
) -> u32 {
    boundary(|| {
        // SAFETY: the caller's contract.
        let (records, data) =
            unsafe { (arg_mut(records, "records")?, bytes(data, len, "record")?) };
        records.records.push(data.to_vec());
        Ok(())
    })
}
