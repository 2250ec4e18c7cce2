//! What open knows before it scans the journal: the manifest, read and classified, and, when
//! no usable manifest says it, what the store refuses and which segments compaction deleted on
//! purpose, from the files a manifest's loss leaves (SPEC S4).
//!
//! Only damage, a file that reads back wrong (a bad magic, a checksum mismatch, a body that
//! does not decode: `Corrupt`), makes open set the manifest aside or rebuild. An error of the
//! read itself (`Io`: a transient `EIO`, `EMFILE`) says nothing about the file: it is returned
//! as it is, before open has changed anything on disk. A newer format is refused
//! (`UnsupportedVersion`, SPEC S10).
//!
//! May call: the container and heads modules, through the [`Vfs`].

use std::path::Path;

use super::super::damage::Damage;
use super::super::vfs::Vfs;
use super::super::{MANIFEST, MANIFEST_MAGIC, Manifest, container, decode_manifest, heads};
use crate::error::{Error, Result};

/// Where a damaged manifest is kept as evidence.
pub(in crate::store::file) const SET_ASIDE: &str = "MANIFEST.damaged";

/// The manifest as open finds it.
pub(in crate::store::file) enum ManifestRead {
    /// No manifest: a new store, or one whose manifest was lost or set aside.
    Absent,
    Read(Manifest),
    /// It reads back wrong (`Corrupt`, kept to say why).
    Damaged(Error),
}

/// Reads the manifest. `Err` is an I/O error (nothing can be said about the file) or a newer
/// format; damage is [`ManifestRead::Damaged`].
pub(in crate::store::file) fn read_manifest(vfs: &dyn Vfs, dir: &Path) -> Result<ManifestRead> {
    let read = container::read(vfs, dir, MANIFEST, MANIFEST_MAGIC)
        .and_then(|m| m.map(|env| decode_manifest(&env)).transpose());
    match read {
        Ok(Some(m)) => Ok(ManifestRead::Read(m)),
        Ok(None) => Ok(ManifestRead::Absent),
        Err(e @ Error::Corrupt { .. }) => Ok(ManifestRead::Damaged(e)),
        Err(e) => Err(e),
    }
}

/// What the store refuses, and which segments compaction deleted, for a rebuild no usable
/// manifest guides: the damage the newest heads snapshot that reads back intact records (it
/// is written with every manifest), and the deleted segments a manifest set aside earlier
/// records (they stay deleted, so that part of it is true however old it is; its refusals
/// may since have been accepted, and are not taken). A file that reads back wrong is
/// skipped; an I/O error is returned.
pub(in crate::store::file) fn known_without_manifest(vfs: &dyn Vfs, dir: &Path) -> Result<Damage> {
    let mut known = newest_snapshot_damage(vfs, dir)?;
    let aside = container::read(vfs, dir, SET_ASIDE, MANIFEST_MAGIC)
        .and_then(|m| m.map(|env| decode_manifest(&env)).transpose());
    match aside {
        Ok(Some(m)) => known.merge(Damage {
            retired: m.damage.retired,
            ..Damage::default()
        }),
        Ok(None) => {}
        Err(e @ Error::Corrupt { .. }) => log::debug!("{SET_ASIDE} reads back wrong: {e}"),
        Err(e) => return Err(e),
    }
    Ok(known)
}

/// The damage the newest heads snapshot in `dir` that reads back intact records; nothing if
/// none does.
fn newest_snapshot_damage(vfs: &dyn Vfs, dir: &Path) -> Result<Damage> {
    let mut names: Vec<String> = vfs
        .list(dir)
        .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?
        .into_iter()
        .filter(|n| n.starts_with("heads-") && n.ends_with(".snap"))
        .collect();
    // Named by the next LSN, zero-padded: the newest sorts last.
    names.sort_unstable();
    for name in names.iter().rev() {
        match heads::open(vfs, dir, name) {
            Ok(Some(snap)) => {
                log::warn!("taking what the store refuses and deleted from heads snapshot {name}");
                return Ok(snap.position.damage);
            }
            // Removed since the listing: the next one.
            Ok(None) => {}
            Err(e @ Error::Corrupt { .. }) => {
                log::warn!("heads snapshot {name} reads back wrong ({e}); trying an older one");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Damage::default())
}
