//! A store that stays small (SPEC S13): the peers' logs data set, scaled down, settles within a
//! bound of bytes on disk per byte of payload, and sixteen committers write within a bound of
//! bytes per byte of payload; each bound with the negative controls that break it. The
//! analysis behind them (where every byte of the full data set goes) runs by hand.

use portcullis::log;
use portcullis::store::{Batch, FileStore, Partition, Store, SyncPolicy};

// The examples' and the peers' pseudo-random values, so the logs set is the same bytes.
#[path = "../examples/common/fill.rs"]
#[allow(dead_code)]
mod fill;
use fill::value;

fn dir_size(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        total += if m.is_dir() {
            dir_size(&e.path())
        } else {
            m.len()
        };
    }
    total
}

/// The analysis behind SPEC S13 on the peers' logs data set (run by hand, in release:
/// `PORTCULLIS_FOOTPRINT_ENTITIES=10000 cargo test --release --test footprint -- --ignored
/// --nocapture`).
#[test]
#[ignore]
fn where_the_bytes_of_the_logs_data_set_go() {
    let entities: u64 = std::env::var("PORTCULLIS_FOOTPRINT_ENTITIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let records = 100u64;
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path())
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .open()
        .unwrap();
    let parts: Vec<Partition> = (0..entities)
        .map(|e| Partition::new(format!("e/logs/{e:08}")).unwrap())
        .collect();
    let t = std::time::Instant::now();
    for s in 0..records {
        for (e, p) in parts.iter().enumerate() {
            let r = log::append(&store, p, &[value(e as u64, s, 200)], Batch::new()).unwrap();
            assert!(r.committed().is_some());
        }
    }
    let payload = entities * records * 200;
    eprintln!(
        "loaded {} MB of payload in {:.1} s; written {} MB; on disk {} MiB",
        payload / 1_000_000,
        t.elapsed().as_secs_f64(),
        store.stats().bytes_written / 1_000_000,
        dir_size(dir.path()) >> 20
    );
    store.wait_for_background_compactions();
    let f = store.footprint().unwrap();
    eprintln!(
        "after the background compactions: on disk {} MiB; written {} MB\n{f}",
        dir_size(dir.path()) >> 20,
        store.stats().bytes_written / 1_000_000,
    );
    let estimate = store.dead_bytes_by_segment();
    for (n, size, dead) in &f.per_segment {
        let est = estimate.iter().find(|(m, _)| m == n).map_or(0, |(_, d)| *d);
        eprintln!(
            "  segment {n}: {} KiB, dead {} KiB, estimated {} KiB",
            size >> 10,
            dead >> 10,
            est >> 10
        );
    }
    store.close().unwrap();
    eprintln!("closed: on disk {} MiB", dir_size(dir.path()) >> 20);
    let store = FileStore::open(dir.path()).unwrap();
    store.wait_for_background_compactions();
    eprintln!(
        "reopened and idle: on disk {} MiB; written {} MB more",
        dir_size(dir.path()) >> 20,
        store.stats().bytes_written / 1_000_000
    );
    let report = store.compact().unwrap();
    eprintln!(
        "after compact(): on disk {} MiB ({report:?})\n{}",
        dir_size(dir.path()) >> 20,
        store.footprint().unwrap()
    );
    store.close().unwrap();
}

// --- bounds on a fault-injecting disk -----------------------------------------------------

use std::path::Path;
use std::sync::Arc;

use portcullis::store::{FaultFs, FileStoreBuilder, Vfs};

const DIR: &str = "/db";

/// Every file's length under `dir` on `fs`.
fn bytes_on(fs: &FaultFs, dir: &Path) -> u64 {
    let mut total = 0;
    for name in fs.list(dir).unwrap() {
        let path = dir.join(name);
        match fs.kind(&path).unwrap() {
            Some(portcullis::store::PathKind::Dir) => total += bytes_on(fs, &path),
            Some(portcullis::store::PathKind::File) => {
                total += fs
                    .open(&path, portcullis::store::OpenMode::Read)
                    .unwrap()
                    .len()
                    .unwrap();
            }
            None => {}
        }
    }
    total
}

fn on(fs: &FaultFs, segment_bytes: u64) -> FileStoreBuilder {
    FileStore::builder(DIR)
        .vfs(Arc::new(fs.clone()))
        .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
        .segment_bytes(segment_bytes)
}

/// How a test store writes and compacts (the negative controls switch one thing off).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    AsBuilt,
    /// Bases and copies as format version 2 wrote them.
    Version2Records,
    /// No segment is due because of its dead bytes (only scatter starts compaction).
    NoReclaim,
}

impl Variant {
    /// The builder of a store that behaves as this variant from the moment it opens (before
    /// any background compaction open may start).
    fn on(self, fs: &FaultFs, segment_bytes: u64) -> FileStoreBuilder {
        let builder = on(fs, segment_bytes);
        match self {
            Variant::AsBuilt => builder,
            Variant::Version2Records => builder.write_version_2_records(),
            Variant::NoReclaim => builder.skip_reclaim_trigger(),
        }
    }

    fn apply(self, store: &FileStore) {
        store.set_version_2_records_for_test(self == Variant::Version2Records);
        store.set_reclaim_off_for_test(self == Variant::NoReclaim);
    }
}

/// The peers' logs data set scaled down (300 entities x 100 records of 200 B, appended in
/// turns through `portcullis::log`, in 256 KiB segments), loaded, closed and settled (reopened,
/// background compaction waited for, closed). Returns its bytes on disk per byte of payload.
fn logs_set_settled(variant: Variant) -> f64 {
    const ENTITIES: u64 = 300;
    const RECORDS: u64 = 100;
    const SEGMENT_BYTES: u64 = 256 << 10;
    let fs = FaultFs::new();
    let store = variant.on(&fs, SEGMENT_BYTES).open().unwrap();
    let parts: Vec<Partition> = (0..ENTITIES)
        .map(|e| Partition::new(format!("e/logs/{e:08}")).unwrap())
        .collect();
    for s in 0..RECORDS {
        for (e, p) in parts.iter().enumerate() {
            let r = log::append(&store, p, &[value(e as u64, s, 200)], Batch::new()).unwrap();
            assert!(r.committed().is_some());
        }
    }
    store.close().unwrap();
    let store = variant.on(&fs, SEGMENT_BYTES).open().unwrap();
    store.wait_for_background_compactions();
    store.close().unwrap();
    let store = on(&fs, SEGMENT_BYTES).auto_compact(false).open().unwrap();
    if std::env::var("FOOTPRINT_DEBUG").is_ok() {
        let f = store.footprint().unwrap();
        eprintln!("{variant:?}:\n{f}");
        for (n, size, dead) in &f.per_segment {
            eprintln!("  segment {n}: {size} dead {dead}");
        }
    }
    for (e, p) in parts.iter().enumerate().step_by(37) {
        let page = log::read_log(&store, p, 1, 1000).unwrap();
        assert_eq!(page.records.len() as u64, RECORDS);
        assert_eq!(page.records[99].payload, value(e as u64, 99, 200));
    }
    store.close().unwrap();
    let payload = ENTITIES * RECORDS * 200;
    let on_disk = bytes_on(&fs, Path::new(DIR));
    let amplification = on_disk as f64 / payload as f64;
    eprintln!("{variant:?}: {on_disk} bytes on disk for {payload} of payload: {amplification:.3}");
    amplification
}

/// SPEC S13: once compaction settles, the logs data set takes at most LOGS_BOUND bytes on disk
/// per byte of payload (1.27 to 1.33 measured; SQLite takes 1.24 on the full data set, 236 MiB
/// for 200 MB, so the bound is 1.15 times SQLite's).
#[test]
fn s13_the_logs_data_set_settles_within_its_bound() {
    let amplification = logs_set_settled(Variant::AsBuilt);
    assert!(amplification <= LOGS_BOUND, "{amplification:.3}");
}

const LOGS_BOUND: f64 = 1.42;

/// The negative control of that bound: with the bases and copies of format version 2 (whole
/// keys in every base entry, keys again in every copy), the same settled store is over it
/// (1.52 to 1.57 measured).
#[test]
fn s13_control_with_version_2_records_the_logs_bound_fails() {
    let amplification = logs_set_settled(Variant::Version2Records);
    assert!(amplification > LOGS_BOUND, "{amplification:.3}");
}

/// Ten partitions each overwrite their 40 keys 25 times, one key per batch, each partition's
/// batches in a run (nothing is scattered, so only dead bytes can start compaction), in 64 KiB
/// segments; then the store settles (reopened, background compaction waited for, closed).
/// Returns its bytes on disk and the bytes its live values and bases take.
fn overwrites_settled(variant: Variant) -> (u64, u64) {
    const PARTITIONS: u64 = 10;
    const KEYS: u64 = 40;
    const ROUNDS: u64 = 25;
    const SEGMENT_BYTES: u64 = 64 << 10;
    let fs = FaultFs::new();
    let store = variant.on(&fs, SEGMENT_BYTES).open().unwrap();
    for p in 0..PARTITIONS {
        let partition = Partition::new(format!("kv/{p}")).unwrap();
        for round in 0..ROUNDS {
            for k in 0..KEYS {
                let b = Batch::new().put(k.to_be_bytes().to_vec(), value(p * KEYS + k, round, 400));
                assert!(store.apply(&partition, &b).unwrap().is_committed());
            }
        }
    }
    store.close().unwrap();
    let store = variant.on(&fs, SEGMENT_BYTES).open().unwrap();
    store.wait_for_background_compactions();
    let live = {
        let f = store.footprint().unwrap();
        f.live_values + f.live_bases
    };
    store.close().unwrap();
    let store = on(&fs, SEGMENT_BYTES).auto_compact(false).open().unwrap();
    for p in 0..PARTITIONS {
        let partition = Partition::new(format!("kv/{p}")).unwrap();
        let got = store.get(&partition, &7u64.to_be_bytes()).unwrap();
        assert_eq!(got, Some(value(p * KEYS + 7, ROUNDS - 1, 400)));
    }
    store.close().unwrap();
    let on_disk = bytes_on(&fs, Path::new(DIR));
    eprintln!("{variant:?}: {on_disk} bytes on disk, {live} live");
    (on_disk, live)
}

/// SPEC S7, S13: overwritten values are reclaimed by compaction that starts by itself, down to
/// at most half as much again as what is live (no sealed segment is left a third dead) plus the
/// two newest segments (the one appended to, and the one compaction last wrote into).
#[test]
fn s13_overwrites_settle_within_half_again_what_is_live() {
    let (on_disk, live) = overwrites_settled(Variant::AsBuilt);
    assert!(
        on_disk <= live * 3 / 2 + 2 * (64 << 10),
        "{on_disk} on disk, {live} live"
    );
}

/// The negative control: with no segment due because of its dead bytes, nothing reclaims the
/// overwritten values (they are not scattered) and the store keeps every one of them.
#[test]
fn s13_control_without_reclaiming_dead_segments_overwrites_stay() {
    let (on_disk, live) = overwrites_settled(Variant::NoReclaim);
    assert!(
        on_disk > live * 3 / 2 + 2 * (64 << 10),
        "{on_disk} on disk, {live} live"
    );
}

/// Sixteen threads each commit COMMITS single-row batches of 100-byte values, durably, to a
/// partition of its own (the peers' commits workload); returns every byte the store wrote
/// (records, bases, the zeros that prepare segments, snapshots, the manifest, its close) per
/// byte of payload.
fn sixteen_committers(variant: Variant) -> f64 {
    const THREADS: u64 = 16;
    const COMMITS: u64 = 600;
    let fs = FaultFs::new();
    let store = FileStore::builder(DIR)
        .vfs(Arc::new(fs.clone()))
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .open()
        .unwrap();
    variant.apply(&store);
    let before = fs.bytes_written();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let store = &store;
            s.spawn(move || {
                let p = Partition::new(format!("commits/{t}")).unwrap();
                for i in 0..COMMITS {
                    let b = Batch::new().put(i.to_be_bytes().to_vec(), value(t, i, 100));
                    assert!(store.apply(&p, &b).unwrap().is_committed());
                }
            });
        }
    });
    store.close().unwrap();
    let written = fs.bytes_written() - before;
    let amplification = written as f64 / (THREADS * COMMITS * 100) as f64;
    eprintln!("{variant:?}: {written} bytes written: {amplification:.3} per byte of payload");
    amplification
}

/// SPEC S13: under sixteen threads of durable single-row commits the store writes at most
/// WRITE_BOUND bytes per byte of payload: each commit's record (175 bytes for 100 of value),
/// the zeros that prepare the journal's space (as many bytes again), and the bases that bound
/// each partition's chain.
#[test]
fn s13_sixteen_committers_write_within_their_bound() {
    let amplification = sixteen_committers(Variant::AsBuilt);
    assert!(amplification <= WRITE_BOUND, "{amplification:.3}");
}

const WRITE_BOUND: f64 = 5.5;

/// The negative control of that bound: bases of format version 2 (whole keys and locations in
/// every entry) write more than it allows.
#[test]
fn s13_control_with_version_2_bases_committers_write_over_the_bound() {
    let amplification = sixteen_committers(Variant::Version2Records);
    assert!(amplification > WRITE_BOUND, "{amplification:.3}");
}
