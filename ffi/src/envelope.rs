//! Versioned records and checkpoints of a C state machine (SPEC E7): the version envelope of
//! docs/SCHEMA.md, byte for byte what the Rust `typed` module and the Python package write, so
//! a C machine and a Python or typed Rust machine of the same version read each other's stores.
//!
//! Owns: `PC_VERSION_REFUSED`, `pc_envelope_write` and `pc_envelope_split`, and what a machine
//! with a `version` does to the bytes that cross the boundary: `wrap` puts the envelope on
//! every record and checkpoint C produces, `record_of` and `checkpoint_of` take it off
//! those C is handed, calling the machine's upcasts for older versions and refusing newer ones
//! (and older ones without an upcast) with both versions named. Called by [`crate::machine`]
//! (the callbacks), [`crate::engine`] (writes) and [`crate::inspect`] (history); calls C only
//! through `boundary::callback`.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::ffi::c_void;
use std::fmt;

use portcullis::typed::split_version;
use portcullis::{EntityId, Error, Rejection};

use crate::boundary::{
    Fail, boundary, bytes, callback, distinct, invalid, out_ptr, pc_bytes, set_callback_code, span,
};
use crate::error::pc_error;
use crate::machine::{pc_entity_view, pc_machine, pc_sink, refused};

/// The callback code (`pc_error_callback_code`, not a `pc_code`) of a refusal the library
/// makes for a machine with a `version`: bytes of a newer version, of an older one the machine
/// has no upcast for, or an envelope no code writes. The Python package refuses with the same
/// code.
pub const PC_VERSION_REFUSED: u32 = 0x5056;

/// The most bytes an envelope takes: five 7-bit groups (a `u32`) and the closing zero byte.
const MAX_HEADER: usize = 6;

/// `payload` behind the envelope of `version` (at least 1): the version in 7-bit groups,
/// lowest first, each in a byte with its top bit set, then a zero byte.
fn envelope(version: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_HEADER + payload.len());
    let mut rest = version;
    loop {
        // Truncation intended: the low 7 bits.
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
        if rest == 0 {
            break;
        }
    }
    out.push(0);
    out.extend_from_slice(payload);
    out
}

/// Bytes C produced as the engine stores them: behind the envelope of `version`, or unchanged
/// for version 0 (a machine without versions).
pub(crate) fn wrap(version: u32, bytes: Vec<u8>) -> Vec<u8> {
    if version == 0 {
        bytes
    } else {
        envelope(version, &bytes)
    }
}

/// What the refusals call a record or a checkpoint.
#[derive(Clone, Copy)]
enum What {
    Record(Option<u64>),
    Checkpoint,
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::Record(Some(seq)) => write!(f, "record {seq}"),
            What::Record(None) => f.write_str("the record"),
            What::Checkpoint => f.write_str("the checkpoint"),
        }
    }
}

/// A refusal the library makes on the machine's behalf: its callback code is
/// `PC_VERSION_REFUSED`.
fn version_refused(reason: String) -> Rejection {
    set_callback_code(PC_VERSION_REFUSED);
    Rejection::new(reason)
}

/// Stored bytes as a machine of version `current` (at least 1) reads them: the payload of its
/// own version, or an older version's that `hook` (present when `has_hook`) brings up.
fn stored<'a>(
    what: What,
    hook: &str,
    has_hook: bool,
    current: u32,
    bytes: &'a [u8],
) -> Result<(u32, &'a [u8]), Rejection> {
    let split = split_version(bytes).map_err(|r| version_refused(format!("{what}: {r}")))?;
    let v = split.version;
    match v.cmp(&current) {
        Ordering::Equal => Ok((v, split.payload)),
        Ordering::Greater => Err(version_refused(format!(
            "{what} was written by version {v}, newer than this machine's version {current}: \
             only code that knows version {v} reads it"
        ))),
        Ordering::Less if has_hook => Ok((v, split.payload)),
        Ordering::Less => Err(version_refused(format!(
            "{what} was written by version {v} and this machine is version {current}: the \
             machine has no {hook} to bring version {v} up (docs/SCHEMA.md)"
        ))),
    }
}

/// A stored record (sequence number `seq` when known) as the machine's callbacks read it:
/// unchanged for version 0; otherwise without its envelope, through `upcast_record` if older.
pub(crate) fn record_of<'a>(
    m: &pc_machine,
    seq: Option<u64>,
    record: &'a [u8],
) -> Result<Cow<'a, [u8]>, Rejection> {
    let current = m.version;
    if current == 0 {
        return Ok(Cow::Borrowed(record));
    }
    let what = What::Record(seq);
    let has = m.upcast_record.is_some();
    let (v, payload) = stored(what, "upcast_record", has, current, record)?;
    let Some(upcast) = m.upcast_record.filter(|_| v != current) else {
        return Ok(Cow::Borrowed(payload));
    };
    let mut sink = pc_sink::new();
    // SAFETY: C's upcast with its user_data, a record and a sink valid for the call.
    let (code, reason) =
        callback(|| unsafe { upcast(m.user_data, v, payload.as_ptr(), payload.len(), &mut sink) });
    match code {
        0 => Ok(Cow::Owned(sink.into_bytes())),
        code => Err(refused(
            "upcast_record",
            code,
            reason,
            format!("{what} of version {v} (this machine is version {current})"),
        )),
    }
}

/// A stored checkpoint as the machine reads it.
pub(crate) enum Checkpoint<'a> {
    /// Bytes of the machine's version (or of a machine without versions), for `decode`.
    Current(&'a [u8]),
    /// The state `upcast_checkpoint` made of an older version's checkpoint.
    Upcast(*mut c_void),
}

/// A stored checkpoint of `entity` as the machine reads it: unchanged for version 0;
/// otherwise without its envelope, or through `upcast_checkpoint` if older.
pub(crate) fn checkpoint_of<'a>(
    m: &pc_machine,
    entity: &EntityId,
    bytes: &'a [u8],
) -> Result<Checkpoint<'a>, Rejection> {
    let current = m.version;
    if current == 0 {
        return Ok(Checkpoint::Current(bytes));
    }
    let has = m.upcast_checkpoint.is_some();
    let (v, payload) = stored(What::Checkpoint, "upcast_checkpoint", has, current, bytes)?;
    let Some(upcast) = m.upcast_checkpoint.filter(|_| v != current) else {
        return Ok(Checkpoint::Current(payload));
    };
    let view = pc_entity_view::of(entity);
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: C's upcast with its user_data, and a view, bytes and out-pointer valid for the
    // call.
    let (code, reason) = callback(|| unsafe {
        upcast(
            m.user_data,
            &view,
            v,
            payload.as_ptr(),
            payload.len(),
            &mut out,
        )
    });
    match code {
        0 => Ok(Checkpoint::Upcast(out)),
        code => Err(refused(
            "upcast_checkpoint",
            code,
            reason,
            format!("the checkpoint of version {v} (this machine is version {current})"),
        )),
    }
}

/// Writes `len` bytes at `data` behind the version envelope of `version` into `*out` (free it
/// with `pc_bytes_free`): the bytes a machine with that `version` stores for them, and what
/// the Rust `typed` module and the Python package store. Version 0 is not a version
/// (`PC_INVALID_ARGUMENT`).
///
/// # Safety
/// `data` readable for `len` bytes (null only with 0); `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_envelope_write(
    version: u32,
    data: *const u8,
    len: usize,
    out: *mut pc_bytes,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (data, out) = unsafe { (bytes(data, len, "data")?, out_ptr(out, "out")?) };
        if version == 0 {
            return Err(invalid(
                "version",
                "0 is not a version: versions start at 1",
            ));
        }
        out.set(pc_bytes::from_vec(envelope(version, data)));
        Ok::<(), Error>(())
    })
}

/// Reads the version of stored bytes (`len` at `data`): `*version` is the envelope's, or 1 for
/// bytes without one; the machine's own bytes start `*offset` bytes in (0 without an
/// envelope); `*enveloped` says whether there was one. Bytes are enveloped when they start
/// with one to five bytes of 0x80 or more followed by a zero byte (docs/SCHEMA.md). An
/// envelope naming version 0 or one beyond 32 bits answers `PC_INVALID_ARGUMENT`: no code
/// writes those.
///
/// # Safety
/// `data` readable for `len` bytes (null only with 0); out-pointers writable and distinct.
/// Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_envelope_split(
    data: *const u8,
    len: usize,
    version: *mut u32,
    offset: *mut usize,
    enveloped: *mut bool,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (data, version, offset, enveloped) = unsafe {
            (
                bytes(data, len, "data")?,
                out_ptr(version, "version")?,
                out_ptr(offset, "offset")?,
                out_ptr(enveloped, "enveloped")?,
            )
        };
        distinct(&[
            ("version", span(&version)),
            ("offset", span(&offset)),
            ("enveloped", span(&enveloped)),
        ])?;
        let split = split_version(data).map_err(|r| invalid("data", &r.reason))?;
        version.set(split.version);
        offset.set(data.len() - split.payload.len());
        enveloped.set(split.enveloped);
        Ok::<(), Fail>(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::pc_apply_context;
    use crate::machine::{CMachine, pc_records};
    use crate::outputs::{pc_records_push, pc_sink_write};
    use parking_lot::Mutex;
    use portcullis::{ApplyContext, Origin, StateMachine};

    /// The records `apply` saw.
    static SEEN: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

    unsafe extern "C" fn fresh(
        _: *mut c_void,
        _: *const pc_entity_view,
        s: *mut *mut c_void,
    ) -> u32 {
        // SAFETY: the library's out-pointer.
        unsafe { *s = std::ptr::null_mut() };
        0
    }
    unsafe extern "C" fn apply(
        _: *mut c_void,
        _: *mut c_void,
        _: *const pc_apply_context,
        record: *const u8,
        len: usize,
    ) -> u32 {
        // SAFETY: the library's record, valid for the call.
        SEEN.lock()
            .push(unsafe { std::slice::from_raw_parts(record, len) }.to_vec());
        0
    }
    unsafe extern "C" fn encode(_: *mut c_void, _: *const c_void, out: *mut pc_sink) -> u32 {
        // SAFETY: the library's sink and a static byte.
        unsafe { pc_sink_write(out, b"S".as_ptr(), 1, std::ptr::null_mut()) }
    }
    unsafe extern "C" fn decode(
        _: *mut c_void,
        _: *const pc_entity_view,
        _: *const u8,
        _: usize,
        s: *mut *mut c_void,
    ) -> u32 {
        // SAFETY: the library's out-pointer.
        unsafe { *s = std::ptr::null_mut() };
        0
    }
    unsafe extern "C" fn free_state(_: *mut c_void, _: *mut c_void) {}
    unsafe extern "C" fn repair(
        _: *mut c_void,
        _: *const pc_entity_view,
        _: *const c_void,
        _: u64,
        out: *mut pc_records,
    ) -> u32 {
        // SAFETY: the library's list and a static byte.
        unsafe { pc_records_push(out, b"R".as_ptr(), 1, std::ptr::null_mut()) }
    }
    /// Version 1's record `x` is version 2's `x+`.
    unsafe extern "C" fn upcast(
        _: *mut c_void,
        version: u32,
        record: *const u8,
        len: usize,
        out: *mut pc_sink,
    ) -> u32 {
        assert_eq!(version, 1);
        // SAFETY: the library's record and sink, and a static byte.
        unsafe {
            pc_sink_write(out, record, len, std::ptr::null_mut());
            pc_sink_write(out, b"+".as_ptr(), 1, std::ptr::null_mut())
        }
    }

    fn machine(version: u32) -> CMachine {
        // SAFETY: all-zero bytes are a valid `pc_machine`.
        let mut m: pc_machine = unsafe { std::mem::zeroed() };
        m.struct_size = std::mem::size_of::<pc_machine>();
        m.fresh = Some(fresh);
        m.apply = Some(apply);
        m.encode = Some(encode);
        m.decode = Some(decode);
        m.free_state = Some(free_state);
        m.repair = Some(repair);
        m.version = version;
        m.upcast_record = Some(upcast);
        CMachine::new(m).unwrap()
    }

    /// With a version, what C writes (repair's records, checkpoints) gets the envelope and
    /// what C is handed loses it, older versions coming up through `upcast_record`; version 0
    /// changes nothing.
    #[test]
    fn e7_a_versioned_machine_wraps_what_c_writes_and_unwraps_what_it_reads() {
        let who = EntityId::new("ns", b"id").unwrap();
        let ctx = ApplyContext::new(&who, 1, Origin::Replay);
        let (v2, v0) = (machine(2), machine(0));
        let mut state = v2.fresh(&who);
        assert_eq!(v2.repair(&who, &state, 1).unwrap(), [b"\x82\x00R".to_vec()]);
        assert_eq!(v2.encode_checkpoint(&state).unwrap(), b"\x82\x00S");
        for stored in [&b"\x82\x00a"[..], b"\x81\x00b", b"c"] {
            v2.apply(&mut state, &ctx, stored).unwrap();
        }
        let newer = v2.apply(&mut state, &ctx, b"\x83\x00d").unwrap_err();
        assert!(
            newer
                .reason
                .contains("version 3, newer than this machine's version 2")
        );
        assert_eq!(
            SEEN.lock().drain(..).collect::<Vec<_>>(),
            [&b"a"[..], b"b+", b"c+"]
        );
        let mut state = v0.fresh(&who);
        assert_eq!(v0.repair(&who, &state, 1).unwrap(), [b"R".to_vec()]);
        assert_eq!(v0.encode_checkpoint(&state).unwrap(), b"S");
        v0.apply(&mut state, &ctx, b"\x83\x00d").unwrap();
        assert_eq!(SEEN.lock().drain(..).collect::<Vec<_>>(), [b"\x83\x00d"]);
    }

    /// The envelope is the typed module's, byte for byte, and the Python package's literals.
    #[test]
    fn e7_the_envelope_is_the_typed_modules_and_pythons() {
        for version in [1, 2, 127, 128, 300, u32::MAX] {
            let value = "a value";
            let typed = portcullis::typed::encode_versioned(version, &value).unwrap();
            let plain = portcullis::typed::encode(&value).unwrap();
            assert_eq!(wrap(version, plain), typed, "version {version}");
        }
        assert_eq!(wrap(1, b"x".to_vec()), b"\x81\x00x");
        assert_eq!(wrap(300, Vec::new()), b"\xac\x82\x00");
        assert_eq!(wrap(0, b"as is".to_vec()), b"as is");
    }
}
