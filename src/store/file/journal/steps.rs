//! Segment files and their zero-filled steps: names, salts, creating a segment (header synced
//! before anything else goes in) and preparing the space records will go into (SPEC S3, S4).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use super::super::format::{self, SEGMENT_HEADER_LEN};
use super::super::vfs::{OpenMode, Vfs, VfsFile};
use super::Segment;
use crate::error::{Error, Result};

pub fn segment_file_name(number: u32) -> String {
    format!("{number:010}.seg")
}

pub fn parse_segment_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A fresh random salt for a new segment: std's per-thread random hash keys, a count of the
/// salts this process made, and the process id (no clock: library code reads time only through
/// the store's clock, SPEC E9).
pub fn new_salt() -> u64 {
    if let Some(salt) = crate::sync::simulated_unique() {
        return salt;
    }
    use std::sync::atomic::{AtomicU64, Ordering}; // seams: not shared (a process-wide counter)
    static MADE: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(MADE.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish() | 1
}

/// Creates a segment file of `size` bytes with its header, synced together with the size, and
/// its directory entry synced; then prepares the bytes after the header for records
/// ([`prepare_step`]: zeros written and synced).
pub fn create_segment(
    vfs: &dyn Vfs,
    dir: &Path,
    number: u32,
    salt: u64,
    size: u64,
) -> Result<Segment> {
    create_segment_with(vfs, dir, number, salt, size, false).map(|(segment, _)| segment)
}

/// [`create_segment`], or with `sparse` (the zero fill's negative control) sized with
/// `set_len` only; also returns how many `fdatasync`s it made (counted in the store's stats).
pub(super) fn create_segment_with(
    vfs: &dyn Vfs,
    dir: &Path,
    number: u32,
    salt: u64,
    size: u64,
    sparse: bool,
) -> Result<(Segment, u64)> {
    let path = dir.join(segment_file_name(number));
    let file = vfs
        .open(&path, OpenMode::CreateNew)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    let header = format::encode_segment_header(number, salt);
    // The header is durable before any zeros are written: a power cut during the zero fill
    // then leaves a valid header followed by the unacknowledged writes of a torn tail, never
    // a new segment without its header (which open could not tell from damage).
    let syncs = size_step(&*file, SEGMENT_HEADER_LEN, size, true)
        .and_then(|()| file.write_all_at(&header, 0))
        .and_then(|()| file.sync_data())
        .and_then(|()| vfs.sync_dir(dir))
        .and_then(|()| match sparse {
            true => Ok(0),
            false => prepare_step(&*file, SEGMENT_HEADER_LEN, size, true),
        })
        .map_err(|e| Error::io(format!("initialising {}", path.display()), e))?;
    let segment = Segment {
        file,
        seed: format::salt_seed(salt),
    };
    Ok((segment, 1 + syncs))
}

/// How far ahead of its records the tail segment is prepared: far enough that a lone commit
/// seldom prepares a step (once in about 1,500 commits of 174 bytes; at 16 threads about one
/// extra sync in 90), near enough that open after a crash reads at most this much unwritten
/// space to be sure no record follows the last one (SPEC S4; reading it from a cold cache took
/// about 1.1 ms for 355 KB and 0.6 ms for 128 KB, so 1 MiB steps made it most of a cold
/// reopen), and that preparing a step (writing and syncing its zeros) stays a short pause for
/// the one commit that does it.
pub const PREALLOCATION_STEP: u64 = 256 << 10;

/// The size to give a segment whose records will end at `end`: the next whole step past it,
/// never past `segment_bytes` (a first record larger than a segment is written as it is).
pub fn preallocation_target(end: u64, segment_bytes: u64) -> u64 {
    ((end / PREALLOCATION_STEP + 1) * PREALLOCATION_STEP)
        .min(segment_bytes)
        .max(end)
}

/// Prepares bytes `from..to` of a segment for records: writes zeros over them and syncs them,
/// so that a later write there overwrites blocks the file system has already allocated, and
/// the `fdatasync` of a commit has only data to flush: no new file size and no block
/// allocation, either of which would make the sync also commit the file system's journal
/// (measured on ext4: a sync after a write into a hole or past the end took about twice as long
/// as one after an overwrite). `set_len` alone would leave a hole, allocated block by block as
/// records fill it. An all-zero frame is invalid, so recovery reads the zeros as the end of the
/// segment's records. `sync` is off under the weaker sync policies, whose commits do not sync.
/// Returns how many `fdatasync`s it made (0 or 1).
pub fn prepare_step(file: &dyn VfsFile, from: u64, to: u64, sync: bool) -> std::io::Result<u64> {
    size_step(file, from, to, false)?;
    if sync && to > from {
        file.sync_data()?;
        return Ok(1);
    }
    Ok(0)
}

/// Writes zeros over `from..to` a bounded buffer at a time (or, `sparse`, only extends the
/// file to `to` with `set_len`, never shrinking it).
pub(super) fn size_step(
    file: &dyn VfsFile,
    from: u64,
    to: u64,
    sparse: bool,
) -> std::io::Result<()> {
    if sparse {
        if file.len()? < to {
            file.set_len(to)?;
        }
        return Ok(());
    }
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}
