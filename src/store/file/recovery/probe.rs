//! What the scan asks of the bytes of a segment: whether a record at an offset is valid, where
//! the next valid one is, whether only zeros follow, and who a damaged record belonged to.
//! Everything is read through a bounded [`Window`].

use std::io;

use super::super::format::{
    self, BODY_HEAD_MAX, FRAME_LEN, Loc, decode_body_head, decode_frame, partition_hash,
};
use super::super::window::Window;

/// Whether everything from `at` to the end of the segment is zeros: the preallocated space
/// nothing was written to, where the segment's records end. Checked a buffer at a time.
pub(super) fn zeros_to_end(w: &mut Window, at: u64) -> io::Result<bool> {
    Ok(at + w.zeros_from(at)? >= w.len())
}

/// Where the written bytes from `from` on end: just past the last non-zero byte (the
/// preallocated zeros after it were never written).
pub(super) fn written_end(w: &mut Window, from: u64) -> io::Result<u64> {
    let (mut at, mut end) = (from, from);
    while at < w.len() {
        at += w.zeros_from(at)?;
        if at >= w.len() {
            break;
        }
        let bytes = w.get(at, 4096)?;
        at += bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len()) as u64;
        end = at;
    }
    Ok(end)
}

pub(super) enum Probe {
    /// A valid record: its frame, partition name, previous-record location and total length.
    Valid(format::Frame, Vec<u8>, Loc, u64),
    /// A bad record (header or body).
    Bad,
}

/// Checks the record at `at`: its frame, then its body's name against the frame's hash, then
/// the body's checksum, read through the window (a body larger than it is checksummed piece
/// by piece, never held whole).
pub(super) fn probe(w: &mut Window, at: u64, seed: u32) -> io::Result<Probe> {
    let Some(frame) = decode_frame(seed, w.get(at, FRAME_LEN)?) else {
        return Ok(Probe::Bad);
    };
    let body_at = at + FRAME_LEN as u64;
    let body_len = frame.body_len as u64;
    if body_at + body_len > w.len() {
        return Ok(Probe::Bad);
    }
    let head = w.get(body_at, body_len.min(BODY_HEAD_MAX as u64) as usize)?;
    let (name, prev) = match decode_body_head(head) {
        Some((name, prev)) if partition_hash(name) == frame.partition_hash => (name.to_vec(), prev),
        _ => return Ok(Probe::Bad),
    };
    if w.crc(body_at, body_len)? != Some(frame.body_crc) {
        return Ok(Probe::Bad);
    }
    Ok(Probe::Valid(frame, name, prev, FRAME_LEN as u64 + body_len))
}

/// Finds the first valid record at or after `from` with an LSN above `after_lsn`.
pub(super) fn find_valid(
    w: &mut Window,
    from: u64,
    seed: u32,
    after_lsn: Option<u64>,
) -> io::Result<Option<(u64, format::Frame)>> {
    let mut at = from;
    while at + FRAME_LEN as u64 <= w.len() {
        // Cheap filter before the checksum: the LSN field must be plausible.
        let f = w.get(at, FRAME_LEN)?;
        if f[..8].iter().all(|&b| b == 0) {
            // No frame starts where its length field (bytes 4..8) would be zero: skip a run
            // of zeros (unwritten, preallocated space) at once, not byte by byte.
            let zeros = w.zeros_from(at)?;
            at = (at + zeros).saturating_sub(7).max(at + 1);
            continue;
        }
        let lsn = u64::from_le_bytes(f[9..17].try_into().unwrap());
        if after_lsn.is_none_or(|after| lsn > after && lsn - after < (1 << 32))
            && let Probe::Valid(frame, ..) = probe(w, at, seed)?
        {
            return Ok(Some((at, frame)));
        }
        at += 1;
    }
    Ok(None)
}

/// Whether a valid record at or after `first` (the first valid one after a damaged record, as
/// [`find_valid`] found it) was framed once LSN `lsn` was durable: then the damaged record,
/// whose LSN that is, had been synced and its damage is not a torn write. The first valid
/// record after the damage may have been written in the same group commit as the damaged one
/// (so it proves nothing), while a later one, framed after that group's sync, does; every valid
/// record up to the end of the window is asked. The search for the next one starts where the
/// last valid one ends (records follow one another; damage in between is skipped as before).
pub(super) fn proves_durable(
    w: &mut Window,
    first: Option<(u64, format::Frame)>,
    seed: u32,
    after_lsn: Option<u64>,
    lsn: u64,
) -> io::Result<bool> {
    let mut next = first;
    while let Some((at, frame)) = next {
        if frame.synced_lsn >= lsn {
            return Ok(true);
        }
        let end = at + FRAME_LEN as u64 + u64::from(frame.body_len);
        next = find_valid(w, end, seed, after_lsn)?;
    }
    Ok(false)
}

/// Who a damaged record belonged to, when the evidence agrees: a header that still validates,
/// or a body whose name hashes to the hash in the (unverified) header.
pub(super) struct Candidate {
    pub(super) hash: u64,
    pub(super) name: Option<Vec<u8>>,
    /// Where the record claims to end (an offset in its segment).
    pub(super) end: u64,
}

pub(super) fn attribute(w: &mut Window, at: u64, seed: u32) -> io::Result<Option<Candidate>> {
    // The frame and the head of the body are all the evidence there is.
    let bytes = w.get(at, FRAME_LEN + BODY_HEAD_MAX)?;
    let body = bytes.get(FRAME_LEN..).unwrap_or(&[]);
    let name_of = |hash: u64| {
        decode_body_head(body)
            .map(|(n, _)| n.to_vec())
            .filter(|n| partition_hash(n) == hash)
    };
    if let Some(frame) = bytes.get(..FRAME_LEN).and_then(|h| decode_frame(seed, h)) {
        return Ok(Some(Candidate {
            hash: frame.partition_hash,
            name: name_of(frame.partition_hash),
            end: at + (FRAME_LEN + frame.body_len as usize) as u64,
        }));
    }
    let field = |from: usize, to: usize| bytes.get(from..to);
    let (Some(claimed), Some(body_len)) = (field(17, 25), field(4, 8)) else {
        return Ok(None);
    };
    let claimed = u64::from_le_bytes(claimed.try_into().unwrap());
    let body_len = u32::from_le_bytes(body_len.try_into().unwrap()) as usize;
    Ok(name_of(claimed).map(|name| Candidate {
        hash: claimed,
        name: Some(name),
        end: at + (FRAME_LEN + body_len) as u64,
    }))
}
