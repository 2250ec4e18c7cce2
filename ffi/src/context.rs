//! What a C callback learns about the entity and the record it is called for: the entity's
//! namespace and id (`pc_entity_view`), a record's sequence number and origin
//! (`pc_apply_context`, `PC_ORIGIN_*`).
//!
//! Owns: those structs and constants, and their conversion from the engine's types. Used by
//! [`crate::machine`] (callbacks), [`crate::envelope`] (upcasts) and [`crate::inspect`]
//! (lists).

use portcullis::{ApplyContext, EntityId, Origin};

/// Where a record being applied comes from (`pc_apply_context.origin`); the family's values
/// do not overlap any other family's.
pub type pc_origin = u32;
/// Origin: stored history folded again (suppress side effects).
pub const PC_ORIGIN_REPLAY: pc_origin = 0x0601;
/// Origin: deferred work folded for the first time inside the restore unit.
pub const PC_ORIGIN_DEFERRED: pc_origin = 0x0602;
/// Origin: a record the unclean-restart repair returned, folded for the first time.
pub const PC_ORIGIN_REPAIR: pc_origin = 0x0603;
/// Origin: a record a write has just appended (for `check`: is about to append).
pub const PC_ORIGIN_LIVE: pc_origin = 0x0604;
/// Origin: one this header does not name (a newer library): treat the record as a replay
/// (no side effects) until the program is rebuilt against the newer header.
pub const PC_ORIGIN_UNKNOWN: pc_origin = 0x06FF;

/// An entity, borrowed for the duration of a callback (or of the list that holds it): its
/// namespace (UTF-8, not NUL-terminated in callbacks) and its id.
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
    pub(crate) fn of(entity: &EntityId) -> Self {
        let ns = entity.namespace().as_str().as_bytes();
        pc_entity_view {
            ns: ns.as_ptr(),
            ns_len: ns.len(),
            id: entity.id().as_ptr(),
            id_len: entity.id().len(),
        }
    }
}

/// What `apply` and `check` learn about the record besides its bytes. The library fills it:
/// fields may be added at its end.
#[repr(C)]
#[derive(Debug)]
pub struct pc_apply_context {
    /// The entity the record belongs to.
    pub entity: pc_entity_view,
    /// The record's sequence number in the entity's log (for `check`: the one it will get).
    pub seq: u64,
    /// `PC_ORIGIN_*`.
    pub origin: pc_origin,
}

/// The C constant of an origin; one this build does not name answers `PC_ORIGIN_UNKNOWN`,
/// never `PC_ORIGIN_LIVE` (which would invite side effects for a replayed record).
pub(crate) fn origin(o: Origin) -> pc_origin {
    match o {
        Origin::Replay => PC_ORIGIN_REPLAY,
        Origin::Deferred => PC_ORIGIN_DEFERRED,
        Origin::Repair => PC_ORIGIN_REPAIR,
        Origin::Live => PC_ORIGIN_LIVE,
        _ => PC_ORIGIN_UNKNOWN,
    }
}

/// What `apply` and `check` are told about a record.
pub(crate) fn context(ctx: &ApplyContext<'_>) -> pc_apply_context {
    pc_apply_context {
        entity: pc_entity_view::of(ctx.entity),
        seq: ctx.seq,
        origin: origin(ctx.origin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every origin this build knows has its own constant; none is reported as another.
    #[test]
    fn every_known_origin_has_its_own_constant() {
        let all = [
            Origin::Replay,
            Origin::Deferred,
            Origin::Repair,
            Origin::Live,
        ];
        let codes: std::collections::HashSet<_> = all.iter().map(|o| origin(*o)).collect();
        assert_eq!(codes.len(), all.len());
        assert!(!codes.contains(&PC_ORIGIN_UNKNOWN));
    }
}
