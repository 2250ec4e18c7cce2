//! Stores on a [`FaultFs`] disk for the damage and recovery tests: small segments so a short
//! workload spans several, and helpers to find and damage the files docs/DESIGN.md documents.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use portcullis::store::{Batch, FaultFs, FileStore, FileStoreBuilder, Partition, Store, Vfs};
use portcullis::{Error, ManualClock};

use super::workload::{batch, partition_of};

/// Where the store lives on the fault-injecting disk.
pub const DIR: &str = "/db";
/// Batches of the shared workload [`written`] commits.
pub const BATCHES: u64 = 24;

/// A store configuration with 4 KiB segments, no automatic snapshots or compaction, and a base
/// record every 4 records.
pub fn builder(fs: &FaultFs) -> FileStoreBuilder {
    FileStore::builder(DIR)
        .vfs(Arc::new(fs.clone()))
        .clock(Arc::new(ManualClock::new(1_000)))
        .segment_bytes(4096)
        .snapshot_every_bytes(1 << 40)
        .base_every_records(4)
        .auto_compact(false)
}

/// A disk holding the workload's batches `1..=BATCHES`: closed cleanly (a heads snapshot covers
/// everything) or left by a killed process (open must scan the journal).
pub fn written(clean_close: bool) -> FaultFs {
    written_with(clean_close, false)
}

/// The partition [`written_after_keeper`] writes first; its one row ([`KEPT`]) is never
/// overwritten, so reading it needs the first segment.
pub const KEEPER: &str = "keeper";
/// The key and value of [`KEEPER`]'s row.
pub const KEPT: (&[u8], &[u8]) = (b"kept", b"first");

/// [`written`], after one row of [`KEEPER`] that lives in the first segment (a sealed segment
/// older than the heads snapshot, which open does not read).
pub fn written_after_keeper(clean_close: bool) -> FaultFs {
    written_with(clean_close, true)
}

fn written_with(clean_close: bool, keeper: bool) -> FaultFs {
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    if keeper {
        let put = Batch::new().put(KEPT.0.to_vec(), KEPT.1.to_vec());
        let p = Partition::new(KEEPER).unwrap();
        assert!(store.apply(&p, &put).unwrap().is_committed());
    }
    for n in 1..=BATCHES {
        assert!(
            store
                .apply(&partition_of(n), &batch(n))
                .unwrap()
                .is_committed()
        );
    }
    if clean_close {
        store.close().unwrap();
        fs
    } else {
        let image = fs.crash_process();
        drop(store);
        image
    }
}

/// The journal directory.
pub fn journal() -> PathBuf {
    Path::new(DIR).join("journal")
}

/// The journal's segment files, oldest first.
pub fn segments(fs: &FaultFs) -> Vec<PathBuf> {
    let mut names: Vec<String> = fs
        .list(&journal())
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    names.into_iter().map(|n| journal().join(n)).collect()
}

/// The number in a segment file's name.
pub fn segment_number(path: &Path) -> u32 {
    let name = path.file_name().unwrap().to_string_lossy();
    name.trim_end_matches(".seg").parse().unwrap()
}

/// The heads snapshot files.
pub fn snapshot_files(fs: &FaultFs) -> Vec<PathBuf> {
    fs.list(Path::new(DIR))
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with("heads-") && n.ends_with(".snap"))
        .map(|n| Path::new(DIR).join(n))
        .collect()
}

/// Changes a file's bytes in place.
pub fn damage(fs: &FaultFs, path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = fs.read_file(path).unwrap();
    f(&mut bytes);
    fs.write_file(path, bytes).unwrap();
}

/// Commits one batch that puts `len` bytes `x` under `key` in `p`.
pub fn put_filled(store: &FileStore, p: &Partition, key: &str, len: usize) {
    let b = Batch::new().put(key.as_bytes().to_vec(), vec![b'x'; len]);
    assert!(store.apply(p, &b).unwrap().is_committed());
}

/// A store on `fs` ([`builder`]), left open, in which partition `big`'s value `old` (300
/// bytes) lives in a segment that filler batches then sealed; the returned path is that
/// segment. Later batches of `big` (`k0`..`k7`, 10 bytes each) are enough that a base record,
/// holding the location of `old`, follows, so `big`'s newest chain does not need the segment.
pub fn value_in_a_sealed_segment(fs: &FaultFs) -> (FileStore, Partition, PathBuf) {
    let store = builder(fs).open().unwrap();
    let big = Partition::new("big").unwrap();
    put_filled(&store, &big, "old", 300);
    let holder = segments(fs).pop().unwrap();
    let filler = Partition::new("filler").unwrap();
    while segments(fs).last() == Some(&holder) {
        put_filled(&store, &filler, "f", 1500);
    }
    for i in 0..8 {
        put_filled(&store, &big, &format!("k{i}"), 10);
    }
    (store, big, holder)
}

/// A tally of single-key writes: each batch sets key `v` of one partition to a fresh value,
/// so what a partition shows tells exactly which of its batches survived.
#[derive(Default)]
pub struct Tally {
    /// Every value written per partition, oldest first.
    pub written: BTreeMap<String, Vec<Vec<u8>>>,
    n: u64,
}

impl Tally {
    /// Commits one batch to `name` whose value is `pad` bytes long.
    pub fn put(&mut self, store: &FileStore, name: &str, pad: usize) {
        self.n += 1;
        let mut value = format!("{name} #{}:", self.n).into_bytes();
        value.resize(value.len() + pad, b'.');
        let p = Partition::new(name).unwrap();
        let b = Batch::new().put(b"v".to_vec(), value.clone());
        assert!(store.apply(&p, &b).unwrap().is_committed());
        self.written.entry(name.to_owned()).or_default().push(value);
    }

    /// The newest value of a partition.
    pub fn newest(&self, name: &str) -> &[u8] {
        self.written[name].last().unwrap()
    }

    /// Checks that no partition was rolled back: each answers its newest value or refuses with
    /// `Corrupt`. Returns the partitions that refused.
    pub fn refused(&self, store: &FileStore) -> Vec<String> {
        let mut refused = Vec::new();
        for (name, values) in &self.written {
            let p = Partition::new(name).unwrap();
            match store.get(&p, b"v") {
                Ok(Some(v)) if &v == values.last().unwrap() => {}
                Err(Error::Corrupt { .. }) => refused.push(name.clone()),
                Ok(other) => panic!(
                    "partition {name} was rolled back: it answers {:?}, its newest value is {:?}",
                    other.map(|v| String::from_utf8_lossy(&v[..v.len().min(20)]).into_owned()),
                    String::from_utf8_lossy(&values.last().unwrap()[..20])
                ),
                Err(e) => panic!("partition {name}: {e}"),
            }
        }
        refused
    }
}

/// The partitions (of `names`) with a record in `bytes` of a segment.
pub fn partitions_in(bytes: &[u8], names: &[&str]) -> Vec<String> {
    let mut found: Vec<String> = super::layout::records(bytes)
        .iter()
        .filter_map(|r| {
            names
                .iter()
                .find(|n| super::layout::partition_hash(n.as_bytes()) == r.partition_hash)
        })
        .map(|n| n.to_string())
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The partition of [`compacted_with_a_gap`] whose first record is damaged.
pub const DAMAGED: &str = "damaged";
/// The partition of [`compacted_with_a_gap`] written once, in the first segment, and never
/// again: compaction does not rewrite it, so nothing after the gap proves it lost nothing.
pub const QUIET: &str = "quiet";

/// A disk closed cleanly after a compaction that deleted segments between two it kept: the
/// first segment (it holds a damaged record of [`DAMAGED`], and a segment that does not read
/// back intact is kept as evidence; [`QUIET`]'s only record is there too) and the tail. The
/// manifest and the heads snapshot record the deleted segments, so a full-scan rebuild can tell
/// their gap from a loss; one that forgot them would refuse [`QUIET`] and every partition the
/// store does not know. Returns the disk and what was written.
pub fn compacted_with_a_gap() -> (FaultFs, Tally) {
    let fs = FaultFs::new();
    let store = builder(&fs).open().unwrap();
    let mut tally = Tally::default();
    tally.put(&store, QUIET, 10);
    tally.put(&store, DAMAGED, 200);
    tally.put(&store, DAMAGED, 10);
    while segments(&fs).len() < 5 {
        tally.put(&store, "busy", 900);
    }
    store.close().unwrap();
    let first = segments(&fs)[0].clone();
    let bytes = fs.read_file(&first).unwrap();
    let hash = super::layout::partition_hash(DAMAGED.as_bytes());
    let record = super::layout::records(&bytes)
        .into_iter()
        .find(|r| r.partition_hash == hash)
        .unwrap();
    damage(&fs, &first, |b| {
        b[record.offset + super::layout::FRAME_LEN + record.body_len - 3] ^= 0x08
    });
    let store = builder(&fs).open().unwrap();
    let report = store.compact().unwrap();
    assert_eq!(report.segments_kept, 1, "{report:?}");
    assert!(report.segments_removed >= 2, "{report:?}");
    tally.put(&store, "busy", 10);
    store.close().unwrap();
    let numbers: Vec<u32> = segments(&fs).iter().map(|s| segment_number(s)).collect();
    assert!(
        numbers.len() >= 2 && numbers[1] > numbers[0] + 1,
        "no gap: {numbers:?}"
    );
    (fs, tally)
}

/// Every file under [`DIR`] and its bytes, read from a copy of the disk (a fault planned on
/// `fs` does not fire): what open may not change when it fails.
pub fn files(fs: &FaultFs) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![PathBuf::from(DIR)];
    // A copy: no fault planned on `fs` applies to it.
    let fs = fs.fork();
    while let Some(dir) = dirs.pop() {
        for name in fs.list(&dir).unwrap() {
            let path = dir.join(name);
            match fs.read_file(&path) {
                Some(bytes) => {
                    found.insert(path, bytes);
                }
                None => dirs.push(path),
            }
        }
    }
    found
}
