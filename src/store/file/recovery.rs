//! Opening a journal after a clean close or a crash (SPEC S4, S5).
//!
//! Open reads the manifest, the heads snapshot it names, and only the journal written after
//! that snapshot, updating partition heads. Recovery then tells a torn tail from damage:
//!
//! - a bad record in the last segment with nothing valid after it, or with only records framed
//!   before it was known durable, is a torn tail: it and everything after it were never
//!   acknowledged; they are truncated and logged;
//! - a bad record anywhere else (in a sealed segment, which is synced before the next one is
//!   started, or followed by a record that was framed after it became durable) is damage: the
//!   partition it belongs to is reported corrupt and fails its loads, the scan continues, and
//!   every other partition keeps working.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use super::format::{
    self, FRAME_LEN, Loc, SEGMENT_HEADER_LEN, decode_body_head, decode_frame, loc, partition_hash,
};
use super::journal::{JournalTail, Segment, create_segment, new_salt, parse_segment_file_name};
use super::vfs::{OpenMode, Vfs, VfsFile};
use crate::error::{Error, Result};

/// A damaged record found at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedRecord {
    /// Segment number.
    pub segment: u32,
    /// Byte offset in the segment.
    pub offset: u64,
    /// The partition it belongs to, when that could be established.
    pub partition: Option<String>,
}

/// A torn tail truncated at open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Segment number.
    pub segment: u32,
    /// Where the segment was cut.
    pub offset: u64,
    /// Bytes dropped (in that segment and any later ones).
    pub bytes_dropped: u64,
}

/// Damage recovery found, for loads to consult.
#[derive(Debug, Default)]
pub struct Damage {
    pub partition_hashes: HashSet<u64>,
    pub records: Vec<DamagedRecord>,
}

pub struct ScanOutcome {
    pub tail: JournalTail,
    pub heads: HashMap<Box<[u8]>, Loc>,
    pub damage: Damage,
    pub torn_tail: Option<TornTail>,
    pub bytes_scanned: u64,
    pub records_scanned: u64,
}

/// Opens every segment in `journal_dir` and checks its header.
pub fn open_segments(vfs: &dyn Vfs, journal_dir: &Path) -> Result<BTreeMap<u32, Segment>> {
    open_segments_with(vfs, journal_dir, |_, file| file)
}

/// [`open_segments`], keeping for each segment the file `keep` makes of the handle that read
/// its header (the store keeps a handle from its bounded table instead, and closes this one).
pub fn open_segments_with(
    vfs: &dyn Vfs,
    journal_dir: &Path,
    keep: impl Fn(u32, Arc<dyn VfsFile>) -> Arc<dyn VfsFile>,
) -> Result<BTreeMap<u32, Segment>> {
    let mut segments = BTreeMap::new();
    let names = vfs
        .list(journal_dir)
        .map_err(|e| Error::io(format!("listing {}", journal_dir.display()), e))?;
    let numbers: Vec<u32> = names
        .iter()
        .filter_map(|n| parse_segment_file_name(n))
        .collect();
    let last = numbers.iter().copied().max();
    for number in numbers {
        let path = journal_dir.join(super::journal::segment_file_name(number));
        let file = vfs
            .open(&path, OpenMode::ReadWrite)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let mut header = [0u8; SEGMENT_HEADER_LEN as usize];
        let read = file.read_exact_at(&mut header, 0);
        let decoded = match read {
            Ok(()) => format::decode_segment_header(&header, &path.display().to_string()),
            Err(_) => Err(Error::corrupt(
                path.display().to_string(),
                "segment header is short",
            )),
        };
        match decoded {
            Ok((n, salt)) if n == number => {
                segments.insert(
                    number,
                    Segment {
                        file: keep(number, file),
                        seed: format::salt_seed(salt),
                    },
                );
            }
            Ok(_) => {
                return Err(Error::corrupt(
                    path.display().to_string(),
                    "segment header names another segment",
                ));
            }
            // A newer format is refused whatever else is wrong (SPEC S10).
            Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
            // The newest segment's header is written and synced before any record goes into
            // it, so a bad header there is a segment creation cut short: it holds nothing.
            Err(e) if Some(number) == last => {
                log::warn!("removing a journal segment whose creation was cut short: {e}");
                drop(file);
                vfs.remove(&path)
                    .map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
                vfs.sync_dir(journal_dir)
                    .map_err(|e| Error::io(format!("syncing {}", journal_dir.display()), e))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(segments)
}

enum Probe {
    /// A valid record: its frame, partition name and total length.
    Valid(format::Frame, Vec<u8>, u64),
    /// A bad record (header or body).
    Bad,
}

/// How the LSN of the next record must relate to the one expected.
#[derive(Clone, Copy)]
enum LsnRule {
    /// Any LSN (nothing is known yet).
    Any,
    /// Exactly this one (within a segment, LSNs are consecutive).
    Exactly(u64),
    /// At least this one (at a segment's start: compaction may have deleted the segments
    /// between, taking their LSNs with them).
    AtLeast(u64),
}

fn probe(bytes: &[u8], at: usize, seed: u32, rule: LsnRule) -> Probe {
    let Some(frame) = bytes
        .get(at..at + FRAME_LEN)
        .and_then(|h| decode_frame(seed, h))
    else {
        return Probe::Bad;
    };
    let lsn_ok = match rule {
        LsnRule::Any => true,
        LsnRule::Exactly(lsn) => frame.lsn == lsn,
        LsnRule::AtLeast(lsn) => frame.lsn >= lsn,
    };
    if !lsn_ok {
        return Probe::Bad;
    }
    let body_start = at + FRAME_LEN;
    let Some(body) = bytes.get(body_start..body_start + frame.body_len as usize) else {
        return Probe::Bad;
    };
    if format::body_crc(body) != frame.body_crc {
        return Probe::Bad;
    }
    match decode_body_head(body) {
        Some((name, _)) if partition_hash(name) == frame.partition_hash => {
            Probe::Valid(frame, name.to_vec(), (FRAME_LEN + body.len()) as u64)
        }
        _ => Probe::Bad,
    }
}

/// Finds the first valid record at or after `from` with an LSN above `after_lsn`.
fn find_valid(
    bytes: &[u8],
    from: usize,
    seed: u32,
    after_lsn: Option<u64>,
) -> Option<(usize, format::Frame)> {
    let mut at = from;
    while at + FRAME_LEN <= bytes.len() {
        // Cheap filter before the checksum: the LSN field must be plausible.
        let lsn = u64::from_le_bytes(bytes[at + 9..at + 17].try_into().unwrap());
        if after_lsn.is_none_or(|after| lsn > after && lsn - after < (1 << 32))
            && let Probe::Valid(frame, _, _) = probe(bytes, at, seed, LsnRule::Any)
        {
            return Some((at, frame));
        }
        at += 1;
    }
    None
}

/// Names the partition of a damaged record when the evidence agrees: a header that still
/// validates, or a body whose name hashes to the hash in the (unverified) header.
fn attribute(bytes: &[u8], at: usize, seed: u32) -> (Option<u64>, Option<String>) {
    let name_of = |b: &[u8]| decode_body_head(b).map(|(n, _)| n.to_vec());
    let body = bytes.get(at + FRAME_LEN..).unwrap_or(&[]);
    if let Some(frame) = bytes
        .get(at..at + FRAME_LEN)
        .and_then(|h| decode_frame(seed, h))
    {
        let name = name_of(body).filter(|n| partition_hash(n) == frame.partition_hash);
        return (
            Some(frame.partition_hash),
            name.map(|n| n.escape_ascii().to_string()),
        );
    }
    let claimed = bytes
        .get(at + 17..at + 25)
        .map(|h| u64::from_le_bytes(h.try_into().unwrap()));
    match (name_of(body), claimed) {
        (Some(name), Some(hash)) if partition_hash(&name) == hash => {
            (Some(hash), Some(name.escape_ascii().to_string()))
        }
        _ => (None, None),
    }
}

/// Reads a segment from `from` to its end: open reads only the journal after the snapshot.
fn read_from(file: &Arc<dyn VfsFile>, number: u32, from: u64) -> Result<Vec<u8>> {
    let len = file
        .len()
        .map_err(|e| Error::io(format!("sizing segment {number}"), e))?;
    let mut bytes = vec![0u8; len.saturating_sub(from) as usize];
    file.read_exact_at(&mut bytes, from)
        .map_err(|e| Error::io(format!("reading segment {number}"), e))?;
    Ok(bytes)
}

/// Scans the journal from `start` (segment, offset) and LSN `start_lsn` (None: accept the
/// first valid record's LSN), updating `heads`.
pub fn scan(
    vfs: &dyn Vfs,
    journal_dir: &Path,
    mut segments: BTreeMap<u32, Segment>,
    start: Option<(u32, u64)>,
    start_lsn: Option<u64>,
    mut heads: HashMap<Box<[u8]>, Loc>,
) -> Result<ScanOutcome> {
    let mut damage = Damage::default();
    let mut torn_tail = None;
    let mut expected = start_lsn;
    let mut bytes_scanned = 0u64;
    let mut records_scanned = 0u64;
    let numbers: Vec<u32> = segments.keys().copied().collect();
    let last = numbers.last().copied();
    let (start_segment, start_offset) =
        start.unwrap_or((numbers.first().copied().unwrap_or(1), SEGMENT_HEADER_LEN));
    let mut end_of_tail = SEGMENT_HEADER_LEN;

    if start.is_some() && !segments.contains_key(&start_segment) {
        return Err(Error::corrupt(
            format!("journal segment {start_segment}"),
            "the heads snapshot points into a segment that is missing",
        ));
    }

    let mut i = 0;
    'segments: while i < numbers.len() {
        let number = numbers[i];
        i += 1;
        if number < start_segment {
            continue;
        }
        let segment = segments[&number].clone();
        // `bytes` starts at `base`; positions below are relative to it.
        let base = if number == start_segment {
            start_offset
        } else {
            SEGMENT_HEADER_LEN
        };
        let bytes = read_from(&segment.file, number, base)?;
        let mut at = 0usize;
        let is_last = Some(number) == last;
        while at < bytes.len() {
            let at_segment_start = at == 0 && base == SEGMENT_HEADER_LEN;
            let rule = match expected {
                None => LsnRule::Any,
                Some(lsn) if at_segment_start => LsnRule::AtLeast(lsn),
                Some(lsn) => LsnRule::Exactly(lsn),
            };
            match probe(&bytes, at, segment.seed, rule) {
                Probe::Valid(frame, name, len) => {
                    heads.insert(name.into_boxed_slice(), loc(number, base + at as u64));
                    expected = Some(frame.lsn + 1);
                    at += len as usize;
                    bytes_scanned += len;
                    records_scanned += 1;
                }
                Probe::Bad => {
                    let after = expected.map(|e| e.saturating_sub(1));
                    let next = find_valid(&bytes, at + 1, segment.seed, after);
                    // In the last segment, damage is a torn write unless a later record was
                    // framed after the damaged one had become durable.
                    let durable_damage = match (&next, expected) {
                        (Some((_, f)), Some(lsn)) => f.synced_lsn >= lsn,
                        (Some(_), None) => true,
                        (None, _) => false,
                    };
                    if is_last && !durable_damage {
                        let dropped = bytes.len() as u64 - at as u64;
                        let cut = base + at as u64;
                        log::warn!(
                            "journal segment {number}: torn tail at offset {cut}, truncating {dropped} bytes of unacknowledged writes"
                        );
                        segment
                            .file
                            .set_len(cut)
                            .and_then(|()| segment.file.sync_data())
                            .map_err(|e| Error::io(format!("truncating segment {number}"), e))?;
                        torn_tail = Some(TornTail {
                            segment: number,
                            offset: cut,
                            bytes_dropped: dropped,
                        });
                        end_of_tail = cut;
                        break 'segments;
                    }
                    let (hash, partition) = attribute(&bytes, at, segment.seed);
                    let offset = base + at as u64;
                    log::error!(
                        "journal segment {number} offset {offset}: damaged record (partition {}); its partition will refuse to load",
                        partition.as_deref().unwrap_or("unknown")
                    );
                    if let Some(h) = hash {
                        damage.partition_hashes.insert(h);
                    }
                    damage.records.push(DamagedRecord {
                        segment: number,
                        offset,
                        partition,
                    });
                    match next {
                        Some((next_at, frame)) => {
                            expected = Some(frame.lsn);
                            at = next_at;
                        }
                        None => {
                            // Nothing valid follows in this sealed segment: continue with the
                            // next one, accepting its first LSN.
                            expected = None;
                            continue 'segments;
                        }
                    }
                }
            }
        }
        end_of_tail = base + at as u64;
    }

    let next_lsn = expected.unwrap_or(1);
    let (tail_segment, tail_seed, tail_offset) = match segments.iter().next_back() {
        Some((&n, s)) => (n, s.seed, end_of_tail.max(SEGMENT_HEADER_LEN)),
        None => {
            let salt = new_salt();
            let s = create_segment(vfs, journal_dir, 1, salt)?;
            let seed = s.seed;
            segments.insert(1, s);
            (1, seed, SEGMENT_HEADER_LEN)
        }
    };
    Ok(ScanOutcome {
        tail: JournalTail {
            segments,
            tail_segment,
            tail_seed,
            tail_offset,
            next_lsn,
        },
        heads,
        damage,
        torn_tail,
        bytes_scanned,
        records_scanned,
    })
}
