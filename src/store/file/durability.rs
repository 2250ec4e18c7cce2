//! Directory and open-time syncs: what makes a new store's directories, and whatever open
//! found on disk, durable before the store relies on them (SPEC S3, S4).
//!
//! Called by open only; calls only the [`Vfs`].

use std::path::Path;

use super::format::SEGMENT_HEADER_LEN;
use super::journal::JournalTail;
use super::vfs::{Vfs, VfsFile};
use crate::error::{Error, Result};

/// Makes durable everything open is about to trust and serve (SPEC S4), as PostgreSQL syncs
/// its data directory after a crash, but only what a killed process can have left undurable:
///
/// - the tail segment's records that no frame proves durable ([`JournalTail::unproven_from`]
///   on). A process killed during its `fdatasync` leaves writes that readers see (they are in
///   the page cache) but a power cut could still take away, after readers saw them. A sync
///   alone is not enough after a *failed* sync: the kernel then marks the pages clean although
///   they never reached the disk (fsyncgate), so a reopen in the same boot reads them and a
///   later sync writes nothing. Open therefore writes those bytes again (the same bytes, which
///   makes the pages dirty) and then syncs. Every other scanned record is on disk already: a
///   frame's `synced_lsn` is written only after a sync through it succeeded (a failed sync is
///   latched and nothing is framed after it), and every segment but the newest was synced,
///   successfully, before its successor was created;
/// - when the tail segment held no record ([`Needs::created`]): its header and its directory
///   entry. A segment's header is synced, and then its directory entry, before any record is
///   written into it, by a process whose syncs had all succeeded (a failed one is latched and
///   nothing is written after it); so a segment holding a record has both durable, and only a
///   newest segment whose creation may have been cut short needs them;
/// - when no snapshot was read ([`Needs::directories`]): the store directory and its parent. A
///   manifest naming a snapshot exists only after an earlier open synced both (every open that
///   reads none comes here before it writes its manifest), and every later change in the store
///   directory (a heads snapshot, the manifest's rename) syncs it before anything relies on it.
///   The one rename a kill can leave undurable is the newest manifest's, killed inside the
///   directory sync that follows it; a power cut then falls back to the previous manifest, whose
///   snapshot the same durable journal extends (as for a clean reopen, see [`found_nothing`]).
///
/// The sync of the tail also makes the zeros the scan found after its records durable; when it
/// is not made, [`JournalTail::prepared_end`] is cleared so the journal does not rely on them.
/// Not called when open found nothing to make durable ([`found_nothing`]: a store closed
/// cleanly). `skip_tail` (a negative control, tests only) leaves the journal as found.
pub(super) fn sync_what_open_found(
    vfs: &dyn Vfs,
    dir: &Path,
    journal_dir: &Path,
    tail: &mut JournalTail,
    skip_tail: bool,
    needs: Needs,
) -> Result<()> {
    let number = tail.tail_segment;
    let unproven = tail.unproven_from.filter(|_| !skip_tail);
    let header = needs.created && !skip_tail;
    match tail.segments.get(&number) {
        Some(segment) if unproven.is_some() || header => {
            let io = |e| Error::io(format!("rewriting journal segment {number} at open"), e);
            let file = &*segment.file;
            // The tail's records end at the tail offset (the scan stopped there, within the
            // file): the zeros of its prepared end hold no records, and writing them again
            // would only cost time.
            let end = tail.tail_offset;
            if header {
                rewrite(file, 0, SEGMENT_HEADER_LEN.min(end)).map_err(io)?;
            }
            if let Some(from) = unproven {
                rewrite(file, from.min(end), end).map_err(io)?;
            }
            file.sync_data()
                .map_err(|e| Error::io(format!("syncing journal segment {number} at open"), e))?;
        }
        _ => tail.prepared_end = 0,
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let journal = needs.created.then_some(journal_dir);
    let store = needs.directories.then_some([dir, parent]);
    for d in journal.into_iter().chain(store.into_iter().flatten()) {
        vfs.sync_dir(d)
            .map_err(|e| Error::io(format!("syncing {} at open", d.display()), e))?;
    }
    Ok(())
}

/// Which of its directory syncs and header rewrites open needs after what it found (see
/// [`sync_what_open_found`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Needs {
    /// The tail segment held no record: its creation may have been cut short before its
    /// header or its directory entry was synced.
    pub created: bool,
    /// No snapshot was read: the store directory and its parent may never have been synced.
    pub directories: bool,
}

impl Needs {
    /// What open needs after a scan from `scan_start` (None: no snapshot was read) that left
    /// `tail`. `unchecked` (a negative control, tests only) takes every tail as one that held
    /// records.
    pub(super) fn of(tail: &JournalTail, scan_start: Option<(u32, u64)>, unchecked: bool) -> Needs {
        Needs {
            created: tail.tail_offset <= SEGMENT_HEADER_LEN && !unchecked,
            directories: scan_start.is_none(),
        }
    }
}

/// Whether open found nothing a killed process could have left readable but not durable, so
/// [`sync_what_open_found`] has nothing to do: a heads snapshot was read, and the journal ends
/// exactly at its position, in the segment it points into (no record, torn tail, damage or
/// later segment after it; zeros of a preallocated end are not records).
///
/// Everything open then relies on was synced, successfully, before the manifest named that
/// snapshot: a snapshot is written only after the journal is synced through its position, by a
/// process none of whose syncs had failed (a failed sync is latched and refuses every later
/// snapshot), and that segment's header and directory entry were synced when it was created,
/// before any record went into it; so were the store's directories when they were created. A
/// clean reopen therefore writes and syncs nothing. (The manifest's own rename may not be
/// durable if its writer was killed inside the directory sync that follows it; losing it falls
/// back to the previous manifest, whose snapshot the same durable journal extends.)
pub(super) fn found_nothing(
    outcome: &super::recovery::ScanOutcome,
    scan_start: Option<(u32, u64)>,
) -> bool {
    let Some((segment, offset)) = scan_start else {
        return false;
    };
    outcome.bytes_scanned == 0
        && outcome.records.is_empty()
        && outcome.torn_tail.is_none()
        && outcome.damage.is_empty()
        && outcome.tail.tail_segment == segment
        && outcome.tail.tail_offset == offset
}

/// Writes bytes `from..to` of `file` over themselves, a bounded chunk at a time.
fn rewrite(file: &dyn VfsFile, from: u64, to: u64) -> std::io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let mut buf = Vec::new();
    let mut at = from;
    while at < to {
        let n = CHUNK.min(to - at);
        buf.resize(n as usize, 0);
        file.read_exact_at(&mut buf, at)?;
        file.write_all_at(&buf, at)?;
        at += n;
    }
    Ok(())
}

/// Creates a directory and any missing parents, and syncs the parent of each one created: a new
/// directory's entry is no more durable than a new file's (SPEC S3), so without this a power cut
/// could take a just-created store, with every batch acknowledged in it, away.
pub(super) fn create_dir_durably(vfs: &dyn Vfs, dir: &Path) -> Result<()> {
    let io = |what: &str, path: &Path, e| Error::io(format!("{what} {}", path.display()), e);
    let mut missing = Vec::new();
    for ancestor in dir.ancestors() {
        if ancestor.as_os_str().is_empty()
            || vfs
                .kind(ancestor)
                .map_err(|e| io("inspecting", ancestor, e))?
                .is_some()
        {
            break;
        }
        missing.push(ancestor);
    }
    vfs.create_dir_all(dir)
        .map_err(|e| io("creating", dir, e))?;
    // Deepest first: each parent is synced once its new child holds what it must.
    for created in missing {
        if let Some(parent) = created.parent() {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            vfs.sync_dir(parent)
                .map_err(|e| io("syncing the directory of", created, e))?;
        }
    }
    Ok(())
}
