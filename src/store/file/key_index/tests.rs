use std::collections::BTreeMap;
use std::ops::Bound;

use proptest::prelude::*;

use super::*;

fn loc(n: u32) -> ValueLoc {
    ValueLoc {
        at: n as u64 + 1,
        len: n,
        crc: n ^ 0x5a5a,
    }
}

/// Checks the layout's invariants and that `index` holds exactly what `model` holds.
fn check(index: &KeyIndex, model: &BTreeMap<Vec<u8>, ValueLoc>) {
    let n = index.ends.len();
    assert_eq!(index.locs.len(), n);
    for i in 1..n {
        assert!(index.key(i - 1) < index.key(i), "run out of order at {i}");
    }
    let end = index.ends.last().map_or(0, |e| e & !DEAD) as usize;
    assert_eq!(index.arena.len(), end, "arena holds exactly the run's keys");
    assert!(index.arena.len() <= index.arena_max as usize);
    assert_eq!(index.dead, (0..n).filter(|&i| index.is_dead(i)).count());
    assert!(
        n == 0 || !index.is_dead(n - 1),
        "dead keys at the end are trimmed"
    );
    for k in index.side.keys() {
        assert!(index.find(k).is_err(), "side map and run are disjoint");
    }
    let waiting = index.side.len().saturating_sub(index.side_kept) + index.dead;
    assert!(
        waiting <= MERGE_MIN.max((n + index.side_kept) / 4),
        "merge overdue"
    );
    assert_eq!(index.len(), model.len());
    assert_eq!(index.is_empty(), model.is_empty());
    let got: Vec<(Vec<u8>, ValueLoc)> = index.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
    let want: Vec<(Vec<u8>, ValueLoc)> = model.iter().map(|(k, v)| (k.clone(), *v)).collect();
    assert_eq!(got, want);
    assert!(index.values().eq(model.values()));
    assert_eq!(index.iter().len(), model.len());
}

fn in_bounds(k: &[u8], (start, end): (Bound<&[u8]>, Bound<&[u8]>)) -> bool {
    let after = match start {
        Bound::Included(s) => k >= s,
        Bound::Excluded(s) => k > s,
        Bound::Unbounded => true,
    };
    let before = match end {
        Bound::Included(e) => k <= e,
        Bound::Excluded(e) => k < e,
        Bound::Unbounded => true,
    };
    after && before
}

#[derive(Clone, Debug)]
enum Op {
    Get(Vec<u8>),
    Insert(Vec<u8>, u32),
    Remove(Vec<u8>),
    /// Keys past the greatest one, as a log appends them.
    Append(u8, u32),
    RemoveRange(Bound<Vec<u8>>, Bound<Vec<u8>>),
    Range(Bound<Vec<u8>>, Bound<Vec<u8>>),
    /// A scan of pages of `limit` entries, each resuming after the last key of the one before.
    Pages(usize),
    RemoveAll,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Short keys over a small alphabet: collisions, and keys before, between and after
        // others; the empty key among them.
        6 => proptest::collection::vec(0u8..4, 0..4),
        // Long keys, up to the store's limit.
        1 => (0u8..4, 100usize..1025).prop_map(|(b, n)| vec![b; n]),
        2 => any::<u16>().prop_map(|n| n.to_be_bytes().to_vec()),
    ]
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        key().prop_map(Bound::Included),
        key().prop_map(Bound::Excluded),
        Just(Bound::Unbounded),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => key().prop_map(Op::Get),
        6 => (key(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
        3 => key().prop_map(Op::Remove),
        3 => (1u8..40, any::<u32>()).prop_map(|(n, v)| Op::Append(n, v)),
        1 => (bound(), bound()).prop_map(|(s, e)| Op::RemoveRange(s, e)),
        2 => (bound(), bound()).prop_map(|(s, e)| Op::Range(s, e)),
        1 => (1usize..10).prop_map(Op::Pages),
        1 => Just(Op::RemoveAll),
    ]
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    b.as_ref().map(|k| k.as_slice())
}

fn run(mut index: KeyIndex, ops: Vec<Op>) {
    let mut model: BTreeMap<Vec<u8>, ValueLoc> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Get(k) => {
                assert_eq!(index.get(&k), model.get(&k));
                assert_eq!(index.get_mut(&k).copied(), model.get(&k).copied());
            }
            Op::Insert(k, v) => assert_eq!(index.insert(&k, loc(v)), model.insert(k, loc(v))),
            Op::Remove(k) => assert_eq!(index.remove(&k), model.remove(&k)),
            Op::Append(n, v) => {
                let last = model.keys().next_back().cloned().unwrap_or_default();
                for i in 0..n {
                    let mut k = last.clone();
                    k.extend_from_slice(&[i, 0xff]);
                    assert_eq!(index.insert(&k, loc(v)), model.insert(k, loc(v)));
                }
            }
            Op::RemoveRange(s, e) => {
                let bounds = (as_ref(&s), as_ref(&e));
                let doomed: Vec<Vec<u8>> = model
                    .keys()
                    .filter(|k| in_bounds(k, bounds))
                    .cloned()
                    .collect();
                let mut want: Vec<(Vec<u8>, ValueLoc)> = doomed
                    .into_iter()
                    .map(|k| {
                        let v = model.remove(&k).unwrap();
                        (k, v)
                    })
                    .collect();
                let mut got = Vec::new();
                index.remove_range(bounds, |k, v| got.push((k.to_vec(), v)));
                got.sort_by(|a, b| a.0.cmp(&b.0));
                want.sort_by(|a, b| a.0.cmp(&b.0));
                assert_eq!(got, want);
            }
            Op::Range(s, e) => {
                let bounds = (as_ref(&s), as_ref(&e));
                let got: Vec<(&[u8], &ValueLoc)> = index.range::<[u8], _>(bounds).collect();
                let want: Vec<(&[u8], &ValueLoc)> = model
                    .iter()
                    .filter(|(k, _)| in_bounds(k, bounds))
                    .map(|(k, v)| (k.as_slice(), v))
                    .collect();
                assert_eq!(got, want);
            }
            Op::Pages(limit) => {
                let mut from: Bound<Vec<u8>> = Bound::Unbounded;
                let mut got = Vec::new();
                loop {
                    let mut page = index.range::<[u8], _>((as_ref(&from), Bound::Unbounded));
                    let taken: Vec<(Vec<u8>, ValueLoc)> = page
                        .by_ref()
                        .take(limit)
                        .map(|(k, v)| (k.to_vec(), *v))
                        .collect();
                    let more = page.next().is_some();
                    if let Some((k, _)) = taken.last() {
                        from = Bound::Excluded(k.clone());
                    }
                    got.extend(taken);
                    if !more {
                        break;
                    }
                }
                let want: Vec<(Vec<u8>, ValueLoc)> =
                    model.iter().map(|(k, v)| (k.clone(), *v)).collect();
                assert_eq!(got, want);
            }
            Op::RemoveAll => {
                let keys: Vec<Vec<u8>> = model.keys().cloned().collect();
                for k in keys {
                    assert_eq!(index.remove(&k), model.remove(&k));
                }
                assert!(index.ends.is_empty() && index.arena.is_empty());
            }
        }
        check(&index, &model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn behaves_like_an_ordered_map(ops in proptest::collection::vec(op(), 0..400)) {
        run(KeyIndex::new(), ops);
    }

    /// With a tiny arena, keys past its limit live in the side map.
    #[test]
    fn behaves_like_an_ordered_map_past_the_arena_limit(
        arena_max in 0u32..600,
        ops in proptest::collection::vec(op(), 0..300),
    ) {
        run(KeyIndex::with_arena_max(arena_max), ops);
    }
}

fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

#[test]
fn keys_in_order_go_to_the_end_of_one_arena() {
    // A log's keys, and a base record's entries, come in key order: no side map, no box.
    let mut index = KeyIndex::new();
    for n in 1..=1_000u64 {
        assert_eq!(index.insert(be(n), loc(n as u32)), None);
    }
    assert!(index.side.is_empty());
    assert_eq!((index.arena.len(), index.ends.len()), (8_000, 1_000));
    // Overwrites and removals of keys in the run stay in it.
    assert_eq!(index.insert(be(5), loc(0)), Some(loc(5)));
    assert_eq!(index.remove(&be(6)), Some(loc(6)));
    assert_eq!(index.insert(be(6), loc(1)), None, "revived in place");
    assert!(index.side.is_empty());
    assert_eq!(index.len(), 1_000);
    assert_eq!(index.merges, 0);
}

#[test]
fn removing_the_last_keys_shrinks_the_arena() {
    let mut index: KeyIndex = (1..=10u64).map(|n| (be(n), loc(n as u32))).collect();
    index.remove(&be(9));
    assert_eq!((index.ends.len(), index.dead), (10, 1));
    // The last key goes, and the dead one before it with it.
    index.remove(&be(10));
    assert_eq!(
        (index.ends.len(), index.dead, index.arena.len()),
        (8, 0, 64)
    );
    assert_eq!(index.insert(be(9), loc(9)), None);
    assert_eq!(index.ends.len(), 9);
}

#[test]
fn keys_close_to_the_end_go_in_place() {
    // A log's head row comes after its first record but sorts before it.
    let mut index = KeyIndex::new();
    index.insert(b"\0log.rec\0\0\0\0\0\0\0\x01", loc(1));
    index.insert(b"\0log.head", loc(2));
    assert!(index.side.is_empty());
    assert_eq!(index.ends.len(), 2);
    // A key with SHIFT_KEYS keys after it goes in place; one with more goes to the side map.
    let mut index: KeyIndex = (100..100 + SHIFT_KEYS as u64)
        .map(|n| (be(n), loc(0)))
        .collect();
    index.insert(be(1), loc(1));
    assert_eq!((index.ends.len(), index.side.len()), (SHIFT_KEYS + 1, 0));
    index.insert(be(0), loc(1));
    assert_eq!((index.ends.len(), index.side.len()), (SHIFT_KEYS + 1, 1));
    // So does one with more than SHIFT_BYTES of keys after it.
    let long = |n: u8| vec![n; 1024];
    let mut index: KeyIndex = (1..=4).map(|n| (long(n), loc(0))).collect();
    index.insert(long(0), loc(1));
    assert_eq!((index.ends.len(), index.side.len()), (5, 0));
    index.insert([0u8], loc(1));
    assert_eq!((index.ends.len(), index.side.len()), (5, 1));
    let model = index.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
    check(&index, &model);
}

#[test]
fn out_of_order_keys_merge_once_past_the_threshold() {
    // A run of 100 keys; the keys that come before them go to the side map, until there are
    // more than MERGE_MIN there.
    let mut index: KeyIndex = (1_000..1_100u64).map(|n| (be(n), loc(0))).collect();
    for n in 0..MERGE_MIN as u64 {
        index.insert(be(999 - n), loc(1));
    }
    assert_eq!(
        (index.side.len(), index.ends.len(), index.merges),
        (MERGE_MIN, 100, 0)
    );
    index.insert(be(10), loc(2));
    let merged = 100 + MERGE_MIN + 1;
    assert_eq!(
        (index.side.len(), index.ends.len(), index.merges),
        (0, merged, 1)
    );
    let mut want: Vec<[u8; 8]> = (968..1_100u64).map(be).collect();
    want.push(be(10));
    want.sort();
    assert!(index.keys().eq(want.iter().map(|k| &k[..])));
    let model = index.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
    check(&index, &model);
}

#[test]
fn dead_keys_are_dropped_once_past_the_threshold() {
    let mut index: KeyIndex = (0..400u64).map(|n| (be(n), loc(n as u32))).collect();
    // A quarter of 400 may wait.
    for n in 0..100u64 {
        index.remove(&be(n));
    }
    assert_eq!((index.dead, index.ends.len(), index.merges), (100, 400, 0));
    index.remove(&be(100));
    assert_eq!((index.dead, index.ends.len(), index.merges), (0, 299, 1));
    assert_eq!(index.iter().next().map(|(k, _)| k), Some(&be(101)[..]));
}

#[test]
fn merges_stay_few_whatever_the_order() {
    // Every key before the last: each merge happens after the run grew by a quarter, so there
    // are O(log n) of them, not O(n).
    for arena_max in [ARENA_MAX, 0, 4_000] {
        let mut index = KeyIndex::with_arena_max(arena_max);
        for n in (0..20_000u64).rev() {
            index.insert(be(n), loc(0));
        }
        assert_eq!(index.len(), 20_000);
        assert!(
            index.merges <= 40,
            "{} merges (arena max {arena_max})",
            index.merges
        );
        for n in 0..20_000u64 {
            index.remove(&be(n));
        }
        assert!(index.is_empty());
        assert!(
            index.merges <= 80,
            "{} merges (arena max {arena_max})",
            index.merges
        );
    }
}

#[test]
fn inverted_and_empty_ranges_are_empty() {
    // Keys in the run and in the side map (inserted before more than SHIFT_KEYS others).
    let index: KeyIndex = (0..100u64)
        .map(|n| n * 2)
        .chain([1_000, 500, 50, 3])
        .map(|n| (be(n), loc(0)))
        .collect();
    assert_eq!(index.side.len(), 1);
    let (a, b) = (&be(50)[..], &be(10)[..]);
    assert_eq!(
        index
            .range::<[u8], _>((Bound::Included(a), Bound::Included(b)))
            .count(),
        0
    );
    assert_eq!(
        index
            .range::<[u8], _>((Bound::Excluded(a), Bound::Excluded(a)))
            .count(),
        0
    );
    assert_eq!(
        index
            .range::<[u8], _>((Bound::Included(a), Bound::Excluded(a)))
            .count(),
        0
    );
    assert_eq!(
        index
            .range::<[u8], _>((Bound::Included(a), Bound::Included(a)))
            .count(),
        1
    );
    let c = &be(3)[..];
    assert_eq!(
        index
            .range::<[u8], _>((Bound::Included(c), Bound::Included(&be(2)[..])))
            .count(),
        0
    );
    assert_eq!(
        index
            .range::<[u8], _>((Bound::Excluded(c), Bound::Excluded(c)))
            .count(),
        0
    );
    assert_eq!(
        index
            .range::<[u8], _>((Bound::Included(c), Bound::Included(c)))
            .count(),
        1
    );
}
