//! Inspecting a store directory without changing it (SPEC E5): opening through an
//! [`OverlayFs`], and a walk that reads every file of the directory, the manifest, the newest
//! heads snapshot, every segment header, and every record of every segment with its checksums.
//!
//! Open reads only the journal after the newest snapshot (SPEC S5), so damage to older records
//! shows only when their partition loads; this walk reads all of it, and reports what it finds
//! the same way recovery would (it runs recovery's own scan, from the first segment, on the
//! overlay), so the two can never disagree about what counts as damage.
//!
//! Both keep at most [`OPEN_SEGMENTS`] segment files open at once (the store's bounded table,
//! over an overlay that holds an unchanged file only while a handle on it lives), so a journal
//! of any number of segments is inspected within a small descriptor limit.

use crate::sync::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::overlay::OverlayFs;
use super::recovery::{self, DamagedRecord, TornTail};
use super::vfs::{OpenMode, Vfs};
use super::{
    FileStore, JOURNAL_DIR, MANIFEST, MANIFEST_MAGIC, SyncPolicy, container, format, heads,
    journal, segments,
};
use crate::error::{Error, Result};

/// Segment files an inspection keeps open at once, in the store it opens and in the walk.
const OPEN_SEGMENTS: usize = 16;

/// How a small whole file (manifest, snapshot) was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FileState {
    /// Present, and its checksum matches.
    Intact,
    /// Not there.
    Missing,
    /// There, but it does not verify (the error says how).
    Damaged(String),
}

/// What the walk found.
#[derive(Clone, Debug)]
pub(crate) struct FileCheck {
    /// Every file of the directory and its journal, with its size in bytes.
    pub(crate) files: Vec<(String, u64)>,
    pub(crate) manifest: FileState,
    /// The snapshot the manifest names, and how it was found.
    pub(crate) snapshot: Option<(String, FileState)>,
    /// Segments whose header does not verify.
    pub(crate) bad_headers: Vec<(u32, String)>,
    /// Records that fail their checksums (or are out of order) with valid records after them.
    pub(crate) damaged: Vec<DamagedRecord>,
    /// A damaged end of the newest segment: what a crash cuts short; open truncates it.
    pub(crate) torn_tail: Option<TornTail>,
    /// Why the walk could not read the journal to its end, if it could not.
    pub(crate) unreadable: Option<String>,
    pub(crate) records: u64,
    pub(crate) bytes: u64,
    /// What the manifest says the store refuses (SPEC S4), persisted by earlier opens.
    pub(crate) persisted: super::StoreDamage,
}

fn state_of<T>(read: Result<Option<T>>) -> Result<(FileState, Option<T>)> {
    match read {
        Ok(Some(value)) => Ok((FileState::Intact, Some(value))),
        Ok(None) => Ok((FileState::Missing, None)),
        Err(e @ Error::UnsupportedVersion { .. }) => Err(e),
        Err(e) => Ok((FileState::Damaged(e.to_string()), None)),
    }
}

fn sizes(dir: &Path, prefix: &str, out: &mut Vec<(String, u64)>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let meta = entry
            .metadata()
            .map_err(|e| Error::io(format!("inspecting {}", entry.path().display()), e))?;
        if meta.is_file() {
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            found.push((name, meta.len()));
        }
    }
    found.sort();
    out.extend(found);
    Ok(())
}

impl FileStore {
    /// Opens the store in `dir` without changing anything in it (see [`OverlayFs`]): recovery
    /// runs as it would, but what it writes stays in memory. Refuses a store another process
    /// has open ([`Error::Locked`]) and a directory that does not exist.
    pub(crate) fn open_unchanged(dir: &Path) -> Result<FileStore> {
        if !dir.is_dir() {
            return Err(Error::invalid(format!(
                "{} is not a directory holding a store",
                dir.display()
            )));
        }
        FileStore::builder(dir)
            .vfs(Arc::new(OverlayFs::new()))
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .auto_compact(false)
            .max_open_segments(OPEN_SEGMENTS)
            .open()
    }

    /// Reads every file of the store's directory and checks every checksum, changing nothing.
    /// Meant for a store opened with [`FileStore::open_unchanged`], whose lock it relies on.
    pub(crate) fn check_files(&self) -> Result<FileCheck> {
        check_files(self.path(), OverlayFs::without_lock())
    }
}

/// Reads every file of the store directory `dir` and checks every checksum, changing nothing,
/// for a store that does not open. Holds the directory's lock while it reads.
pub(crate) fn check_unopened(dir: &Path) -> Result<FileCheck> {
    let fs = OverlayFs::new();
    let _lock = fs.try_lock(&dir.join(super::LOCK_FILE)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Error::Locked {
                path: dir.display().to_string(),
            }
        } else {
            Error::io(format!("locking {}", dir.display()), e)
        }
    })?;
    check_files(dir, fs)
}

fn check_files(dir: &Path, fs: OverlayFs) -> Result<FileCheck> {
    let journal_dir = dir.join(JOURNAL_DIR);
    let mut files = Vec::new();
    sizes(dir, "", &mut files)?;
    if journal_dir.is_dir() {
        sizes(&journal_dir, &format!("{JOURNAL_DIR}/"), &mut files)?;
    }

    let (manifest, read) = state_of(
        container::read(&fs, dir, MANIFEST, MANIFEST_MAGIC)
            .and_then(|env| env.map(|env| super::decode_manifest(&env)).transpose()),
    )?;
    // The segments compaction deleted, so the walk accepts exactly those gaps.
    let known = read.as_ref().map(|m| m.damage.clone()).unwrap_or_default();
    let snapshot = match read.and_then(|m| m.snapshot) {
        Some(name) => {
            // Every page is read and checked.
            let read = heads::verify(&fs, dir, &name);
            Some((name, state_of(read)?.0))
        }
        None => None,
    };

    let mut bad_headers = Vec::new();
    for (name, _) in &files {
        let Some(number) = name
            .strip_prefix(&format!("{JOURNAL_DIR}/"))
            .and_then(journal::parse_segment_file_name)
        else {
            continue;
        };
        let path = dir.join(name);
        let mut header = [0u8; format::SEGMENT_HEADER_LEN as usize];
        let read = fs
            .open(&path, OpenMode::Read)
            .and_then(|f| f.read_exact_at(&mut header, 0));
        let problem = match read {
            Err(e) => Some(format!("the header cannot be read: {e}")),
            Ok(()) => match format::decode_segment_header(&header, name) {
                Ok((n, _)) if n == number => None,
                Ok((n, _)) => Some(format!("the header names segment {n}")),
                Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
                Err(e) => Some(e.to_string()),
            },
        };
        if let Some(problem) = problem {
            bad_headers.push((number, problem));
        }
    }

    let mut check = FileCheck {
        files,
        manifest,
        snapshot,
        bad_headers,
        damaged: Vec::new(),
        torn_tail: None,
        unreadable: None,
        records: 0,
        bytes: 0,
        persisted: super::damage::describe(&known),
    };
    // Recovery's own scan, from the first record of the first segment, on an overlay.
    let files =
        segments::SegmentFiles::new(journal_dir.clone(), Arc::new(fs.clone()), OPEN_SEGMENTS);
    let scanned = recovery::list_segments(&fs, &journal_dir)
        .and_then(|numbers| {
            recovery::open_segments_with(&fs, &journal_dir, &numbers, 0, |number, _| {
                files.file(number)
            })
        })
        .and_then(|segments| {
            recovery::scan(
                &fs,
                &journal_dir,
                segments,
                None,
                None,
                recovery::Known {
                    heads: HashMap::default(),
                    pages: None,
                },
                &known,
            )
        });
    match scanned {
        Ok(outcome) => {
            check.damaged = outcome.records;
            check.torn_tail = outcome.torn_tail;
            check.records = outcome.records_scanned;
            check.bytes = outcome.bytes_scanned;
        }
        Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
        Err(e) => check.unreadable = Some(e.to_string()),
    }
    Ok(check)
}
