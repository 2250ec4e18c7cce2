//! The reserved rows of an entity log inside an entity partition.
//!
//! Every key starts with [`RESERVED_KEY_PREFIX`](crate::entity::RESERVED_KEY_PREFIX) (`0x00`),
//! followed by `log.` so that other reserved rows (leases, deferred work) can never fall inside
//! a log range:
//!
//! | key | value |
//! | --- | --- |
//! | `\0log.head` | [`LogHead`](super::LogHead): next seq, first retained seq, digests, checkpoint mark |
//! | `\0log.rec` + seq (8 bytes, big-endian) | one record: version, digest (8 bytes LE), payload |
//! | `\0log.ckpt` | the newest [`Checkpoint`](super::Checkpoint) |
//!
//! Big-endian sequence numbers make key order equal sequence order, so a scan pages history
//! in order.

use crate::store::KeyRange;

const HEAD: &[u8] = b"\0log.head";
const RECORD_PREFIX: &[u8] = b"\0log.rec";
const CHECKPOINT: &[u8] = b"\0log.ckpt";
const LOG_PREFIX: &[u8] = b"\0log.";

/// The head row's key.
pub fn head_key() -> Vec<u8> {
    HEAD.to_vec()
}

/// The checkpoint row's key.
pub fn checkpoint_key() -> Vec<u8> {
    CHECKPOINT.to_vec()
}

/// The key of record `seq`.
///
/// ```
/// use portcullis::log::keys;
/// assert!(keys::record_key(1) < keys::record_key(256));
/// assert_eq!(keys::record_seq(&keys::record_key(7)), Some(7));
/// ```
pub fn record_key(seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(RECORD_PREFIX.len() + 8);
    key.extend_from_slice(RECORD_PREFIX);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// The sequence number a record key names, if it is a well-formed record key.
pub fn record_seq(key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(RECORD_PREFIX)?;
    Some(u64::from_be_bytes(rest.try_into().ok()?))
}

/// Every record row with `from <= seq < to`.
pub fn record_range(from: u64, to: u64) -> KeyRange {
    KeyRange::between(record_key(from), record_key(to))
}

/// Every record row with `seq >= from`, including any malformed key under the record prefix
/// (so that corruption is seen, not skipped).
pub fn records_from(from: u64) -> KeyRange {
    let mut range = KeyRange::prefix(RECORD_PREFIX);
    range.start = std::ops::Bound::Included(record_key(from));
    range
}

/// Whether `key` is one of the rows this module owns (callers' extra operations may not touch
/// them).
pub fn is_log_key(key: &[u8]) -> bool {
    key.starts_with(LOG_PREFIX)
}

/// Whether any key in `range` could be one of the rows this module owns.
pub fn overlaps_log(range: &KeyRange) -> bool {
    use std::ops::Bound;
    let log = KeyRange::prefix(LOG_PREFIX);
    let (Bound::Included(log_start), Bound::Excluded(log_end)) = (&log.start, &log.end) else {
        return true;
    };
    let starts_before_log_end = match &range.start {
        Bound::Included(s) | Bound::Excluded(s) => s < log_end,
        Bound::Unbounded => true,
    };
    let ends_after_log_start = match &range.end {
        Bound::Included(e) => e >= log_start,
        Bound::Excluded(e) => e > log_start,
        Bound::Unbounded => true,
    };
    !range.is_empty() && starts_before_log_end && ends_after_log_start
}
