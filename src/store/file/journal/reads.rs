//! Reading the journal by location: values and records, verified against their checksums;
//! damage answers `Corrupt`, never a retryable `Io` (SPEC S4). A chain walk may take records
//! from a window of the bytes before a record, read at once, checked as a read of each would be.

use super::super::format::{self, FRAME_LEN, Frame, Loc, ValueLoc, loc_offset, loc_segment};
use super::super::vfs::VfsFile;
use super::Journal;
use crate::error::{Error, Result};

impl Journal {
    /// Reads `buf.len()` bytes at a location.
    /// A missing segment or one whose header is damaged answers `Corrupt` (see
    /// `SegmentSet::get`); the segment's handle is taken once for the read, without allocating.
    pub fn read_at(&self, at: Loc, buf: &mut [u8]) -> Result<()> {
        let segment = loc_segment(at);
        self.segments.seed(segment)?;
        self.segments
            .reader(segment)
            .and_then(|file| file.read_exact_at(buf, loc_offset(at)))
            .map_err(|e| Error::io(format!("reading journal segment {segment}"), e))
    }

    /// Reads a value and verifies its checksum.
    /// Damage answers `Corrupt` naming the segment and the partition, never a retryable `Io`
    /// (SPEC S4): a value past the end of a truncated segment, in a missing segment or one
    /// whose header is damaged, or failing its checksum.
    pub fn read_value(&self, v: &ValueLoc, partition: &dyn std::fmt::Display) -> Result<Vec<u8>> {
        let damaged = |detail: &str| value_damage(v, partition, detail);
        let mut buf = vec![0u8; v.len as usize];
        match self.read_at(v.at, &mut buf) {
            Ok(()) => {}
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(damaged("the segment ends before it (truncated)"));
            }
            Err(Error::Corrupt { detail, .. }) => return Err(damaged(&detail)),
            Err(e) => return Err(e),
        }
        if crc32c::crc32c(&buf) != v.crc {
            return Err(damaged("failed its checksum"));
        }
        Ok(buf)
    }

    /// Reads and verifies the record at `at`; returns its frame and body.
    pub fn read_record(&self, at: Loc) -> Result<(Frame, Vec<u8>)> {
        match self.read_record_start(at)? {
            RecordStart::Whole(frame, body) => Ok((frame, body)),
            RecordStart::Partial(frame, start) => self.finish_record(at, frame, start),
        }
    }

    /// Reads the rest of the record at `at` whose frame and body start
    /// [`Journal::read_record_start`] answered `Partial`, and verifies the whole body; returns
    /// the frame and body like [`Journal::read_record`], without reading the start again.
    pub fn finish_record(
        &self,
        at: Loc,
        frame: Frame,
        mut body: Vec<u8>,
    ) -> Result<(Frame, Vec<u8>)> {
        self.segments.seed(loc_segment(at))?;
        let got = body.len();
        body.resize(frame.body_len as usize, 0);
        self.segments
            .reader(loc_segment(at))
            .and_then(|file| {
                file.read_exact_at(&mut body[got..], loc_offset(at) + (FRAME_LEN + got) as u64)
            })
            .map_err(|e| record_read_error(at, e, "the segment ends inside the record"))?;
        if format::body_crc(&body) != frame.body_crc {
            return Err(record_damage(at, "record body failed its checksum"));
        }
        Ok((frame, body))
    }

    /// Reads the record at `at` with one read of a few KiB: the whole record, verified, when it
    /// is that small; otherwise its verified frame and the start of its body (unverified).
    pub fn read_record_start(&self, at: Loc) -> Result<RecordStart> {
        self.read_record_start_in(at, SPECULATIVE_READ, &mut Vec::new())
    }

    /// [`Journal::read_record_start`] for a chain walk, which follows a partition's links
    /// without holding large bodies: reads `guess` bytes first (the size the walk expects,
    /// usually its last record's), into `scratch`, a buffer the walk reuses from record to
    /// record, so a record costs no zeroed buffer and the kernel copies little more than the
    /// record. A record longer than the guess is read on up to [`SPECULATIVE_READ`] bytes with a
    /// second read, so the answer is the same as with one read of that size: `Whole` for a
    /// record that small, else the frame and the body's first bytes. The body is copied out
    /// at its exact size.
    pub fn read_record_start_in(
        &self,
        at: Loc,
        guess: usize,
        scratch: &mut Vec<u8>,
    ) -> Result<RecordStart> {
        // The header checked, then the table's handle for this record's reads: no allocation.
        let seed = self.segments.seed(loc_segment(at))?;
        let file = self
            .segments
            .reader(loc_segment(at))
            .map_err(|e| record_read_error(at, e, "record unreadable"))?;
        if scratch.len() < SPECULATIVE_READ {
            // Zeroed once per walk, not once per record.
            scratch.resize(SPECULATIVE_READ, 0);
        }
        let want = guess.clamp(MIN_GUESS, SPECULATIVE_READ);
        let offset = loc_offset(at);
        let mut got = read_up_to(&*file, &mut scratch[..want], offset)
            .map_err(|e| record_read_error(at, e, "record unreadable"))?;
        if got < FRAME_LEN {
            return Err(record_damage(at, "record header unreadable"));
        }
        let frame = format::decode_frame(seed, &scratch[..FRAME_LEN])
            .ok_or_else(|| record_damage(at, "record header failed its checksum"))?;
        let end = FRAME_LEN + frame.body_len as usize;
        if end > got && got == want && want < SPECULATIVE_READ {
            // Longer than guessed: read on as far as one speculative read would have.
            let upto = end.min(SPECULATIVE_READ);
            got += read_up_to(&*file, &mut scratch[got..upto], offset + got as u64)
                .map_err(|e| record_read_error(at, e, "record unreadable"))?;
        }
        if end <= got {
            let body = &scratch[FRAME_LEN..end];
            if format::body_crc(body) != frame.body_crc {
                return Err(record_damage(at, "record body failed its checksum"));
            }
            Ok(RecordStart::Whole(frame, body.to_vec()))
        } else {
            Ok(RecordStart::Partial(
                frame,
                scratch[FRAME_LEN..got].to_vec(),
            ))
        }
    }
}

impl Journal {
    /// Fills `window` with the bytes of the segment of `at` that end where the record at `at`
    /// starts, up to [`WINDOW_BYTES`] of them, when `prev`, the record before it in its chain,
    /// starts at most [`WINDOW_REACH`] bytes before it in the same segment: a chain walk then
    /// takes `prev` and the records before it that lie in the window from there, one read for
    /// all of them. The window stays inside the segment (it starts at the segment's start at
    /// the earliest). Otherwise, or when the read fails or comes up short, the window is left
    /// empty, so the record is read alone and any damage is reported from there.
    pub fn fill_window(&self, at: Loc, prev: Loc, window: &mut Window) {
        window.len = 0;
        let (segment, end) = (loc_segment(at), loc_offset(at));
        let close_before = loc_segment(prev) == segment
            && loc_offset(prev) < end
            && end - loc_offset(prev) <= WINDOW_REACH as u64;
        if !close_before {
            return;
        }
        let Ok(file) = self.segments.reader(segment) else {
            return;
        };
        let start = end.saturating_sub(WINDOW_BYTES as u64);
        let len = (end - start) as usize;
        if window.bytes.len() < len {
            // Zeroed once per thread, not once per walk.
            window.bytes.resize(WINDOW_BYTES, 0);
        }
        if let Ok(got) = read_up_to(&*file, &mut window.bytes[..len], start)
            && got == len
        {
            (window.segment, window.start, window.len) = (segment, start, len);
        }
    }

    /// The record at `at` taken from `window`, checked exactly as [`Journal::read_record_start`]
    /// checks it (the segment's seed, the frame's checksum, the body's checksum), when its frame
    /// lies in the window and it is whole there and no longer than one speculative read (so the
    /// answer is the one a read would give); `None` otherwise, and the record is read.
    pub fn record_in_window(&self, at: Loc, window: &Window) -> Option<Result<RecordStart>> {
        let from = window.offset_of(at)?;
        if from + FRAME_LEN > window.len {
            return None;
        }
        let seed = match self.segments.seed(loc_segment(at)) {
            Ok(seed) => seed,
            Err(e) => return Some(Err(e)),
        };
        let held = &window.bytes[from..window.len];
        let Some(frame) = format::decode_frame(seed, &held[..FRAME_LEN]) else {
            return Some(Err(record_damage(at, "record header failed its checksum")));
        };
        let end = FRAME_LEN + frame.body_len as usize;
        if end > held.len() || end > SPECULATIVE_READ {
            return None;
        }
        let body = &held[FRAME_LEN..end];
        if format::body_crc(body) != frame.body_crc {
            return Some(Err(record_damage(at, "record body failed its checksum")));
        }
        Some(Ok(RecordStart::Whole(frame, body.to_vec())))
    }
}

/// Bytes a chain walk reads at once when a record's chain link points close before it (see
/// [`Journal::fill_window`]): a partition's small records written in a row, with other
/// partitions' records between, are read together rather than one read each.
pub const WINDOW_BYTES: usize = 64 << 10;
/// How far before a record its chain's previous record may start for the walk to read a
/// window: nearer records make a window likely to hold several of the chain's records, so
/// one read of [`WINDOW_BYTES`] replaces several small ones rather than one.
pub const WINDOW_REACH: usize = 16 << 10;

/// Bytes of one journal segment a chain walk read in one go (see [`Journal::fill_window`]);
/// its buffer is kept by the walk's thread from one load to the next.
#[derive(Default)]
pub struct Window {
    segment: u32,
    /// Offset in the segment of the window's first byte.
    start: u64,
    /// Bytes of `bytes` that hold the segment's (0: the window is empty).
    len: usize,
    bytes: Vec<u8>,
}

impl Window {
    /// Where in the window the bytes at `at` start, if the window holds them.
    fn offset_of(&self, at: Loc) -> Option<usize> {
        let offset = loc_offset(at);
        (self.len > 0
            && loc_segment(at) == self.segment
            && offset >= self.start
            && offset < self.start + self.len as u64)
            .then(|| (offset - self.start) as usize)
    }

    /// Whether the window holds the start of the bytes at `at`.
    pub fn holds(&self, at: Loc) -> bool {
        self.offset_of(at).is_some()
    }

    /// Empties the window (its buffer is kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// Bytes read at once when a record is fetched by location (frame plus a typical body).
const SPECULATIVE_READ: usize = 4096;
/// Fewest bytes a chain walk's first read of a record asks for: a frame and a small body.
const MIN_GUESS: usize = 512;

/// What one read at a record's location found (see [`Journal::read_record_start`]).
pub enum RecordStart {
    /// The whole record; its body passed its checksum.
    Whole(Frame, Vec<u8>),
    /// The frame (verified) and the first bytes of a longer body (not yet verified).
    Partial(Frame, Vec<u8>),
}

/// Damage to a value: `Corrupt` naming the partition, the segment and the value's offset.
pub fn value_damage(v: &ValueLoc, partition: &dyn std::fmt::Display, detail: &str) -> Error {
    Error::corrupt(
        format!("partition {partition}"),
        format!(
            "value at journal segment {} offset {}: {detail}",
            loc_segment(v.at),
            loc_offset(v.at)
        ),
    )
}

pub(super) fn record_damage(at: Loc, detail: &str) -> Error {
    Error::corrupt(
        format!(
            "journal segment {} offset {}",
            loc_segment(at),
            loc_offset(at)
        ),
        detail.to_owned(),
    )
}

/// A failed read of a record: a segment that ends too soon is damage (`Corrupt`, never a
/// retryable `Io`: SPEC S4); any other I/O error stays `Io`, so a transient failure is not
/// remembered as damage.
fn record_read_error(at: Loc, e: std::io::Error, detail: &str) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        record_damage(at, detail)
    } else {
        Error::io(
            format!(
                "reading journal segment {} offset {}",
                loc_segment(at),
                loc_offset(at)
            ),
            e,
        )
    }
}

/// Reads as much of `buf` as the file holds at `offset`; returns how many bytes were read.
fn read_up_to(file: &dyn VfsFile, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
