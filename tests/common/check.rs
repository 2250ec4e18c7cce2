//! The model of what each prefix of the workload leaves, and the checker every crash test
//! uses: what a reopened store shows must be exactly the state after batches `1..=m` for one
//! `m`, with `m` at least the newest acknowledged batch and at most the newest attempted one.

use std::collections::BTreeMap;

use portcullis::store::{KeyRange, MemoryStore, Outcome, Partition, Store};

use super::workload::{GEN_KEY, PARTITIONS, batch, decode_gen, partition_of};

/// The rows of every non-empty workload partition.
pub type State = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

/// The states after each prefix of the workload, built by running it on the in-memory store
/// (the reference backend), and extended on demand.
pub struct Model {
    reference: MemoryStore,
    /// `states[i]` is the state after batches `1..=first + i`.
    states: Vec<State>,
    first: u64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            reference: MemoryStore::new(),
            states: vec![State::new()],
            first: 0,
        }
    }
}

impl Model {
    /// The state after batches `1..=m`.
    ///
    /// Panics if `m` is below a point passed to [`Model::forget_before`].
    pub fn state(&mut self, m: u64) -> &State {
        assert!(m >= self.first, "state {m} was forgotten");
        while self.first + self.states.len() as u64 <= m {
            let n = self.first + self.states.len() as u64;
            let outcome = self.reference.apply(&partition_of(n), &batch(n)).unwrap();
            assert_eq!(
                outcome,
                Outcome::Committed,
                "the workload refused itself at {n}"
            );
            self.states.push(read_state(&self.reference).unwrap());
        }
        &self.states[(m - self.first) as usize]
    }

    /// Drops the states before `m`, for long runs whose newest batch only grows.
    pub fn forget_before(&mut self, m: u64) {
        self.state(m);
        let drop = (m - self.first) as usize;
        self.states.drain(..drop);
        self.first = m;
    }
}

/// Everything a store shows in the workload's partitions, read in small pages so paging is
/// exercised too. Empty partitions are left out.
pub fn read_state(store: &dyn Store) -> portcullis::Result<State> {
    let mut state = State::new();
    for name in PARTITIONS {
        let p = Partition::new(name).unwrap();
        let mut rows = BTreeMap::new();
        let mut cursor = None;
        loop {
            let page = store.scan(&p, &KeyRange::all(), cursor.as_ref(), 3)?;
            rows.extend(page.entries);
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        // Point reads must agree with the scan.
        if let Some(v) = rows.get(GEN_KEY) {
            assert_eq!(
                store.get(&p, GEN_KEY)?.as_ref(),
                Some(v),
                "get and scan disagree"
            );
        }
        if !rows.is_empty() {
            state.insert(name.to_string(), rows);
        }
    }
    Ok(state)
}

/// The newest batch a state shows: the largest generation of any partition (0 if none).
pub fn newest_batch(state: &State) -> Result<u64, String> {
    let mut newest = 0;
    for (name, rows) in state {
        let gen_bytes = rows
            .get(GEN_KEY)
            .ok_or_else(|| format!("partition {name} has rows but no generation key"))?;
        let g = decode_gen(gen_bytes)
            .ok_or_else(|| format!("partition {name} has a malformed generation {gen_bytes:?}"))?;
        newest = newest.max(g);
    }
    Ok(newest)
}

/// Checks that `state` is exactly the state after batches `1..=m` for some
/// `acked <= m <= attempted`, and returns `m`.
pub fn check_state(
    model: &mut Model,
    state: &State,
    acked: u64,
    attempted: u64,
) -> Result<u64, String> {
    let m = newest_batch(state)?;
    if m < acked {
        return Err(format!(
            "batch {acked} was acknowledged as durable, but the newest batch visible is {m}"
        ));
    }
    if m > attempted {
        return Err(format!(
            "batch {m} is visible, but only batches up to {attempted} were ever attempted"
        ));
    }
    let expected = model.state(m);
    if state != expected {
        return Err(format!(
            "not a prefix: the newest batch is {m}, but the rows differ from the state after \
             batches 1..={m}: {}",
            describe_difference(expected, state)
        ));
    }
    Ok(m)
}

/// Reads a store and checks it as [`check_state`] does.
pub fn check_store(
    model: &mut Model,
    store: &dyn Store,
    acked: u64,
    attempted: u64,
) -> Result<u64, String> {
    let state = read_state(store).map_err(|e| format!("reading the store failed: {e}"))?;
    check_state(model, &state, acked, attempted)
}

fn describe_difference(expected: &State, found: &State) -> String {
    for name in PARTITIONS {
        let e = expected.get(name);
        let f = found.get(name);
        if e != f {
            let empty = BTreeMap::new();
            let (e, f) = (e.unwrap_or(&empty), f.unwrap_or(&empty));
            for k in e.keys().chain(f.keys()) {
                if e.get(k) != f.get(k) {
                    return format!(
                        "partition {name}, key {}: expected {:?}, found {:?}",
                        k.escape_ascii(),
                        e.get(k).map(|v| short(v)),
                        f.get(k).map(|v| short(v)),
                    );
                }
            }
        }
    }
    "no difference".into()
}

fn short(v: &[u8]) -> String {
    let s = v.escape_ascii().to_string();
    s.chars().take(40).collect()
}
