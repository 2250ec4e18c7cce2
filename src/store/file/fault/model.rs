//! The disk model behind [`FaultFs`](super::FaultFs): what is in the page cache (current) and
//! what would survive a power cut (durable), for file bytes and for directory entries.
//!
//! A power cut is modelled as unkindly as the ALICE and CrashMonkey studies found real file
//! systems to be: unsynced writes reach the disk in 4 KiB pieces, any subset of them, in any
//! order, and a piece may be cut short; unsynced directory changes (creations, renames,
//! removals, new subdirectories) survive in any subset. What a sync made durable stays.
//!
//! This module knows nothing of fault injection or operation counting, nor of paths (the tree of
//! directories is in [`disk`](super::disk)); it only answers "what does this file or directory
//! hold now" and "what could it hold after a crash".

use std::collections::BTreeMap;

use super::rng::Rng;

/// The unit in which unsynced writes reach the disk (a page of the page cache).
pub(crate) const PAGE: u64 = 4096;

/// Identifies a file's contents independently of its names (an inode).
pub(crate) type FileId = u64;

/// One change to a file's bytes, kept until a sync makes it durable.
#[derive(Clone, Debug)]
pub(crate) enum FileWrite {
    /// Bytes written at an offset (the file grows, zero-filled, if needed).
    Data { offset: u64, bytes: Vec<u8> },
    /// The file truncated or extended (zero-filled) to a length.
    SetLen(u64),
}

impl FileWrite {
    fn apply(&self, data: &mut Vec<u8>) {
        match self {
            FileWrite::Data { offset, bytes } => write_at(data, *offset, bytes),
            FileWrite::SetLen(len) => data.resize(*len as usize, 0),
        }
    }

    /// This change cut at page boundaries: the pieces that reach the disk independently.
    fn pieces(&self) -> Vec<FileWrite> {
        let FileWrite::Data { offset, bytes } = self else {
            return vec![self.clone()];
        };
        let mut pieces = Vec::new();
        let mut at = 0usize;
        while at < bytes.len() {
            let pos = offset + at as u64;
            let room = (PAGE - pos % PAGE) as usize;
            let end = bytes.len().min(at + room);
            pieces.push(FileWrite::Data {
                offset: pos,
                bytes: bytes[at..end].to_vec(),
            });
            at = end;
        }
        pieces
    }

    /// Applies part of this change, as a power cut in the middle of it would: a prefix of the
    /// bytes, then, where the rest should be, the old bytes; past the old end of the file (newly
    /// allocated space), zeros or garbage may appear instead. Only the bytes this change writes
    /// are touched, and bytes already there are never garbled (sector writes are atomic; SQLite
    /// calls this "powersafe overwrite"). Changing a length is all or nothing.
    fn apply_torn(&self, data: &mut Vec<u8>, rng: &mut Rng) {
        let FileWrite::Data { offset, bytes } = self else {
            if rng.one_in(2) {
                self.apply(data);
            }
            return;
        };
        let cut = rng.below(bytes.len() as u64 + 1) as usize;
        write_at(data, *offset, &bytes[..cut]);
        // Fill only what lies past the current end: old bytes stay as they were.
        let from = (*offset as usize + cut).max(data.len());
        let end = *offset as usize + bytes.len();
        if from >= end {
            return;
        }
        match rng.below(3) {
            0 => {}
            1 => write_at(data, from as u64, &vec![0u8; end - from]),
            _ => {
                let mut garbage = vec![0u8; rng.below((end - from) as u64 + 1) as usize];
                rng.fill(&mut garbage);
                write_at(data, from as u64, &garbage);
            }
        }
    }
}

fn write_at(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let offset = offset as usize;
    let end = offset + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[offset..end].copy_from_slice(bytes);
}

/// How many of a set of pending changes a crash keeps, and which.
#[derive(Clone, Copy)]
enum Survival {
    /// None of them.
    None,
    /// All of them, whole (the page cache reached the disk just in time).
    All,
    /// A prefix in order, the next one possibly torn (an ordered file system).
    Prefix(usize),
    /// Each independently, any one possibly torn (write-back in any order).
    Subset,
}

fn survival(rng: &mut Rng, len: usize) -> Survival {
    match rng.below(6) {
        0 => Survival::None,
        1 => Survival::All,
        2 => Survival::Prefix(rng.below(len as u64 + 1) as usize),
        _ => Survival::Subset,
    }
}

/// A file's bytes: what readers see now, what survives a crash, and the writes in between.
#[derive(Clone, Debug, Default)]
pub(crate) struct FileData {
    pub(crate) current: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<FileWrite>,
}

impl FileData {
    pub(crate) fn durable(bytes: Vec<u8>) -> Self {
        FileData {
            current: bytes.clone(),
            durable: bytes,
            unsynced: Vec::new(),
        }
    }

    /// Applies a change to the current bytes; it becomes durable at the next sync.
    pub(crate) fn write(&mut self, change: FileWrite) {
        change.apply(&mut self.current);
        self.unsynced.push(change);
    }

    /// Makes every write so far durable.
    pub(crate) fn sync(&mut self) {
        for change in self.unsynced.drain(..) {
            change.apply(&mut self.durable);
        }
    }

    /// A failed sync: some of the pages may have reached the disk before the error, the others
    /// never will. Like Linux after a failed fsync, the pages are marked clean, so readers
    /// still see every write but no later sync saves the lost ones.
    pub(crate) fn fail_sync(&mut self, rng: &mut Rng) {
        self.durable = self.crash_bytes(rng);
        self.unsynced.clear();
    }

    /// Whether any write awaits a sync.
    pub(crate) fn has_unsynced(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// The bytes a power cut now could leave: the durable bytes, plus the unsynced writes' page
    /// pieces that `rng` keeps, applied in the order they were written (a later write to the
    /// same bytes wins when both survive), any kept piece possibly torn.
    pub(crate) fn crash_bytes(&self, rng: &mut Rng) -> Vec<u8> {
        let mut bytes = self.durable.clone();
        if self.unsynced.is_empty() {
            return bytes;
        }
        let pieces: Vec<FileWrite> = self.unsynced.iter().flat_map(FileWrite::pieces).collect();
        match survival(rng, pieces.len()) {
            Survival::None => {}
            Survival::All => pieces.iter().for_each(|p| p.apply(&mut bytes)),
            Survival::Prefix(kept) => {
                pieces[..kept].iter().for_each(|p| p.apply(&mut bytes));
                if let Some(next) = pieces.get(kept)
                    && rng.one_in(2)
                {
                    next.apply_torn(&mut bytes, rng);
                }
            }
            Survival::Subset => {
                for piece in &pieces {
                    if !rng.one_in(2) {
                        continue;
                    }
                    if rng.one_in(4) {
                        piece.apply_torn(&mut bytes, rng);
                    } else {
                        piece.apply(&mut bytes);
                    }
                }
            }
        }
        bytes
    }
}

/// Identifies a directory independently of its name, so a renamed directory keeps its entries.
pub(crate) type DirId = u64;

/// What a directory entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    File(FileId),
    Dir(DirId),
}

/// One atomic change to a directory's entries (a rename is one change of two entries).
pub(crate) type DirChange = Vec<(String, Option<Node>)>;

/// A directory's entries (name -> file or subdirectory), current and durable.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirData {
    pub(crate) current: BTreeMap<String, Node>,
    durable: BTreeMap<String, Node>,
    unsynced: Vec<DirChange>,
}

impl DirData {
    pub(crate) fn change(&mut self, change: DirChange) {
        apply_dir_change(&mut self.current, &change);
        self.unsynced.push(change);
    }

    /// Makes every entry change so far durable.
    pub(crate) fn sync(&mut self) {
        for change in self.unsynced.drain(..) {
            apply_dir_change(&mut self.durable, &change);
        }
    }

    /// Whether any entry change awaits a directory sync.
    pub(crate) fn has_unsynced(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// The entries after a crash: the durable ones plus any subset of the changes since, in
    /// order (a file created or renamed since the last sync may vanish, one removed may
    /// reappear). A rename within the directory stays atomic.
    pub(crate) fn crash_entries(&self, rng: &mut Rng) -> BTreeMap<String, Node> {
        let mut entries = self.durable.clone();
        let kept: Vec<&DirChange> = match survival(rng, self.unsynced.len()) {
            Survival::None => Vec::new(),
            Survival::All => self.unsynced.iter().collect(),
            Survival::Prefix(n) => self.unsynced[..n].iter().collect(),
            Survival::Subset => self.unsynced.iter().filter(|_| rng.one_in(2)).collect(),
        };
        for change in kept {
            apply_dir_change(&mut entries, change);
        }
        entries
    }
}

fn apply_dir_change(entries: &mut BTreeMap<String, Node>, change: &DirChange) {
    for (name, target) in change {
        match target {
            Some(node) => entries.insert(name.clone(), *node),
            None => entries.remove(name),
        };
    }
}

pub(crate) fn durable_dir(entries: BTreeMap<String, Node>) -> DirData {
    DirData {
        current: entries.clone(),
        durable: entries,
        unsynced: Vec::new(),
    }
}
