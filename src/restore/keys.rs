//! Reserved rows restore owns inside an entity partition (next to the log's `\0log.` rows).
//!
//! | key | value |
//! | --- | --- |
//! | `\0entity` | registration marker: the incarnation that registered the entity |
//! | `\0defer.` + `0x01` + term (8 bytes BE) + arrival (8 bytes BE) | one deferred record (SPEC R8) |
//! | `\0repair` | the last unclean incarnation this entity was repaired for (SPEC R3) |
//! | `\0refused.` + the deferred row's key after `\0defer.` | a deferred record the state refused when the restore unit drained it: a version byte, then postcard of the reason, the sequence number it would have had, and the record (SPEC R8, R12) |
//!
//! A deferred row is keyed by the *term* of the namespace holding it was accepted under (the
//! owner row's term, one per adoption by any owner, increasing: SPEC F11) and the accepting
//! engine's arrival counter. One term belongs to one engine, so keys are unique across owners
//! sharing a store, and key order is acceptance order across hand-overs: a new owner's term
//! begins after the old owner's last accepted row (after revocation completed, or after it
//! released the namespace).
//!
//! Rows of the earlier format, `\0defer.` + incarnation (8 bytes BE) + arrival (8 bytes BE),
//! stay readable: they fall in the same range, and since an incarnation number's first byte
//! is `0x00` (below 2^56) they sort before every row of the current format, which were all
//! accepted after them. The drain moves both kinds into the log alike.

use crate::store::KeyRange;

const ENTITY: &[u8] = b"\0entity";
const DEFER_PREFIX: &[u8] = b"\0defer.";
const REPAIR: &[u8] = b"\0repair";
const REFUSED_PREFIX: &[u8] = b"\0refused.";

/// The registration marker's key.
pub fn entity_key() -> Vec<u8> {
    ENTITY.to_vec()
}

/// The repair row's key.
pub fn repair_key() -> Vec<u8> {
    REPAIR.to_vec()
}

/// The format tag of deferred rows keyed by namespace term (see the module docs).
const DEFER_BY_TERM: u8 = 0x01;

/// The key of a deferred record accepted under namespace term `term` as the accepting engine's
/// `arrival`-th deferral; key order is acceptance order across owners and hand-overs.
pub fn deferred_key(term: u64, arrival: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(DEFER_PREFIX.len() + 17);
    key.extend_from_slice(DEFER_PREFIX);
    key.push(DEFER_BY_TERM);
    key.extend_from_slice(&term.to_be_bytes());
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

/// The key a refused deferred record is set aside under: its deferred key with `\0refused.`
/// in place of `\0defer.`, so refused rows keep acceptance order.
pub fn refused_key(deferred: &[u8]) -> Vec<u8> {
    let tail = deferred.strip_prefix(DEFER_PREFIX).unwrap_or(deferred);
    let mut key = Vec::with_capacity(REFUSED_PREFIX.len() + tail.len());
    key.extend_from_slice(REFUSED_PREFIX);
    key.extend_from_slice(tail);
    key
}

/// Every refused deferred row.
pub fn refused_range() -> KeyRange {
    KeyRange::prefix(REFUSED_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_rows_keep_the_deferred_order_outside_the_deferred_range() {
        let (a, b) = (deferred_key(1, 9), deferred_key(2, 0));
        let (ra, rb) = (refused_key(&a), refused_key(&b));
        assert!(ra < rb);
        assert!(refused_range().contains(&ra) && !deferred_range().contains(&ra));
        assert!(!refused_range().contains(&a));
    }
}
