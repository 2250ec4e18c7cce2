//! The randomized model test (SPEC S1, S2): random sequences of guarded batches, clock moves,
//! point reads and paged scans over a small key space, checked step by step against a
//! `BTreeMap` model. Backend-generic like the rest of the suite; see [`store_model_tests!`].

use std::collections::BTreeMap;
use std::ops::Bound;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use portcullis::store::{Batch, Cursor, KeyRange, Op, Outcome, Partition, Precondition, Store};
use portcullis::{Clock, Error, ManualClock};

use super::{Open, START_MS};

/// Adds the model test for the backend opened by `$open`: 256 cases by default (or
/// `PROPTEST_CASES`), and an `#[ignore]`d long run of 4096 cases; or `$cases` and `$long_cases`
/// when given (a slower backend runs fewer).
#[macro_export]
macro_rules! store_model_tests {
    ($open:expr) => {
        $crate::store_model_tests!($open, $crate::conformance::model::default_cases(), 4096);
    };
    ($open:expr, $cases:expr, $long_cases:expr) => {
        #[test]
        fn model_random_batches_and_scans() {
            $crate::conformance::model::run_model($open, $cases)
        }

        #[test]
        #[ignore = "long run; use --ignored"]
        fn model_random_batches_and_scans_long() {
            $crate::conformance::model::run_model($open, $long_cases)
        }
    };
}

/// 256, or `PROPTEST_CASES` when set.
pub fn default_cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The key space: index 0 is the (invalid) empty key; the rest probe prefixes and high bytes.
const KEYS: &[&[u8]] = &[
    b"",
    b"a",
    b"a\x00",
    b"ab",
    b"ab\xff",
    b"b",
    b"\x7f",
    b"\x80",
    b"\xff",
    b"\xff\xff",
];
const VALUES: &[&[u8]] = &[b"", b"1", b"2", b"xyz"];
const PARTITIONS: &[&str] = &["m", "m0"];

#[derive(Clone, Debug)]
enum G {
    Equals(usize, usize),
    Absent(usize),
    Present(usize),
    /// A deadline relative to the clock when the batch is applied.
    NotAfter(i64),
}

#[derive(Clone, Debug)]
enum O {
    Put(usize, usize),
    Delete(usize),
    DeleteRange(R),
}

/// A range: each bound is (kind 0 included / 1 excluded / 2 unbounded, key index).
#[derive(Clone, Debug)]
struct R((u8, usize), (u8, usize));

impl R {
    fn to_range(&self) -> KeyRange {
        let bound = |(kind, k): (u8, usize)| match kind {
            0 => Bound::Included(KEYS[k].to_vec()),
            1 => Bound::Excluded(KEYS[k].to_vec()),
            _ => Bound::Unbounded,
        };
        KeyRange {
            start: bound(self.0),
            end: bound(self.1),
        }
    }
}

#[derive(Clone, Debug)]
enum Action {
    Apply {
        part: usize,
        guards: Vec<G>,
        ops: Vec<O>,
    },
    Advance(u64),
    Get(usize, usize),
    GetMany(usize, Vec<usize>),
    /// A whole paged scan with no writes in between.
    Scan(usize, R, usize),
    /// One page of a scan left open across the following actions (writes included); starts a
    /// new scan if none is open. `bool`: resume from a cursor rebuilt from its key.
    ScanStep(usize, R, usize, bool),
    /// A scan that starts from an arbitrary persisted cursor.
    ScanFrom(usize, R, usize, usize),
}

fn key_index() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 30 => 1..KEYS.len()]
}

fn bound_key_index() -> impl Strategy<Value = usize> {
    0..KEYS.len()
}

fn range() -> impl Strategy<Value = R> {
    ((0u8..3, bound_key_index()), (0u8..3, bound_key_index())).prop_map(|(s, e)| R(s, e))
}

fn guard() -> impl Strategy<Value = G> {
    prop_oneof![
        3 => (key_index(), 0..VALUES.len()).prop_map(|(k, v)| G::Equals(k, v)),
        2 => key_index().prop_map(G::Absent),
        2 => key_index().prop_map(G::Present),
        1 => (-2i64..=2).prop_map(G::NotAfter),
    ]
}

fn op() -> impl Strategy<Value = O> {
    prop_oneof![
        5 => (key_index(), 0..VALUES.len()).prop_map(|(k, v)| O::Put(k, v)),
        3 => key_index().prop_map(O::Delete),
        1 => range().prop_map(O::DeleteRange),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    let part = 0..PARTITIONS.len();
    prop_oneof![
        10 => (part.clone(), vec(guard(), 0..4), vec(op(), 0..6))
            .prop_map(|(part, guards, ops)| Action::Apply { part, guards, ops }),
        1 => (0u64..3).prop_map(Action::Advance),
        2 => (part.clone(), key_index()).prop_map(|(p, k)| Action::Get(p, k)),
        2 => (part.clone(), vec(key_index(), 0..6)).prop_map(|(p, ks)| Action::GetMany(p, ks)),
        2 => (part.clone(), range(), 1usize..6).prop_map(|(p, r, l)| Action::Scan(p, r, l)),
        3 => (part.clone(), range(), 1usize..4, any::<bool>())
            .prop_map(|(p, r, l, persist)| Action::ScanStep(p, r, l, persist)),
        1 => (part, range(), 1usize..4, 1..KEYS.len())
            .prop_map(|(p, r, l, k)| Action::ScanFrom(p, r, l, k)),
    ]
}

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

type Model = BTreeMap<Vec<u8>, Vec<u8>>;
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

struct OpenScan {
    part: usize,
    range: KeyRange,
    limit: usize,
    cursor: Cursor,
}

struct Run<'a> {
    store: &'a dyn Store,
    clock: &'a ManualClock,
    parts: Vec<Partition>,
    models: Vec<Model>,
    open_scan: Option<OpenScan>,
}

impl Run<'_> {
    /// The page the model expects: entries of `range` strictly after `after`, at most `limit`,
    /// and the cursor key (`None` when nothing follows).
    fn expected_page(
        &self,
        part: usize,
        range: &KeyRange,
        after: Option<&[u8]>,
        limit: usize,
    ) -> (Entries, Option<Vec<u8>>) {
        let mut matching = self.models[part]
            .iter()
            .filter(|(k, _)| in_range(range, k) && after.is_none_or(|a| k.as_slice() > a));
        let entries: Vec<_> = matching
            .by_ref()
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let next = match (entries.last(), matching.next()) {
            (Some((k, _)), Some(_)) => Some(k.clone()),
            _ => None,
        };
        (entries, next)
    }

    /// Scans one page and checks it against the model; returns the store's cursor.
    fn check_page(
        &self,
        part: usize,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Option<Cursor>, TestCaseError> {
        let page = self
            .store
            .scan(&self.parts[part], range, cursor, limit)
            .map_err(|e| TestCaseError::fail(format!("scan failed: {e}")))?;
        let (entries, next) = self.expected_page(part, range, cursor.map(Cursor::last_key), limit);
        prop_assert_eq!(
            &page.entries,
            &entries,
            "page of {:?} after {:?}",
            range,
            cursor
        );
        prop_assert_eq!(
            page.next.as_ref().map(|c| c.last_key().to_vec()),
            next,
            "cursor of {:?} after {:?}",
            range,
            cursor
        );
        Ok(page.next)
    }

    fn apply(&mut self, part: usize, guards: &[G], ops: &[O]) -> Result<(), TestCaseError> {
        let now = self.clock.now_ms();
        let mut batch = Batch::new();
        for g in guards {
            batch = batch.guard(match g {
                G::Equals(k, v) => Precondition::Equals(KEYS[*k].to_vec(), VALUES[*v].to_vec()),
                G::Absent(k) => Precondition::Absent(KEYS[*k].to_vec()),
                G::Present(k) => Precondition::Present(KEYS[*k].to_vec()),
                G::NotAfter(d) => Precondition::NotAfter(now.saturating_add_signed(*d)),
            });
        }
        for o in ops {
            batch = batch.op(match o {
                O::Put(k, v) => Op::Put(KEYS[*k].to_vec(), VALUES[*v].to_vec()),
                O::Delete(k) => Op::Delete(KEYS[*k].to_vec()),
                O::DeleteRange(r) => Op::DeleteRange(r.to_range()),
            });
        }
        let got = self.store.apply(&self.parts[part], &batch);

        // The model: an empty key anywhere a key is required refuses the whole batch.
        let empty_key = guards
            .iter()
            .any(|g| matches!(g, G::Equals(0, _) | G::Absent(0) | G::Present(0)))
            || ops.iter().any(|o| matches!(o, O::Put(0, _) | O::Delete(0)));
        if empty_key {
            prop_assert!(
                matches!(got, Err(Error::InvalidArgument(_))),
                "expected InvalidArgument for {:?}, got {:?}",
                batch,
                got
            );
            return Ok(());
        }
        // SPEC S11: a store without server-side deadlines refuses any batch carrying one.
        let deadline = guards.iter().any(|g| matches!(g, G::NotAfter(_)));
        if deadline && !self.store.evaluates_deadlines() {
            prop_assert!(
                matches!(got, Err(Error::InvalidArgument(_))),
                "expected InvalidArgument for a deadline in {:?}, got {:?}",
                batch,
                got
            );
            return Ok(());
        }
        let got = got.map_err(|e| TestCaseError::fail(format!("apply failed: {e}")))?;
        let model = &mut self.models[part];
        let mut expected = Outcome::Committed;
        for (index, g) in batch.guards().iter().enumerate() {
            let holds = match g {
                Precondition::Equals(k, v) => model.get(k) == Some(v),
                Precondition::Absent(k) => !model.contains_key(k),
                Precondition::Present(k) => model.contains_key(k),
                Precondition::NotAfter(d) => {
                    if now > *d {
                        expected = Outcome::DeadlinePassed { now_ms: now };
                        break;
                    }
                    true
                }
            };
            if !holds {
                expected = Outcome::PreconditionFailed { index };
                break;
            }
        }
        prop_assert_eq!(got, expected, "outcome of {:?}", batch);
        if expected == Outcome::Committed {
            for op in batch.ops() {
                match op {
                    Op::Put(k, v) => {
                        model.insert(k.clone(), v.clone());
                    }
                    Op::Delete(k) => {
                        model.remove(k);
                    }
                    Op::DeleteRange(r) => model.retain(|k, _| !in_range(r, k)),
                }
            }
        }
        // The partition as a whole matches the model after every batch.
        let all = KeyRange::all();
        let mut cursor = None;
        for _ in 0..=KEYS.len() {
            cursor = self.check_page(part, &all, cursor.as_ref(), 3)?;
            if cursor.is_none() {
                return Ok(());
            }
        }
        Err(TestCaseError::fail("full scan did not end"))
    }

    fn step(&mut self, action: &Action) -> Result<(), TestCaseError> {
        match action {
            Action::Apply { part, guards, ops } => self.apply(*part, guards, ops)?,
            Action::Advance(ms) => self.clock.advance(*ms),
            Action::Get(part, k) => {
                let got = self.store.get(&self.parts[*part], KEYS[*k]);
                // The model: reading the empty key is refused as bad input (S1).
                if KEYS[*k].is_empty() {
                    prop_assert!(matches!(got, Err(Error::InvalidArgument(_))), "{:?}", got);
                    return Ok(());
                }
                let got = got.map_err(|e| TestCaseError::fail(format!("get: {e}")))?;
                prop_assert_eq!(got.as_ref(), self.models[*part].get(KEYS[*k]));
            }
            Action::GetMany(part, ks) => {
                let keys: Vec<&[u8]> = ks.iter().map(|k| KEYS[*k]).collect();
                let got = self.store.get_many(&self.parts[*part], &keys);
                if keys.iter().any(|k| k.is_empty()) {
                    prop_assert!(matches!(got, Err(Error::InvalidArgument(_))), "{:?}", got);
                    return Ok(());
                }
                let got = got.map_err(|e| TestCaseError::fail(format!("get_many: {e}")))?;
                let expected: Vec<Option<Vec<u8>>> = keys
                    .iter()
                    .map(|k| self.models[*part].get(*k).cloned())
                    .collect();
                prop_assert_eq!(got, expected, "get_many {:?}", keys);
            }
            Action::Scan(part, r, limit) => {
                let range = r.to_range();
                let mut cursor = None;
                let mut pages = 0;
                loop {
                    cursor = self.check_page(*part, &range, cursor.as_ref(), *limit)?;
                    pages += 1;
                    prop_assert!(pages <= KEYS.len() + 1, "scan did not end");
                    if cursor.is_none() {
                        break;
                    }
                }
            }
            Action::ScanStep(part, r, limit, persist) => {
                let (part, range, limit, cursor) = match self.open_scan.take() {
                    Some(open) => {
                        let cursor = if *persist {
                            Cursor::after_key(open.cursor.last_key().to_vec())
                        } else {
                            open.cursor
                        };
                        (open.part, open.range, open.limit, Some(cursor))
                    }
                    None => (*part, r.to_range(), *limit, None),
                };
                if let Some(next) = self.check_page(part, &range, cursor.as_ref(), limit)? {
                    self.open_scan = Some(OpenScan {
                        part,
                        range,
                        limit,
                        cursor: next,
                    });
                }
            }
            Action::ScanFrom(part, r, limit, k) => {
                let range = r.to_range();
                let cursor = Cursor::after_key(KEYS[*k].to_vec());
                self.check_page(*part, &range, Some(&cursor), *limit)?;
            }
        }
        Ok(())
    }

    fn finish(&self) -> Result<(), TestCaseError> {
        for (i, p) in self.parts.iter().enumerate() {
            let mut all = Vec::new();
            let mut cursor: Option<Cursor> = None;
            loop {
                let page = self
                    .store
                    .scan(p, &KeyRange::all(), cursor.as_ref(), 4)
                    .map_err(|e| TestCaseError::fail(format!("scan: {e}")))?;
                all.extend(page.entries);
                match page.next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
                prop_assert!(all.len() <= KEYS.len(), "scan did not end");
            }
            let expected: Vec<_> = self.models[i]
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            prop_assert_eq!(all, expected, "final state of {:?}", p);
        }
        // Every partition holding rows is listed, and nothing this run never named.
        let listed = self
            .store
            .list_partitions(b"m")
            .map_err(|e| TestCaseError::fail(format!("list_partitions: {e}")))?;
        for (i, p) in self.parts.iter().enumerate() {
            if !self.models[i].is_empty() {
                prop_assert!(listed.contains(p), "{:?} not listed in {:?}", p, listed);
            }
        }
        for p in &listed {
            prop_assert!(self.parts.contains(p), "unknown partition {:?}", p);
        }
        let mut sorted = listed.clone();
        sorted.sort();
        prop_assert_eq!(listed, sorted, "list_partitions in name order");
        Ok(())
    }
}

fn run_actions(open: Open, actions: &[Action]) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(START_MS);
    let fixture = open(clock.clone());
    let mut run = Run {
        store: &*fixture.store,
        clock: &clock,
        parts: PARTITIONS
            .iter()
            .map(|n| Partition::new(n).expect("partition name"))
            .collect(),
        models: vec![Model::new(); PARTITIONS.len()],
        open_scan: None,
    };
    for action in actions {
        run.step(action)?;
    }
    run.finish()
}

/// Runs `cases` random action sequences against fresh stores from `open`.
pub fn run_model(open: Open, cases: u32) {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&vec(action(), 1..48), |actions| run_actions(open, &actions)) {
        panic!("store model test failed: {e}");
    }
}
