//! What the file store's reads allocate once it has read before: a scan page reuses the buffers
//! an earlier page allocated and zeroed (kept by the store, within a bound), and a value read
//! looks its segment up without allocating, so a lent page allocates nothing for its values and
//! a `get` allocates only the value it answers.
//!
//! A counting global allocator (`stats_alloc`) counts allocations; the tests of this binary
//! take turns (`ONE_AT_A_TIME`), so no other test's allocations blur the counts.

use std::alloc::System;
use std::path::Path;
use std::sync::Mutex;

use portcullis::store::{Batch, FileStore, KeyRange, Partition, Store, SyncPolicy};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Values in the partition, each of `len` bytes, one batch each (so the values lie apart in
/// the journal, among their records' framing).
const VALUES: usize = 200;

fn key(i: usize) -> Vec<u8> {
    format!("k{i:05}").into_bytes()
}

fn value(i: usize, len: usize) -> Vec<u8> {
    vec![i as u8; len]
}

/// A store holding [`VALUES`] values of `len` bytes in `p`, closed and opened again, so reads
/// come from the files.
fn reopened(dir: &Path, p: &Partition, len: usize) -> FileStore {
    {
        let store = FileStore::builder(dir)
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()
            .unwrap();
        for i in 0..VALUES {
            let batch = Batch::new().put(key(i), value(i, len));
            assert!(store.apply(p, &batch).unwrap().is_committed());
        }
        store.close().unwrap();
    }
    FileStore::builder(dir).open().unwrap()
}

/// Visits the whole partition in one lent page, checking every value; returns the allocations
/// and the bytes allocated while doing so.
fn lent_page(store: &FileStore, p: &Partition, len: usize) -> (usize, usize) {
    let (mut seen, mut right) = (0, 0);
    let region = Region::new(GLOBAL);
    // Checked without allocating: value i holds `len` bytes of i, under key i.
    let next = store.scan_visit(p, &KeyRange::all(), None, VALUES, &mut |k, v| {
        let number = std::str::from_utf8(&k[1..])
            .ok()
            .and_then(|n| n.parse().ok());
        let key_right = k.len() == 6 && k[0] == b'k' && number == Some(seen);
        right += usize::from(key_right && v.len() == len && v.iter().all(|&b| b == seen as u8));
        seen += 1;
        Ok(())
    });
    let change = region.change();
    assert_eq!(next.unwrap(), None);
    assert_eq!((seen, right), (VALUES, VALUES));
    (change.allocations, change.bytes_allocated)
}

/// Runs `test` on a store [`reopened`] in a fresh directory with values of `len` bytes, after
/// one lent page has loaded the partition's index and allocated the page's buffers; closes it.
fn after_a_first_page(len: usize, test: impl FnOnce(&FileStore, &Partition)) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = Partition::new("e/bufs/1").unwrap();
    let store = reopened(dir.path(), &p, len);
    lent_page(&store, &p, len);
    test(&store, &p);
    store.close().unwrap();
}

#[test]
fn a_page_read_again_allocates_nothing_for_its_values() {
    // 200 KiB of values: more than the cache of recent records holds, so the page reads most
    // of them from the journal.
    let len = 1_000;
    after_a_first_page(len, |store, p| {
        for _ in 0..3 {
            let (allocations, bytes) = lent_page(store, p, len);
            // Not one buffer of the page's size, nor one allocation per value or per read.
            assert!(
                allocations <= 1 && bytes < len,
                "{allocations} allocations, {bytes} bytes for a page of {VALUES} values of {len} bytes"
            );
        }
    });
}

#[test]
fn a_get_allocates_only_the_value_it_answers() {
    let len = 1_000;
    // The first page loads the index; later reads find the values in the journal, past the
    // cache's reach.
    after_a_first_page(len, |store, p| {
        let k = key(0);
        let region = Region::new(GLOBAL);
        let got = store.get(p, &k).unwrap();
        let allocations = region.change().allocations;
        assert_eq!(got, Some(value(0, len)));
        assert_eq!(allocations, 1, "{allocations} allocations for one value");
    });
}

#[test]
fn a_page_larger_than_the_kept_bound_is_not_kept() {
    // 200 values of 2 KiB: a 400 KiB page, over the 256 KiB a kept page may hold.
    let len = 2_048;
    after_a_first_page(len, |store, p| {
        for _ in 0..2 {
            // Its buffers were dropped after the last page, so this page allocates its own again.
            let (_, bytes) = lent_page(store, p, len);
            assert!(
                bytes >= VALUES * len / 2,
                "{bytes} bytes allocated: a page of {} bytes was kept",
                VALUES * len
            );
        }
    });
}
