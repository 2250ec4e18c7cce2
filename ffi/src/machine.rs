//! The state machine implemented in C (SPEC R, E3): a struct of function pointers and
//! `user_data`, adapted to [`StateMachine`]. An entity's state is an opaque `void *` that C
//! allocates (`fresh`, `decode`), changes in place (`apply`) and frees (`free_state`).
//!
//! Owns: `pc_machine` (read through its `struct_size`, so fields added at its end leave
//! compiled callers working) and its adapter [`CMachine`], the per-entity [`CState`], and
//! `destroy` running exactly once. What callbacks are told about an entity and a record is in
//! [`crate::context`], the outputs they write into in [`crate::outputs`], the version
//! envelope of a machine with a `version` in [`crate::envelope`].

use std::ffi::c_void;
use std::sync::Arc;

use portcullis::{ApplyContext, EntityId, Error, Rejection, StateMachine};

use crate::boundary::{callback, invalid};
use crate::context::context;
pub use crate::context::{pc_apply_context, pc_entity_view};
use crate::envelope::{Checkpoint, checkpoint_of, record_of, wrap};
pub use crate::outputs::{pc_records, pc_sink};

/// An entity's state machine, implemented in C. Set `struct_size = sizeof(pc_machine)`.
/// Required: `fresh`, `apply`, `encode`, `decode`, `free_state`; optional (null): `validate`,
/// `repair`, `destroy`, `check`, `upcast_record`, `upcast_checkpoint`; `version` 0 means the
/// machine does not version its bytes.
///
/// Threads: callbacks run on the engine's pool threads (warm, background work) and on any
/// thread that touches an entity, concurrently for different entities; one entity's state is
/// used by one thread at a time. They must not block on a lock the caller of a `pc_engine_*`
/// function holds. A callback that calls back into the engine for the entity it is working on
/// (or waits for the warm, or closes the engine) gets `PC_WOULD_DEADLOCK`.
///
/// Refusing: every callback that returns a `uint32_t` refuses with a non-zero code, and may
/// call `pc_refuse(reason)` first to say why. During a restore a refusal contains the entity
/// (SPEC R4) with a reason naming the callback, the code and the reason, except a refusing
/// `decode` while the entity's whole history is stored: the restore replays it instead and
/// checkpoints again (SPEC E7). A refusing `validate` answers the write with
/// `PC_INVALID_ARGUMENT`, a refusing `check` with `PC_REFUSED`, a refusing `encode` publishes
/// nothing (`PC_REFUSED`); nothing is written. A refusing upcast counts as a refusal of the
/// callback that was to read its result.
///
/// Versions: the library reads `struct_size` bytes. Fields are only ever added at the end: a
/// program compiled against an older header passes a smaller size and its missing callbacks
/// count as null. A size larger than this library knows is accepted only if the bytes it does
/// not know are zero (a newer callback this library cannot call is refused, never ignored).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct pc_machine {
    /// `sizeof(pc_machine)` as the caller compiled it.
    pub struct_size: usize,
    /// Passed as the first argument of every callback.
    pub user_data: *mut c_void,
    /// Makes the state of an entity with no history into `*state_out` (null may be a valid
    /// state). Non-zero refuses: the entity is contained; `*state_out` is then ignored.
    pub fresh: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            entity: *const pc_entity_view,
            state_out: *mut *mut c_void,
        ) -> u32,
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
    /// `pc_sink_write`. Non-zero refuses: nothing is published (bytes written are dropped).
    pub encode: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            state: *const c_void,
            out: *mut pc_sink,
        ) -> u32,
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
    /// Optional: checks a record's bytes before it is written or deferred; non-zero refuses it
    /// (`PC_INVALID_ARGUMENT`).
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
    /// Optional: runs exactly once, after the last callback and after every state was freed:
    /// before `pc_engine_free` returns, or before `pc_engine_open` returns if opening failed.
    /// (After a close that timed out, callbacks still running finish first and `destroy` runs
    /// on the thread of the last one.) `user_data` is not used afterwards.
    pub destroy: Option<unsafe extern "C" fn(user_data: *mut c_void)>,
    /// Optional (a program whose `struct_size` ends before it has none): checks a record
    /// against the entity's current state before it is written (SPEC
    /// R12), for every record of `pc_engine_append`, `pc_engine_write` and `pc_engine_defer`
    /// to a restored entity (`ctx->origin` `PC_ORIGIN_LIVE`), and for deferred records inside
    /// the restore unit (`PC_ORIGIN_DEFERRED`; a refused one is set aside, never appended).
    /// Non-zero refuses: the write answers `PC_REFUSED` and writes nothing. Must not change
    /// anything.
    pub check: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            state: *const c_void,
            ctx: *const pc_apply_context,
            record: *const u8,
            record_len: usize,
        ) -> u32,
    >,
    /// The version of the records and checkpoints the machine writes (SPEC E7), or 0 (also for
    /// a program whose `struct_size` ends before it): no version, bytes pass through
    /// unchanged. From 1 up, the library stores every record (`pc_engine_append`,
    /// `pc_engine_write`, `pc_engine_defer`, `repair`) and checkpoint (`encode`) behind the
    /// version envelope of docs/SCHEMA.md, and `apply`, `check`, `validate` and `decode` see
    /// only bytes of this version, without the envelope; `pc_engine_read` and
    /// `pc_engine_history` answer them the same way. Older bytes come up through
    /// `upcast_record` and `upcast_checkpoint`; newer ones, and older ones without an upcast,
    /// are refused with both versions named (callback code `PC_VERSION_REFUSED`). Bytes stored
    /// without an envelope are version 1.
    pub version: u32,
    /// Optional, with a `version`: writes `record`, stored by the older version `version`
    /// (without its envelope), as a record of the machine's version to `out` with
    /// `pc_sink_write`. Non-zero refuses, as the callback about to read it would (`apply`
    /// contains the entity, `check` and `validate` refuse the write).
    pub upcast_record: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            version: u32,
            record: *const u8,
            record_len: usize,
            out: *mut pc_sink,
        ) -> u32,
    >,
    /// Optional, with a `version`: decodes a checkpoint the older version `version` wrote
    /// (`bytes`, without its envelope) into a new state in `*state_out`, as `decode` does for
    /// the machine's own version. Non-zero refuses, as `decode` does: the restore replays the
    /// whole history instead while it is stored.
    pub upcast_checkpoint: Option<
        unsafe extern "C" fn(
            user_data: *mut c_void,
            entity: *const pc_entity_view,
            version: u32,
            bytes: *const u8,
            bytes_len: usize,
            state_out: *mut *mut c_void,
        ) -> u32,
    >,
}

/// The first byte after the fields every caller of ABI 1 has: everything up to `destroy`.
const MIN_SIZE: usize = std::mem::offset_of!(pc_machine, check);

/// Copies a caller's `pc_machine` of `struct_size` bytes: fields it does not have are null.
/// A size below the oldest `pc_machine` is refused (nothing in it is trusted, not even
/// `destroy`).
///
/// # Safety
/// `m` points to at least `size_of::<usize>()` readable bytes, and to `struct_size` of them.
pub(crate) unsafe fn read_machine(m: *const pc_machine) -> Result<pc_machine, Error> {
    // SAFETY: the caller promises the size field is readable.
    let size = unsafe { m.cast::<usize>().read_unaligned() };
    if size < MIN_SIZE {
        return Err(invalid(
            "machine",
            &format!(
                "has struct_size {size}, less than the {MIN_SIZE} bytes of the oldest pc_machine: \
                 set struct_size = sizeof(pc_machine)"
            ),
        ));
    }
    let known = std::mem::size_of::<pc_machine>();
    let mut copy = [0u8; std::mem::size_of::<pc_machine>()];
    let n = size.min(known);
    // SAFETY: the caller promises `size >= n` readable bytes.
    unsafe { std::ptr::copy_nonoverlapping(m.cast::<u8>(), copy.as_mut_ptr(), n) };
    // SAFETY: every field of `pc_machine` is a pointer, an `Option` of a function pointer or an
    // integer, for which all-zero bytes are valid (null / `None` / 0), and the prefix holds the
    // caller's values for the fields it has (padding may hold anything).
    Ok(unsafe { std::mem::transmute::<[u8; std::mem::size_of::<pc_machine>()], pc_machine>(copy) })
}

/// Refuses a caller's `pc_machine` that sets fields past the ones this library knows (a newer
/// header's callback this library cannot call must not be ignored).
///
/// # Safety
/// As for [`read_machine`], which accepted it.
pub(crate) unsafe fn no_unknown_fields(m: *const pc_machine) -> Result<(), Error> {
    // SAFETY: the caller's contract.
    let size = unsafe { m.cast::<usize>().read_unaligned() };
    let known = std::mem::size_of::<pc_machine>();
    if size <= known {
        return Ok(());
    }
    // SAFETY: the caller promises `size` readable bytes.
    let raw = unsafe { std::slice::from_raw_parts(m.cast::<u8>(), size) };
    if raw[known..].iter().any(|b| *b != 0) {
        return Err(invalid(
            "machine",
            &format!(
                "sets fields past the {known} bytes this library (ABI {}) knows: use a newer \
                 library, or leave them zero",
                crate::version::PC_ABI_VERSION
            ),
        ));
    }
    Ok(())
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

/// [`StateMachine`] over a C `pc_machine`. A clone shares the callbacks (`destroy` runs when
/// the last one and the last state are gone).
#[derive(Clone)]
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
    /// C's pointer, for a write's decision and a visit.
    pub(crate) fn as_ptr(&self) -> *const c_void {
        self.ptr
    }

    /// The state's checkpoint bytes, as the machine's `encode` writes them, or its refusal.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, Rejection> {
        let mut sink = pc_sink::new();
        let encode = self.cb.0.encode.expect("checked at construction");
        // SAFETY: C's encode with its user_data, a live state and a sink valid for the call.
        let (code, reason) =
            callback(|| unsafe { encode(self.cb.0.user_data, self.ptr, &mut sink) });
        match code {
            0 => Ok(sink.into_bytes()),
            code => Err(refused("encode", code, reason, "the state".to_owned())),
        }
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

    /// The caller's struct, as read at open.
    pub(crate) fn m(&self) -> &pc_machine {
        &self.cb.0
    }

    fn state(&self, ptr: *mut c_void) -> CState {
        CState {
            ptr,
            cb: Arc::clone(&self.cb),
        }
    }
}

pub(crate) fn refused(
    callback: &str,
    code: u32,
    reason: Option<String>,
    what: String,
) -> Rejection {
    let why = reason.map_or_else(String::new, |r| format!(": {r}"));
    Rejection::new(format!(
        "the C state machine's {callback} refused {what} with code {code}{why}"
    ))
}

impl StateMachine for CMachine {
    type State = CState;

    fn fresh(&self, entity: &EntityId) -> CState {
        let view = pc_entity_view::of(entity);
        let fresh = self.m().fresh.expect("checked at construction");
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: C's fresh with its user_data, a view and an out-pointer valid for the call.
        let (code, reason) = callback(|| unsafe { fresh(self.m().user_data, &view, &mut out) });
        if code != 0 {
            // `fresh` cannot refuse in the Rust trait; the restore unit runs it under a panic
            // catch that contains the entity with this text as the reason (SPEC R4).
            // `resume_unwind` skips the panic hook: nothing is printed.
            let r = refused("fresh", code, reason, "a fresh state".to_owned());
            std::panic::resume_unwind(Box::new(r.reason));
        }
        self.state(out)
    }

    fn apply(
        &self,
        state: &mut CState,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        let record = record_of(self.m(), Some(ctx.seq), record)?;
        let c = context(ctx);
        let apply = self.m().apply.expect("checked at construction");
        // SAFETY: C's apply with its user_data, the entity's state (this thread's alone during
        // the call), a context and a record valid for the call.
        let (code, reason) = callback(|| unsafe {
            apply(
                self.m().user_data,
                state.ptr,
                &c,
                record.as_ptr(),
                record.len(),
            )
        });
        match code {
            0 => Ok(()),
            code => Err(refused(
                "apply",
                code,
                reason,
                format!("record {}", ctx.seq),
            )),
        }
    }

    fn encode_checkpoint(&self, state: &CState) -> Result<Vec<u8>, Rejection> {
        state.encode().map(|b| wrap(self.m().version, b))
    }

    fn decode_checkpoint(&self, entity: &EntityId, bytes: &[u8]) -> Result<CState, Rejection> {
        let bytes = match checkpoint_of(self.m(), entity, bytes)? {
            Checkpoint::Current(bytes) => bytes,
            Checkpoint::Upcast(state) => return Ok(self.state(state)),
        };
        let view = pc_entity_view::of(entity);
        let decode = self.m().decode.expect("checked at construction");
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: C's decode with its user_data, and a view, bytes and out-pointer valid for
        // the call.
        let (code, reason) = callback(|| unsafe {
            decode(
                self.m().user_data,
                &view,
                bytes.as_ptr(),
                bytes.len(),
                &mut out,
            )
        });
        match code {
            0 => Ok(self.state(out)),
            code => Err(refused("decode", code, reason, "the checkpoint".to_owned())),
        }
    }

    fn validate(&self, record: &[u8]) -> Result<(), Rejection> {
        let record = record_of(self.m(), None, record)?;
        let Some(validate) = self.m().validate else {
            return Ok(());
        };
        // SAFETY: C's validate with its user_data and a record valid for the call.
        let (code, reason) =
            callback(|| unsafe { validate(self.m().user_data, record.as_ptr(), record.len()) });
        match code {
            0 => Ok(()),
            code => Err(refused("validate", code, reason, "the record".to_owned())),
        }
    }

    fn check(
        &self,
        state: &CState,
        ctx: &ApplyContext<'_>,
        record: &[u8],
    ) -> Result<(), Rejection> {
        let Some(check) = self.m().check else {
            return Ok(());
        };
        let record = record_of(self.m(), Some(ctx.seq), record)?;
        let c = context(ctx);
        // SAFETY: C's check with its user_data, a state, a context and a record valid for the
        // call.
        let (code, reason) = callback(|| unsafe {
            check(
                self.m().user_data,
                state.ptr,
                &c,
                record.as_ptr(),
                record.len(),
            )
        });
        match code {
            0 => Ok(()),
            code => Err(refused(
                "check",
                code,
                reason,
                format!("record {}", ctx.seq),
            )),
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
        let (code, reason) =
            callback(|| unsafe { repair(self.m().user_data, &view, state.ptr, unclean, &mut out) });
        match code {
            0 => Ok(out
                .records
                .into_iter()
                .map(|r| wrap(self.m().version, r))
                .collect()),
            code => Err(refused(
                "repair",
                code,
                reason,
                format!("incarnation {unclean}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `pc_machine` from an older header (ending before `check`, or before `version`) reads
    /// the fields it lacks as null or 0; one from a newer header is accepted only if the fields
    /// this library does not know are zero.
    #[test]
    fn the_struct_size_decides_which_fields_are_read() {
        // SAFETY: all-zero bytes are a valid `pc_machine` (null pointers, `None`s, 0).
        let mut m: pc_machine = unsafe { std::mem::zeroed() };
        m.struct_size = MIN_SIZE;
        // SAFETY: `m` is a whole struct; only `MIN_SIZE` bytes are read.
        let read = unsafe { read_machine(&m) }.unwrap();
        assert!(read.check.is_none());
        // A header from before versions: `version` and the upcasts are not read.
        m.version = 2;
        m.struct_size = std::mem::offset_of!(pc_machine, version);
        // SAFETY: as above.
        let read = unsafe { read_machine(&m) }.unwrap();
        assert_eq!(read.version, 0);
        m.struct_size = std::mem::size_of::<pc_machine>();
        // SAFETY: as above.
        assert_eq!(unsafe { read_machine(&m) }.unwrap().version, 2);
        m.struct_size = 8;
        // SAFETY: as above.
        assert!(unsafe { read_machine(&m) }.is_err());
        // A `usize` array, so the size field is aligned like a real struct's.
        let mut bigger = [0usize; std::mem::size_of::<pc_machine>() / 8 + 1];
        bigger[0] = std::mem::size_of_val(&bigger);
        // SAFETY: a buffer of the size it announces.
        unsafe {
            assert!(read_machine(bigger.as_ptr().cast()).is_ok());
            assert!(no_unknown_fields(bigger.as_ptr().cast()).is_ok());
            *bigger.last_mut().unwrap() = 1;
            assert!(read_machine(bigger.as_ptr().cast()).is_ok());
            assert!(no_unknown_fields(bigger.as_ptr().cast()).is_err());
        }
    }
}
