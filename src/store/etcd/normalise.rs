//! A batch's operations as etcd operations that never overlap (SPEC S2 on etcd).
//!
//! Owns: normalisation. etcd refuses a transaction that puts one key twice or puts a key inside
//! a range it deletes, while a batch's operations apply in order. So the operations become
//! their net effect: the last operation on a key wins, range deletes are merged and split
//! around the keys the batch puts afterwards. A batch of n operations becomes at most 2n etcd
//! operations, which is why the backend's operation limit is half of etcd's. Point keys stay
//! borrowed (partition prefix and user key, encoded without being joined).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::json::Body;
use super::keys::{encode_range, successor};
use crate::store::Op;

/// An etcd key: a partition prefix and a user key (not joined), or a whole key.
#[derive(Debug)]
pub(crate) enum Key<'a> {
    Parts(&'a [u8], &'a [u8]),
    Whole(Vec<u8>),
}

impl Key<'_> {
    /// The whole key.
    pub(crate) fn joined(&self) -> Vec<u8> {
        match self {
            Key::Parts(prefix, key) => [*prefix, *key].concat(),
            Key::Whole(key) => key.clone(),
        }
    }

    fn write(&self, body: &mut Body) {
        match self {
            Key::Parts(prefix, key) => body.bytes(&[prefix, key]),
            Key::Whole(key) => body.bytes(&[key]),
        };
    }
}

/// One operation of a transaction's success branch.
#[derive(Debug)]
pub(crate) enum EtcdOp<'a> {
    Put {
        key: Key<'a>,
        value: &'a [u8],
    },
    /// A delete of `key`, or of `[key, end)`.
    Delete {
        key: Key<'a>,
        end: Option<Vec<u8>>,
    },
}

impl EtcdOp<'_> {
    /// The key this operation writes, and the end of its range if it deletes a range.
    pub(crate) fn written(&self) -> (Vec<u8>, Option<Vec<u8>>) {
        match self {
            EtcdOp::Put { key, .. } => (key.joined(), None),
            EtcdOp::Delete { key, end } => (key.joined(), end.clone()),
        }
    }

    pub(crate) fn write(&self, body: &mut Body) {
        match self {
            EtcdOp::Put { key, value } => {
                body.raw("{\"request_put\":{\"key\":");
                key.write(body);
                body.raw(",\"value\":").bytes(&[value]).raw("}}");
            }
            EtcdOp::Delete { key, end } => {
                body.raw("{\"request_delete_range\":{\"key\":");
                key.write(body);
                if let Some(end) = end {
                    body.raw(",\"range_end\":").bytes(&[end]);
                }
                body.raw("}}");
            }
        }
    }
}

/// `prefix + key` compared with `other`, without joining them.
fn cmp_joined(prefix: &[u8], key: &[u8], other: &[u8]) -> Ordering {
    let (head, tail) = other.split_at(prefix.len().min(other.len()));
    prefix.cmp(head).then_with(|| key.cmp(tail))
}

/// The net effect of `ops`, in order, as etcd operations that never overlap: the last Put or
/// Delete of a key wins unless a later range delete covers it; range deletes are merged and
/// split around the keys put after them.
pub(crate) fn normalise<'a>(prefix: &'a [u8], ops: &'a [Op]) -> Vec<EtcdOp<'a>> {
    // User key -> its last point operation (Some: put this value; None: delete). Every key
    // has the same prefix, so user-key order is etcd's key order.
    let mut points: BTreeMap<&[u8], Option<&[u8]>> = BTreeMap::new();
    let mut ranges: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let inside = |k: &[u8], start: &[u8], end: &[u8]| {
        cmp_joined(prefix, k, start) != Ordering::Less
            && cmp_joined(prefix, k, end) == Ordering::Less
    };
    for op in ops {
        match op {
            Op::Put(k, v) => {
                points.insert(k, Some(v));
            }
            Op::Delete(k) => {
                points.insert(k, None);
            }
            Op::DeleteRange(r) => {
                if let Some((start, end)) = encode_range(prefix, r) {
                    points.retain(|k, _| !inside(k, &start, &end));
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
    let mut out = Vec::with_capacity(points.len() + 2 * merged.len());
    // Split each interval around the keys put after it.
    for (start, end) in &merged {
        let mut from = start.clone();
        for (key, value) in &points {
            if value.is_some() && inside(key, start, end) {
                let mut full = Vec::with_capacity(prefix.len() + key.len());
                full.extend_from_slice(prefix);
                full.extend_from_slice(key);
                if from < full {
                    out.push(EtcdOp::Delete {
                        key: Key::Whole(from),
                        end: Some(full.clone()),
                    });
                }
                from = successor(&full);
            }
        }
        if from < *end {
            out.push(EtcdOp::Delete {
                key: Key::Whole(from),
                end: Some(end.clone()),
            });
        }
    }
    for (key, value) in points {
        let covered = merged.iter().any(|(s, e)| inside(key, s, e));
        match value {
            Some(value) => out.push(EtcdOp::Put {
                key: Key::Parts(prefix, key),
                value,
            }),
            // A delete inside a range delete is already done.
            None if covered => {}
            None => out.push(EtcdOp::Delete {
                key: Key::Parts(prefix, key),
                end: None,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyRange;
    use crate::store::etcd::keys::Layout;
    use serde_json::Value;

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
            // Through the JSON the transaction carries.
            let mut body = Body::default();
            body.raw("[");
            for (i, op) in normal.iter().enumerate() {
                if i > 0 {
                    body.raw(",");
                }
                op.write(&mut body);
            }
            body.raw("]");
            let normal: Vec<Value> = serde_json::from_slice(body.as_bytes()).unwrap();
            apply_like_etcd(&mut got, &normal);
            assert_eq!(got, expected, "{ops:?}");
        }
    }
}
