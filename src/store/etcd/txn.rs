//! A guarded batch as one etcd transaction (SPEC S2 on etcd, S11).
//!
//! ```text
//! compare:  one per key guard, in order          Equals  -> VALUE  == v
//!                                                Absent  -> CREATE == 0
//!                                                Present -> CREATE >  0
//!           the client's marker slot             VALUE  == its value as last known
//! success:  the batch's operations (normalised), the partition's registry key (unless known
//!           to exist), the slot set to "c" + the batch's number
//! failure:  read the slot, [after a lost answer: if the slot still holds the value expected,
//!           set it to "x" + the batch's number], then read every guarded key
//! ```
//!
//! etcd refuses a transaction that puts one key twice or puts a key inside a range it deletes,
//! while a batch's operations apply in order. So the operations are normalised to their net
//! effect first: the last operation on a key wins, range deletes are merged and split around
//! the keys the batch puts afterwards. A batch of n operations becomes at most 2n etcd
//! operations, which is why the backend's operation limit is half of etcd's.
//!
//! A failed transaction does not say which compare failed; its failure branch reads the slot
//! and every guarded key at the same revision, and the guards are evaluated in order against
//! those values, so `PreconditionFailed { index }` names the first guard that did not hold.
//! The slot tells whether an earlier copy of this very batch committed (docs/etcd.md).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::client::{RangeResponse, TxnResponse};
use super::keys::{Layout, b64, encode_range, successor};
use crate::error::{Error, Result};
use crate::store::{Batch, Op, Outcome, Precondition, check_guards};

/// etcd operations the backend may add to a batch: the registry key and the marker slot.
pub(crate) const RESERVED_OPS: usize = 2;

/// The slot value that says batch `seq` committed.
pub(crate) fn committed_mark(seq: u64) -> Vec<u8> {
    mark(b'c', seq)
}

/// The slot value that says batch `seq` was refused after a lost answer and can no longer
/// commit.
fn aborted_mark(seq: u64) -> Vec<u8> {
    mark(b'x', seq)
}

fn mark(tag: u8, seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(9);
    v.push(tag);
    v.extend_from_slice(&seq.to_be_bytes());
    v
}

/// What one answer says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The batch's fate is decided; the slot now holds `slot`.
    Decided { outcome: Outcome, slot: Vec<u8> },
    /// The transaction failed on the slot alone (an earlier copy of this batch was refused and
    /// aborted): nothing of the batch applied; try again with the slot at `slot`.
    SlotMoved { slot: Vec<u8> },
}

/// The transaction for one attempt of one batch.
#[derive(Debug)]
pub(crate) struct Txn {
    /// Key guards in order, with their index in the batch's guards.
    guards: Vec<(usize, Precondition)>,
    /// The distinct guarded keys, in the order the failure branch reads them.
    read_keys: Vec<Vec<u8>>,
    committed: Vec<u8>,
    /// The slot's value this attempt expects.
    expected: Vec<u8>,
    /// The slot value the failure branch writes when the slot still holds `expected`, if it
    /// writes one.
    aborted: Option<Vec<u8>>,
    body: Value,
}

/// Where a batch goes and under which marker.
pub(crate) struct Target<'a> {
    /// The partition's row prefix.
    pub(crate) prefix: &'a [u8],
    /// The partition's registry key, unless the partition is known to exist.
    pub(crate) registry: Option<&'a [u8]>,
    /// The client's marker slot key and its value as last known.
    pub(crate) slot_key: &'a [u8],
    pub(crate) slot_value: &'a [u8],
    /// The batch's number, unique for this client.
    pub(crate) seq: u64,
    /// An earlier copy may be on its way: a refusal must also abort it.
    pub(crate) abort_on_refusal: bool,
}

impl Txn {
    /// Builds the transaction for `batch`. The batch has been validated; `NotAfter` refused.
    pub(crate) fn build(t: &Target<'_>, batch: &Batch) -> Txn {
        let mut compare = Vec::with_capacity(batch.guards().len() + 1);
        let mut guards = Vec::with_capacity(batch.guards().len());
        let mut reads: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
        for (index, guard) in batch.guards().iter().enumerate() {
            let (key, mut c) = match guard {
                Precondition::Equals(k, v) => (
                    k,
                    json!({"target": "VALUE", "result": "EQUAL", "value": b64(v)}),
                ),
                Precondition::Absent(k) => (
                    k,
                    json!({"target": "CREATE", "result": "EQUAL", "create_revision": "0"}),
                ),
                Precondition::Present(k) => (
                    k,
                    json!({"target": "CREATE", "result": "GREATER", "create_revision": "0"}),
                ),
                Precondition::NotAfter(_) => unreachable!("refused before building"),
            };
            c["key"] = Value::String(b64(&Layout::data_key(t.prefix, key)));
            compare.push(c);
            guards.push((index, guard.clone()));
            *reads.entry(key.clone()).or_default() |= matches!(guard, Precondition::Equals(..));
        }
        let slot = b64(t.slot_key);
        compare.push(
            json!({"key": slot, "target": "VALUE", "result": "EQUAL", "value": b64(t.slot_value)}),
        );

        let committed = committed_mark(t.seq);
        let mut success = normalise(t.prefix, batch.ops());
        if let Some(registry) = t.registry {
            success.push(json!({"request_put": {"key": b64(registry)}}));
        }
        success.push(json!({"request_put": {"key": slot, "value": b64(&committed)}}));

        let mut failure = Vec::with_capacity(reads.len() + 2);
        failure.push(json!({"request_range": {"key": slot}}));
        let aborted = t.abort_on_refusal.then(|| aborted_mark(t.seq));
        if let Some(aborted) = &aborted {
            // Conditional, so that a committed mark (an earlier copy committed) is never
            // overwritten.
            failure.push(json!({"request_txn": {
                "compare": [{"key": slot, "target": "VALUE", "result": "EQUAL", "value": b64(t.slot_value)}],
                "success": [{"request_put": {"key": slot, "value": b64(aborted)}}],
            }}));
        }
        let mut read_keys = Vec::with_capacity(reads.len());
        for (key, needs_value) in reads {
            failure.push(json!({"request_range": {
                "key": b64(&Layout::data_key(t.prefix, &key)),
                "keys_only": !needs_value,
            }}));
            read_keys.push(key);
        }
        Txn {
            guards,
            read_keys,
            committed,
            expected: t.slot_value.to_vec(),
            aborted,
            body: json!({"compare": compare, "success": success, "failure": failure}),
        }
    }

    /// The request body.
    pub(crate) fn body(&self) -> &Value {
        &self.body
    }

    /// What etcd's answer means for the batch.
    pub(crate) fn outcome(&self, answer: &TxnResponse) -> Result<Answer> {
        if answer.succeeded {
            return Ok(Answer::Decided {
                outcome: Outcome::Committed,
                slot: self.committed.clone(),
            });
        }
        let ranges: Vec<&RangeResponse> = answer
            .responses
            .iter()
            .filter_map(|r| r.response_range.as_ref())
            .collect();
        if ranges.len() != self.read_keys.len() + 1 {
            return Err(inconsistent("the failure branch's reads are missing"));
        }
        let Some(found) = ranges[0].kvs.first().map(|kv| kv.value.0.clone()) else {
            return Err(inconsistent("the marker slot is missing"));
        };
        // What the slot holds now: the abort mark if this answer wrote it, else what it read.
        let slot = match &self.aborted {
            Some(aborted) if found == self.expected => aborted.clone(),
            _ => found.clone(),
        };
        if found == self.committed {
            // An earlier copy of this batch committed.
            return Ok(Answer::Decided {
                outcome: Outcome::Committed,
                slot,
            });
        }
        let mut values: BTreeMap<&[u8], Option<Vec<u8>>> = BTreeMap::new();
        for (key, range) in self.read_keys.iter().zip(&ranges[1..]) {
            values.insert(key, range.kvs.first().map(|kv| kv.value.0.clone()));
        }
        let guards: Vec<Precondition> = self.guards.iter().map(|(_, g)| g.clone()).collect();
        let refused = check_guards(&guards, || 0, |k| Ok(values.get(k).cloned().flatten()))?;
        match refused {
            Some(Outcome::PreconditionFailed { index }) => Ok(Answer::Decided {
                outcome: Outcome::PreconditionFailed {
                    index: self.guards[index].0,
                },
                slot,
            }),
            // Every guard holds: the slot alone failed (it moved past the value this attempt
            // expected, when an earlier copy was aborted).
            _ => Ok(Answer::SlotMoved { slot }),
        }
    }
}

fn inconsistent(what: &str) -> Error {
    Error::Unavailable {
        reason: format!("etcd answered a transaction inconsistently ({what}); nothing was applied"),
        retry_after_ms: 100,
    }
}

/// The net effect of `ops`, in order, as etcd operations that never overlap: the last Put or
/// Delete of a key wins unless a later range delete covers it; range deletes are merged and
/// split around the keys put after them.
fn normalise(prefix: &[u8], ops: &[Op]) -> Vec<Value> {
    // Key -> its last point operation (Some: put this value; None: delete).
    let mut points: BTreeMap<Vec<u8>, Option<&[u8]>> = BTreeMap::new();
    let mut ranges: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                points.insert(Layout::data_key(prefix, k), Some(v));
            }
            Op::Delete(k) => {
                points.insert(Layout::data_key(prefix, k), None);
            }
            Op::DeleteRange(r) => {
                if let Some((start, end)) = encode_range(prefix, r) {
                    points.retain(|k, _| !(*k >= start && *k < end));
                    ranges.push((start, end));
                }
            }
        }
    }
    // Merge the ranges into disjoint, ordered intervals.
    ranges.sort();
    let mut merged: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => {
                if end > last.1 {
                    last.1 = end;
                }
            }
            _ => merged.push((start, end)),
        }
    }
    let covered = |k: &[u8]| {
        merged
            .iter()
            .any(|(s, e)| k >= s.as_slice() && k < e.as_slice())
    };
    let mut out = Vec::with_capacity(points.len() + 2 * merged.len());
    // Split each interval around the keys put after it.
    for (start, end) in &merged {
        let mut from = start.clone();
        for (key, value) in points.range::<[u8], _>((
            std::ops::Bound::Included(start.as_slice()),
            std::ops::Bound::Excluded(end.as_slice()),
        )) {
            if value.is_some() {
                if from < *key {
                    out.push(delete_range(&from, key));
                }
                from = successor(key);
            }
        }
        if from < *end {
            out.push(delete_range(&from, end));
        }
    }
    for (key, value) in &points {
        match value {
            Some(v) => out.push(json!({"request_put": {"key": b64(key), "value": b64(v)}})),
            // A delete inside a range delete is already done.
            None if covered(key) => {}
            None => out.push(json!({"request_delete_range": {"key": b64(key)}})),
        }
    }
    out
}

fn delete_range(start: &[u8], end: &[u8]) -> Value {
    json!({"request_delete_range": {"key": b64(start), "range_end": b64(end)}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyRange;

    /// Applies normalised etcd operations to a map, refusing what etcd refuses (a key put
    /// twice, or put inside a range deleted in the same transaction).
    fn apply_like_etcd(rows: &mut BTreeMap<Vec<u8>, Vec<u8>>, ops: &[Value]) {
        let field = |op: &Value, kind: &str, name: &str| {
            op[kind][name]
                .as_str()
                .map(|s| super::super::keys::unb64(s).unwrap())
        };
        let mut dels: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut puts: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for op in ops {
            if let Some(k) = field(op, "request_put", "key") {
                puts.push((k, field(op, "request_put", "value").unwrap_or_default()));
            } else {
                let k = field(op, "request_delete_range", "key").unwrap();
                dels.push((k, field(op, "request_delete_range", "range_end")));
            }
        }
        let in_del = |k: &[u8]| {
            dels.iter().any(|(s, e)| match e {
                Some(e) => k >= s.as_slice() && k < e.as_slice(),
                None => k == s.as_slice(),
            })
        };
        for (i, (k, _)) in puts.iter().enumerate() {
            assert!(!in_del(k), "put of {k:?} inside a delete");
            assert!(puts[..i].iter().all(|(p, _)| p != k), "{k:?} put twice");
        }
        rows.retain(|k, _| !in_del(k));
        rows.extend(puts);
    }

    #[test]
    fn normalised_ops_have_the_batch_effect_and_never_overlap() {
        let prefix = b"Pd\x01x".to_vec();
        let k = |s: &str| s.as_bytes().to_vec();
        let cases: Vec<Vec<Op>> = vec![
            vec![Op::Put(k("a"), k("1")), Op::Put(k("a"), k("2"))],
            vec![Op::Put(k("a"), k("1")), Op::Delete(k("a"))],
            vec![Op::Delete(k("a")), Op::Put(k("a"), k("3"))],
            vec![
                Op::DeleteRange(KeyRange::all()),
                Op::Put(k("b"), k("1")),
                Op::Put(k("d"), k("2")),
            ],
            vec![Op::Put(k("b"), k("1")), Op::DeleteRange(KeyRange::all())],
            vec![
                Op::DeleteRange(KeyRange::between(k("a"), k("c"))),
                Op::DeleteRange(KeyRange::between(k("b"), k("e"))),
                Op::Put(k("a"), k("x")),
                Op::Delete(k("d")),
                Op::Delete(k("z")),
                Op::Put(k("e"), k("y")),
                Op::DeleteRange(KeyRange::between(k("q"), k("p"))),
            ],
        ];
        for ops in cases {
            let mut expected: BTreeMap<Vec<u8>, Vec<u8>> = ["a", "b", "c", "d", "e", "z"]
                .iter()
                .map(|s| (Layout::data_key(&prefix, s.as_bytes()), k("old")))
                .collect();
            let mut got = expected.clone();
            for op in &ops {
                match op {
                    Op::Put(key, v) => {
                        expected.insert(Layout::data_key(&prefix, key), v.clone());
                    }
                    Op::Delete(key) => {
                        expected.remove(&Layout::data_key(&prefix, key));
                    }
                    Op::DeleteRange(r) => {
                        expected.retain(|key, _| !r.contains(&key[prefix.len()..]));
                    }
                }
            }
            let normal = normalise(&prefix, &ops);
            assert!(normal.len() <= 2 * ops.len(), "{ops:?}");
            apply_like_etcd(&mut got, &normal);
            assert_eq!(got, expected, "{ops:?}");
        }
    }
}
