//! The on-disk encoding of journal segments and records. Pure functions: no I/O.
//!
//! Every file starts with magic and format version, checked by a preamble checksum that no
//! version may move, so the version is read before anything a version could change (S10).
//! Segment header (32 bytes): preamble (magic, format version, its checksum), segment number,
//! salt, header checksum.
//! Record frame (37 bytes) then body:
//!
//! | field          | bytes | meaning                                                     |
//! |----------------|-------|-------------------------------------------------------------|
//! | header_crc     | 4     | crc32c of the salt and the next 33 bytes                    |
//! | body_len       | 4     | bytes of body that follow (never 0)                         |
//! | kind           | 1     | [`RecordKind`]                                              |
//! | lsn            | 8     | journal sequence number, consecutive across segments        |
//! | partition_hash | 8     | FNV-1a of the partition name, to attribute damaged bodies   |
//! | synced_lsn     | 8     | newest lsn known durable when this record was framed        |
//! | body_crc       | 4     | crc32c of the body                                          |
//!
//! The header checksum is seeded with the segment's random salt, so stale bytes of an older
//! file never validate, and an all-zero frame is invalid (its length is 0).

use std::ops::Bound;

use super::super::types::{KeyRange, Op};
use crate::error::{Error, Result};

/// The format version this build writes and the newest it reads (SPEC S10). Version 1 files
/// (no preamble check, no persisted damage) are still read.
pub const FORMAT_VERSION: u32 = 2;
pub const SEGMENT_MAGIC: [u8; 8] = *b"PCLSSEG\x01";
pub const SEGMENT_HEADER_LEN: u64 = 32;
pub const FRAME_LEN: usize = 37;
/// No record body may exceed this (the largest batch plus framing of every op).
pub const MAX_BODY_LEN: usize = (64 << 20) + (16 << 20);
/// Every file from version 2 on starts with this preamble, whose layout no later version may
/// change: magic (8) | format version (4) | crc32c of those 12 bytes (4).
pub const PREAMBLE_LEN: usize = 16;

/// Reads a file's magic and format version before anything whose layout a version could
/// change, with one rule for every file (SPEC S10): a damaged magic or preamble is damage
/// (`Corrupt`); a newer version whose preamble checks out is `UnsupportedVersion`. Returns the
/// version (1 or [`FORMAT_VERSION`]). Version 1 files had no preamble check; their own header
/// checksum covers the version.
pub fn read_preamble(bytes: &[u8], magic: &[u8; 8], file: &str) -> Result<u32> {
    if bytes.len() < 12 || bytes[0..8] != magic[..] {
        return Err(Error::corrupt(
            file,
            "not a Portcullis file of this kind (bad magic)",
        ));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    if version == 1 {
        return Ok(1);
    }
    let check = bytes
        .get(12..16)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()));
    if check != Some(crc32c::crc32c(&bytes[0..12])) {
        return Err(Error::corrupt(
            file,
            "the format version field is damaged (preamble checksum mismatch)",
        ));
    }
    if version > FORMAT_VERSION {
        return Err(Error::UnsupportedVersion {
            file: file.to_owned(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if version == 0 {
        return Err(Error::corrupt(file, "format version 0 does not exist"));
    }
    Ok(version)
}

/// The preamble of a file of this build's version.
pub fn encode_preamble(magic: &[u8; 8]) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[0..8].copy_from_slice(magic);
    p[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let crc = crc32c::crc32c(&p[0..12]);
    p[12..16].copy_from_slice(&crc.to_le_bytes());
    p
}

/// Where a byte lives: segment number in the high 24 bits, offset in the low 40.
/// Zero means "nowhere" (segment numbers start at 1).
pub type Loc = u64;

pub fn loc(segment: u32, offset: u64) -> Loc {
    debug_assert!(segment < (1 << 24) && offset < (1 << 40));
    ((segment as u64) << 40) | offset
}

pub fn loc_segment(l: Loc) -> u32 {
    (l >> 40) as u32
}

pub fn loc_offset(l: Loc) -> u64 {
    l & ((1 << 40) - 1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// One committed batch of one partition.
    Batch = 1,
    /// A partition's complete key index; chain walks stop here.
    Base = 2,
    /// One of several records that together hold a partition's key index, when it is too large
    /// for one record: part `i` of `n`, written consecutively in the partition's chain. Only a
    /// complete run (the last part and every one before it) is a base; parts of a run cut short
    /// by a crash carry nothing and a chain walk passes over them.
    BasePart = 3,
}

impl RecordKind {
    fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(RecordKind::Batch),
            2 => Some(RecordKind::Base),
            3 => Some(RecordKind::BasePart),
            _ => None,
        }
    }
}

pub fn salt_seed(salt: u64) -> u32 {
    crc32c::crc32c(&salt.to_le_bytes())
}

/// Version 2 segment header: preamble (16) | segment number (4) | salt (8) | crc32c of the
/// 28 bytes before it (4).
pub fn encode_segment_header(segment: u32, salt: u64) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[0..16].copy_from_slice(&encode_preamble(&SEGMENT_MAGIC));
    h[16..20].copy_from_slice(&segment.to_le_bytes());
    h[20..28].copy_from_slice(&salt.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Decodes a segment header; returns (segment number, salt). Magic and version are read
/// first ([`read_preamble`]); a newer version is refused before anything else is read.
pub fn decode_segment_header(h: &[u8], file: &str) -> Result<(u32, u64)> {
    let version = read_preamble(h, &SEGMENT_MAGIC, file)?;
    if h.len() < SEGMENT_HEADER_LEN as usize {
        return Err(Error::corrupt(file, "segment header is short"));
    }
    // Version 1: magic | version | number (4) | salt (8) | crc of bytes 0..24 (4) | padding.
    let (number_at, salt_at, crc_at) = if version == 1 {
        (12, 16, 24)
    } else {
        (16, 20, 28)
    };
    let crc = u32::from_le_bytes(h[crc_at..crc_at + 4].try_into().unwrap());
    if crc != crc32c::crc32c(&h[0..crc_at]) {
        return Err(Error::corrupt(file, "segment header checksum mismatch"));
    }
    let segment = u32::from_le_bytes(h[number_at..number_at + 4].try_into().unwrap());
    let salt = u64::from_le_bytes(h[salt_at..salt_at + 8].try_into().unwrap());
    Ok((segment, salt))
}

/// FNV-1a, 64-bit: a stable hash of a partition name stored in every frame.
pub fn partition_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub body_len: u32,
    pub kind: RecordKind,
    pub lsn: u64,
    pub partition_hash: u64,
    pub synced_lsn: u64,
    pub body_crc: u32,
}

pub fn encode_frame(seed: u32, frame: &Frame) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    f[4..8].copy_from_slice(&frame.body_len.to_le_bytes());
    f[8] = frame.kind as u8;
    f[9..17].copy_from_slice(&frame.lsn.to_le_bytes());
    f[17..25].copy_from_slice(&frame.partition_hash.to_le_bytes());
    f[25..33].copy_from_slice(&frame.synced_lsn.to_le_bytes());
    f[33..37].copy_from_slice(&frame.body_crc.to_le_bytes());
    let crc = crc32c::crc32c_append(seed, &f[4..]);
    f[0..4].copy_from_slice(&crc.to_le_bytes());
    f
}

/// Decodes and verifies a frame header. `None` if it does not validate.
pub fn decode_frame(seed: u32, f: &[u8]) -> Option<Frame> {
    if f.len() < FRAME_LEN {
        return None;
    }
    let crc = u32::from_le_bytes(f[0..4].try_into().unwrap());
    if crc != crc32c::crc32c_append(seed, &f[4..FRAME_LEN]) {
        return None;
    }
    let body_len = u32::from_le_bytes(f[4..8].try_into().unwrap());
    if body_len == 0 || body_len as usize > MAX_BODY_LEN {
        return None;
    }
    Some(Frame {
        body_len,
        kind: RecordKind::from_u8(f[8])?,
        lsn: u64::from_le_bytes(f[9..17].try_into().unwrap()),
        partition_hash: u64::from_le_bytes(f[17..25].try_into().unwrap()),
        synced_lsn: u64::from_le_bytes(f[25..33].try_into().unwrap()),
        body_crc: u32::from_le_bytes(f[33..37].try_into().unwrap()),
    })
}

/// The body checksum. Unseeded, so it can be computed before the record's segment is known
/// (outside the append mutex); the salted header checksum already rejects stale frames.
pub fn body_crc(body: &[u8]) -> u32 {
    crc32c::crc32c(body)
}

/// Where a value's bytes live, with a checksum so on-demand reads are verified too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueLoc {
    pub at: Loc,
    pub len: u32,
    pub crc: u32,
}

/// A batch operation as journaled: values stay in the body, located by offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalOp {
    /// Key, and the value's offset and length within the body.
    Put(Vec<u8>, u32, u32),
    Delete(Vec<u8>),
    DeleteRange(KeyRange),
}

/// A decoded record body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Body {
    pub partition: Vec<u8>,
    pub prev: Loc,
    pub content: Content,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    Batch(Vec<JournalOp>),
    Base(Vec<(Vec<u8>, ValueLoc)>),
    /// Part `part` (from 0) of `parts` of a split base.
    BasePart {
        part: u32,
        parts: u32,
        entries: Vec<(Vec<u8>, ValueLoc)>,
    },
}

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_DELETE_RANGE: u8 = 3;

/// The exact length of the body [`encode_batch_body`] makes: keys and values plus the framing
/// of every operation, a `DeleteRange` included. Computed without encoding, so a batch whose
/// record would exceed [`MAX_BODY_LEN`] is refused before anything is built or written.
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
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
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
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn key(&mut self) -> Option<Vec<u8>> {
        let n = self.u16()? as usize;
        Some(self.take(n)?.to_vec())
    }
    fn bound(&mut self) -> Option<Bound<Vec<u8>>> {
        match self.u8()? {
            0 => Some(Bound::Unbounded),
            1 => Some(Bound::Included(self.key()?)),
            2 => Some(Bound::Excluded(self.key()?)),
            _ => None,
        }
    }
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
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

/// Decodes a whole body. Fails (never panics) on any malformed input.
pub fn decode_body(kind: RecordKind, body: &[u8]) -> Result<Body> {
    decode_body_inner(kind, body)
        .ok_or_else(|| Error::corrupt("journal record", "malformed record body"))
}

fn decode_body_inner(kind: RecordKind, body: &[u8]) -> Option<Body> {
    let mut r = Reader { bytes: body, at: 0 };
    let n = r.u8()? as usize;
    let partition = r.take(n)?.to_vec();
    let prev = r.u64()?;
    let place = match kind {
        RecordKind::BasePart => {
            let part = r.u32()?;
            let parts = r.u32()?;
            if part >= parts {
                return None;
            }
            Some((part, parts))
        }
        _ => None,
    };
    let count = r.u32()? as usize;
    let content = match kind {
        RecordKind::Batch => {
            // Each op takes at least 2 bytes, so a count beyond that is a lie: refuse before
            // allocating for it.
            if count > r.remaining() / 2 {
                return None;
            }
            let mut ops = Vec::with_capacity(count);
            for _ in 0..count {
                ops.push(match r.u8()? {
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
                });
            }
            Content::Batch(ops)
        }
        RecordKind::Base | RecordKind::BasePart => {
            if count > r.remaining() / 18 {
                return None;
            }
            let mut entries = Vec::with_capacity(count);
            for _ in 0..count {
                let k = r.key()?;
                let at = r.u64()?;
                let len = r.u32()?;
                let crc = r.u32()?;
                entries.push((k, ValueLoc { at, len, crc }));
            }
            match place {
                Some((part, parts)) => Content::BasePart {
                    part,
                    parts,
                    entries,
                },
                None => Content::Base(entries),
            }
        }
    };
    if r.remaining() != 0 {
        return None;
    }
    Some(Body {
        partition,
        prev,
        content,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_reject_damage() {
        let seed = salt_seed(42);
        let frame = Frame {
            body_len: 10,
            kind: RecordKind::Batch,
            lsn: 7,
            partition_hash: 99,
            synced_lsn: 5,
            body_crc: 1234,
        };
        let bytes = encode_frame(seed, &frame);
        assert_eq!(decode_frame(seed, &bytes), Some(frame));
        assert_eq!(
            decode_frame(salt_seed(43), &bytes),
            None,
            "another salt must not validate"
        );
        for i in 0..FRAME_LEN {
            let mut damaged = bytes;
            damaged[i] ^= 0x10;
            assert_eq!(decode_frame(seed, &damaged), None, "flip at byte {i}");
        }
        assert_eq!(decode_frame(seed, &[0u8; FRAME_LEN]), None);
    }

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
        assert_eq!(jops[0], JournalOp::Put(b"k".to_vec(), offsets[0], 5));
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
            let _ = decode_body(RecordKind::Batch, &bytes);
            let _ = decode_body(RecordKind::Base, &bytes);
            let _ = decode_body(RecordKind::BasePart, &bytes);
            let _ = decode_base_part_head(&bytes);
            let _ = decode_frame(1, &bytes);
        }
    }
}
