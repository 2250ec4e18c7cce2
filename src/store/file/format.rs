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
//!
//! Record bodies (what a frame carries) are encoded and decoded in [`body`]; its items are
//! re-exported here, so the rest of the store names one format module.

mod body;
mod packed;

use crate::error::{Error, Result};
pub use body::{
    BODY_HEAD_MAX, Item, JournalOp, base_entry_len, base_head_len, batch_body_len,
    decode_base_part_head, decode_body_head, encode_base_body, encode_base_part_body,
    encode_batch_body, visit_body,
};
pub use packed::{
    encode_packed_base_body, encode_values_body, packed_entry_max, packed_head_len, values_head_len,
};

/// The format version this build writes and the newest it reads (SPEC S10). Version 3 added
/// packed bases and values records ([`packed`]); files of versions 1 (no preamble check, no
/// persisted damage) and 2 are still read, and so are the records they hold.
pub const FORMAT_VERSION: u32 = 3;
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
    debug_assert!(segment <= MAX_LOC_SEGMENT && offset < (1 << 40));
    ((segment as u64) << 40) | offset
}

/// The largest segment number a [`Loc`] can hold.
pub const MAX_LOC_SEGMENT: u32 = (1 << 24) - 1;

/// The last segment number the journal may start when it rolls over. The 65,536 numbers above
/// it are left for open, which starts a fresh segment past a damaged or lost newest one (at
/// most one each open), so no segment ever gets a number a location cannot hold.
pub const LAST_APPEND_SEGMENT: u32 = MAX_LOC_SEGMENT - (1 << 16);

/// The number of the segment after `current`, or [`Error::Exhausted`] past
/// [`LAST_APPEND_SEGMENT`]: segment numbers never go back (compaction deletes segments but
/// never renumbers them), and a number past 24 bits would silently wrap every location into
/// it.
pub fn next_segment(current: u32) -> Result<u32> {
    match current.checked_add(1) {
        Some(next) if next <= LAST_APPEND_SEGMENT => Ok(next),
        _ => Err(Error::Exhausted {
            what: "journal segment numbers".into(),
            detail: format!(
                "the journal's segment {current} is full and {LAST_APPEND_SEGMENT} is the last \
                 segment this store's format can number; copy every partition into a new store \
                 (list_partitions, then scan and apply each partition) and use that one"
            ),
        }),
    }
}

pub fn loc_segment(l: Loc) -> u32 {
    (l >> 40) as u32
}

pub fn loc_offset(l: Loc) -> u64 {
    l & ((1 << 40) - 1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// A base whose entries are packed (format version 3; see [`packed`]).
    PackedBase = 4,
    /// A part of a base run whose entries are packed (format version 3).
    PackedBasePart = 5,
    /// Compaction's copies of a partition's values, without keys (format version 3): the base
    /// written right after them names each; a chain walk passes over it.
    Values = 6,
}

impl RecordKind {
    /// Every kind, for the tests that feed each decoder arbitrary bytes.
    #[cfg(test)]
    pub const ALL: [RecordKind; 6] = [
        RecordKind::Batch,
        RecordKind::Base,
        RecordKind::BasePart,
        RecordKind::PackedBase,
        RecordKind::PackedBasePart,
        RecordKind::Values,
    ];

    fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(RecordKind::Batch),
            2 => Some(RecordKind::Base),
            3 => Some(RecordKind::BasePart),
            4 => Some(RecordKind::PackedBase),
            5 => Some(RecordKind::PackedBasePart),
            6 => Some(RecordKind::Values),
            _ => None,
        }
    }

    /// A whole base: a chain walk stops here.
    pub fn is_base(self) -> bool {
        matches!(self, RecordKind::Base | RecordKind::PackedBase)
    }

    /// A part of a base run.
    #[cfg(feature = "test-hooks")]
    pub fn is_base_part(self) -> bool {
        matches!(self, RecordKind::BasePart | RecordKind::PackedBasePart)
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
}
