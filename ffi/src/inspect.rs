//! Looking at an engine's entities from C without restoring them: the registered entities,
//! an entity's history a page at a time (SPEC L2), and whether an entity is contained and why
//! (SPEC R4).
//!
//! Owns: the `pc_entity_list` and `pc_history_page` handles.

use std::ffi::{CString, c_char};

use portcullis::log::LogRecord;
use portcullis::{EntityId, Error};

use crate::boundary::{
    Fail, arg, boundary, boundary_void, distinct, invalid, out_ptr, pc_bytes, span,
};
use crate::engine::{entity, handle, live, pc_engine};
use crate::envelope::record_of;
use crate::error::pc_error;
use crate::machine::pc_entity_view;

/// The registered entities of an engine, in name order: read with `pc_entity_list_len` and
/// `pc_entity_list_get`, free with `pc_entity_list_free`. One thread at a time.
pub struct pc_entity_list {
    /// Each entity with its namespace NUL-terminated (so it can be passed back as `ns`).
    entities: Vec<(EntityId, CString)>,
}

/// One page of an entity's history: records in sequence order. One thread at a time.
pub struct pc_history_page {
    records: Vec<LogRecord>,
    next_seq: Option<u64>,
}

/// Every registered entity of the engine, in name order (partition names only: no rows are
/// read). Free `*out` with `pc_entity_list_free`.
///
/// # Safety
/// `engine` live; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_entities(
    engine: *const pc_engine,
    out: *mut *mut pc_entity_list,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        let entities = live(engine)?
            .entities()?
            .into_iter()
            .map(|e| {
                let ns = CString::new(e.namespace().as_str()).unwrap_or_default();
                (e, ns)
            })
            .collect();
        out.set(Box::into_raw(Box::new(pc_entity_list { entities })));
        Ok::<(), Fail>(())
    })
}

/// How many entities the list holds (0 for null).
///
/// # Safety
/// `list` null or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_entity_list_len(list: *const pc_entity_list) -> usize {
    // SAFETY: null or a live list.
    unsafe { list.as_ref() }.map_or(0, |l| l.entities.len())
}

/// Borrows entity `index` of the list into `*out`: pointers into the list, valid until it is
/// freed. Here `out->ns` is also NUL-terminated, so it can be passed as a `ns` argument. An
/// index past the end answers `PC_INVALID_ARGUMENT`.
///
/// # Safety
/// `list` live; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_entity_list_get(
    list: *const pc_entity_list,
    index: usize,
    out: *mut pc_entity_view,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (list, out) = unsafe { (arg(list, "list")?, out_ptr(out, "out")?) };
        let (e, ns) = list.entities.get(index).ok_or_else(|| {
            invalid(
                "index",
                &format!(
                    "{index} is past the list's {} entities",
                    list.entities.len()
                ),
            )
        })?;
        out.set(pc_entity_view {
            ns: ns.as_ptr().cast(),
            ns_len: ns.as_bytes().len(),
            id: e.id().as_ptr(),
            id_len: e.id().len(),
        });
        Ok::<(), Fail>(())
    })
}

/// Frees a list. Null is a no-op.
///
/// # Safety
/// `list` null or from `pc_engine_entities`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_entity_list_free(list: *mut pc_entity_list) {
    boundary_void(|| {
        if !list.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(list) });
        }
    });
}

/// Reads at most `limit` (at least 1) records of the entity's history from sequence number
/// `from_seq` on (records a truncation removed are skipped), without restoring the entity.
/// Read the page with `pc_history_page_len`, `pc_history_page_record` and
/// `pc_history_page_next`; free it with `pc_history_page_free`. For a machine with a `version`
/// the records are what `apply` sees (SPEC E7): without their envelope, older versions
/// through `upcast_record`; a page holding one the machine cannot read answers `PC_REFUSED`
/// with both versions named.
///
/// # Safety
/// `engine` live; `ns` NUL-terminated; `id` readable; `out` writable. Any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_history(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    from_seq: u64,
    limit: usize,
    out: *mut *mut pc_history_page,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        if limit == 0 {
            return Err(invalid("limit", "must be at least 1").into());
        }
        let (h, who) = (handle(engine)?, entity(ns, id, id_len)?);
        let mut records = h
            .engine
            .history(&who, from_seq)?
            .take(limit)
            .collect::<Result<Vec<_>, _>>()?;
        if h.machine.m().version != 0 {
            // As the machine reads them: without the envelope, older versions upcast.
            for r in &mut records {
                let read = record_of(h.machine.m(), Some(r.seq), &r.payload).map_err(|why| {
                    Error::Refused {
                        entity: who.to_string(),
                        reason: format!("its history could not be read ({why})"),
                    }
                })?;
                r.payload = read.into_owned();
            }
        }
        let next_seq = (records.len() == limit).then(|| records[limit - 1].seq + 1);
        out.set(Box::into_raw(Box::new(pc_history_page {
            records,
            next_seq,
        })));
        Ok::<(), Fail>(())
    })
}

/// How many records the page holds (0 for null).
///
/// # Safety
/// `page` null or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_history_page_len(page: *const pc_history_page) -> usize {
    // SAFETY: null or a live page.
    unsafe { page.as_ref() }.map_or(0, |p| p.records.len())
}

/// Borrows record `index` of the page: its sequence number and bytes (pointers into the page,
/// valid until it is freed). An index past the end answers `PC_INVALID_ARGUMENT`.
///
/// # Safety
/// `page` live; out-pointers writable and distinct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_history_page_record(
    page: *const pc_history_page,
    index: usize,
    seq: *mut u64,
    data: *mut *const u8,
    len: *mut usize,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (page, seq, data, len) = unsafe {
            (
                arg(page, "page")?,
                out_ptr(seq, "seq")?,
                out_ptr(data, "data")?,
                out_ptr(len, "len")?,
            )
        };
        distinct(&[
            ("seq", span(&seq)),
            ("data", span(&data)),
            ("len", span(&len)),
        ])?;
        let r = page.records.get(index).ok_or_else(|| {
            invalid(
                "index",
                &format!("{index} is past the page's {} records", page.records.len()),
            )
        })?;
        seq.set(r.seq);
        data.set(r.payload.as_ptr());
        len.set(r.payload.len());
        Ok::<(), Fail>(())
    })
}

/// Where the next page starts: `*more` is false when the history ended within this page;
/// otherwise `*next_seq` is the `from_seq` to pass next (that page may turn out empty).
///
/// # Safety
/// `page` live; out-pointers writable and distinct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_history_page_next(
    page: *const pc_history_page,
    more: *mut bool,
    next_seq: *mut u64,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (page, more, next) = unsafe {
            (
                arg(page, "page")?,
                out_ptr(more, "more")?,
                out_ptr(next_seq, "next_seq")?,
            )
        };
        distinct(&[("more", span(&more)), ("next_seq", span(&next))])?;
        more.set(page.next_seq.is_some());
        next.set(page.next_seq.unwrap_or(0));
        Ok::<(), Fail>(())
    })
}

/// Frees a history page. Null is a no-op.
///
/// # Safety
/// `page` null or from `pc_engine_history`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_history_page_free(page: *mut pc_history_page) {
    boundary_void(|| {
        if !page.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(page) });
        }
    });
}

/// Whether the entity is contained (SPEC R4), without touching it: `*contained`, and when it
/// is, `*reason` receives the named reason (UTF-8; free it with `pc_bytes_free`; `{NULL, 0}`
/// otherwise).
///
/// # Safety
/// `engine` live; `ns` NUL-terminated; `id` readable; out-pointers writable and distinct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_containment(
    engine: *const pc_engine,
    ns: *const c_char,
    id: *const u8,
    id_len: usize,
    contained: *mut bool,
    reason: *mut pc_bytes,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let (contained, reason) =
            unsafe { (out_ptr(contained, "contained")?, out_ptr(reason, "reason")?) };
        distinct(&[("contained", span(&contained)), ("reason", span(&reason))])?;
        let found = live(engine)?.containment(&entity(ns, id, id_len)?)?;
        contained.set(found.is_some());
        reason.set(pc_bytes::from_vec(
            found.map_or_else(Vec::new, |c| c.to_string().into_bytes()),
        ));
        Ok::<(), Fail>(())
    })
}
