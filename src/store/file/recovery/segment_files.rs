//! The journal's segment files as open finds them: listed, the scanned ones opened and their
//! headers checked; a damaged header is kept as evidence, a newer format refused (SPEC S4,
//! S5, S10).

use crate::sync::HashMap;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::super::format::SEGMENT_HEADER_LEN;
use super::super::journal::{Segment, parse_segment_file_name};
use super::super::segments::seed_of;
use super::super::vfs::{OpenMode, Vfs, VfsFile};
use super::super::window::Window;
use crate::error::{Error, Result};

/// A segment whose header could not be read: kept on disk as evidence, never read from.
pub struct DamagedSegment {
    pub reason: String,
}

/// The journal's segment files as open found them.
pub struct Segments {
    pub live: BTreeMap<u32, Segment>,
    pub damaged: BTreeMap<u32, DamagedSegment>,
    /// Sealed segments before the scan's start, listed but not opened: their headers are
    /// checked on first use.
    pub unchecked: Vec<u32>,
    /// Each live segment's length when its header was read, so the scan does not ask again.
    pub lens: HashMap<u32, u64>,
    /// Whether the scan checks that the rest of a segment is zeros before it takes an all-zero
    /// frame as the end of its records (always, except for the negative control
    /// `SkipSync::ZeroEndCheck`).
    pub zero_end_check: bool,
    /// Records the scan takes as proven durable beyond what the frames prove: 0, except for
    /// the negative control `SkipSync::ProofBound`.
    pub proof_slack: u64,
}

/// The numbers of the segment files in `journal_dir`, in order: one listing of the directory.
pub fn list_segments(vfs: &dyn Vfs, journal_dir: &Path) -> Result<Vec<u32>> {
    let names = vfs
        .list(journal_dir)
        .map_err(|e| Error::io(format!("listing {}", journal_dir.display()), e))?;
    let mut numbers: Vec<u32> = names
        .iter()
        .filter_map(|n| parse_segment_file_name(n))
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// Opens the segments `numbers` (from [`list_segments`]) from `from` on, the ones the scan
/// reads, and checks each one's header; older ones are left unopened, to be checked on first
/// use (SPEC S5: open does not grow with the number of segments). A header that cannot be
/// read is damage: the file is kept and listed, and open goes on (SPEC S4). Only the newest
/// segment, when nothing after its header could be a record (a creation cut short), is
/// removed. A newer format version is refused (SPEC S10).
///
/// Keeps for each live segment the file `keep` makes of the handle that read its header (the
/// store and the inspection walk keep a handle from a bounded table instead, and close this
/// one, so neither needs more than a bounded number of file descriptors).
pub fn open_segments_with(
    vfs: &dyn Vfs,
    journal_dir: &Path,
    numbers: &[u32],
    from: u32,
    keep: impl Fn(u32, Arc<dyn VfsFile>) -> Arc<dyn VfsFile>,
) -> Result<Segments> {
    let mut live = BTreeMap::new();
    let mut damaged = BTreeMap::new();
    let mut lens = HashMap::default();
    let last = numbers.iter().copied().max();
    let unchecked: Vec<u32> = numbers.iter().copied().filter(|&n| n < from).collect();
    for &number in numbers.iter().filter(|&&n| n >= from) {
        let path = journal_dir.join(super::super::journal::segment_file_name(number));
        let shown = path.display().to_string();
        let file = vfs
            .open(&path, OpenMode::ReadWrite)
            .map_err(|e| Error::io(format!("opening {shown}"), e))?;
        let len = file
            .len()
            .map_err(|e| Error::io(format!("sizing {shown}"), e))?;
        let mut header = vec![0u8; len.min(SEGMENT_HEADER_LEN) as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| Error::io(format!("reading {shown}"), e))?;
        let reason = match seed_of(&header, number, &shown) {
            Ok(seed) => {
                lens.insert(number, len);
                live.insert(
                    number,
                    Segment {
                        file: keep(number, file),
                        seed,
                    },
                );
                continue;
            }
            // A newer format is refused whatever else is wrong (SPEC S10).
            Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
            Err(e) => e.to_string(),
        };
        // The newest segment's header is written and synced before any record goes into it:
        // if nothing after the header could be a record, its creation was cut short.
        if Some(number) == last && holds_nothing(&*file, len)? {
            log::warn!("removing journal segment {number}, whose creation was cut short: {reason}");
            drop(file);
            vfs.remove(&path)
                .map_err(|e| Error::io(format!("removing {shown}"), e))?;
            vfs.sync_dir(journal_dir)
                .map_err(|e| Error::io(format!("syncing {}", journal_dir.display()), e))?;
            continue;
        }
        log::error!(
            "journal segment {number} has a damaged header ({reason}); it is kept, and what it may hold is refused"
        );
        damaged.insert(number, DamagedSegment { reason });
    }
    Ok(Segments {
        live,
        damaged,
        unchecked,
        lens,
        zero_end_check: true,
        proof_slack: 0,
    })
}

/// Whether nothing after a segment header could be a record: no bytes, or only zeros (an
/// all-zero frame is invalid; a segment is preallocated with zeros before its header is
/// written).
fn holds_nothing(file: &dyn VfsFile, len: u64) -> Result<bool> {
    if len <= SEGMENT_HEADER_LEN {
        return Ok(true);
    }
    let mut w = Window::new(file, len);
    let zeros = w
        .zeros_from(SEGMENT_HEADER_LEN)
        .map_err(|e| Error::io("reading a journal segment", e))?;
    Ok(SEGMENT_HEADER_LEN + zeros == len)
}
