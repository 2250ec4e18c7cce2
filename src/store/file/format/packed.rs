//! The record bodies format version 3 added: *packed* bases, whose entries share key prefixes
//! and store each location as its distance from where the previous value ended, and *values*
//! records, compaction's copies of a partition's values with no keys (its base, written right
//! after them, names each one). Pure functions: no I/O.
//!
//! A packed base body (whole, or one part of a run) is the name, the chain link and, for a
//! part, its place in the run, as in a base of version 2, then:
//!
//! | field      | bytes  | meaning                                                       |
//! |------------|--------|---------------------------------------------------------------|
//! | count      | 4      | entries                                                       |
//! | key bytes  | 4      | bytes of every key together (an index makes room at once)     |
//! | entries    |        | each: shared (varint), suffix length (varint), suffix, location (zigzag varint of its distance from the end of the previous entry's value, from 0 for the first), value length (varint), value crc32c (4) |
//!
//! A base's entries come in key order and a partition's values lie in runs (compaction copies
//! them together, in key order), so a log's entry of a 16-byte key takes about 10 bytes here
//! against 34 in a version 2 base.
//!
//! A values record body is the name and the chain link, then values end to end. It carries
//! nothing for a chain walk: a walk passes over it to the record before, as over a base run
//! cut short (the base after it is what points at its values).
//!
//! May call: the body reader of [`super::body`] only.

use super::body::{Item, Reader};
use super::{Loc, ValueLoc};
use crate::store::MAX_KEY_BYTES;

/// The most bytes one packed entry takes besides its key's: two varints of at most 2 bytes
/// (shared and suffix lengths, both at most [`MAX_KEY_BYTES`]), a location of at most 10, a
/// length of at most 5, and the checksum.
pub const PACKED_ENTRY_FRAMING: usize = 2 + 2 + 10 + 5 + 4;

/// An upper bound of the bytes one entry takes in a packed base (its key shares nothing).
pub fn packed_entry_max(key: &[u8]) -> usize {
    key.len() + PACKED_ENTRY_FRAMING
}

/// Bytes of a packed base body before its entries (a part's adds 8 for its place in the run).
pub fn packed_head_len(partition: &[u8]) -> usize {
    1 + partition.len() + 8 + 8
}

/// Encodes a packed base body: the partition's whole index, or (with `place`: part, parts) a
/// slice of it in key order.
pub fn encode_packed_base_body<'a>(
    partition: &[u8],
    prev: Loc,
    place: Option<(u32, u32)>,
    entries: impl ExactSizeIterator<Item = (&'a [u8], &'a ValueLoc)>,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(32 + partition.len() + entries.len() * 12);
    b.push(partition.len() as u8);
    b.extend_from_slice(partition);
    b.extend_from_slice(&prev.to_le_bytes());
    if let Some((part, parts)) = place {
        b.extend_from_slice(&part.to_le_bytes());
        b.extend_from_slice(&parts.to_le_bytes());
    }
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    let key_bytes_at = b.len();
    b.extend_from_slice(&[0; 4]);
    let (mut key_bytes, mut last, mut end): (u64, &[u8], u64) = (0, &[], 0);
    for (k, v) in entries {
        let shared = k.iter().zip(last).take_while(|(a, b)| a == b).count();
        put_varint(&mut b, shared as u64);
        put_varint(&mut b, (k.len() - shared) as u64);
        b.extend_from_slice(&k[shared..]);
        put_varint(&mut b, zigzag(v.at.wrapping_sub(end) as i64));
        put_varint(&mut b, v.len as u64);
        b.extend_from_slice(&v.crc.to_le_bytes());
        key_bytes += k.len() as u64;
        (last, end) = (k, v.at.wrapping_add(v.len as u64));
    }
    b[key_bytes_at..key_bytes_at + 4].copy_from_slice(&(key_bytes as u32).to_le_bytes());
    b
}

/// Bytes of a values record body before its values.
pub fn values_head_len(partition: &[u8]) -> usize {
    1 + partition.len() + 8
}

/// Encodes a values record: `values` end to end after the name and the chain link. The first
/// value starts [`values_head_len`] bytes into the body.
pub fn encode_values_body<'a>(
    partition: &[u8],
    prev: Loc,
    values: impl Iterator<Item = &'a [u8]>,
    len: usize,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(values_head_len(partition) + len);
    b.push(partition.len() as u8);
    b.extend_from_slice(partition);
    b.extend_from_slice(&prev.to_le_bytes());
    for v in values {
        b.extend_from_slice(v);
    }
    b
}

/// Decodes the entries of a packed base after its head, handing each to `visit` (its key in a
/// buffer of the decoder's, so keys are copied once more than a version 2 base's). `None` on
/// anything malformed; never panics, and never makes room for more than the body can hold.
pub(super) fn visit_packed_entries<'a>(
    r: &mut Reader<'a>,
    visit: &mut impl FnMut(Item<'a, '_>),
) -> Option<()> {
    let count = r.u32()? as usize;
    let key_bytes = r.u32()? as usize;
    // Each entry takes at least 8 bytes (three one-byte varints, no suffix, the checksum) and
    // holds a key of at most MAX_KEY_BYTES: a count or a total beyond that is a lie.
    if count > r.remaining() / 8 || key_bytes > count.saturating_mul(MAX_KEY_BYTES) {
        return None;
    }
    // Room is a hint: never more than a few times the body, whatever the header says.
    visit(Item::Entries {
        count,
        key_bytes: key_bytes.min(r.remaining().saturating_mul(4)),
    });
    let mut key: Vec<u8> = Vec::new();
    let (mut total, mut end) = (0usize, 0u64);
    for _ in 0..count {
        let shared = usize::try_from(r.varint()?).ok()?;
        let suffix = usize::try_from(r.varint()?).ok()?;
        if shared > key.len() || shared.checked_add(suffix)? > MAX_KEY_BYTES {
            return None;
        }
        key.truncate(shared);
        key.extend_from_slice(r.take(suffix)?);
        let at = end.wrapping_add(unzigzag(r.varint()?) as u64);
        let len = u32::try_from(r.varint()?).ok()?;
        let crc = r.u32()?;
        total += key.len();
        end = at.wrapping_add(len as u64);
        visit(Item::Entry(&key, ValueLoc { at, len, crc }));
    }
    (total == key_bytes).then_some(())
}

fn put_varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::super::body::{Content, decode_body};
    use super::super::{RecordKind, loc};
    use super::*;

    fn entries() -> Vec<(Vec<u8>, ValueLoc)> {
        let mut at = loc(7, 4096);
        let mut out = Vec::new();
        for seq in [1u64, 2, 3, 255, 256, 70_000] {
            let mut k = b"\0log.rec".to_vec();
            k.extend_from_slice(&seq.to_be_bytes());
            out.push((
                k,
                ValueLoc {
                    at,
                    len: 209,
                    crc: seq as u32,
                },
            ));
            at += 209;
        }
        // A value before the previous one, in another segment, and an empty one.
        out.push((
            b"\0log.z".to_vec(),
            ValueLoc {
                at: loc(2, 40),
                len: 0,
                crc: 1,
            },
        ));
        out.push((
            b"z".repeat(1024),
            ValueLoc {
                at: loc(9, 1 << 39),
                len: u32::MAX,
                crc: 2,
            },
        ));
        out
    }

    #[test]
    fn packed_bases_round_trip_and_are_small() {
        let e = entries();
        let refs = e.iter().map(|(k, v)| (k.as_slice(), v));
        let body = encode_packed_base_body(b"e/logs/1", loc(3, 99), None, refs);
        let decoded = decode_body(RecordKind::PackedBase, &body).unwrap();
        assert_eq!(decoded.prev, loc(3, 99));
        assert_eq!(decoded.content, Content::Base(e.clone()));
        // The first log entry takes its whole key and location, each later one about 10
        // bytes (34 in a version 2 base).
        let logs = e[..6].iter().map(|(k, v)| (k.as_slice(), v));
        let small = encode_packed_base_body(b"e/logs/1", 0, None, logs);
        let entries = small.len() - packed_head_len(b"e/logs/1");
        assert!(entries <= (16 + 15) + 5 * 12, "{entries}");
        // A part says where it lies in its run.
        let refs = e.iter().map(|(k, v)| (k.as_slice(), v));
        let body = encode_packed_base_body(b"p", 0, Some((1, 4)), refs);
        let decoded = decode_body(RecordKind::PackedBasePart, &body).unwrap();
        assert_eq!(
            decoded.content,
            Content::BasePart {
                part: 1,
                parts: 4,
                entries: e
            }
        );
        for cut in 0..body.len() {
            assert!(decode_body(RecordKind::PackedBasePart, &body[..cut]).is_err());
        }
    }

    #[test]
    fn a_packed_base_that_lies_is_refused() {
        let e = entries();
        let refs = e.iter().map(|(k, v)| (k.as_slice(), v));
        let body = encode_packed_base_body(b"p", 0, None, refs);
        let head = 1 + 1 + 8;
        // Every byte of the counts flipped in turn: refused, never a panic or a huge room.
        for i in head..head + 8 {
            let mut bad = body.clone();
            bad[i] ^= 0xff;
            assert!(
                decode_body(RecordKind::PackedBase, &bad).is_err(),
                "byte {i}"
            );
        }
        // A key sharing more than the key before it had.
        let k = [(b"a".as_slice(), &e[0].1)];
        let mut bad = encode_packed_base_body(b"p", 0, None, k.into_iter());
        bad[head + 8] = 5;
        assert!(decode_body(RecordKind::PackedBase, &bad).is_err());
    }

    #[test]
    fn values_records_hold_their_values_after_the_head() {
        let values = [b"one".as_slice(), b"", b"three"];
        let body = encode_values_body(b"p", loc(1, 50), values.into_iter(), 8);
        assert_eq!(&body[values_head_len(b"p")..], b"onethree");
        let decoded = decode_body(RecordKind::Values, &body).unwrap();
        assert_eq!((decoded.partition, decoded.prev), (&b"p"[..], loc(1, 50)));
        assert_eq!(decoded.content, Content::Values);
        assert!(decode_body(RecordKind::Values, &body[..values_head_len(b"p") - 1]).is_err());
    }

    #[test]
    fn varints_and_zigzag_round_trip() {
        for v in [0i64, 1, -1, 63, -64, 64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
            let mut b = Vec::new();
            put_varint(&mut b, zigzag(v));
            let mut r = Reader::new(&b);
            assert_eq!(r.varint(), Some(zigzag(v)));
            assert_eq!(r.remaining(), 0);
        }
        // Eleven continuation bytes are not a varint.
        let mut r = Reader::new(&[0x80; 11]);
        assert_eq!(r.varint(), None);
    }
}
