//! Record bodies: encoding a batch or a base (whole or in parts) into the bytes a frame
//! carries, and decoding them back. Pure functions: no I/O.
//!
//! May call: the frame-level items of [`super`] (locations, record kinds) only.

use std::ops::Bound;

use super::{Loc, RecordKind, ValueLoc};
use crate::error::{Error, Result};
use crate::store::types::{KeyRange, Op};

/// A batch operation as journaled: values stay in the body, located by offset. Keys are
/// borrowed from the body's bytes: a chain walk copies each one straight into its index's arena,
/// so decoding allocates nothing per key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalOp<'a> {
    /// Key, and the value's offset and length within the body.
    Put(&'a [u8], u32, u32),
    Delete(&'a [u8]),
    /// Owned: rare, and its bounds are kept by the index operation that applies it.
    DeleteRange(KeyRange),
}

/// A decoded record body, collected by [`decode_body`]: the tests' view of what
/// [`visit_body`] hands over. Its name and batch keys are borrowed from the body's bytes.
#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Body<'a> {
    pub partition: &'a [u8],
    pub prev: Loc,
    pub content: Content<'a>,
}

#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content<'a> {
    Batch(Vec<JournalOp<'a>>),
    Base(Vec<(Vec<u8>, ValueLoc)>),
    /// Part `part` (from 0) of `parts` of a split base.
    BasePart {
        part: u32,
        parts: u32,
        entries: Vec<(Vec<u8>, ValueLoc)>,
    },
    /// Values with no keys (a packed base after them names each).
    Values,
}

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_DELETE_RANGE: u8 = 3;

/// The exact length of the body [`encode_batch_body`] makes: keys and values plus the framing
/// of every operation, a `DeleteRange` included. Computed without encoding, so a batch whose
/// record would exceed [`MAX_BODY_LEN`](super::MAX_BODY_LEN) is refused before anything is
/// built or written.
pub fn batch_body_len(partition: &[u8], ops: &[Op]) -> usize {
    let mut size = 1 + partition.len() + 8 + 4;
    for op in ops {
        size += match op {
            Op::Put(k, v) => 1 + 2 + k.len() + 4 + v.len(),
            Op::Delete(k) => 1 + 2 + k.len(),
            Op::DeleteRange(r) => 1 + bound_size(&r.start) + bound_size(&r.end),
        };
    }
    size
}

/// Encodes a batch body. Returns the body and, per Put op in order, the value's offset in it.
pub fn encode_batch_body(partition: &[u8], prev: Loc, ops: &[Op]) -> (Vec<u8>, Vec<u32>) {
    let mut b = Vec::with_capacity(batch_body_len(partition, ops));
    put_name(&mut b, partition, prev);
    b.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    let mut value_offsets = Vec::new();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                b.push(OP_PUT);
                put_key(&mut b, k);
                b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                value_offsets.push(b.len() as u32);
                b.extend_from_slice(v);
            }
            Op::Delete(k) => {
                b.push(OP_DELETE);
                put_key(&mut b, k);
            }
            Op::DeleteRange(r) => {
                b.push(OP_DELETE_RANGE);
                put_bound(&mut b, &r.start);
                put_bound(&mut b, &r.end);
            }
        }
    }
    (b, value_offsets)
}

/// Bytes one index entry takes in a base body.
pub fn base_entry_len(key: &[u8]) -> usize {
    2 + key.len() + 16
}

/// Bytes of a base body before its entries (a part's adds 8 for its place in the run).
pub fn base_head_len(partition: &[u8]) -> usize {
    1 + partition.len() + 8 + 4
}

/// Encodes a base body: the partition's whole index.
pub fn encode_base_body<'a>(
    partition: &[u8],
    prev: Loc,
    entries: impl ExactSizeIterator<Item = (&'a [u8], &'a ValueLoc)>,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + partition.len() + entries.len() * 40);
    put_name(&mut b, partition, prev);
    put_entries(&mut b, entries);
    b
}

/// Encodes part `part` of `parts` of a split base: a slice of the index, in key order.
pub fn encode_base_part_body<'a>(
    partition: &[u8],
    prev: Loc,
    part: u32,
    parts: u32,
    entries: impl ExactSizeIterator<Item = (&'a [u8], &'a ValueLoc)>,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(24 + partition.len() + entries.len() * 40);
    put_name(&mut b, partition, prev);
    b.extend_from_slice(&part.to_le_bytes());
    b.extend_from_slice(&parts.to_le_bytes());
    put_entries(&mut b, entries);
    b
}

fn put_entries<'a>(
    b: &mut Vec<u8>,
    entries: impl ExactSizeIterator<Item = (&'a [u8], &'a ValueLoc)>,
) {
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (k, v) in entries {
        put_key(b, k);
        b.extend_from_slice(&v.at.to_le_bytes());
        b.extend_from_slice(&v.len.to_le_bytes());
        b.extend_from_slice(&v.crc.to_le_bytes());
    }
}

fn put_name(b: &mut Vec<u8>, partition: &[u8], prev: Loc) {
    b.push(partition.len() as u8);
    b.extend_from_slice(partition);
    b.extend_from_slice(&prev.to_le_bytes());
}

fn put_key(b: &mut Vec<u8>, k: &[u8]) {
    b.extend_from_slice(&(k.len() as u16).to_le_bytes());
    b.extend_from_slice(k);
}

fn bound_size(bound: &Bound<Vec<u8>>) -> usize {
    match bound {
        Bound::Included(k) | Bound::Excluded(k) => 3 + k.len(),
        Bound::Unbounded => 1,
    }
}

fn put_bound(b: &mut Vec<u8>, bound: &Bound<Vec<u8>>) {
    match bound {
        Bound::Included(k) => {
            b.push(1);
            put_key(b, k);
        }
        Bound::Excluded(k) => {
            b.push(2);
            put_key(b, k);
        }
        Bound::Unbounded => b.push(0),
    }
}

/// A cursor over body bytes that never panics and never over-allocates: every length is
/// checked against what remains before it is used.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    #[cfg(test)]
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn key(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
    fn bound(&mut self) -> Option<Bound<Vec<u8>>> {
        match self.u8()? {
            0 => Some(Bound::Unbounded),
            1 => Some(Bound::Included(self.key()?.to_vec())),
            2 => Some(Bound::Excluded(self.key()?.to_vec())),
            _ => None,
        }
    }
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }
    /// An unsigned LEB128 varint of at most 10 bytes.
    pub(super) fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                // The tenth byte holds only the top bit.
                return (i < 9 || b <= 1).then_some(v);
            }
        }
        None
    }
}

/// The most bytes [`decode_body_head`] reads: the name's length (1), the name (at most 255) and
/// the previous-record location (8).
pub const BODY_HEAD_MAX: usize = 1 + 255 + 8;

/// Reads only the partition name and the previous-record location of a body.
pub fn decode_body_head(body: &[u8]) -> Option<(&[u8], Loc)> {
    let mut r = Reader { bytes: body, at: 0 };
    let n = r.u8()? as usize;
    let name = r.take(n)?;
    let prev = r.u64()?;
    Some((name, prev))
}

/// Reads the place of a base part in its run: (part, parts). `None` if malformed.
pub fn decode_base_part_head(body: &[u8]) -> Option<(u32, u32)> {
    let mut r = Reader { bytes: body, at: 0 };
    let n = r.u8()? as usize;
    r.take(n)?;
    r.u64()?;
    let part = r.u32()?;
    let parts = r.u32()?;
    (part < parts).then_some((part, parts))
}

/// One piece of a body's content, as [`visit_body`] decodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item<'a, 'k> {
    /// A batch's operation, its keys borrowed from the body.
    Op(JournalOp<'a>),
    /// A base's (or base part's) size, before its entries: how many there are and the bytes
    /// of their keys, so an index can make room for all of them at once (a hint: never more
    /// than a few times the body's bytes).
    Entries { count: usize, key_bytes: usize },
    /// One entry of a base, in key order. A packed base lends its key from a buffer of the
    /// decoder's, valid only for the call.
    Entry(&'k [u8], ValueLoc),
}

/// The parts of a body outside its operations or entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyHead<'a> {
    pub partition: &'a [u8],
    pub prev: Loc,
    /// A base part's place in its run: (part, parts).
    pub place: Option<(u32, u32)>,
}

/// Decodes a whole body into lists, through [`visit_body`]. Fails (never panics) on any
/// malformed input.
#[cfg(test)]
pub fn decode_body(kind: RecordKind, body: &[u8]) -> Result<Body<'_>> {
    let (mut ops, mut entries) = (Vec::new(), Vec::new());
    let head = visit_body(kind, body, |item| match item {
        Item::Op(op) => ops.push(op),
        Item::Entries { count, .. } => entries.reserve_exact(count),
        Item::Entry(k, v) => entries.push((k.to_vec(), v)),
    })?;
    let content = match (kind, head.place) {
        (RecordKind::Batch, _) => Content::Batch(ops),
        (RecordKind::Values, _) => Content::Values,
        (_, Some((part, parts))) => Content::BasePart {
            part,
            parts,
            entries,
        },
        (_, None) => Content::Base(entries),
    };
    Ok(Body {
        partition: head.partition,
        prev: head.prev,
        content,
    })
}

/// Decodes a body, handing each operation or entry to `visit` as it is decoded, so a chain
/// walk applies a record to its index without collecting it first. Fails (never panics) on
/// any malformed input; `visit` may then have seen the items before the fault, so a caller
/// drops what it built from them.
pub fn visit_body<'a>(
    kind: RecordKind,
    body: &'a [u8],
    mut visit: impl FnMut(Item<'a, '_>),
) -> Result<BodyHead<'a>> {
    visit_body_inner(kind, body, &mut visit)
        .ok_or_else(|| Error::corrupt("journal record", "malformed record body"))
}

fn visit_body_inner<'a>(
    kind: RecordKind,
    body: &'a [u8],
    visit: &mut impl FnMut(Item<'a, '_>),
) -> Option<BodyHead<'a>> {
    let mut r = Reader { bytes: body, at: 0 };
    let n = r.u8()? as usize;
    let partition = r.take(n)?;
    let prev = r.u64()?;
    let place = match kind {
        RecordKind::BasePart | RecordKind::PackedBasePart => {
            let part = r.u32()?;
            let parts = r.u32()?;
            if part >= parts {
                return None;
            }
            Some((part, parts))
        }
        _ => None,
    };
    match kind {
        // Values after the head: nothing to hand over.
        RecordKind::Values => {
            return Some(BodyHead {
                partition,
                prev,
                place,
            });
        }
        RecordKind::PackedBase | RecordKind::PackedBasePart => {
            super::packed::visit_packed_entries(&mut r, visit)?;
            return (r.remaining() == 0).then_some(BodyHead {
                partition,
                prev,
                place,
            });
        }
        _ => {}
    }
    let count = r.u32()? as usize;
    match kind {
        RecordKind::Batch => {
            // Each op takes at least 2 bytes, so a count beyond that is a lie.
            if count > r.remaining() / 2 {
                return None;
            }
            for _ in 0..count {
                visit(Item::Op(match r.u8()? {
                    OP_PUT => {
                        let k = r.key()?;
                        let len = r.u32()?;
                        let at = r.at as u32;
                        r.take(len as usize)?;
                        JournalOp::Put(k, at, len)
                    }
                    OP_DELETE => JournalOp::Delete(r.key()?),
                    OP_DELETE_RANGE => {
                        let start = r.bound()?;
                        let end = r.bound()?;
                        JournalOp::DeleteRange(KeyRange { start, end })
                    }
                    _ => return None,
                }));
            }
        }
        _ => {
            // A version 2 base or base part. Each entry takes 18 bytes besides its key: what
            // remains beyond that is exactly the keys' bytes, unless the body is malformed
            // (then it is refused below).
            let framing = count.checked_mul(18)?;
            if framing > r.remaining() {
                return None;
            }
            visit(Item::Entries {
                count,
                key_bytes: r.remaining() - framing,
            });
            for _ in 0..count {
                let k = r.key()?;
                let at = r.u64()?;
                let len = r.u32()?;
                let crc = r.u32()?;
                visit(Item::Entry(k, ValueLoc { at, len, crc }));
            }
        }
    }
    if r.remaining() != 0 {
        return None;
    }
    Some(BodyHead {
        partition,
        prev,
        place,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{decode_frame, loc};
    use super::*;

    #[test]
    fn bodies_round_trip() {
        let ops = vec![
            Op::Put(b"k".to_vec(), b"value".to_vec()),
            Op::Delete(b"d".to_vec()),
            Op::DeleteRange(KeyRange::between(b"a".to_vec(), b"b".to_vec())),
            Op::DeleteRange(KeyRange::all()),
        ];
        let (body, offsets) = encode_batch_body(b"part", loc(3, 100), &ops);
        assert_eq!(
            body.len(),
            batch_body_len(b"part", &ops),
            "every op is counted"
        );
        let decoded = decode_body(RecordKind::Batch, &body).unwrap();
        assert_eq!(decoded.partition, b"part");
        assert_eq!(decoded.prev, loc(3, 100));
        let Content::Batch(jops) = decoded.content else {
            panic!()
        };
        assert_eq!(jops[0], JournalOp::Put(b"k", offsets[0], 5));
        assert_eq!(
            &body[offsets[0] as usize..offsets[0] as usize + 5],
            b"value"
        );
        assert_eq!(jops.len(), 4);
        // Every truncation of a valid body is refused without panicking.
        for cut in 0..body.len() {
            assert!(decode_body(RecordKind::Batch, &body[..cut]).is_err());
        }
    }

    #[test]
    fn base_parts_round_trip() {
        let v = ValueLoc {
            at: loc(2, 40),
            len: 3,
            crc: 9,
        };
        let keys = [b"a".to_vec(), b"b".to_vec()];
        let entries = keys.iter().map(|k| (k.as_slice(), &v));
        let body = encode_base_part_body(b"part", loc(1, 32), 1, 3, entries);
        assert_eq!(
            body.len(),
            base_head_len(b"part") + 8 + base_entry_len(b"a") + base_entry_len(b"b")
        );
        assert_eq!(decode_base_part_head(&body), Some((1, 3)));
        let decoded = decode_body(RecordKind::BasePart, &body).unwrap();
        assert_eq!(decoded.prev, loc(1, 32));
        assert_eq!(
            decoded.content,
            Content::BasePart {
                part: 1,
                parts: 3,
                entries: vec![(b"a".to_vec(), v), (b"b".to_vec(), v)],
            }
        );
        // A part outside its run is malformed.
        let bad = encode_base_part_body(b"part", 0, 3, 3, std::iter::empty());
        assert!(decode_body(RecordKind::BasePart, &bad).is_err());
        assert_eq!(decode_base_part_head(&bad), None);
        for cut in 0..body.len() {
            assert!(decode_body(RecordKind::BasePart, &body[..cut]).is_err());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 1;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            for kind in RecordKind::ALL {
                let _ = decode_body(kind, &bytes);
            }
            let _ = decode_base_part_head(&bytes);
            let _ = decode_frame(1, &bytes);
        }
    }
}
