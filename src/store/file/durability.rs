//! Directory and open-time syncs: what makes a new store's directories, and whatever open
//! found on disk, durable before the store relies on them (SPEC S3, S4).
//!
//! Called by open only; calls only the [`Vfs`].

use std::path::Path;

use super::journal::JournalTail;
use super::vfs::Vfs;
use crate::error::{Error, Result};

/// Makes durable everything open is about to trust and serve (SPEC S4). A process killed
/// during its `fdatasync` leaves writes that readers see (they are in the page cache) but a
/// power cut could still take away, after readers saw them and after later segments sealed
/// them; likewise a segment or snapshot whose directory entry was not yet synced. So, as
/// PostgreSQL syncs its data directory after a crash, open syncs the segments it scanned (from
/// the snapshot's segment on: older ones were sealed, so synced, before their successor began),
/// the journal directory, the store directory and its parent. On an intact store each of these
/// is a sync with nothing to write.
pub(super) fn sync_what_open_found(
    vfs: &dyn Vfs,
    dir: &Path,
    journal_dir: &Path,
    tail: &JournalTail,
    first_scanned: Option<u32>,
) -> Result<()> {
    for (number, segment) in tail.segments.range(first_scanned.unwrap_or(0)..) {
        segment
            .file
            .sync_data()
            .map_err(|e| Error::io(format!("syncing journal segment {number} at open"), e))?;
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    for d in [journal_dir, dir, parent] {
        vfs.sync_dir(d)
            .map_err(|e| Error::io(format!("syncing {} at open", d.display()), e))?;
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
