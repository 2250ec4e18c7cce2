//! Reserved rows restore owns inside an entity partition (next to the log's `\0log.` rows).
//!
//! | key | value |
//! | --- | --- |
//! | `\0entity` | registration marker: the incarnation that registered the entity |
//! | `\0defer.` + incarnation (8 bytes BE) + arrival (8 bytes BE) | one deferred record (SPEC R8) |
//! | `\0repair` | the last unclean incarnation this entity was repaired for (SPEC R3) |

use crate::store::KeyRange;

const ENTITY: &[u8] = b"\0entity";
const DEFER_PREFIX: &[u8] = b"\0defer.";
const REPAIR: &[u8] = b"\0repair";

/// The registration marker's key.
pub fn entity_key() -> Vec<u8> {
    ENTITY.to_vec()
}

/// The repair row's key.
pub fn repair_key() -> Vec<u8> {
    REPAIR.to_vec()
}

/// The key of a deferred record; key order is arrival order across incarnations.
pub fn deferred_key(incarnation: u64, arrival: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(DEFER_PREFIX.len() + 16);
    key.extend_from_slice(DEFER_PREFIX);
    key.extend_from_slice(&incarnation.to_be_bytes());
    key.extend_from_slice(&arrival.to_be_bytes());
    key
}

/// The marker of an idempotent deferral's id (SPEC R8): present once a deferral with this id
/// was accepted. Outside the deferred rows' range (`-`, not `.`).
pub fn defer_id_key(id: &[u8]) -> Vec<u8> {
    let mut key = b"\0defer-id.".to_vec();
    key.extend_from_slice(id);
    key
}

/// Every deferred row.
pub fn deferred_range() -> KeyRange {
    KeyRange::prefix(DEFER_PREFIX)
}
