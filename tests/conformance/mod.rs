//! The store conformance suite (SPEC S1, S2, S9, E1).
//!
//! Every backend of [`portcullis::store::Store`] must pass every case here. The cases are plain
//! functions that take an [`Open`] factory: a function that opens a fresh, empty store on a
//! given [`ManualClock`] and returns it in a [`Fixture`]. The [`conformance_suite!`] macro turns
//! every case into its own `#[test]`, and [`store_model_tests!`] adds the randomized model test
//! (see `model.rs`).
//!
//! # Adding a backend
//!
//! Write one more file under `tests/`, e.g. `tests/conformance_file.rs`:
//!
//! ```ignore
//! #[macro_use]
//! mod conformance;
//!
//! use std::sync::Arc;
//! use conformance::Fixture;
//! use portcullis::ManualClock;
//! use portcullis::store::FileStore;
//!
//! fn open_file(clock: ManualClock) -> Fixture {
//!     let dir = tempfile::tempdir().unwrap();
//!     let store = FileStore::builder(dir.path()).clock(Arc::new(clock.clone())).open().unwrap();
//!     // `keeping` holds the directory until the fixture drops, after the store.
//!     Fixture::new(Arc::new(store), clock).keeping(dir)
//! }
//!
//! conformance_suite!(open_file);
//! store_model_tests!(open_file);
//! ```
//!
//! The store must read `NotAfter` deadlines from the clock it was given, or answer `false` to
//! `Store::evaluates_deadlines` and refuse every batch that carries one (SPEC S11); the cases
//! check whichever the store declares, and size limits against `Store::limits`. Cases never sleep:
//! concurrent cases synchronise with barriers, scoped threads and bounded loops, and keep their
//! total number of committed batches to a few thousand, since a syncing backend pays a sync for
//! each.

#![allow(dead_code)]

pub mod model;

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use portcullis::store::{
    Batch, Cursor, KeyRange, MAX_BATCH_BYTES, MAX_KEY_BYTES, MAX_PARTITION_NAME_BYTES,
    MAX_VALUE_BYTES, Outcome, Partition, Precondition, ScanPage, Store, StoreLimits,
};
use portcullis::{Clock, Error, ManualClock};

/// A freshly opened, empty store and the clock it reads.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// The store's clock.
    pub clock: ManualClock,
    // Dropped after `store` (fields drop in declaration order): e.g. a temporary directory.
    keep: Option<Box<dyn Any>>,
}

impl Fixture {
    /// Wraps a store opened on `clock`.
    pub fn new(store: Arc<dyn Store>, clock: ManualClock) -> Self {
        Fixture {
            store,
            clock,
            keep: None,
        }
    }

    /// Keeps `guard` alive until after the store is dropped.
    pub fn keeping(mut self, guard: impl Any) -> Self {
        self.keep = Some(Box::new(guard));
        self
    }
}

/// Opens a fresh, empty store whose `NotAfter` preconditions read `clock`.
pub type Open = fn(ManualClock) -> Fixture;

/// Where every case's clock starts.
pub const START_MS: u64 = 1_000_000;

/// Turns every conformance case into a `#[test]` for the backend opened by `$open`.
#[macro_export]
macro_rules! conformance_suite {
    ($open:expr) => {
        $crate::conformance_suite!(@cases $open;
            keys_sort_bytewise,
            get_answers_latest_value_and_none_when_missing,
            get_many_answers_one_slot_per_key_in_order,
            scan_pages_hold_at_most_limit_and_resume_strictly_after,
            scan_ends_with_none_when_last_page_is_exactly_full,
            scan_ranges_with_every_bound_kind,
            scan_prefix_ranges,
            scan_empty_and_inverted_ranges,
            scan_limit_zero_is_refused,
            scan_resumes_from_persisted_cursor_and_sees_writes_between_pages,
            scan_pages_are_consistent_under_concurrent_batches,
            scan_visit_lends_the_pages_scan_returns,
            precondition_equals,
            precondition_absent,
            precondition_present,
            precondition_not_after,
            deadlines_refused_when_not_evaluated,
            preconditions_combined_report_first_failing_index,
            failed_precondition_changes_nothing,
            failed_batch_on_new_partition_creates_nothing,
            delete_of_absent_key_commits,
            delete_range_with_every_bound_kind,
            ops_in_one_batch_apply_in_order,
            empty_batch_commits,
            concurrent_compare_and_set_loses_no_update,
            compare_and_set_through_get_for_update_loses_no_update,
            concurrent_claims_have_exactly_one_winner,
            readers_never_see_half_applied_batch,
            partitions_are_independent,
            list_partitions_by_prefix,
            key_size_limit,
            empty_key_is_refused,
            reads_with_invalid_keys_are_refused,
            value_size_limit,
            batch_size_limit,
            batch_count_limits,
            invalid_partition_names_are_refused,
            closed_store_answers_closed,
            error_codes_are_stable,
        );
    };
    (@cases $open:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::$case($open)
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn fresh(open: Open) -> Fixture {
    open(ManualClock::new(START_MS))
}

/// A partition by name.
pub fn part(name: impl AsRef<[u8]>) -> Partition {
    Partition::new(name).expect("valid partition name")
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// Applies `batch` and insists it commits.
pub fn commit(store: &dyn Store, p: &Partition, batch: Batch) {
    assert_eq!(
        store.apply(p, &batch).expect("apply"),
        Outcome::Committed,
        "batch {batch:?} on {p:?}"
    );
}

/// Puts every pair in one batch.
pub fn put_all(store: &dyn Store, p: &Partition, rows: &[(Vec<u8>, Vec<u8>)]) {
    let mut batch = Batch::new();
    for (k, v) in rows {
        batch = batch.put(k.clone(), v.clone());
    }
    commit(store, p, batch);
}

/// Pages through `range` with `limit`, checking the paging rules of S1 on every page
/// (at most `limit` entries, keys strictly increasing across pages, cursor at the last key,
/// a non-final page is full), and returns every entry.
pub fn scan_all(store: &dyn Store, p: &Partition, range: &KeyRange, limit: usize) -> Rows {
    let mut out: Rows = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for _ in 0..100_000 {
        let page = store.scan(p, range, cursor.as_ref(), limit).expect("scan");
        check_page_shape(&page, limit, out.last().map(|(k, _)| k.as_slice()));
        out.extend(page.entries.iter().cloned());
        match page.next {
            Some(c) => {
                assert_eq!(page.entries.len(), limit, "a page before the end is full");
                cursor = Some(c);
            }
            None => return out,
        }
    }
    panic!("scan of {p:?} did not end");
}

/// Checks the shape of one page: at most `limit` entries, strictly increasing keys, all after
/// `after`, and a cursor that names the last key returned.
fn check_page_shape(page: &ScanPage, limit: usize, after: Option<&[u8]>) {
    assert!(
        page.entries.len() <= limit,
        "page of {} entries exceeds limit {limit}",
        page.entries.len()
    );
    let mut prev = after.map(<[u8]>::to_vec);
    for (k, _) in &page.entries {
        if let Some(prev) = &prev {
            assert!(k > prev, "key {k:?} does not follow {prev:?}");
        }
        prev = Some(k.clone());
    }
    if let Some(c) = &page.next {
        let last = page
            .entries
            .last()
            .expect("a page with a cursor has entries");
        assert_eq!(c.last_key(), last.0.as_slice(), "cursor names the last key");
    }
}

/// Every row of `p`, by a full scan.
pub fn dump(store: &dyn Store, p: &Partition) -> Rows {
    scan_all(store, p, &KeyRange::all(), 7)
}

/// Every partition and every row in it.
pub fn snapshot(store: &dyn Store) -> BTreeMap<Partition, Rows> {
    store
        .list_partitions(b"")
        .expect("list_partitions")
        .into_iter()
        .map(|p| {
            let rows = dump(store, &p);
            (p, rows)
        })
        .collect()
}

/// Marks a group of writer threads finished when the last one ends, even by a panic, so
/// readers that loop "until the writers are done" stop at once if a writer fails.
struct LastOneOut<'a> {
    left: &'a AtomicUsize,
    done: &'a AtomicBool,
}

impl Drop for LastOneOut<'_> {
    fn drop(&mut self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.store(true, Ordering::Release);
        }
    }
}

fn keys_of(rows: &Rows) -> Vec<Vec<u8>> {
    rows.iter().map(|(k, _)| k.clone()).collect()
}

fn assert_code(result: portcullis::Result<impl std::fmt::Debug>, code: u32, what: &str) {
    match result {
        Err(e) => assert_eq!(e.code(), code, "{what}: wrong error {e:?}"),
        Ok(v) => panic!("{what}: expected error code {code}, got Ok({v:?})"),
    }
}

fn assert_too_large(result: portcullis::Result<Outcome>, what: &str) {
    match result {
        Err(Error::TooLarge { .. }) => {}
        other => panic!("{what}: expected Error::TooLarge, got {other:?}"),
    }
}

fn assert_invalid(result: portcullis::Result<impl std::fmt::Debug>, what: &str) {
    match result {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("{what}: expected Error::InvalidArgument, got {other:?}"),
    }
}

/// Keys chosen to catch signed-byte, length-first and prefix ordering mistakes.
fn tricky_keys() -> Vec<Vec<u8>> {
    vec![
        vec![0x00],
        vec![0x00, 0x00],
        b("a"),
        vec![b'a', 0x00],
        b("ab"),
        b("abc"),
        vec![b'a', b'b', 0xff],
        vec![b'a', 0x7f],
        vec![b'a', 0x80],
        vec![b'a', 0xff],
        vec![b'a', 0xff, 0xff],
        b("b"),
        vec![0x7f],
        vec![0x80],
        vec![0x80, 0x00],
        vec![0xfe, 0xff],
        vec![0xff],
        vec![0xff, 0x00],
        vec![0xff, 0xff],
    ]
}

/// Every combination of start and end bound kinds, around `lo` and `hi`.
fn every_bound_kind(lo: &[u8], hi: &[u8]) -> Vec<KeyRange> {
    let starts = [
        Bound::Included(lo.to_vec()),
        Bound::Excluded(lo.to_vec()),
        Bound::Unbounded,
    ];
    let ends = [
        Bound::Included(hi.to_vec()),
        Bound::Excluded(hi.to_vec()),
        Bound::Unbounded,
    ];
    let mut out = Vec::new();
    for s in &starts {
        for e in &ends {
            out.push(KeyRange {
                start: s.clone(),
                end: e.clone(),
            });
        }
    }
    out
}

/// Whether `key` lies in `r`, computed here rather than trusting `KeyRange::contains`.
fn in_range(r: &KeyRange, key: &[u8]) -> bool {
    let lo = match &r.start {
        Bound::Included(s) => key >= s.as_slice(),
        Bound::Excluded(s) => key > s.as_slice(),
        Bound::Unbounded => true,
    };
    let hi = match &r.end {
        Bound::Included(e) => key <= e.as_slice(),
        Bound::Excluded(e) => key < e.as_slice(),
        Bound::Unbounded => true,
    };
    lo && hi
}

// ---------------------------------------------------------------------------------------------
// S1: reads, order and scans
// ---------------------------------------------------------------------------------------------

/// S1: keys are ordered as unsigned bytes, a prefix before its extensions.
pub fn keys_sort_bytewise(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("order");
    let mut keys = tricky_keys();
    // Insert in a scrambled order, one key per batch and some in one batch.
    keys.reverse();
    keys.rotate_left(5);
    for k in &keys[..6] {
        commit(s, &p, Batch::new().put(k.clone(), k.clone()));
    }
    let rest: Rows = keys[6..].iter().map(|k| (k.clone(), k.clone())).collect();
    put_all(s, &p, &rest);

    let expected: Vec<Vec<u8>> = vec![
        vec![0x00],
        vec![0x00, 0x00],
        vec![0x61],
        vec![0x61, 0x00],
        vec![0x61, 0x62],
        vec![0x61, 0x62, 0x63],
        vec![0x61, 0x62, 0xff],
        vec![0x61, 0x7f],
        vec![0x61, 0x80],
        vec![0x61, 0xff],
        vec![0x61, 0xff, 0xff],
        vec![0x62],
        vec![0x7f],
        vec![0x80],
        vec![0x80, 0x00],
        vec![0xfe, 0xff],
        vec![0xff],
        vec![0xff, 0x00],
        vec![0xff, 0xff],
    ];
    for limit in [1, 2, 3, 100] {
        let rows = scan_all(s, &p, &KeyRange::all(), limit);
        assert_eq!(keys_of(&rows), expected, "limit {limit}");
        for (k, v) in &rows {
            assert_eq!(k, v, "value follows its key");
        }
    }
}

/// S1: `get` answers the latest committed value, `None` for a missing key or partition, and an
/// empty value is present (not absent).
pub fn get_answers_latest_value_and_none_when_missing(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("get");
    assert_eq!(s.get(&p, b"k").unwrap(), None, "missing partition");
    commit(s, &p, Batch::new().put(b("k"), b("1")));
    assert_eq!(s.get(&p, b"k").unwrap(), Some(b("1")));
    commit(s, &p, Batch::new().put(b("k"), b("2")));
    assert_eq!(s.get(&p, b"k").unwrap(), Some(b("2")));
    assert_eq!(
        s.get(&p, b"k\0").unwrap(),
        None,
        "an extension is another key"
    );
    assert_eq!(s.get(&p, b"missing").unwrap(), None);
    commit(s, &p, Batch::new().put(b("empty"), Vec::new()));
    assert_eq!(s.get(&p, b"empty").unwrap(), Some(Vec::new()));
    commit(s, &p, Batch::new().delete(b("k")));
    assert_eq!(s.get(&p, b"k").unwrap(), None);
    let binary = vec![0u8, 0xff, 0x80, 0x00];
    commit(s, &p, Batch::new().put(vec![0xff, 0x00], binary.clone()));
    assert_eq!(s.get(&p, &[0xff, 0x00]).unwrap(), Some(binary));
}

/// S1: `get_many` answers exactly one slot per key, in the order asked, with duplicates and
/// missing keys in place.
pub fn get_many_answers_one_slot_per_key_in_order(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("many");
    assert_eq!(
        s.get_many(&p, &[b"a", b"b", b"a"]).unwrap(),
        vec![None, None, None],
        "missing partition"
    );
    assert_eq!(s.get_many(&p, &[]).unwrap(), Vec::<Option<Vec<u8>>>::new());
    put_all(
        s,
        &p,
        &[
            (b("a"), b("1")),
            (b("b"), b("2")),
            (b("c"), Vec::new()),
            (vec![0xff], b("3")),
        ],
    );
    let keys: Vec<&[u8]> = vec![b"c", b"zz", b"a", &[0xff], b"a", b"b", b"zz", b"c"];
    assert_eq!(
        s.get_many(&p, &keys).unwrap(),
        vec![
            Some(Vec::new()),
            None,
            Some(b("1")),
            Some(b("3")),
            Some(b("1")),
            Some(b("2")),
            None,
            Some(Vec::new()),
        ]
    );
    assert_eq!(s.get_many(&p, &[]).unwrap(), Vec::<Option<Vec<u8>>>::new());
    assert_eq!(s.get_many(&p, &[b"nope"]).unwrap(), vec![None]);
}

fn numbered(n: usize) -> Rows {
    (0..n)
        .map(|i| {
            (
                format!("k{i:03}").into_bytes(),
                format!("v{i}").into_bytes(),
            )
        })
        .collect()
}

/// S1: every page holds at most `limit` entries in key order; the cursor resumes strictly after
/// the last key returned; `None` at the end.
pub fn scan_pages_hold_at_most_limit_and_resume_strictly_after(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("pages");
    let rows = numbered(10);
    put_all(s, &p, &rows);
    for limit in 1..=12 {
        let mut seen: Rows = Vec::new();
        let mut cursor: Option<Cursor> = None;
        let mut pages = 0;
        loop {
            let page = s
                .scan(&p, &KeyRange::all(), cursor.as_ref(), limit)
                .unwrap();
            pages += 1;
            assert!(pages <= 11, "limit {limit}: too many pages");
            let expected_len = limit.min(rows.len() - seen.len());
            assert_eq!(page.entries.len(), expected_len, "limit {limit}");
            assert_eq!(
                page.entries,
                rows[seen.len()..seen.len() + expected_len].to_vec()
            );
            seen.extend(page.entries.iter().cloned());
            match page.next {
                Some(c) => {
                    assert_eq!(c.last_key(), seen.last().unwrap().0.as_slice());
                    assert!(
                        seen.len() < rows.len(),
                        "limit {limit}: cursor after the end"
                    );
                    cursor = Some(c);
                }
                None => break,
            }
        }
        assert_eq!(seen, rows, "limit {limit}");
        assert_eq!(pages, rows.len().div_ceil(limit), "limit {limit}");
    }
    // A cursor taken from a page resumes strictly after its key, with a smaller limit too.
    let first = s.scan(&p, &KeyRange::all(), None, 4).unwrap();
    let c = first.next.clone().unwrap();
    let again = s.scan(&p, &KeyRange::all(), Some(&c), 1).unwrap();
    assert_eq!(again.entries, rows[4..5].to_vec());
    // A missing partition scans empty.
    let empty = s.scan(&part("nothing"), &KeyRange::all(), None, 3).unwrap();
    assert!(empty.entries.is_empty() && empty.next.is_none());
}

/// S1: `scan_visit` lends exactly the entries and cursors `scan` returns, for every range
/// and limit; a visitor may call the store; a visitor's error stops the page and comes back
/// as is.
pub fn scan_visit_lends_the_pages_scan_returns(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("lent");
    let rows = numbered(10);
    put_all(s, &p, &rows);
    let (lo, hi) = (rows[2].0.clone(), rows[7].0.clone());
    let mut ranges = every_bound_kind(&lo, &hi);
    ranges.push(KeyRange::all());
    ranges.push(KeyRange::prefix(&rows[3].0));
    ranges.push(KeyRange {
        start: Bound::Included(hi.clone()),
        end: Bound::Excluded(lo.clone()),
    });
    for range in &ranges {
        for limit in [1, 3, 10, 11] {
            let mut cursor: Option<Cursor> = None;
            for _ in 0..=rows.len() {
                let page = s.scan(&p, range, cursor.as_ref(), limit).unwrap();
                let mut lent: Rows = Vec::new();
                let next = s
                    .scan_visit(&p, range, cursor.as_ref(), limit, &mut |k, v| {
                        lent.push((k.to_vec(), v.to_vec()));
                        Ok(())
                    })
                    .unwrap();
                assert_eq!(lent, page.entries, "{range:?} limit {limit}");
                assert_eq!(next, page.next, "{range:?} limit {limit}");
                match next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
        }
    }
    // A missing partition lends nothing; a zero limit is refused like `scan`'s.
    let mut visits = 0;
    let next = s
        .scan_visit(&part("nothing"), &KeyRange::all(), None, 3, &mut |_, _| {
            visits += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!((visits, next), (0, None));
    assert_invalid(
        s.scan_visit(&p, &KeyRange::all(), None, 0, &mut |_, _| Ok(())),
        "scan_visit with limit 0",
    );
    // The visitor may read the store, and its error stops the page.
    let mut seen = 0;
    let stopped = s.scan_visit(&p, &KeyRange::all(), None, 10, &mut |k, v| {
        assert_eq!(s.get(&p, k).unwrap().as_deref(), Some(v));
        seen += 1;
        match seen {
            3 => Err(Error::InvalidArgument("stop here".into())),
            _ => Ok(()),
        }
    });
    match stopped {
        Err(Error::InvalidArgument(m)) if m == "stop here" => {}
        other => panic!("expected the visitor's error, got {other:?}"),
    }
    assert_eq!(seen, 3, "no entry is lent after the visitor's error");
}

/// S1: when the last page is exactly full the scan still answers `None` (no empty extra page).
pub fn scan_ends_with_none_when_last_page_is_exactly_full(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("full");
    let rows = numbered(6);
    put_all(s, &p, &rows);
    put_all(s, &part("full-neighbour"), &[(b("k999"), b("x"))]);
    for limit in [1, 2, 3, 6] {
        let mut cursor = None;
        for i in 0..(6 / limit) {
            let page = s
                .scan(&p, &KeyRange::all(), cursor.as_ref(), limit)
                .unwrap();
            assert_eq!(page.entries.len(), limit);
            if i + 1 == 6 / limit {
                assert_eq!(page.next, None, "limit {limit}: exactly full last page");
            } else {
                assert!(page.next.is_some(), "limit {limit}: page {i}");
            }
            cursor = page.next;
        }
    }
    // Exactly full at the end of a bounded range, with keys after the range.
    let r = KeyRange::between(b("k002"), b("k004"));
    let page = s.scan(&p, &r, None, 2).unwrap();
    assert_eq!(keys_of(&page.entries), vec![b("k002"), b("k003")]);
    assert_eq!(page.next, None);
    let page = s.scan(&p, &KeyRange::all(), None, 7).unwrap();
    assert_eq!(page.entries.len(), 6);
    assert_eq!(page.next, None);
}

/// S1: ranges with every combination of included, excluded and unbounded ends, with bounds that
/// are and are not keys.
pub fn scan_ranges_with_every_bound_kind(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("ranges");
    let keys = tricky_keys();
    let rows: Rows = keys.iter().map(|k| (k.clone(), b("v"))).collect();
    put_all(s, &p, &rows);
    let mut sorted = rows.clone();
    sorted.sort();
    let bounds: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b("a"), b("b")),               // both are keys
        (b("a\x01"), vec![0x80, 0x01]), // neither is a key
        (vec![0x80], vec![0xff]),       // high bytes
        (Vec::new(), vec![0xff, 0xff]), // the empty lower bound, the last key
        (b("ab"), b("ab")),             // one point
    ];
    for (lo, hi) in &bounds {
        for r in every_bound_kind(lo, hi) {
            let expected: Rows = sorted
                .iter()
                .filter(|(k, _)| in_range(&r, k))
                .cloned()
                .collect();
            for limit in [1, 2, 5, 100] {
                assert_eq!(scan_all(s, &p, &r, limit), expected, "{r:?} limit {limit}");
            }
        }
    }
}

/// S1: prefix ranges, including prefixes ending in 0xff and the empty prefix.
pub fn scan_prefix_ranges(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("prefix");
    let keys = tricky_keys();
    let rows: Rows = keys.iter().map(|k| (k.clone(), k.clone())).collect();
    put_all(s, &p, &rows);
    let prefixes: Vec<Vec<u8>> = vec![
        b("a"),
        b("ab"),
        vec![b'a', 0xff],
        vec![0xff],
        vec![0xff, 0xff],
        vec![0x80],
        vec![0x00],
        b("zz"),
        Vec::new(),
    ];
    for prefix in &prefixes {
        let mut expected: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        expected.sort();
        for limit in [1, 3, 100] {
            let got = scan_all(s, &p, &KeyRange::prefix(prefix), limit);
            assert_eq!(keys_of(&got), expected, "prefix {prefix:?} limit {limit}");
        }
    }
}

/// S1: empty and inverted ranges answer an empty final page, never a panic or an error.
pub fn scan_empty_and_inverted_ranges(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("empty-ranges");
    put_all(
        s,
        &p,
        &[(b("a"), b("1")), (b("b"), b("2")), (b("c"), b("3"))],
    );
    let a = || b("a");
    let c = || b("c");
    let ranges = [
        KeyRange::between(a(), a()),
        KeyRange::between(c(), a()),
        KeyRange {
            start: Bound::Excluded(a()),
            end: Bound::Excluded(a()),
        },
        KeyRange {
            start: Bound::Excluded(a()),
            end: Bound::Included(a()),
        },
        KeyRange {
            start: Bound::Included(c()),
            end: Bound::Included(a()),
        },
        KeyRange {
            start: Bound::Excluded(c()),
            end: Bound::Excluded(a()),
        },
        KeyRange {
            start: Bound::Excluded(a()),
            end: Bound::Excluded(b("a\0")),
        },
        KeyRange {
            start: Bound::Unbounded,
            end: Bound::Excluded(Vec::new()),
        },
        KeyRange::from(b("d")),
        KeyRange::prefix(b"q"),
    ];
    for r in &ranges {
        for limit in [1, 10] {
            let page = s.scan(&p, r, None, limit).unwrap();
            assert!(page.entries.is_empty(), "{r:?}: {page:?}");
            assert_eq!(page.next, None, "{r:?}");
            let page = s.scan(&part("empty-missing"), r, None, limit).unwrap();
            assert!(page.entries.is_empty() && page.next.is_none());
        }
    }
    // A cursor past the end of the range.
    let page = s
        .scan(
            &p,
            &KeyRange::between(a(), c()),
            Some(&Cursor::after_key(b("zzz"))),
            5,
        )
        .unwrap();
    assert!(page.entries.is_empty() && page.next.is_none());
    // A single-point range.
    let page = s
        .scan(
            &p,
            &KeyRange {
                start: Bound::Included(b("b")),
                end: Bound::Included(b("b")),
            },
            None,
            1,
        )
        .unwrap();
    assert_eq!(page.entries, vec![(b("b"), b("2"))]);
    assert_eq!(page.next, None);
}

/// S1: a scan limit of 0 is refused with `InvalidArgument`.
pub fn scan_limit_zero_is_refused(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("limit0");
    assert_invalid(s.scan(&p, &KeyRange::all(), None, 0), "missing partition");
    put_all(s, &p, &[(b("a"), b("1"))]);
    assert_invalid(s.scan(&p, &KeyRange::all(), None, 0), "limit 0");
    assert_invalid(
        s.scan(&p, &KeyRange::all(), Some(&Cursor::after_key(b("a"))), 0),
        "limit 0 with cursor",
    );
    assert_invalid(
        s.scan(&p, &KeyRange::between(b("b"), b("a")), None, 0),
        "limit 0, inverted range",
    );
    assert_eq!(dump(s, &p), vec![(b("a"), b("1"))]);
}

/// S1: a cursor persisted as a key resumes strictly after that key, whether or not the key
/// exists; a cursor before the range start leaves the start in force; each page reads the
/// current state, so writes between pages after the cursor are seen and before it are not.
pub fn scan_resumes_from_persisted_cursor_and_sees_writes_between_pages(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("cursor");
    put_all(
        s,
        &p,
        &[
            (b("a"), b("1")),
            (b("b"), b("2")),
            (b("c"), b("3")),
            (b("d"), b("4")),
            (b("e"), b("5")),
        ],
    );
    let all = KeyRange::all();
    let page = s
        .scan(&p, &all, Some(&Cursor::after_key(b("b"))), 2)
        .unwrap();
    assert_eq!(keys_of(&page.entries), vec![b("c"), b("d")]);
    let page = s
        .scan(&p, &all, Some(&Cursor::after_key(b("bb"))), 10)
        .unwrap();
    assert_eq!(keys_of(&page.entries), vec![b("c"), b("d"), b("e")]);
    assert_eq!(page.next, None);
    let page = s
        .scan(&p, &all, Some(&Cursor::after_key(b("b\0"))), 10)
        .unwrap();
    assert_eq!(keys_of(&page.entries), vec![b("c"), b("d"), b("e")]);
    // A cursor before the start of the range: the range start still holds.
    let r = KeyRange::from(b("c"));
    let page = s
        .scan(&p, &r, Some(&Cursor::after_key(b("a"))), 10)
        .unwrap();
    assert_eq!(keys_of(&page.entries), vec![b("c"), b("d"), b("e")]);
    let r = KeyRange {
        start: Bound::Excluded(b("c")),
        end: Bound::Unbounded,
    };
    let page = s
        .scan(&p, &r, Some(&Cursor::after_key(b("a"))), 10)
        .unwrap();
    assert_eq!(keys_of(&page.entries), vec![b("d"), b("e")]);

    // Writes between pages.
    let first = s.scan(&p, &all, None, 2).unwrap();
    assert_eq!(keys_of(&first.entries), vec![b("a"), b("b")]);
    let c = first.next.unwrap();
    commit(
        s,
        &p,
        Batch::new()
            .delete(b("b")) // the cursor's own key
            .put(b("b\0"), b("new")) // just after the cursor
            .put(b("aa"), b("behind")) // behind the cursor: not seen
            .delete(b("d")),
    );
    let second = s.scan(&p, &all, Some(&c), 2).unwrap();
    assert_eq!(second.entries, vec![(b("b\0"), b("new")), (b("c"), b("3"))]);
    let third = s.scan(&p, &all, second.next.as_ref(), 2).unwrap();
    assert_eq!(third.entries, vec![(b("e"), b("5"))]);
    assert_eq!(third.next, None);
}

/// S1: each page is a consistent view while batches commit concurrently.
///
/// One writer moves the partition through generations. In generation `g`, every stable key
/// `kNN` holds `g`, and one token key `kNN~` (sorting right after `kNN`) at slot `g % SLOTS`
/// holds `g`; every other token slot is absent. Each batch moves every key and the token to the
/// next generation, by Delete+Put pairs or by DeleteRange followed by Puts. Scanners page
/// through the range with assorted limits and check that each page is *exactly* generation
/// `g`'s state restricted to the key interval the page covers (from just after the previous
/// cursor to its last key, or to the end on the final page): one generation per page, each
/// stable key present, the token present iff its slot is covered, no other token. A page that
/// mixed two states would show two generations, a missing key, or zero or two tokens. Across
/// pages, stable keys appear exactly once, in order, and generations never go back.
pub fn scan_pages_are_consistent_under_concurrent_batches(open: Open) {
    const SLOTS: usize = 16;
    const BATCHES: u64 = 400;
    const SCANNERS: usize = 2;
    const MAX_SCANS: usize = 20_000;
    let f = fresh(open);
    let s = &*f.store;
    let p = part("scan-race");
    let key = |i: usize| format!("k{i:02}").into_bytes();
    let tok = |i: usize| format!("k{i:02}~").into_bytes();
    let gen_val = |g: u64| g.to_string().into_bytes();
    let state = |g: u64| -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut m: BTreeMap<_, _> = (0..SLOTS).map(|i| (key(i), gen_val(g))).collect();
        m.insert(tok(g as usize % SLOTS), gen_val(g));
        m
    };
    // Rows outside the scanned range that nothing touches.
    put_all(s, &p, &[(b("a"), b("outside")), (b("l"), b("outside"))]);
    let initial: Rows = state(0).into_iter().collect();
    put_all(s, &p, &initial);

    let range = KeyRange::prefix(b"k");
    let done = AtomicBool::new(false);
    let barrier = Barrier::new(SCANNERS + 1);
    thread::scope(|scope| {
        scope.spawn(|| {
            let writers_left = AtomicUsize::new(1);
            let _finish = LastOneOut {
                left: &writers_left,
                done: &done,
            };
            barrier.wait();
            for g in 1..=BATCHES {
                let old = (g - 1) as usize % SLOTS;
                let new = g as usize % SLOTS;
                let mut batch = Batch::new().equals(key(0), gen_val(g - 1));
                if g.is_multiple_of(2) {
                    batch = batch.delete_range(KeyRange::prefix(b"k"));
                    for i in 0..SLOTS {
                        batch = batch.put(key(i), gen_val(g));
                    }
                } else {
                    for i in 0..SLOTS {
                        batch = batch.delete(key(i)).put(key(i), gen_val(g));
                    }
                    batch = batch.delete(tok(old));
                }
                batch = batch.put(tok(new), gen_val(g));
                commit(s, &p, batch);
            }
        });
        for t in 0..SCANNERS {
            let (range, done, barrier, p, state) = (&range, &done, &barrier, &p, &state);
            scope.spawn(move || {
                barrier.wait();
                let limits = [1usize, 2, 3, 5, 7, 16, 17, 33, 100];
                let mut scans = 0usize;
                while scans < 3 || (!done.load(Ordering::Acquire) && scans < MAX_SCANS) {
                    let limit = limits[(scans + t) % limits.len()];
                    scan_once_consistent(s, p, range, limit, state, SLOTS);
                    scans += 1;
                }
            });
        }
    });
    let end: Rows = state(BATCHES).into_iter().collect();
    assert_eq!(scan_all(s, &p, &range, 5), end);
    assert_eq!(s.get(&p, b"a").unwrap(), Some(b("outside")));
    assert_eq!(s.get(&p, b"l").unwrap(), Some(b("outside")));
}

fn scan_once_consistent(
    s: &dyn Store,
    p: &Partition,
    range: &KeyRange,
    limit: usize,
    state: &dyn Fn(u64) -> BTreeMap<Vec<u8>, Vec<u8>>,
    slots: usize,
) {
    let mut cursor: Option<Cursor> = None;
    let mut last_gen = 0u64;
    let mut stable_seen: Vec<Vec<u8>> = Vec::new();
    for _ in 0..10_000 {
        let page = s.scan(p, range, cursor.as_ref(), limit).expect("scan");
        check_page_shape(&page, limit, cursor.as_ref().map(Cursor::last_key));
        let lower: Bound<Vec<u8>> = match &cursor {
            Some(c) => Bound::Excluded(c.last_key().to_vec()),
            None => Bound::Unbounded,
        };
        let upper: Bound<Vec<u8>> = match (&page.next, page.entries.last()) {
            (Some(_), Some((k, _))) => Bound::Included(k.clone()),
            _ => Bound::Unbounded,
        };
        let covered = KeyRange {
            start: lower,
            end: upper,
        };
        match page.entries.first() {
            Some((_, v)) => {
                let g: u64 = std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("unexpected value {v:?}"));
                assert!(g >= last_gen, "page went back from gen {last_gen} to {g}");
                last_gen = g;
                let expected: Rows = state(g)
                    .into_iter()
                    .filter(|(k, _)| in_range(&covered, k))
                    .collect();
                assert_eq!(
                    page.entries, expected,
                    "page (limit {limit}) over {covered:?} is not generation {g}'s state"
                );
            }
            None => {
                // Only a final page may be empty, and then it covers no stable key.
                assert!(page.next.is_none());
                let stable_in = (0..slots)
                    .map(|i| format!("k{i:02}").into_bytes())
                    .any(|k| in_range(&covered, &k));
                assert!(!stable_in, "empty page over {covered:?} skips stable keys");
            }
        }
        stable_seen.extend(
            page.entries
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| !k.ends_with(b"~")),
        );
        match page.next {
            Some(c) => cursor = Some(c),
            None => {
                let expected: Vec<Vec<u8>> = (0..slots)
                    .map(|i| format!("k{i:02}").into_bytes())
                    .collect();
                assert_eq!(stable_seen, expected, "each stable key exactly once");
                return;
            }
        }
    }
    panic!("scan did not end");
}

// ---------------------------------------------------------------------------------------------
// S2: guarded batches
// ---------------------------------------------------------------------------------------------

fn seeded(open: Open, name: &str) -> (Fixture, Partition) {
    let f = fresh(open);
    let p = part(name);
    put_all(
        &*f.store,
        &p,
        &[
            (b("k"), b("v")),
            (b("empty"), Vec::new()),
            (b("other"), b("o")),
        ],
    );
    (f, p)
}

fn expect_outcome(s: &dyn Store, p: &Partition, batch: Batch, expected: Outcome) {
    if !s.evaluates_deadlines() && has_deadline(&batch) {
        return expect_deadline_refused(s, p, batch);
    }
    let before = snapshot(s);
    let got = s.apply(p, &batch).expect("apply");
    assert_eq!(got, expected, "{batch:?}");
    if !got.is_committed() {
        assert_eq!(snapshot(s), before, "a refused batch changed something");
    }
}

fn has_deadline(batch: &Batch) -> bool {
    batch
        .guards()
        .iter()
        .any(|g| matches!(g, Precondition::NotAfter(_)))
}

/// S11: a store that does not evaluate deadlines refuses a batch carrying `NotAfter` with
/// `InvalidArgument` (code 1), before looking at anything else, and changes nothing.
fn expect_deadline_refused(s: &dyn Store, p: &Partition, batch: Batch) {
    assert!(!s.evaluates_deadlines());
    let before = snapshot(s);
    let result = s.apply(p, &batch);
    assert_eq!(
        result.as_ref().map_err(Error::code).err(),
        Some(1),
        "{batch:?}: {result:?}"
    );
    assert_invalid(result, "a deadline on a store without deadlines");
    assert_eq!(snapshot(s), before, "a refused deadline changed something");
}

/// S2: `Equals(key, value)` holds only when the key holds exactly that value.
pub fn precondition_equals(open: Open) {
    let (f, p) = seeded(open, "equals");
    let s = &*f.store;
    let fail = Outcome::PreconditionFailed { index: 0 };
    expect_outcome(
        s,
        &p,
        Batch::new().equals(b("k"), b("w")).put(b("x"), b("1")),
        fail,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().equals(b("k"), b("vv")).put(b("x"), b("1")),
        fail,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().equals(b("k"), Vec::new()).put(b("x"), b("1")),
        fail,
    );
    // An absent key equals nothing, not even the empty value.
    expect_outcome(
        s,
        &p,
        Batch::new()
            .equals(b("nope"), Vec::new())
            .put(b("x"), b("1")),
        fail,
    );
    // A key in another partition does not count.
    expect_outcome(
        s,
        &part("equals-other"),
        Batch::new().equals(b("k"), b("v")),
        fail,
    );
    expect_outcome(
        s,
        &p,
        Batch::new()
            .equals(b("empty"), Vec::new())
            .put(b("x"), b("1")),
        Outcome::Committed,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().equals(b("k"), b("v")).put(b("k"), b("w")),
        Outcome::Committed,
    );
    assert_eq!(s.get(&p, b"k").unwrap(), Some(b("w")));
    assert_eq!(s.get(&p, b"x").unwrap(), Some(b("1")));
}

/// S2: `Absent(key)` holds only when the key holds no value (an empty value is a value).
pub fn precondition_absent(open: Open) {
    let (f, p) = seeded(open, "absent");
    let s = &*f.store;
    let fail = Outcome::PreconditionFailed { index: 0 };
    expect_outcome(s, &p, Batch::new().absent(b("k")).put(b("x"), b("1")), fail);
    expect_outcome(
        s,
        &p,
        Batch::new().absent(b("empty")).put(b("x"), b("1")),
        fail,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().absent(b("k\0")).put(b("x"), b("1")),
        Outcome::Committed,
    );
    // A key deleted earlier is absent again.
    commit(s, &p, Batch::new().delete(b("k")));
    expect_outcome(
        s,
        &p,
        Batch::new().absent(b("k")).put(b("k"), b("again")),
        Outcome::Committed,
    );
    assert_eq!(s.get(&p, b"k").unwrap(), Some(b("again")));
    assert_eq!(s.get(&p, b"x").unwrap(), Some(b("1")));
}

/// S2: `Present(key)` holds when the key holds any value, including the empty one.
pub fn precondition_present(open: Open) {
    let (f, p) = seeded(open, "present");
    let s = &*f.store;
    let fail = Outcome::PreconditionFailed { index: 0 };
    expect_outcome(
        s,
        &p,
        Batch::new().present(b("nope")).put(b("x"), b("1")),
        fail,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().present(b("k\0")).put(b("x"), b("1")),
        fail,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().present(b("empty")).put(b("x"), b("1")),
        Outcome::Committed,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().present(b("k")).delete(b("k")),
        Outcome::Committed,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().present(b("k")).put(b("y"), b("1")),
        fail,
    );
    assert_eq!(s.get(&p, b"x").unwrap(), Some(b("1")));
    assert_eq!(s.get(&p, b"y").unwrap(), None);
}

/// S2: `NotAfter(deadline)` reads the store's clock: a deadline equal to now passes; now past
/// the deadline answers `DeadlinePassed { now_ms }` and changes nothing.
pub fn precondition_not_after(open: Open) {
    let (f, p) = seeded(open, "not-after");
    let s = &*f.store;
    if !s.evaluates_deadlines() {
        // See `deadlines_refused_when_not_evaluated`.
        return;
    }
    let clock = &f.clock;
    assert_eq!(s.now_ms(), START_MS, "the store reads the given clock");
    let now = clock.now_ms();
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(now + 1).put(b("a"), b("1")),
        Outcome::Committed,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(now).put(b("b"), b("1")),
        Outcome::Committed,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(now - 1).put(b("c"), b("1")),
        Outcome::DeadlinePassed { now_ms: now },
    );
    clock.advance(250);
    assert_eq!(s.now_ms(), now + 250);
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(now + 249).put(b("c"), b("1")),
        Outcome::DeadlinePassed { now_ms: now + 250 },
    );
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(now + 250).put(b("d"), b("1")),
        Outcome::Committed,
    );
    // The clock may move backwards (skew); the check follows it.
    clock.set(now - 1000);
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(now - 1000).put(b("e"), b("1")),
        Outcome::Committed,
    );
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(0).delete(b("k")),
        Outcome::DeadlinePassed { now_ms: now - 1000 },
    );
    expect_outcome(s, &p, Batch::new().not_after(u64::MAX), Outcome::Committed);
    assert_eq!(
        s.get_many(&p, &[b"a", b"b", b"c", b"d", b"e", b"k"])
            .unwrap(),
        vec![
            Some(b("1")),
            Some(b("1")),
            None,
            Some(b("1")),
            Some(b("1")),
            Some(b("v"))
        ]
    );
}

/// S2: with several preconditions, the first one that fails (in the order added) is reported;
/// a passed deadline is reported as `DeadlinePassed` only if no earlier precondition failed.
pub fn preconditions_combined_report_first_failing_index(open: Open) {
    let (f, p) = seeded(open, "combined");
    let s = &*f.store;
    if !s.evaluates_deadlines() {
        // Every batch here carries a deadline but one; the order of key guards alone is
        // checked by the other precondition cases and the model test.
        return;
    }
    let now = f.clock.now_ms();
    let ok = || {
        Batch::new()
            .present(b("k"))
            .equals(b("k"), b("v"))
            .absent(b("nope"))
            .not_after(now)
    };
    expect_outcome(s, &p, ok().put(b("x"), b("1")), Outcome::Committed);
    expect_outcome(
        s,
        &p,
        ok().equals(b("other"), b("wrong")).put(b("y"), b("1")),
        Outcome::PreconditionFailed { index: 4 },
    );
    expect_outcome(
        s,
        &p,
        Batch::new()
            .present(b("k"))
            .absent(b("k"))
            .present(b("nope"))
            .put(b("y"), b("1")),
        Outcome::PreconditionFailed { index: 1 },
    );
    expect_outcome(
        s,
        &p,
        Batch::new()
            .not_after(now)
            .equals(b("k"), b("v"))
            .present(b("nope"))
            .absent(b("k"))
            .put(b("y"), b("1")),
        Outcome::PreconditionFailed { index: 2 },
    );
    expect_outcome(
        s,
        &p,
        Batch::new()
            .equals(b("k"), b("v"))
            .equals(b("k"), b("bad"))
            .not_after(now - 1)
            .put(b("y"), b("1")),
        Outcome::PreconditionFailed { index: 1 },
    );
    expect_outcome(
        s,
        &p,
        Batch::new()
            .equals(b("k"), b("v"))
            .not_after(now - 1)
            .equals(b("k"), b("bad"))
            .put(b("y"), b("1")),
        Outcome::DeadlinePassed { now_ms: now },
    );
    expect_outcome(
        s,
        &p,
        Batch::new()
            .guard(Precondition::NotAfter(now + 5))
            .guard(Precondition::Present(b("x")))
            .guard(Precondition::Equals(b("x"), b("1")))
            .guard(Precondition::Absent(b("y")))
            .put(b("y"), b("2")),
        Outcome::Committed,
    );
    assert_eq!(s.get(&p, b"y").unwrap(), Some(b("2")));
}

/// S2: a failed precondition or passed deadline changes nothing, whatever the batch's
/// operations (compared by a full scan of every partition before and after).
pub fn failed_precondition_changes_nothing(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("unchanged");
    let q = part("unchanged-neighbour");
    put_all(
        s,
        &p,
        &[(b("a"), b("1")), (b("b"), b("2")), (b("c"), b("3"))],
    );
    put_all(s, &q, &[(b("x"), b("9"))]);
    let now = f.clock.now_ms();
    let destructive = |batch: Batch| {
        batch
            .put(b("a"), b("changed"))
            .delete(b("b"))
            .put(b("new"), b("n"))
            .delete_range(KeyRange::all())
            .put(b("after"), b("x"))
    };
    let before = snapshot(s);
    let cases = [
        (
            destructive(
                Batch::new()
                    .present(b("a"))
                    .equals(b("b"), b("2"))
                    .absent(b("c")),
            ),
            Outcome::PreconditionFailed { index: 2 },
        ),
        (
            destructive(Batch::new().equals(b("a"), b("2"))),
            Outcome::PreconditionFailed { index: 0 },
        ),
        (
            destructive(Batch::new().present(b("a")).present(b("new"))),
            Outcome::PreconditionFailed { index: 1 },
        ),
        (
            destructive(
                Batch::new()
                    .absent(b("new"))
                    .absent(b("after"))
                    .absent(b("a")),
            ),
            Outcome::PreconditionFailed { index: 2 },
        ),
        (
            destructive(Batch::new().present(b("a")).not_after(now - 1)),
            Outcome::DeadlinePassed { now_ms: now },
        ),
    ];
    for (batch, expected) in cases {
        if !s.evaluates_deadlines() && has_deadline(&batch) {
            expect_deadline_refused(s, &p, batch);
            continue;
        }
        assert_eq!(s.apply(&p, &batch).unwrap(), expected, "{batch:?}");
        assert_eq!(snapshot(s), before, "{batch:?} changed something");
    }
    // The same batch with guards that hold does everything.
    commit(
        s,
        &p,
        destructive(Batch::new().present(b("a")).absent(b("new"))),
    );
    assert_eq!(dump(s, &p), vec![(b("after"), b("x"))]);
    assert_eq!(dump(s, &q), vec![(b("x"), b("9"))]);
}

/// S2: a refused batch on a partition that does not exist yet leaves no trace: no rows, and no
/// new partition in `list_partitions`.
pub fn failed_batch_on_new_partition_creates_nothing(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    put_all(s, &part("exists"), &[(b("a"), b("1"))]);
    let before = snapshot(s);
    let p = part("never");
    let now = f.clock.now_ms();
    assert_eq!(
        s.apply(&p, &Batch::new().present(b("a")).put(b("a"), b("1")))
            .unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    assert_eq!(
        s.apply(
            &p,
            &Batch::new().equals(b("a"), Vec::new()).put(b("a"), b("1"))
        )
        .unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    expect_outcome(
        s,
        &p,
        Batch::new().not_after(now - 1).put(b("a"), b("1")),
        Outcome::DeadlinePassed { now_ms: now },
    );
    assert_too_large(
        s.apply(
            &p,
            &Batch::new().put(vec![b'k'; s.limits().max_key_bytes + 1], b("1")),
        ),
        "oversize key on a new partition",
    );
    assert_invalid(
        s.apply(&p, &Batch::new().put(Vec::new(), b("1"))),
        "empty key on a new partition",
    );
    assert_eq!(s.get(&p, b"a").unwrap(), None);
    assert_eq!(snapshot(s), before);
    assert_eq!(
        s.list_partitions(b"never").unwrap(),
        Vec::<Partition>::new()
    );
    // Its first committed batch then creates it.
    commit(s, &p, Batch::new().absent(b("a")).put(b("a"), b("1")));
    assert_eq!(s.list_partitions(b"never").unwrap(), vec![p.clone()]);
    assert_eq!(dump(s, &p), vec![(b("a"), b("1"))]);
}

/// S2: deleting an absent key commits and changes nothing.
pub fn delete_of_absent_key_commits(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("delete-absent");
    put_all(s, &p, &[(b("a"), b("1")), (b("c"), b("3"))]);
    let before = snapshot(s);
    commit(s, &p, Batch::new().delete(b("b")));
    commit(
        s,
        &p,
        Batch::new().delete(b("a\0")).delete(b("b")).delete(b("b")),
    );
    assert_eq!(snapshot(s), before);
    commit(s, &p, Batch::new().delete(b("a")).delete(b("a")));
    assert_eq!(dump(s, &p), vec![(b("c"), b("3"))]);
}

/// S2: `DeleteRange` with every combination of bound kinds, including empty and inverted
/// ranges (which delete nothing), removes exactly the keys in the range.
pub fn delete_range_with_every_bound_kind(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let keys = tricky_keys();
    let rows: Rows = {
        let mut r: Rows = keys.iter().map(|k| (k.clone(), b("v"))).collect();
        r.sort();
        r
    };
    let bounds: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b("a"), b("b")),
        (b("a\x01"), vec![0x80, 0x01]),
        (vec![0x80], vec![0xff]),
        (Vec::new(), vec![0xff, 0xff]),
        (b("ab"), b("ab")),
        (b("b"), b("a")), // inverted
    ];
    let mut n = 0;
    for (lo, hi) in &bounds {
        for r in every_bound_kind(lo, hi) {
            let p = part(format!("dr{n}"));
            n += 1;
            put_all(s, &p, &rows);
            commit(s, &p, Batch::new().delete_range(r.clone()));
            let expected: Rows = rows
                .iter()
                .filter(|(k, _)| !in_range(&r, k))
                .cloned()
                .collect();
            assert_eq!(dump(s, &p), expected, "{r:?}");
        }
    }
    // Prefix ranges, one ending in 0xff.
    for prefix in [b("a"), vec![b'a', 0xff], vec![0xff]] {
        let p = part(format!("dr{n}"));
        n += 1;
        put_all(s, &p, &rows);
        commit(s, &p, Batch::new().delete_range(KeyRange::prefix(&prefix)));
        let expected: Rows = rows
            .iter()
            .filter(|(k, _)| !k.starts_with(&prefix))
            .cloned()
            .collect();
        assert_eq!(dump(s, &p), expected, "prefix {prefix:?}");
    }
    // A range over a missing partition, and over nothing.
    commit(
        s,
        &part("dr-missing"),
        Batch::new().delete_range(KeyRange::all()),
    );
    assert_eq!(dump(s, &part("dr-missing")), Vec::new());
}

/// S2: operations in one batch apply in order.
pub fn ops_in_one_batch_apply_in_order(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("in-order");
    commit(s, &p, Batch::new().put(b("k"), b("1")).delete(b("k")));
    assert_eq!(s.get(&p, b"k").unwrap(), None, "put then delete");
    commit(s, &p, Batch::new().delete(b("k")).put(b("k"), b("2")));
    assert_eq!(s.get(&p, b"k").unwrap(), Some(b("2")), "delete then put");
    commit(s, &p, Batch::new().put(b("k"), b("3")).put(b("k"), b("4")));
    assert_eq!(s.get(&p, b"k").unwrap(), Some(b("4")), "last put wins");
    commit(
        s,
        &p,
        Batch::new()
            .put(b("r1"), b("x"))
            .put(b("r2"), b("x"))
            .delete_range(KeyRange::prefix(b"r"))
            .put(b("r2"), b("y")),
    );
    assert_eq!(
        scan_all(s, &p, &KeyRange::prefix(b"r"), 10),
        vec![(b("r2"), b("y"))],
        "put, delete-range, put"
    );
    commit(
        s,
        &p,
        Batch::new()
            .delete_range(KeyRange::all())
            .put(b("z"), b("1"))
            .put(b("a"), b("1")),
    );
    assert_eq!(dump(s, &p), vec![(b("a"), b("1")), (b("z"), b("1"))]);
    commit(
        s,
        &p,
        Batch::new()
            .put(b("m"), b("1"))
            .delete_range(KeyRange::between(b("b"), b("z"))),
    );
    assert_eq!(dump(s, &p), vec![(b("a"), b("1")), (b("z"), b("1"))]);
    // Guards see the state before the batch, not its own writes.
    assert_eq!(
        s.apply(&p, &Batch::new().present(b("q")).put(b("q"), b("1")))
            .unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
}

/// S2: an empty batch, and a batch of guards only, commit without changing anything.
pub fn empty_batch_commits(open: Open) {
    let (f, p) = seeded(open, "empty-batch");
    let s = &*f.store;
    let before = snapshot(s);
    commit(s, &p, Batch::new());
    commit(s, &p, Batch::new().present(b("k")));
    expect_outcome(
        s,
        &p,
        Batch::new().present(b("k")).not_after(f.clock.now_ms()),
        Outcome::Committed,
    );
    assert_eq!(snapshot(s), before);
}

/// S1/S2: `get_for_update` answers what the next batch's preconditions will see, so
/// compare-and-set loops built on it lose no update, and after the loops end it agrees with
/// `get`.
pub fn compare_and_set_through_get_for_update_loses_no_update(open: Open) {
    const THREADS: usize = 8;
    const PER_THREAD: u64 = 100;
    let f = fresh(open);
    let s = &*f.store;
    let p = part("cas-for-update");
    assert_eq!(
        s.get_for_update(&p, b"n").unwrap(),
        None,
        "a missing partition"
    );
    assert!(matches!(
        s.get_for_update(&p, b""),
        Err(Error::InvalidArgument(_))
    ));
    let barrier = Barrier::new(THREADS);
    thread::scope(|scope| {
        for _ in 0..THREADS {
            let (p, barrier) = (&p, &barrier);
            scope.spawn(move || {
                barrier.wait();
                for _ in 0..PER_THREAD {
                    // Bounded: every failed attempt follows another thread's commit.
                    for attempt in 0.. {
                        assert!(attempt <= THREADS as u64 * PER_THREAD, "livelock");
                        let current = s.get_for_update(p, b"n").unwrap();
                        let n = current
                            .as_deref()
                            .map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()));
                        let guard = match current {
                            Some(v) => Batch::new().equals(b("n"), v),
                            None => Batch::new().absent(b("n")),
                        };
                        let batch = guard.put(b("n"), (n + 1).to_be_bytes().to_vec());
                        if s.apply(p, &batch).unwrap().is_committed() {
                            break;
                        }
                    }
                }
            });
        }
    });
    let total = (THREADS as u64 * PER_THREAD).to_be_bytes().to_vec();
    assert_eq!(s.get(&p, b"n").unwrap(), Some(total.clone()));
    assert_eq!(s.get_for_update(&p, b"n").unwrap(), Some(total));
}

/// S2: preconditions are checked and operations applied atomically with respect to every other
/// batch on the partition: threads racing compare-and-set increments lose no update.
///
/// Each increment also writes a log key of its own in the same batch, so the count of log keys
/// must match the counter.
pub fn concurrent_compare_and_set_loses_no_update(open: Open) {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 125;
    // Each failed attempt of a thread follows a distinct commit by another thread (the counter
    // only grows, and every retry re-reads it), so no thread needs more attempts than this.
    const MAX_ATTEMPTS: usize = THREADS * PER_THREAD + PER_THREAD;
    let f = fresh(open);
    let s = &*f.store;
    let p = part("counter");
    commit(s, &p, Batch::new().put(b("n"), b("0")));
    let barrier = Barrier::new(THREADS);
    thread::scope(|scope| {
        for t in 0..THREADS {
            let (p, barrier) = (&p, &barrier);
            scope.spawn(move || {
                barrier.wait();
                let mut attempts = 0;
                for i in 0..PER_THREAD {
                    loop {
                        attempts += 1;
                        assert!(
                            attempts <= MAX_ATTEMPTS,
                            "thread {t}: more failed attempts than commits by others"
                        );
                        let cur = s.get(p, b"n").unwrap().expect("counter present");
                        let n: u64 = std::str::from_utf8(&cur).unwrap().parse().unwrap();
                        let batch = Batch::new()
                            .equals(b("n"), cur)
                            .put(b("n"), (n + 1).to_string().into_bytes())
                            .put(format!("log/{t}/{i:04}").into_bytes(), n.to_string());
                        match s.apply(p, &batch).unwrap() {
                            Outcome::Committed => break,
                            Outcome::PreconditionFailed { index: 0 } => continue,
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                }
            });
        }
    });
    let total = (THREADS * PER_THREAD) as u64;
    assert_eq!(
        s.get(&p, b"n").unwrap(),
        Some(total.to_string().into_bytes()),
        "lost updates"
    );
    let log = scan_all(s, &p, &KeyRange::prefix(b"log/"), 97);
    assert_eq!(log.len() as u64, total);
    // Every counter value was observed by exactly one successful increment.
    let seen: BTreeSet<u64> = log
        .iter()
        .map(|(_, v)| std::str::from_utf8(v).unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        seen,
        (0..total).collect::<BTreeSet<u64>>(),
        "duplicate increments"
    );
}

/// S2: preconditions are checked and operations applied as one step: threads released together
/// by a barrier race the same `Absent(claim)` + `Put(claim)` batch, round after round, and
/// exactly one of them commits each round. The winner's batch also records its own name, so a
/// second winner would show as a second record.
pub fn concurrent_claims_have_exactly_one_winner(open: Open) {
    const THREADS: usize = 4;
    const ROUNDS: usize = 300;
    let f = fresh(open);
    let s = &*f.store;
    let p = part("claims");
    let barrier = Barrier::new(THREADS);
    let results: Vec<(Vec<usize>, Vec<String>)> = thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (p, barrier) = (&p, &barrier);
                scope.spawn(move || {
                    let (mut won, mut surprises) = (Vec::new(), Vec::new());
                    for round in 0..ROUNDS {
                        barrier.wait();
                        let claim = format!("claim/{round:04}").into_bytes();
                        let batch = Batch::new()
                            .absent(claim.clone())
                            .put(claim, t.to_string())
                            .put(format!("winner/{round:04}/{t}").into_bytes(), b("1"));
                        // Never panic inside a round: the other threads would wait at the
                        // barrier forever. Record the surprise and check it after the join.
                        match s.apply(p, &batch) {
                            Ok(Outcome::Committed) => won.push(round),
                            Ok(Outcome::PreconditionFailed { index: 0 }) => {}
                            other => surprises.push(format!("round {round}: {other:?}")),
                        }
                    }
                    (won, surprises)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let surprises: Vec<&String> = results.iter().flat_map(|(_, s)| s).collect();
    assert!(surprises.is_empty(), "unexpected answers: {surprises:?}");
    let wins: Vec<&Vec<usize>> = results.iter().map(|(w, _)| w).collect();
    let mut rounds_won: Vec<usize> = wins.iter().copied().flatten().copied().collect();
    rounds_won.sort_unstable();
    assert_eq!(
        rounds_won,
        (0..ROUNDS).collect::<Vec<_>>(),
        "each round has exactly one winner"
    );
    let winners = scan_all(s, &p, &KeyRange::prefix(b"winner/"), 64);
    assert_eq!(winners.len(), ROUNDS, "one winner record per round");
    for (t, won) in wins.iter().enumerate() {
        for round in won.iter() {
            let claim = format!("claim/{round:04}").into_bytes();
            assert_eq!(s.get(&p, &claim).unwrap(), Some(t.to_string().into_bytes()));
        }
    }
}

/// S2: a reader never observes a half-applied multi-key batch.
///
/// Writers keep every one of `x`, `y0`..`y5` at the same generation (each `y` rewritten by
/// Delete+Put) and move a marker key between `m0` and `m1` in the same batches; readers use
/// `get_many` (with a duplicate key) and one-page scans and must always see every key at one
/// generation and exactly one marker, the one that generation's parity names.
pub fn readers_never_see_half_applied_batch(open: Open) {
    const WRITERS: usize = 2;
    const PER_WRITER: usize = 150;
    const READERS: usize = 2;
    const YS: usize = 6;
    const MAX_READS: usize = 200_000;
    let f = fresh(open);
    let s = &*f.store;
    let p = part("pairs");
    let ys: Vec<Vec<u8>> = (0..YS).map(|i| format!("y{i}").into_bytes()).collect();
    let mut init = Batch::new().put(b("x"), b("0")).put(b("m0"), b("0"));
    for y in &ys {
        init = init.put(y.clone(), b("0"));
    }
    commit(s, &p, init);
    let parse = |v: &[u8]| -> u64 { std::str::from_utf8(v).unwrap().parse().unwrap() };
    let done = AtomicBool::new(false);
    let writers_left = AtomicUsize::new(WRITERS);
    // As in the compare-and-set case, failures are bounded by the other writers' commits.
    const MAX_ATTEMPTS: usize = WRITERS * PER_WRITER + PER_WRITER;
    let barrier = Barrier::new(WRITERS + READERS);
    thread::scope(|scope| {
        for _ in 0..WRITERS {
            let (p, ys, barrier, done, writers_left) = (&p, &ys, &barrier, &done, &writers_left);
            scope.spawn(move || {
                let _finish = LastOneOut {
                    left: writers_left,
                    done,
                };
                barrier.wait();
                let mut attempts = 0;
                for _ in 0..PER_WRITER {
                    loop {
                        attempts += 1;
                        assert!(
                            attempts <= MAX_ATTEMPTS,
                            "more failed attempts than commits by other writers"
                        );
                        let cur = s.get(p, b"x").unwrap().unwrap();
                        let g = parse(&cur);
                        let next = (g + 1).to_string().into_bytes();
                        let mut batch = Batch::new()
                            .equals(b("x"), cur)
                            .put(b("x"), next.clone())
                            .delete(format!("m{}", g % 2).into_bytes());
                        for y in ys {
                            batch = batch.delete(y.clone()).put(y.clone(), next.clone());
                        }
                        batch = batch.put(format!("m{}", (g + 1) % 2).into_bytes(), next);
                        if s.apply(p, &batch).unwrap().is_committed() {
                            break;
                        }
                    }
                }
            });
        }
        for r in 0..READERS {
            let (p, ys, barrier, done) = (&p, &ys, &barrier, &done);
            scope.spawn(move || {
                barrier.wait();
                let mut keys: Vec<&[u8]> = vec![b"x", b"m0", b"m1"];
                keys.extend(ys.iter().map(Vec::as_slice));
                keys.push(b"x");
                let mut reads = 0;
                while reads < 10 || (!done.load(Ordering::Acquire) && reads < MAX_READS) {
                    reads += 1;
                    if (reads + r) % 4 == 0 {
                        let page = s.scan(p, &KeyRange::all(), None, 100).unwrap();
                        assert_eq!(page.entries.len(), YS + 2, "half-applied batch: {page:?}");
                        let g = parse(&page.entries[0].1);
                        assert!(
                            page.entries.iter().all(|(_, v)| parse(v) == g),
                            "half-applied batch: {page:?}"
                        );
                        assert_eq!(page.entries[0].0, format!("m{}", g % 2).into_bytes());
                        continue;
                    }
                    let got = s.get_many(p, &keys).unwrap();
                    assert_eq!(got.len(), keys.len());
                    let x = got[0].clone().expect("x present");
                    for (k, v) in keys.iter().zip(&got).skip(3) {
                        assert_eq!(v.as_ref(), Some(&x), "half-applied batch at {k:?}: {got:?}");
                    }
                    let (here, gone) = if parse(&x).is_multiple_of(2) {
                        (1, 2)
                    } else {
                        (2, 1)
                    };
                    assert_eq!(got[here].as_ref(), Some(&x), "marker missing: {got:?}");
                    assert_eq!(got[gone], None, "two markers: {got:?}");
                }
            });
        }
    });
    let total = (WRITERS * PER_WRITER).to_string().into_bytes();
    assert_eq!(s.get(&p, b"x").unwrap(), Some(total.clone()));
    for y in &ys {
        assert_eq!(s.get(&p, y).unwrap(), Some(total.clone()));
    }
}

/// S2: partitions are independent: the same key in two partitions holds two values, guards read
/// only their own partition, and ranges never reach into another partition, even when one
/// partition's name is a prefix of the other's.
pub fn partitions_are_independent(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("p");
    let q = part("p1");
    let r = part(vec![0xffu8, 0x00]);
    commit(
        s,
        &p,
        Batch::new().put(b("k"), b("in p")).put(b("only-p"), b("1")),
    );
    commit(s, &q, Batch::new().absent(b("k")).put(b("k"), b("in p1")));
    commit(
        s,
        &r,
        Batch::new()
            .absent(b("k"))
            .absent(b("only-p"))
            .put(b("k"), b("in r")),
    );
    assert_eq!(s.get(&p, b"k").unwrap(), Some(b("in p")));
    assert_eq!(s.get(&q, b"k").unwrap(), Some(b("in p1")));
    assert_eq!(s.get(&r, b"k").unwrap(), Some(b("in r")));
    assert_eq!(s.get(&q, b"only-p").unwrap(), None);
    assert_eq!(
        s.apply(&q, &Batch::new().present(b("only-p"))).unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    commit(s, &q, Batch::new().delete_range(KeyRange::all()));
    assert_eq!(dump(s, &q), Vec::new());
    assert_eq!(
        dump(s, &p),
        vec![(b("k"), b("in p")), (b("only-p"), b("1"))]
    );
    assert_eq!(dump(s, &r), vec![(b("k"), b("in r"))]);
    commit(s, &p, Batch::new().delete(b("k")));
    assert_eq!(s.get(&r, b"k").unwrap(), Some(b("in r")));
    assert_eq!(
        s.get_many(&p, &[b"k", b"only-p"]).unwrap(),
        vec![None, Some(b("1"))]
    );
}

/// S1/S9: `list_partitions(prefix)` answers the partitions whose name starts with `prefix`, in
/// name (byte) order.
pub fn list_partitions_by_prefix(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    assert_eq!(s.list_partitions(b"").unwrap(), Vec::<Partition>::new());
    let names: Vec<Vec<u8>> = vec![
        b("users/1"),
        b("orders/2"),
        b("orders"),
        b("orders/1"),
        b("ordersx"),
        vec![0xff, b'a'],
        vec![b'o', 0x80],
        b("orders/10"),
    ];
    for n in &names {
        commit(s, &part(n), Batch::new().put(b("k"), b("v")));
    }
    let listed = |prefix: &[u8]| -> Vec<Vec<u8>> {
        s.list_partitions(prefix)
            .unwrap()
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect()
    };
    let mut all = names.clone();
    all.sort();
    assert_eq!(listed(b""), all);
    assert_eq!(
        listed(b"orders/"),
        vec![b("orders/1"), b("orders/10"), b("orders/2")]
    );
    assert_eq!(
        listed(b"orders"),
        vec![
            b("orders"),
            b("orders/1"),
            b("orders/10"),
            b("orders/2"),
            b("ordersx")
        ]
    );
    assert_eq!(listed(b"o"), {
        let mut v = vec![
            b("orders"),
            b("orders/1"),
            b("orders/10"),
            b("orders/2"),
            b("ordersx"),
            vec![b'o', 0x80],
        ];
        v.sort();
        v
    });
    assert_eq!(listed(&[0xff]), vec![vec![0xff, b'a']]);
    assert_eq!(listed(b"orders/1"), vec![b("orders/1"), b("orders/10")]);
    assert_eq!(listed(b"zzz"), Vec::<Vec<u8>>::new());
    assert_eq!(listed(b"users/1/more"), Vec::<Vec<u8>>::new());
}

// ---------------------------------------------------------------------------------------------
// S1 limits, partition names, close, E1 codes
// ---------------------------------------------------------------------------------------------

/// S1: a key of exactly `MAX_KEY_BYTES` is accepted everywhere; one byte more is refused with
/// `TooLarge` wherever a key appears (Put, Delete, every key guard, a DeleteRange bound), and the
/// refusal changes nothing.
pub fn key_size_limit(open: Open) {
    assert_eq!(MAX_KEY_BYTES, 1024);
    let f = fresh(open);
    let s = &*f.store;
    let limit = s.limits().max_key_bytes;
    assert!((64..=MAX_KEY_BYTES).contains(&limit), "key limit {limit}");
    let p = part("keys");
    let max = vec![b'a'; limit];
    let over = vec![b'a'; limit + 1];
    commit(
        s,
        &p,
        Batch::new().absent(max.clone()).put(max.clone(), b("v")),
    );
    commit(
        s,
        &p,
        Batch::new()
            .present(max.clone())
            .equals(max.clone(), b("v"))
            .put(b("small"), b("1")),
    );
    assert_eq!(s.get(&p, &max).unwrap(), Some(b("v")));
    assert_eq!(s.get_many(&p, &[&max]).unwrap(), vec![Some(b("v"))]);
    let page = s.scan(&p, &KeyRange::prefix(&max), None, 1).unwrap();
    assert_eq!(page.entries, vec![(max.clone(), b("v"))]);
    assert_eq!(page.next, None);
    let page = s
        .scan(
            &p,
            &KeyRange::all(),
            Some(&Cursor::after_key(max.clone())),
            5,
        )
        .unwrap();
    assert_eq!(page.entries, vec![(b("small"), b("1"))]);

    let before = snapshot(s);
    let refused = [
        Batch::new().put(over.clone(), b("v")),
        Batch::new().put(b("ok"), b("v")).put(over.clone(), b("v")),
        Batch::new().put(b("ok"), b("v")).delete(over.clone()),
        Batch::new()
            .equals(over.clone(), b("v"))
            .put(b("ok"), b("v")),
        Batch::new().absent(over.clone()).put(b("ok"), b("v")),
        Batch::new().present(over.clone()).put(b("ok"), b("v")),
        Batch::new()
            .put(b("ok"), b("v"))
            .delete_range(KeyRange::between(b("a"), over.clone())),
        Batch::new()
            .put(b("ok"), b("v"))
            .delete_range(KeyRange::from(over.clone())),
        // The refusal comes before the guards are looked at.
        Batch::new().absent(b("small")).put(over.clone(), b("v")),
    ];
    for batch in refused {
        let result = s.apply(&p, &batch);
        assert_eq!(
            result.as_ref().map_err(Error::code).err(),
            Some(2),
            "{result:?}"
        );
        assert_too_large(result, "key over the limit");
        assert_eq!(snapshot(s), before);
    }
    commit(s, &p, Batch::new().delete(max.clone()));
    assert_eq!(s.get(&p, &max).unwrap(), None);
}

/// S1/E1: an empty key is refused with `InvalidArgument` wherever a key appears, and the refusal
/// changes nothing. (An empty *value* is fine, and so is an empty range bound.)
/// S1/E1: a read with an empty or oversize key is bad input: a clear error, not an answer.
pub fn reads_with_invalid_keys_are_refused(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("read-keys");
    put_all(s, &p, &[(b("a"), b("1"))]);
    let long = vec![b'k'; s.limits().max_key_bytes + 1];
    assert!(matches!(s.get(&p, b""), Err(Error::InvalidArgument(_))));
    assert!(matches!(s.get(&p, &long), Err(Error::TooLarge { .. })));
    let keys: [&[u8]; 2] = [b"a", b""];
    assert!(matches!(
        s.get_many(&p, &keys),
        Err(Error::InvalidArgument(_))
    ));
    let keys: [&[u8]; 2] = [b"a", &long];
    assert!(matches!(s.get_many(&p, &keys), Err(Error::TooLarge { .. })));
    // The same holds on a partition that does not exist.
    let missing = part("never-written");
    assert!(matches!(
        s.get(&missing, b""),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(s.get(&p, b"a").unwrap(), Some(b("1")));
}

pub fn empty_key_is_refused(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("empty-key");
    put_all(s, &p, &[(b("a"), b("1"))]);
    let before = snapshot(s);
    let refused = [
        Batch::new().put(Vec::new(), b("v")),
        Batch::new().put(b("b"), b("v")).put(Vec::new(), b("v")),
        Batch::new().put(b("b"), b("v")).delete(Vec::new()),
        Batch::new().equals(Vec::new(), b("v")).put(b("b"), b("v")),
        Batch::new().absent(Vec::new()).put(b("b"), b("v")),
        Batch::new().present(Vec::new()).put(b("b"), b("v")),
    ];
    for batch in refused {
        let result = s.apply(&p, &batch);
        assert_eq!(
            result.as_ref().map_err(Error::code).err(),
            Some(1),
            "{result:?}"
        );
        assert_invalid(result, "empty key");
        assert_eq!(snapshot(s), before);
    }
    commit(
        s,
        &p,
        Batch::new()
            .put(b("e"), Vec::new())
            .delete_range(KeyRange::between(Vec::new(), b("a\0"))),
    );
    assert_eq!(dump(s, &p), vec![(b("e"), Vec::new())]);
}

/// S1/S11: a value of exactly the store's value limit is accepted and read back whole; one
/// byte more is refused with `TooLarge` (in a Put or an Equals guard) and changes nothing.
pub fn value_size_limit(open: Open) {
    assert_eq!(MAX_VALUE_BYTES, 16 << 20);
    let f = fresh(open);
    let s = &*f.store;
    let limits = s.limits();
    let limit = limits.max_value_bytes;
    assert!(
        (1024..=MAX_VALUE_BYTES).contains(&limit),
        "value limit {limit}"
    );
    assert!(
        limit + 3 <= limits.max_batch_bytes,
        "a largest value fits in a batch"
    );
    let p = part("values");
    let mut max = vec![0x5au8; limit];
    max[0] = 1;
    max[limit - 1] = 2;
    commit(s, &p, Batch::new().put(b("big"), max.clone()));
    let got = s.get(&p, b"big").unwrap().expect("big value present");
    assert!(got == max, "a value of the limit read back changed");
    drop(got);
    if 2 * limit + 3 + 6 <= limits.max_batch_bytes {
        commit(
            s,
            &p,
            Batch::new()
                .equals(b("big"), max.clone())
                .put(b("small"), b("1")),
        );
    } else {
        commit(
            s,
            &p,
            Batch::new()
                .equals(b("big"), max.clone())
                .delete(b("small")),
        );
    }
    let before = snapshot(s);
    let mut over = max.clone();
    over.push(3);
    let refused = [
        Batch::new().put(b("big"), over.clone()),
        Batch::new().put(b("x"), b("1")).put(b("y"), over.clone()),
        Batch::new()
            .equals(b("big"), over.clone())
            .put(b("x"), b("1")),
    ];
    for batch in refused {
        let result = s.apply(&p, &batch);
        assert_eq!(result.as_ref().map_err(Error::code).err(), Some(2));
        assert_too_large(result, "value over the limit");
        assert!(snapshot(s) == before, "a refused value changed something");
    }
}

/// Puts whose keys (3 bytes each) and values add up to exactly `total` bytes, no value above
/// `max_value`.
fn batch_of_bytes(total: usize, max_value: usize) -> Batch {
    let n = total.div_ceil(max_value + 3);
    assert!(n < 100);
    let mut batch = Batch::new();
    let mut left = total;
    for i in 0..n {
        let share = left.div_ceil(n - i);
        left -= share;
        batch = batch.put(format!("k{i:02}").into_bytes(), vec![9u8; share - 3]);
    }
    batch
}

/// S1/S11: a batch larger than the store's batch limit (keys plus values) is refused with
/// `TooLarge` even though every value is within its own limit, and changes nothing; a batch of
/// exactly the limit commits.
pub fn batch_size_limit(open: Open) {
    assert_eq!(MAX_BATCH_BYTES, 64 << 20);
    let f = fresh(open);
    let s = &*f.store;
    let limits = s.limits();
    assert!(limits.max_batch_bytes <= MAX_BATCH_BYTES);
    let p = part("batches");
    put_all(s, &p, &[(b("a"), b("1"))]);
    let before = snapshot(s);
    // Exactly the limit, plus one more byte: a 1-byte key with an empty value.
    let batch = batch_of_bytes(limits.max_batch_bytes, limits.max_value_bytes).put(b("z"), b(""));
    let result = s.apply(&p, &batch);
    assert_eq!(result.as_ref().map_err(Error::code).err(), Some(2));
    assert_too_large(result, "batch over the limit");
    drop(batch);
    assert_eq!(snapshot(s), before);

    // Exactly at the limit is accepted.
    let batch = batch_of_bytes(limits.max_batch_bytes, limits.max_value_bytes);
    let last = batch.ops().len() - 1;
    commit(s, &p, batch);
    let got = s
        .get(&p, format!("k{last:02}").as_bytes())
        .unwrap()
        .expect("last key present");
    assert!(!got.is_empty());
}

/// S11: a store that limits how many operations (and preconditions) a batch carries accepts a
/// batch of exactly that many, refuses one more with `TooLarge` and changes nothing; never
/// splits. A batch at the limit whose puts fall inside its own range delete commits whole.
pub fn batch_count_limits(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let limits = s.limits();
    if limits.max_batch_ops >= 10_000 {
        // No count limit worth probing (the file-backed and in-memory stores have none).
        assert_eq!(limits.max_batch_ops, StoreLimits::DEFAULT.max_batch_ops);
        return;
    }
    let max = limits.max_batch_ops;
    assert!(max >= 8, "a count limit of {max} is too small to be useful");
    let p = part("counts");
    let key = |i: usize| format!("c{i:04}").into_bytes();
    let puts = |n: usize| (0..n).fold(Batch::new(), |acc, i| acc.put(key(i), b("1")));
    let guards = |n: usize| (0..n).fold(Batch::new(), |acc, i| acc.present(key(i)));
    commit(s, &p, puts(max));
    let before = snapshot(s);
    for batch in [puts(max + 1), guards(max + 1).put(b("x"), b("1"))] {
        let result = s.apply(&p, &batch);
        assert_eq!(result.as_ref().map_err(Error::code).err(), Some(2));
        assert_too_large(result, "too many operations or preconditions");
        assert_eq!(snapshot(s), before, "a refused batch changed something");
    }
    // Exactly the limit of each, with every put inside the batch's own range delete.
    let batch = (1..max).fold(guards(max).delete_range(KeyRange::all()), |acc, i| {
        acc.put(key(i), b("2"))
    });
    commit(s, &p, batch);
    let mut expected: Rows = (1..max).map(|i| (key(i), b("2"))).collect();
    assert_eq!(dump(s, &p), expected);
    // Deletes and puts of the same keys in one batch: the last one wins.
    let batch = (0..max / 2).fold(Batch::new(), |acc, i| {
        acc.put(key(i), b("3")).delete(key(i + 1))
    });
    commit(s, &p, batch);
    // Key i < max/2 is put after any delete of it; key max/2 is deleted last.
    expected = (0..max)
        .filter_map(|i| match i {
            i if i < max / 2 => Some((key(i), b("3"))),
            i if i == max / 2 => None,
            i => Some((key(i), b("2"))),
        })
        .collect();
    assert_eq!(dump(s, &p), expected);
}

/// S11: a store that does not evaluate `NotAfter` on its own clock says so and refuses every
/// batch that carries one, whatever the deadline, wherever it stands among the guards, on an
/// existing or a new partition, with `InvalidArgument`; nothing changes.
pub fn deadlines_refused_when_not_evaluated(open: Open) {
    let (f, p) = seeded(open, "no-deadlines");
    let s = &*f.store;
    if s.evaluates_deadlines() {
        // See `precondition_not_after`.
        return;
    }
    let now = f.clock.now_ms();
    for deadline in [0, now - 1, now, now + 1, u64::MAX] {
        expect_deadline_refused(s, &p, Batch::new().not_after(deadline).put(b("a"), b("1")));
        expect_deadline_refused(
            s,
            &p,
            Batch::new()
                .present(b("k"))
                .not_after(deadline)
                .delete(b("k")),
        );
        // Refused even when an earlier guard fails: the refusal is about the batch's shape.
        expect_deadline_refused(s, &p, Batch::new().absent(b("k")).not_after(deadline));
        expect_deadline_refused(
            s,
            &part("no-deadlines-new"),
            Batch::new().not_after(deadline),
        );
    }
    assert_eq!(
        s.list_partitions(b"no-deadlines-new").unwrap(),
        Vec::<Partition>::new()
    );
    // The same batches without the deadline commit.
    commit(s, &p, Batch::new().present(b("k")).delete(b("k")));
    assert_eq!(s.get(&p, b"k").unwrap(), None);
}

/// Partition names are 1 to 255 bytes; `Partition::new` refuses others with `InvalidArgument`.
pub fn invalid_partition_names_are_refused(open: Open) {
    assert_eq!(MAX_PARTITION_NAME_BYTES, 255);
    assert_invalid(Partition::new(""), "empty partition name");
    assert_invalid(Partition::new(vec![b'p'; 256]), "256-byte partition name");
    assert_invalid(Partition::new(vec![b'p'; 4096]), "long partition name");
    assert_eq!(Partition::new("").unwrap_err().code(), 1);
    // The extremes that are allowed work as partitions.
    let f = fresh(open);
    let s = &*f.store;
    let names = [vec![b'p'; 255], vec![0x00], vec![0xff; 3], b("/")];
    for n in &names {
        let p = Partition::new(n).expect("valid name");
        commit(s, &p, Batch::new().put(b("k"), n.clone()));
    }
    for n in &names {
        assert_eq!(s.get(&part(n), b"k").unwrap(), Some(n.clone()));
    }
    assert_eq!(s.list_partitions(b"").unwrap().len(), names.len());
}

/// S1/E1: after `close()`, every call answers `Error::Closed` (code 8); closing twice is
/// harmless.
pub fn closed_store_answers_closed(open: Open) {
    let f = fresh(open);
    let s = &*f.store;
    let p = part("closing");
    put_all(s, &p, &[(b("a"), b("1"))]);
    s.close().expect("close");
    let closed = |r: portcullis::Result<()>, what: &str| match r {
        Err(Error::Closed) => {}
        other => panic!("{what} after close: expected Error::Closed, got {other:?}"),
    };
    closed(s.get(&p, b"a").map(drop), "get");
    closed(s.get_many(&p, &[b"a"]).map(drop), "get_many");
    closed(s.scan(&p, &KeyRange::all(), None, 10).map(drop), "scan");
    closed(
        s.scan_visit(&p, &KeyRange::all(), None, 10, &mut |_, _| Ok(()))
            .map(drop),
        "scan_visit",
    );
    closed(
        s.apply(&p, &Batch::new().put(b("b"), b("2"))).map(drop),
        "apply",
    );
    closed(s.apply(&p, &Batch::new()).map(drop), "empty apply");
    closed(s.list_partitions(b"").map(drop), "list_partitions");
    assert_code(s.get(&p, b"a"), 8, "code of Closed");
    s.close().expect("closing twice is harmless");
    closed(s.get(&p, b"a").map(drop), "get after second close");
}

/// E1: every error's numeric code is stable; the codes the store answers match.
pub fn error_codes_are_stable(open: Open) {
    let all: Vec<(Error, u32)> = vec![
        (Error::InvalidArgument("x".into()), 1),
        (
            Error::TooLarge {
                what: "key",
                size: 2,
                limit: 1,
            },
            2,
        ),
        (Error::Locked { path: "d".into() }, 3),
        (
            Error::UnsupportedVersion {
                file: "f".into(),
                found: 9,
                supported: 1,
            },
            4,
        ),
        (
            Error::Corrupt {
                what: "p".into(),
                detail: "d".into(),
            },
            5,
        ),
        (Error::SyncFailed("e".into()), 6),
        (
            Error::Io {
                context: "c".into(),
                source: std::io::Error::other("e"),
            },
            7,
        ),
        (Error::Closed, 8),
        (
            Error::Fenced {
                grant: 1,
                current: 2,
            },
            9,
        ),
        (
            Error::Unavailable {
                reason: "r".into(),
                retry_after_ms: 1,
            },
            10,
        ),
        (
            Error::Contained {
                entity: "e".into(),
                reason: "r".into(),
            },
            11,
        ),
        (Error::UnknownEntity("e".into()), 12),
        (
            Error::OutcomeUnknown {
                partition: "p".into(),
                detail: "d".into(),
            },
            14,
        ),
        (
            Error::Exhausted {
                what: "journal segment numbers".into(),
                detail: "d".into(),
            },
            16,
        ),
    ];
    for (e, code) in &all {
        assert_eq!(e.code(), *code, "{e:?}");
        assert!(!e.to_string().is_empty(), "{e:?} has a message");
    }
    // The errors a store answers carry those codes.
    let f = fresh(open);
    let s = &*f.store;
    let p = part("codes");
    assert_code(s.scan(&p, &KeyRange::all(), None, 0), 1, "limit 0");
    assert_code(
        s.apply(&p, &Batch::new().put(Vec::new(), b("v"))),
        1,
        "empty key",
    );
    assert_code(
        s.apply(&p, &Batch::new().put(vec![1; MAX_KEY_BYTES + 1], b("v"))),
        2,
        "long key",
    );
    s.close().unwrap();
    assert_code(s.get(&p, b"k"), 8, "closed");
}
