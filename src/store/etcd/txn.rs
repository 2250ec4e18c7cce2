//! A guarded batch as one etcd transaction (SPEC S2 on etcd, S11).
//!
//! ```text
//! compare:  one per key guard, in order          Equals  -> VALUE  == v
//!                                                Absent  -> CREATE == 0
//!                                                Present -> CREATE >  0
//!           the client's marker slot             VALUE  == its value as last known
//! success:  the batch's operations (normalised), the slot set to "c" + the batch's number,
//!           the partition's registry key (unless known to exist)
//! failure:  nothing; after a lost answer: read the slot, set it to "x" + the batch's number
//!           if it still holds the value expected, then read every guarded key (the same
//!           reads, without the abort, when a refusal's revision was compacted)
//! ```
//!
//! The operations are first normalised to their net effect ([`normalise`]), as etcd refuses a
//! transaction that puts one key twice or puts a key inside a range it deletes.
//!
//! A failed transaction does not say which compare failed. The slot and every guarded key are
//! read at the revision the compares saw: by a read-only transaction pinned to the refused
//! answer's revision (a failed transaction with an empty failure branch writes nothing, so
//! that revision is exactly what its compares saw), or, after a lost answer, by the failure
//! branch itself, in the same transaction as the abort. The guards are evaluated in order
//! against those values, so `PreconditionFailed { index }` names the first guard that did not
//! hold. The slot tells whether an earlier copy of this very batch committed (docs/etcd.md).
//! The body is written straight into one buffer ([`Body`]).

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;

use super::client::{Header, RangeResponse, TxnResponse};
use super::json::Body;
use super::normalise::normalise;
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
    /// Refused, and this attempt's failure branch read nothing: nothing applied. Read the slot
    /// and the guarded keys at `revision` ([`Txn::read_back_body`]), then [`Txn::settle`].
    ReadBack { revision: i64 },
}

/// The transaction for one attempt of one batch.
#[derive(Debug)]
pub(crate) struct Txn<'a> {
    batch: &'a Batch,
    prefix: &'a [u8],
    slot_key: &'a [u8],
    committed: Vec<u8>,
    /// The slot's value this attempt expects.
    expected: Vec<u8>,
    /// The slot value the failure branch writes when the slot still holds `expected`, if it
    /// writes one.
    aborted: Option<Vec<u8>>,
    /// Whether the failure branch reads the slot and the guarded keys.
    reads_on_failure: bool,
    body: Vec<u8>,
    /// Where the compares, the success operations (the batch's and the slot's) and the
    /// registry put are in `body`, and how many compares and operations there are: what a
    /// shared transaction takes from this one ([`super::group`]).
    compares: Range<usize>,
    success: Range<usize>,
    registry: Option<Range<usize>>,
    counts: (usize, usize),
}

/// The parts of a first attempt's body that a transaction shared by several batches is made
/// of: its compares, its success operations, and its registry put (written once per group).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fragments<'b> {
    pub(crate) compares: &'b [u8],
    pub(crate) success: &'b [u8],
    pub(crate) registry: Option<&'b [u8]>,
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
    /// An earlier copy may be on its way: a refusal must also abort it (in the same
    /// transaction, so the failure branch reads too).
    pub(crate) abort_on_refusal: bool,
    /// The failure branch reads the slot and the guarded keys even without an abort (when a
    /// refusal could not be read back).
    pub(crate) reads_on_failure: bool,
}

/// The part of a transaction's answer needed when its failure branch read nothing: whether it
/// succeeded, and the revision it saw. The rest of the answer is skipped, not decoded.
#[derive(Deserialize)]
struct TxnHead {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    succeeded: bool,
}

impl<'a> Txn<'a> {
    /// Builds the transaction for `batch`. The batch has been validated; `NotAfter` refused.
    pub(crate) fn build(t: &Target<'a>, batch: &'a Batch) -> Txn<'a> {
        let committed = committed_mark(t.seq);
        let aborted = t.abort_on_refusal.then(|| aborted_mark(t.seq));
        let reads_on_failure = t.reads_on_failure || aborted.is_some();
        let key_bytes: usize = batch.guards().iter().map(guard_bytes).sum::<usize>()
            + batch.ops().iter().map(op_bytes).sum::<usize>();
        let mut body = Body::with_capacity(
            256 + 4 * (t.prefix.len() + 4) * (batch.guards().len() + 2 * batch.ops().len())
                + key_bytes * 4 / 3,
        );
        body.raw("{\"compare\":[");
        let compares_start = body.as_bytes().len();
        for guard in batch.guards() {
            match guard {
                Precondition::Equals(k, v) => {
                    // EQUAL is the default result (0), so it is left out.
                    body.raw("{\"target\":\"VALUE\",\"key\":")
                        .bytes(&[t.prefix, k])
                        .raw(",\"value\":")
                        .bytes(&[v]);
                }
                Precondition::Absent(k) => {
                    body.raw("{\"target\":\"CREATE\",\"create_revision\":\"0\",\"key\":")
                        .bytes(&[t.prefix, k]);
                }
                Precondition::Present(k) => {
                    body.raw(
                        "{\"target\":\"CREATE\",\"result\":\"GREATER\",\"create_revision\":\"0\",\"key\":",
                    )
                    .bytes(&[t.prefix, k]);
                }
                Precondition::NotAfter(_) => unreachable!("refused before building"),
            }
            body.raw("},");
        }
        body.raw("{\"target\":\"VALUE\",\"key\":")
            .bytes(&[t.slot_key])
            .raw(",\"value\":")
            .bytes(&[t.slot_value])
            .raw("}");
        let compares = compares_start..body.as_bytes().len();
        body.raw("],\"success\":[");
        let success_start = body.as_bytes().len();
        let ops = normalise(t.prefix, batch.ops());
        for op in &ops {
            op.write(&mut body);
            body.raw(",");
        }
        body.raw("{\"request_put\":{\"key\":")
            .bytes(&[t.slot_key])
            .raw(",\"value\":")
            .bytes(&[&committed])
            .raw("}}");
        let success = success_start..body.as_bytes().len();
        let registry = t.registry.map(|registry| {
            body.raw(",");
            let start = body.as_bytes().len();
            body.raw("{\"request_put\":{\"key\":")
                .bytes(&[registry])
                .raw("}}");
            start..body.as_bytes().len()
        });
        body.raw("]");
        let counts = (
            batch.guards().len() + 1,
            ops.len() + 1 + usize::from(t.registry.is_some()),
        );
        if reads_on_failure {
            body.raw(",\"failure\":[{\"request_range\":{\"key\":")
                .bytes(&[t.slot_key])
                .raw("}}");
            if let Some(aborted) = &aborted {
                // Conditional, so that a committed mark (an earlier copy committed) is never
                // overwritten.
                body.raw(",{\"request_txn\":{\"compare\":[{\"target\":\"VALUE\",\"key\":")
                    .bytes(&[t.slot_key])
                    .raw(",\"value\":")
                    .bytes(&[t.slot_value])
                    .raw("}],\"success\":[{\"request_put\":{\"key\":")
                    .bytes(&[t.slot_key])
                    .raw(",\"value\":")
                    .bytes(&[aborted])
                    .raw("}}]}}");
            }
            for (key, needs_value) in read_keys(batch) {
                body.raw(",{\"request_range\":{\"key\":")
                    .bytes(&[t.prefix, key]);
                if !needs_value {
                    body.raw(",\"keys_only\":true");
                }
                body.raw("}}");
            }
            body.raw("]");
        }
        body.raw("}");
        Txn {
            batch,
            prefix: t.prefix,
            slot_key: t.slot_key,
            committed,
            expected: t.slot_value.to_vec(),
            aborted,
            reads_on_failure,
            body: body.into_bytes(),
            compares,
            success,
            registry,
            counts,
        }
    }

    /// The batch.
    pub(crate) fn batch(&self) -> &'a Batch {
        self.batch
    }

    /// Whether this attempt may share a transaction: it has no failure branch.
    pub(crate) fn shareable(&self) -> bool {
        !self.reads_on_failure
    }

    /// (compares, success operations) of this attempt, the registry put included.
    pub(crate) fn counts(&self) -> (usize, usize) {
        self.counts
    }

    /// Where this attempt's fragments are in [`Self::body`].
    pub(crate) fn ranges(&self) -> (Range<usize>, Range<usize>, Option<Range<usize>>) {
        (
            self.compares.clone(),
            self.success.clone(),
            self.registry.clone(),
        )
    }

    /// The request body.
    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }

    /// What etcd's answer (the response body) means for the batch.
    pub(crate) fn outcome(&self, answer: &[u8]) -> Result<Answer> {
        if !self.reads_on_failure {
            let head: TxnHead = decode(answer)?;
            return Ok(if head.succeeded {
                self.committed()
            } else {
                Answer::ReadBack {
                    revision: head.header.revision.0,
                }
            });
        }
        let answer: TxnResponse = decode(answer)?;
        if answer.succeeded {
            return Ok(self.committed());
        }
        let ranges: Vec<&RangeResponse> = answer
            .responses
            .iter()
            .filter_map(|r| r.response_range.as_ref())
            .collect();
        self.settle(&ranges)
    }

    /// The answer when this attempt committed (alone or in a shared transaction).
    pub(crate) fn committed(&self) -> Answer {
        Answer::Decided {
            outcome: Outcome::Committed,
            slot: self.committed.clone(),
        }
    }

    /// A read-only transaction that reads the slot, then every guarded key, at `revision`:
    /// what the compares of a refused attempt saw.
    pub(crate) fn read_back_body(&self, revision: i64) -> Vec<u8> {
        let mut body = Body::with_capacity(128 + 64 * self.batch.guards().len());
        body.raw("{\"success\":[{\"request_range\":{\"key\":")
            .bytes(&[self.slot_key])
            .raw(",\"revision\":")
            .int(revision)
            .raw("}}");
        for (key, needs_value) in read_keys(self.batch) {
            body.raw(",{\"request_range\":{\"key\":")
                .bytes(&[self.prefix, key])
                .raw(",\"revision\":")
                .int(revision);
            if !needs_value {
                body.raw(",\"keys_only\":true");
            }
            body.raw("}}");
        }
        body.raw("]}");
        body.into_bytes()
    }

    /// What a refusal means, from the slot and the guarded keys as the compares saw them
    /// (`ranges`: the slot, then the guarded keys in [`read_keys`] order).
    pub(crate) fn settle(&self, ranges: &[&RangeResponse]) -> Result<Answer> {
        let keys = read_keys(self.batch);
        if ranges.len() != keys.len() + 1 {
            return Err(inconsistent("the reads of a refused batch are missing"));
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
        let mut values: BTreeMap<&[u8], Option<&[u8]>> = BTreeMap::new();
        for ((key, _), range) in keys.iter().zip(&ranges[1..]) {
            values.insert(key, range.kvs.first().map(|kv| kv.value.0.as_slice()));
        }
        let refused = check_guards(
            self.batch.guards(),
            || 0,
            |k| Ok(values.get(k).copied().flatten().map(<[u8]>::to_vec)),
        )?;
        match refused {
            Some(outcome @ Outcome::PreconditionFailed { .. }) => {
                Ok(Answer::Decided { outcome, slot })
            }
            // Every guard holds: the slot alone failed (it moved past the value this attempt
            // expected, when an earlier copy was aborted).
            _ => Ok(Answer::SlotMoved { slot }),
        }
    }
}

/// The distinct guarded keys in byte order, each with whether its value is needed (an
/// `Equals` guard) or only whether it exists.
fn read_keys(batch: &Batch) -> Vec<(&[u8], bool)> {
    let mut reads: BTreeMap<&[u8], bool> = BTreeMap::new();
    for guard in batch.guards() {
        let (key, needs_value) = match guard {
            Precondition::Equals(k, _) => (k, true),
            Precondition::Absent(k) | Precondition::Present(k) => (k, false),
            Precondition::NotAfter(_) => continue,
        };
        *reads.entry(key.as_slice()).or_default() |= needs_value;
    }
    reads.into_iter().collect()
}

fn guard_bytes(g: &Precondition) -> usize {
    match g {
        Precondition::Equals(k, v) => k.len() + v.len(),
        Precondition::Absent(k) | Precondition::Present(k) => k.len(),
        Precondition::NotAfter(_) => 0,
    }
}

fn op_bytes(op: &Op) -> usize {
    match op {
        Op::Put(k, v) => k.len() + v.len(),
        Op::Delete(k) => k.len(),
        Op::DeleteRange(_) => 2 * crate::store::MAX_KEY_BYTES,
    }
}

fn decode<'de, T: Deserialize<'de>>(answer: &'de [u8]) -> Result<T> {
    serde_json::from_slice(answer).map_err(|e| Error::Unavailable {
        reason: format!("etcd sent an answer to a transaction that does not decode: {e}"),
        retry_after_ms: 100,
    })
}

fn inconsistent(what: &str) -> Error {
    Error::Unavailable {
        reason: format!("etcd answered a transaction inconsistently ({what}); nothing was applied"),
        retry_after_ms: 100,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A first attempt carries no failure branch (a refusal is read back); a resend after a
    /// lost answer reads and aborts in its failure branch; both compare the slot and set it.
    #[test]
    fn only_a_resend_carries_a_failure_branch() {
        let batch = Batch::new()
            .equals(b"k".to_vec(), b"v".to_vec())
            .put(b"k".to_vec(), b"w".to_vec());
        let target = |abort_on_refusal, reads_on_failure| Target {
            prefix: b"Pd\x01x",
            registry: None,
            slot_key: b"Pm-slot",
            slot_value: b"i",
            seq: 7,
            abort_on_refusal,
            reads_on_failure,
        };
        let body = |t: &Target<'_>| -> Value {
            serde_json::from_slice(Txn::build(t, &batch).body()).unwrap()
        };
        let first = body(&target(false, false));
        assert!(first.get("failure").is_none(), "{first}");
        assert_eq!(first["compare"].as_array().unwrap().len(), 2);
        assert_eq!(first["success"].as_array().unwrap().len(), 2);
        let resend = body(&target(true, false));
        let failure = resend["failure"].as_array().unwrap();
        assert_eq!(failure.len(), 3, "{resend}");
        assert!(failure[1].get("request_txn").is_some(), "{resend}");
        let compacted = body(&target(false, true));
        assert_eq!(compacted["failure"].as_array().unwrap().len(), 2);
    }
}
