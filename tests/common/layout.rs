//! Reads the on-disk layout that docs/DESIGN.md documents (segment header, record frames,
//! whole-file envelopes), so corruption tests can damage exactly the bytes they mean to. Every
//! walk checks itself against the file, so a format change fails these tests loudly instead of
//! letting them damage the wrong bytes.

/// Bytes of a segment header: preamble (16), number (4), salt (8), crc (4).
pub const SEGMENT_HEADER_LEN: usize = 32;
/// Bytes of a record frame before its body.
pub const FRAME_LEN: usize = 37;
/// Where the format version sits in a segment header and in a whole-file envelope.
pub const VERSION_AT: usize = 8;

/// One record of a segment, as the frame describes it.
#[derive(Clone, Copy, Debug)]
pub struct RecordAt {
    /// Offset of the frame in the segment.
    pub offset: usize,
    /// Bytes of body after the frame.
    pub body_len: usize,
    /// 1 = batch, 2 = base, 3 = part of a base split over several records (format version 2's
    /// entries); 4 = base, 5 = part of a base run (packed entries, format version 3); 6 =
    /// compaction's copies of values, without keys.
    pub kind: u8,
    /// FNV-1a of the partition name.
    pub partition_hash: u64,
    /// The record's journal sequence number.
    pub lsn: u64,
    /// The newest LSN known durable when the record was framed.
    pub synced_lsn: u64,
}

impl RecordAt {
    /// The record the frame at `at` of `segment` describes (no check of its checksums).
    fn read(segment: &[u8], at: usize) -> RecordAt {
        let frame = &segment[at..at + FRAME_LEN];
        let u64_at = |i: usize| u64::from_le_bytes(frame[i..i + 8].try_into().unwrap());
        RecordAt {
            offset: at,
            body_len: u32::from_le_bytes(frame[4..8].try_into().unwrap()) as usize,
            kind: frame[8],
            lsn: u64_at(9),
            partition_hash: u64_at(17),
            synced_lsn: u64_at(25),
        }
    }

    /// Where the record ends (its frame and body).
    pub fn end(&self) -> usize {
        self.offset + FRAME_LEN + self.body_len
    }
}

/// Every record of a segment's bytes, in order; panics unless they tile the file exactly, up to
/// the zeros of its preallocated, never written end (see [`written_len`]).
pub fn records(segment: &[u8]) -> Vec<RecordAt> {
    let segment = &segment[..written_len(segment)];
    let mut at = SEGMENT_HEADER_LEN;
    let mut found = Vec::new();
    while at < segment.len() {
        let record = RecordAt::read(segment, at);
        assert!(
            record.body_len > 0 && (1..=6).contains(&record.kind),
            "not a frame at {at}"
        );
        found.push(record);
        at = record.end();
    }
    assert_eq!(at, segment.len(), "records do not tile the segment");
    found
}

/// The records of a segment's bytes, in order, up to the first that is not whole and valid
/// (its frame's checksum, seeded with the segment's salt, or its body's fails, or it does not
/// fit): what a crash or damage left is allowed, unlike in [`records`].
pub fn valid_records(segment: &[u8]) -> Vec<RecordAt> {
    let mut found = Vec::new();
    let Some(salt) = segment.get(20..28) else {
        return found;
    };
    let seed = crc32c::crc32c(salt);
    let mut at = SEGMENT_HEADER_LEN;
    while at + FRAME_LEN <= segment.len() {
        let record = RecordAt::read(segment, at);
        if record.body_len == 0 || record.end() > segment.len() {
            break;
        }
        let frame = &segment[at..at + FRAME_LEN];
        let header_crc = u32::from_le_bytes(frame[0..4].try_into().unwrap());
        let body_crc = u32::from_le_bytes(frame[33..37].try_into().unwrap());
        let body = &segment[at + FRAME_LEN..record.end()];
        if crc32c::crc32c_append(seed, &frame[4..]) != header_crc
            || crc32c::crc32c(body) != body_crc
        {
            break;
        }
        found.push(record);
        at = record.end();
    }
    found
}

/// Where a segment's records end: the file is preallocated with zeros, so its written part
/// ends where the first all-zero frame is followed by nothing but zeros. A segment that holds
/// no records ends after its header.
pub fn written_len(segment: &[u8]) -> usize {
    let mut at = SEGMENT_HEADER_LEN.min(segment.len());
    while at < segment.len() {
        if segment[at..].iter().all(|&b| b == 0) {
            return at;
        }
        let frame = &segment[at..(at + FRAME_LEN).min(segment.len())];
        if frame.len() < FRAME_LEN {
            return segment.len();
        }
        let body_len = u32::from_le_bytes(frame[4..8].try_into().unwrap()) as usize;
        at += FRAME_LEN + body_len;
    }
    segment.len()
}

/// The partition hash frames carry (FNV-1a, 64-bit).
pub fn partition_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Bytes of the preamble every file starts with: magic (8), version (4), crc32c of those (4).
pub const PREAMBLE_LEN: usize = 16;

/// Writes a preamble claiming format `version` that checks out, as a later release would
/// write it: the version is the only thing this build cannot read (what follows is left as it
/// is, a layout this build must not try to interpret).
pub fn set_preamble_version(file: &mut [u8], version: u32) {
    file[VERSION_AT..VERSION_AT + 4].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&file[0..12]);
    file[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// Sets the format version of a segment header (see [`set_preamble_version`]).
pub fn set_segment_version(segment: &mut [u8], version: u32) {
    set_preamble_version(segment, version);
}

/// Sets the format version of a whole-file envelope (manifest, heads snapshot).
pub fn set_envelope_version(file: &mut [u8], version: u32) {
    set_preamble_version(file, version);
}

/// Where the first page of a paged heads snapshot starts, and the length of each page
/// (docs/DESIGN.md, "Heads snapshot").
pub const SNAPSHOT_PAGES_AT: usize = 4096;
pub const SNAPSHOT_PAGE_LEN: usize = 16 << 10;
