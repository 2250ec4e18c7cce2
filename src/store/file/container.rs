//! Small whole files (the manifest, heads snapshots): a versioned, checksummed envelope around
//! a postcard body, written atomically (temp file, sync, rename, sync directory).
//!
//! Envelope (version 2): preamble (magic, format version, preamble checksum: 16) | body length
//! (4) | crc32c of body (4) | body. Version 1 had no preamble checksum (20 bytes before the
//! body). Magic and version are read before anything else by the rule every file follows
//! ([`format::read_preamble`]): a newer file is refused, never misread (S10); a damaged one is
//! damage.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::format::{self, PREAMBLE_LEN};
use super::vfs::{OpenMode, Vfs};
use crate::error::{Error, Result};

const ENVELOPE_LEN: usize = PREAMBLE_LEN + 8;
const ENVELOPE_V1_LEN: usize = 20;
/// Files up to this length are read whole, in one call.
const WHOLE_READ: u64 = 4096;

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
    bytes.extend_from_slice(&format::encode_preamble(magic));
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

/// A verified file: its format version and body.
pub struct Envelope {
    pub version: u32,
    pub body: Vec<u8>,
    pub len: u64,
    path: String,
}

impl Envelope {
    /// Decodes the body; a body that does not decode is damage.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        postcard::from_bytes(&self.body)
            .map_err(|e| Error::corrupt(self.path.clone(), format!("undecodable: {e}")))
    }
}

/// Reads and verifies `dir/name`. `Ok(None)` if the file does not exist. A newer format is
/// `UnsupportedVersion`; anything else wrong is `Corrupt`.
pub fn read(vfs: &dyn Vfs, dir: &Path, name: &str, magic: &[u8; 8]) -> Result<Option<Envelope>> {
    let path = dir.join(name);
    let shown = path.display().to_string();
    let file = match vfs.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("opening {shown}"), e)),
    };
    let len = file
        .len()
        .map_err(|e| Error::io(format!("reading {shown}"), e))?;
    let corrupt = |detail: &str| Error::corrupt(shown.clone(), detail.to_owned());
    // A file of a page or less (the manifest) is read in one call; the checks below are the
    // same whichever way it was read.
    let whole = match len <= WHOLE_READ {
        true => {
            let mut all = vec![0u8; len as usize];
            file.read_exact_at(&mut all, 0)
                .map_err(|e| Error::io(format!("reading {shown}"), e))?;
            Some(all)
        }
        false => None,
    };
    let mut head = [0u8; ENVELOPE_LEN];
    let head_len = (len as usize).min(ENVELOPE_LEN);
    match &whole {
        Some(all) => head[..head_len].copy_from_slice(&all[..head_len]),
        None => file
            .read_exact_at(&mut head[..head_len], 0)
            .map_err(|e| Error::io(format!("reading {shown}"), e))?,
    }
    let version = format::read_preamble(&head[..head_len], magic, &shown)?;
    let envelope_len = if version == 1 {
        ENVELOPE_V1_LEN
    } else {
        ENVELOPE_LEN
    };
    if (len as usize) < envelope_len {
        return Err(corrupt("file too short"));
    }
    let fields = &head[envelope_len - 8..envelope_len];
    let body_len = u32::from_le_bytes(fields[0..4].try_into().unwrap()) as u64;
    if body_len != len - envelope_len as u64 {
        return Err(corrupt("length does not match the file size"));
    }
    let body = match whole {
        Some(mut all) => all.split_off(envelope_len),
        None => {
            let mut body = vec![0u8; body_len as usize];
            file.read_exact_at(&mut body, envelope_len as u64)
                .map_err(|e| Error::io(format!("reading {shown}"), e))?;
            body
        }
    };
    if crc32c::crc32c(&body) != u32::from_le_bytes(fields[4..8].try_into().unwrap()) {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(Some(Envelope {
        version,
        body,
        len,
        path: shown,
    }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::fault::FaultFs;
    use super::{read, write_atomic};

    /// A small file (the manifest) is read in one call, not its envelope then its body: open
    /// pays for each read (issue 13).
    #[test]
    fn a_small_file_is_read_in_one_call() {
        let fs = FaultFs::new();
        let dir = Path::new("/");
        write_atomic(&fs, dir, "small", b"TESTFILE", &vec![7u8; 100]).unwrap();
        let before = fs.ops();
        let env = read(&fs, dir, "small", b"TESTFILE").unwrap().unwrap();
        assert_eq!(env.decode::<Vec<u8>>().unwrap(), vec![7u8; 100]);
        // Open, size, one read.
        assert_eq!(fs.ops() - before, 3);
        // A larger one still reads its envelope first, then its body.
        write_atomic(&fs, dir, "large", b"TESTFILE", &vec![7u8; 8192]).unwrap();
        let before = fs.ops();
        let env = read(&fs, dir, "large", b"TESTFILE").unwrap().unwrap();
        assert_eq!(env.decode::<Vec<u8>>().unwrap().len(), 8192);
        assert_eq!(fs.ops() - before, 4);
    }
}
