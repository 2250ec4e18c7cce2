//! Helpers shared by the store benchmarks: scratch directories, filling a store with history,
//! and telling a real `cargo bench` run from the quick smoke run of `cargo test --benches`.

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};

/// True when run by `cargo bench` (which passes `--bench`) without criterion's `--test`.
/// `cargo test --benches` runs the same binary without `--bench`; the benches then use tiny
/// sizes so tests stay fast.
pub fn full_run() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test")
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A scratch directory in the system's temp dir, removed when dropped.
pub fn scratch(label: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("portcullis-bench-{label}-"))
        .tempdir()
        .expect("creating a scratch directory")
}

/// The name of partition `i`: 18 bytes, like `bench/entity-00042`.
pub fn part_name(i: u64) -> String {
    format!("bench/entity-{i:05}")
}

pub fn partitions(n: u64) -> Vec<Partition> {
    (0..n)
        .map(|i| Partition::new(part_name(i)).expect("valid name"))
        .collect()
}

/// A deterministic value of `len` bytes that does not compress to nothing.
pub fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A row key: the record's sequence number, big-endian, so keys sort in append order.
pub fn seq_key(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

/// Opens a store for bulk loading: no syncs per commit, no background compaction.
pub fn open_for_loading(dir: &Path) -> FileStore {
    FileStore::builder(dir)
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .auto_compact(false)
        .open()
        .expect("opening the store")
}

/// Appends rounds of one-row batches (an entity log: one record per append) round-robin over
/// `parts`, `value_len` bytes each, until at least `bytes` of journal have been written.
/// `first_seq` is the first key of each partition's rows. Returns the rows written per
/// partition.
pub fn append_history(
    store: &FileStore,
    parts: &[Partition],
    first_seq: u64,
    value_len: usize,
    bytes: u64,
) -> u64 {
    let start = store.stats().bytes_written;
    let template = value(first_seq, value_len);
    let mut seq = first_seq;
    let mut last_report = Instant::now();
    while store.stats().bytes_written - start < bytes {
        for (i, p) in parts.iter().enumerate() {
            let mut v = template.clone();
            v[..8].copy_from_slice(&(seq ^ i as u64).to_le_bytes());
            let outcome = store
                .apply(p, &Batch::new().put(seq_key(seq), v))
                .expect("apply");
            assert!(outcome.is_committed());
        }
        seq += 1;
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            eprintln!(
                "  ... {} MiB written",
                (store.stats().bytes_written - start) >> 20
            );
        }
    }
    seq - first_seq
}

/// Copies every file of a store directory (and its journal) into `to`, as a crash would leave
/// them if the machine stopped right now (what was flushed is there; the lock is not held).
pub fn copy_store_files(from: &Path, to: &Path) -> u64 {
    let mut copied = 0;
    std::fs::create_dir_all(to).expect("creating the copy");
    for entry in std::fs::read_dir(from).expect("listing the store") {
        let entry = entry.expect("listing the store");
        let path = entry.path();
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copied += copy_store_files(&path, &target);
        } else {
            copied += std::fs::copy(&path, &target).expect("copying a store file");
        }
    }
    copied
}

/// Total bytes of files under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("listing") {
        let entry = entry.expect("listing");
        let meta = entry.metadata().expect("metadata");
        total += if meta.is_dir() {
            dir_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Median of some durations.
pub fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    if xs.is_empty() {
        return Duration::ZERO;
    }
    xs[xs.len() / 2]
}

/// Size of the newest journal segment of the store in `dir` (the one appends go to).
pub fn last_segment_bytes(dir: &Path) -> u64 {
    let mut newest: Option<(String, u64)> = None;
    for entry in std::fs::read_dir(dir.join("journal")).expect("listing the journal") {
        let entry = entry.expect("listing the journal");
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".seg") {
            continue;
        }
        let len = entry.metadata().expect("metadata").len();
        if newest.as_ref().is_none_or(|(n, _)| name > *n) {
            newest = Some((name, len));
        }
    }
    newest.map_or(0, |(_, len)| len)
}
