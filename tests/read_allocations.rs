//! What reading a history allocates: reading a log page allocates each record's payload once
//! (copied out of the row the store lends through `Store::scan_visit`), and nothing else per
//! record: no key, no buffer per value; the lending read allocates nothing per record.
//!
//! A counting global allocator (`stats_alloc`) counts allocations; the tests of this binary
//! take turns (`ONE_AT_A_TIME`), so no other test's allocations blur the counts, and a read's
//! count is the fewest of three reads, since threads an earlier test left running (the rayon
//! pool's workers starting) count too.

use std::alloc::System;
use std::path::Path;
use std::sync::Mutex;

use portcullis::log;
use portcullis::store::{Batch, FileStore, KeyRange, MemoryStore, Partition, Store, SyncPolicy};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const RECORDS: usize = 200;

/// Opens the store in `dir` without syncs (a base every `base_every` records of a partition,
/// or the store's default), lets `write` fill it and closes it, so that what the test reads
/// next starts from a fresh open with nothing loaded.
fn written(dir: &Path, base_every: Option<u32>, write: impl FnOnce(&FileStore)) {
    let mut builder = FileStore::builder(dir).sync_policy(SyncPolicy::NeverSyncMayLoseRecent);
    if let Some(records) = base_every {
        builder = builder.base_every_records(records);
    }
    let store = builder.open().unwrap();
    write(&store);
    store.close().unwrap();
}

fn fill(store: &dyn Store, p: &Partition) {
    for i in 0..RECORDS {
        let record = vec![i as u8; 100 + i];
        let appended = log::append(store, p, &[record], Batch::new()).unwrap();
        assert!(appended.committed().is_some());
    }
}

/// The fewest allocations any of three runs of `measure` counted. The counter is global: a
/// thread another test of this binary left behind (the rayon pool starting its workers, a
/// store's background job finishing) can allocate during one run, never during every one.
fn fewest(measure: impl Fn() -> usize) -> usize {
    (0..3).map(|_| measure()).min().expect("three runs")
}

/// Allocations made by reading the whole log in one page, and the records read (the fewest of
/// three reads).
fn allocations_of_one_page(store: &dyn Store, p: &Partition) -> usize {
    fewest(|| allocations_of_one_read(store, p))
}

fn allocations_of_one_read(store: &dyn Store, p: &Partition) -> usize {
    let region = Region::new(GLOBAL);
    let page = log::read_log(store, p, 1, RECORDS).unwrap();
    let made = region.change().allocations;
    assert_eq!(page.records.len(), RECORDS);
    for (i, r) in page.records.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1);
        assert_eq!(r.payload, vec![i as u8; 100 + i]);
    }
    made
}

#[test]
fn a_log_page_allocates_each_payload_once_on_the_memory_store() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = MemoryStore::new();
    let p = Partition::new("e/logs/1").unwrap();
    fill(&store, &p);
    // The store lends the page from one buffer; the log allocates each payload.
    let made = allocations_of_one_page(&store, &p);
    assert!(
        made <= RECORDS + 16,
        "{made} allocations for {RECORDS} records"
    );
}

#[test]
fn a_log_page_allocates_each_payload_once_on_the_file_store() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("e/logs/1").unwrap();
    written(dir.path(), None, |store| fill(store, &p));
    let store = FileStore::builder(dir.path()).open().unwrap();
    // The first read loads the partition's index; the second reads only values.
    log::read_log(&store, &p, 1, RECORDS).unwrap();
    let made = allocations_of_one_page(&store, &p);
    assert!(
        made <= RECORDS + 32,
        "{made} allocations for {RECORDS} records"
    );
    store.close().unwrap();
}

/// Allocations made by visiting the whole log in one page with the lending read, which
/// checks every record it is lent (the fewest of three reads).
fn allocations_of_one_lent_page(store: &dyn Store, p: &Partition) -> usize {
    fewest(|| allocations_of_one_lent_read(store, p))
}

fn allocations_of_one_lent_read(store: &dyn Store, p: &Partition) -> usize {
    let mut seqs = 0u64;
    let mut right = 0;
    let region = Region::new(GLOBAL);
    let next = log::visit_log(store, p, 1, RECORDS, |r| {
        seqs += r.seq;
        // Record i (from 0) holds 100 + i bytes of i, as `fill` wrote it.
        let i = r.seq as usize - 1;
        right += usize::from(r.payload.len() == 100 + i && r.payload.iter().all(|&b| b == i as u8));
        Ok::<(), portcullis::Error>(())
    });
    let made = region.change().allocations;
    assert_eq!(next.unwrap(), None);
    assert_eq!(
        (seqs, right),
        ((RECORDS * (RECORDS + 1) / 2) as u64, RECORDS)
    );
    made
}

#[test]
fn a_lent_log_page_allocates_nothing_per_record_on_either_store() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let p = Partition::new("e/logs/1").unwrap();
    let memory = MemoryStore::new();
    fill(&memory, &p);
    let dir = tempfile::tempdir().unwrap();
    written(dir.path(), None, |store| fill(store, &p));
    let file = FileStore::builder(dir.path()).open().unwrap();
    // The first read loads the partition's index; the second reads only values.
    log::read_log(&file, &p, 1, RECORDS).unwrap();
    for (name, store) in [("memory", &memory as &dyn Store), ("file", &file)] {
        // Only the page's buffers, however many records it holds.
        let made = allocations_of_one_lent_page(store, &p);
        assert!(
            made <= 32,
            "{name}: {made} allocations for {RECORDS} records"
        );
    }
    file.close().unwrap();
}

/// A store that implements only the contract's required methods, so `scan_visit` is the
/// provided one over `scan`.
struct ScanOnly(MemoryStore);

impl Store for ScanOnly {
    fn get(&self, p: &Partition, key: &[u8]) -> portcullis::Result<Option<Vec<u8>>> {
        self.0.get(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> portcullis::Result<Vec<Option<Vec<u8>>>> {
        self.0.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        range: &portcullis::store::KeyRange,
        cursor: Option<&portcullis::store::Cursor>,
        limit: usize,
    ) -> portcullis::Result<portcullis::store::ScanPage> {
        self.0.scan(p, range, cursor, limit)
    }
    fn apply(
        &self,
        p: &Partition,
        batch: &Batch,
    ) -> portcullis::Result<portcullis::store::Outcome> {
        self.0.apply(p, batch)
    }
    fn list_partitions(&self, prefix: &[u8]) -> portcullis::Result<Vec<Partition>> {
        self.0.list_partitions(prefix)
    }
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
    fn stats(&self) -> portcullis::store::StoreStats {
        self.0.stats()
    }
    fn close(&self) -> portcullis::Result<()> {
        self.0.close()
    }
}

#[test]
fn a_store_without_its_own_scan_visit_reads_logs_through_scan() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = ScanOnly(MemoryStore::new());
    let p = Partition::new("e/logs/1").unwrap();
    fill(&store, &p);
    // The same records through the provided `scan_visit`: the row's key and value, then the
    // payload copied out of it.
    let made = allocations_of_one_page(&store, &p);
    assert!(
        made <= 3 * RECORDS + 16,
        "{made} allocations for {RECORDS} records"
    );
}

/// Records in the chain a load walks in the test below: no base among them.
const CHAIN: usize = 60;

#[test]
fn a_chain_walk_allocates_about_what_its_records_hold() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("e/logs/1").unwrap();
    written(dir.path(), Some(1_000), |store| {
        for i in 0..CHAIN {
            let b = Batch::new().put(format!("k{i:03}").into_bytes(), vec![i as u8; 150]);
            assert!(store.apply(&p, &b).unwrap().is_committed());
        }
    });
    let store = FileStore::builder(dir.path()).open().unwrap();
    // A get of an absent key loads the index (walking every record) and reads no value.
    let region = Region::new(GLOBAL);
    assert_eq!(store.get(&p, b"absent").unwrap(), None);
    let allocated = region.change().bytes_allocated;
    // Each record's body (about 200 bytes) is kept for the reads that follow, with its key
    // and bookkeeping, besides what any load allocates (about 68 KB here in all); a buffer of
    // a speculative read's size per record (4 KiB) is not (that made it about 300 KB).
    assert!(
        allocated <= CHAIN * 2048,
        "a load of {CHAIN} small records allocated {allocated} bytes"
    );
    assert_eq!(store.get(&p, b"k007").unwrap(), Some(vec![7u8; 150]));
    store.close().unwrap();
}

/// Keys of the base the test below loads.
const BASE_KEYS: usize = 500;

/// A load decodes keys in place: loading a base of many keys, and a chain of batch records
/// after it, allocates a few times per record (its body, kept for the reads that follow, and
/// the cache's entry for it), never once per key nor for a list of a record's operations: the
/// keys go straight from the record's bytes into the index's arena.
#[test]
fn a_load_allocates_nothing_per_key() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("e/logs/1").unwrap();
    written(dir.path(), Some(2), |store| {
        let mut b = Batch::new();
        for i in 0..BASE_KEYS {
            b = b.put(format!("key{i:05}").into_bytes(), vec![1u8; 8]);
        }
        assert!(store.apply(&p, &b).unwrap().is_committed());
        // The base is written once the chain holds two records.
        let b = Batch::new().put(b"key00000".to_vec(), vec![2u8; 8]);
        assert!(store.apply(&p, &b).unwrap().is_committed());
    });
    written(dir.path(), Some(1_000), |store| {
        for i in 0..CHAIN {
            let b = Batch::new()
                .put(format!("key{i:05}").into_bytes(), vec![3u8; 8])
                .delete(format!("key{:05}", BASE_KEYS - 1 - i).into_bytes());
            assert!(store.apply(&p, &b).unwrap().is_committed());
        }
    });
    let store = FileStore::builder(dir.path()).open().unwrap();
    let region = Region::new(GLOBAL);
    assert_eq!(store.get(&p, b"absent").unwrap(), None);
    let made = region.change().allocations;
    // When the decoder copied out every key, this load made 896 allocations; when it still
    // collected each record's operations in a list, 275.
    assert!(
        made <= 3 * CHAIN + 64,
        "a load of a base of {BASE_KEYS} keys and {CHAIN} batches made {made} allocations"
    );
    assert_eq!(store.get(&p, b"key00001").unwrap(), Some(vec![3u8; 8]));
    assert_eq!(store.get(&p, b"key00100").unwrap(), Some(vec![1u8; 8]));
    assert_eq!(
        store
            .get(&p, format!("key{:05}", BASE_KEYS - 1).as_bytes())
            .unwrap(),
        None
    );
    store.close().unwrap();
}

/// A load reuses the buffers of the loads before it on its thread: loading a small partition
/// after another allocates about what its records and index hold, not a fresh read buffer
/// (4 KiB, zero-filled) nor a fresh list for its chain.
#[test]
fn a_load_after_another_allocates_no_read_buffer() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Partition::new("a").unwrap(), Partition::new("b").unwrap());
    written(dir.path(), Some(1_000), |store| {
        for i in 0..3u8 {
            for p in [&a, &b] {
                let batch = Batch::new().put(vec![b'k', i], vec![i; 20]);
                assert!(store.apply(p, &batch).unwrap().is_committed());
            }
        }
    });
    let store = FileStore::builder(dir.path()).open().unwrap();
    assert_eq!(store.get(&a, b"absent").unwrap(), None);
    let region = Region::new(GLOBAL);
    assert_eq!(store.get(&b, b"absent").unwrap(), None);
    let allocated = region.change().bytes_allocated;
    // With a read buffer and a chain list per load this load allocated 5,314 bytes (906 now).
    assert!(
        allocated <= 2_000,
        "a load of 3 small records allocated {allocated} bytes"
    );
    assert_eq!(store.get(&b, &[b'k', 2]).unwrap(), Some(vec![2u8; 20]));
    store.close().unwrap();
}

/// Values of the page the test below reads.
const SCATTERED: usize = 40;

/// Reallocations, and the bytes they grew buffers by, while scanning `p` whole (loaded
/// already).
fn reallocations_of_a_scan(store: &FileStore, p: &Partition) -> (usize, usize) {
    let mut values = 0;
    let region = Region::new(GLOBAL);
    store
        .scan_visit(p, &KeyRange::all(), None, 1_000, &mut |_, v| {
            assert_eq!(v, &[7u8; 200][..]);
            values += 1;
            Ok(())
        })
        .unwrap();
    let change = region.change();
    assert_eq!(values, SCATTERED);
    (
        change.reallocations,
        change.bytes_reallocated.max(0) as usize,
    )
}

/// The values of a page are read into one buffer sized once for all of its reads: a page
/// whose values each take a read of their own (another partition's large values lie between
/// them) moves no already-read bytes as the buffer grows, so it reallocates no more than the
/// same page read with one read.
#[test]
fn a_page_read_with_many_reads_sizes_its_value_buffer_once() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (together, apart, other) = (
        Partition::new("e/together").unwrap(),
        Partition::new("e/apart").unwrap(),
        Partition::new("e/other").unwrap(),
    );
    let open = || {
        FileStore::builder(dir.path())
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .base_every_records(2)
            .auto_compact(false)
            .open()
            .unwrap()
    };
    {
        let store = open();
        let put = |p: &Partition, i: usize, value: Vec<u8>| {
            let b = Batch::new().put(format!("k{i:03}").into_bytes(), value);
            assert!(store.apply(p, &b).unwrap().is_committed());
        };
        for i in 0..SCATTERED {
            put(&together, i, vec![7u8; 200]);
        }
        for i in 0..SCATTERED {
            put(&apart, i, vec![7u8; 200]);
            // Far more than a merged read may skip between two values.
            put(&other, i, vec![1u8; 16 << 10]);
        }
        store.close().unwrap();
    }
    let store = open();
    for p in [&together, &apart] {
        assert_eq!(store.get(p, b"absent").unwrap(), None);
    }
    let (one_read, _) = reallocations_of_a_scan(&store, &together);
    let (many_reads, grown) = reallocations_of_a_scan(&store, &apart);
    assert!(
        many_reads <= one_read,
        "{many_reads} reallocations (growing buffers by {grown} bytes) for a page read with \
         {SCATTERED} reads, {one_read} with one"
    );
    store.close().unwrap();
}
