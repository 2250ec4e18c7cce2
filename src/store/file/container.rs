//! Small whole files (the manifest, heads snapshots): a versioned, checksummed envelope around
//! a postcard body, written atomically (temp file, sync, rename, sync directory).
//!
//! Envelope: magic (8) | format version (4) | body length (4) | crc32c of body (4) | body.
//! The version is read before anything else, so a newer file is refused, never misread (S10).

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::format::FORMAT_VERSION;
use super::vfs::{OpenMode, Vfs};
use crate::error::{Error, Result};

const ENVELOPE_LEN: usize = 20;

/// Writes `value` to `dir/name` atomically.
pub fn write_atomic<T: Serialize>(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    magic: &[u8; 8],
    value: &T,
) -> Result<()> {
    let body =
        postcard::to_stdvec(value).map_err(|e| Error::invalid(format!("encoding {name}: {e}")))?;
    let mut bytes = Vec::with_capacity(ENVELOPE_LEN + body.len());
    bytes.extend_from_slice(magic);
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let io = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
    let file = vfs
        .open(&tmp, OpenMode::CreateTruncate)
        .map_err(|e| io("creating", e))?;
    file.write_all_at(&bytes, 0).map_err(|e| io("writing", e))?;
    file.sync_data().map_err(|e| io("syncing", e))?;
    drop(file);
    vfs.rename(&tmp, &path)
        .map_err(|e| io("renaming into", e))?;
    vfs.sync_dir(dir)
        .map_err(|e| io("syncing the directory of", e))?;
    Ok(())
}

/// Reads and verifies `dir/name`. `Ok(None)` if the file does not exist.
pub fn read<T: DeserializeOwned>(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    magic: &[u8; 8],
) -> Result<Option<(T, u64)>> {
    let path = dir.join(name);
    let file = match vfs.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("opening {}", path.display()), e)),
    };
    let len = file
        .len()
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let corrupt = |detail: &str| Error::corrupt(path.display().to_string(), detail.to_owned());
    if len < ENVELOPE_LEN as u64 {
        return Err(corrupt("file too short"));
    }
    let mut head = [0u8; ENVELOPE_LEN];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if &head[0..8] != magic {
        return Err(corrupt("wrong magic number"));
    }
    let version = u32::from_le_bytes(head[8..12].try_into().unwrap());
    if version > FORMAT_VERSION {
        return Err(Error::UnsupportedVersion {
            file: path.display().to_string(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let body_len = u32::from_le_bytes(head[12..16].try_into().unwrap()) as u64;
    if body_len != len - ENVELOPE_LEN as u64 {
        return Err(corrupt("length does not match the file size"));
    }
    let mut body = vec![0u8; body_len as usize];
    file.read_exact_at(&mut body, ENVELOPE_LEN as u64)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if crc32c::crc32c(&body) != u32::from_le_bytes(head[16..20].try_into().unwrap()) {
        return Err(corrupt("checksum mismatch"));
    }
    let value = postcard::from_bytes(&body).map_err(|e| corrupt(&format!("undecodable: {e}")))?;
    Ok(Some((value, len)))
}
