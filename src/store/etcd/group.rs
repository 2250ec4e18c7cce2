//! Group commit on etcd (SPEC S2, S3, S11): the first attempts of batches applied at once by
//! several threads go to etcd as one transaction, so etcd decodes, proposes, logs, syncs and
//! applies one request for all of them.
//!
//! Owns: the queue of batches waiting for a transaction, who sends it (the leader), which
//! batches may share one ([`Footprint`]) and the bounds a shared transaction keeps.
//!
//! A store keeps at most `in_flight` transactions in flight. A batch applied while fewer are in
//! flight and none waits is sent at once, alone, as it would be without grouping: a lone thread
//! waits for nothing. Otherwise it joins the queue; a batch that finds room leads at once with
//! the queued batches that fit with it, and when a transaction returns, its leader hands the
//! turn to the oldest waiting batch, which takes every queued batch that fits with it. Nobody
//! waits for a group to fill.
//!
//! Why a shared transaction equals its members applied one after another (S2): etcd evaluates
//! every compare of a transaction before any of its operations, so batches share one only if no
//! member writes (puts, deletes or deletes a range over) a key that another member writes or
//! guards; then no member's operations change what another member's compares see, nor another
//! member's effect, and the transaction's effect is the members' in any order. Each member's
//! compares include its own marker slot and its operations set that slot, so the transaction
//! commits every member, each under its own commit mark, or none. Only first attempts are
//! shared. A refused or unsent shared transaction applied nothing: each member is then sent
//! alone, where its own compares decide its outcome (and name its own failing guard). After a
//! lost answer each member resolves its own fate through its own slot, by sending itself again
//! alone (docs/etcd.md, "Faults"), as after any lost answer: it never reports `Committed`
//! without knowing. A shared transaction keeps within etcd's limits: at most `max_txn_ops`
//! compares and operations, and request bodies (JSON, larger than the request etcd measures)
//! adding up to at most the server's request size; a batch alone is never split.
//!
//! Locks: the queue, held to join it, take a group from it or hand the turn on, never across a
//! request, and never while calling a test hook; each waiting batch's cell, held to set or read
//! its fate (taken after the queue's lock, never before it).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use crate::sync::{Condvar, Mutex};
use serde::Deserialize;

use super::client::{Client, Failure, TXN};
use super::json::Body;
use super::normalise::normalise;
use super::txn::{Fragments, Txn};
use crate::store::{Batch, Partition, Precondition};

/// What a transaction means for one batch in it.
#[derive(Debug)]
pub(crate) enum Fate {
    /// The batch went alone: etcd's answer, read as any first attempt's.
    Alone(Result<Vec<u8>, Failure>),
    /// The shared transaction committed, and with it the batch, under its commit mark.
    Committed,
    /// Nothing of the batch applied (the shared transaction was refused, or never sent): send
    /// it alone.
    Retry,
    /// The shared transaction's answer was lost: the batch's fate is unknown until its slot
    /// says (send it again alone, as after any lost answer).
    Lost(Failure),
}

/// The keys a batch writes and guards, as etcd keys.
#[derive(Debug, Default)]
pub(crate) struct Footprint {
    /// Keys put or deleted.
    points: Vec<Vec<u8>>,
    /// Ranges `[start, end)` deleted.
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
    /// Keys guarded.
    guards: Vec<Vec<u8>>,
}

impl Footprint {
    /// What `batch` on the partition with row prefix `prefix` writes and guards (its
    /// normalised operations: what etcd is sent).
    pub(crate) fn of(prefix: &[u8], batch: &Batch) -> Footprint {
        let mut f = Footprint::default();
        for op in normalise(prefix, batch.ops()) {
            match op.written() {
                (key, None) => f.points.push(key),
                (start, Some(end)) => f.ranges.push((start, end)),
            }
        }
        for guard in batch.guards() {
            match guard {
                Precondition::Equals(k, _) | Precondition::Absent(k) | Precondition::Present(k) => {
                    f.guards.push([prefix, k].concat());
                }
                Precondition::NotAfter(_) => {}
            }
        }
        f
    }

    /// Whether what `self` writes touches anything `other` writes or guards.
    fn writes_into(&self, other: &Footprint) -> bool {
        let in_ranges = |k: &[u8], ranges: &[(Vec<u8>, Vec<u8>)]| {
            ranges
                .iter()
                .any(|(s, e)| k >= s.as_slice() && k < e.as_slice())
        };
        let keys = || other.points.iter().chain(&other.guards);
        self.points
            .iter()
            .any(|k| keys().any(|o| o == k) || in_ranges(k, &other.ranges))
            || self.ranges.iter().any(|(s, e)| {
                keys().any(|k| k >= s && k < e)
                    || other.ranges.iter().any(|(os, oe)| os < e && s < oe)
            })
    }

    /// Whether two batches may not share a transaction.
    pub(crate) fn overlaps(&self, other: &Footprint) -> bool {
        self.writes_into(other) || other.writes_into(self)
    }
}

/// A waiting batch's share of a transaction: its first attempt's body and where its parts are.
#[derive(Debug)]
pub(crate) struct Part {
    body: Vec<u8>,
    compares: Range<usize>,
    success: Range<usize>,
    registry: Option<Range<usize>>,
    counts: (usize, usize),
    footprint: Footprint,
}

impl Part {
    /// `txn`'s share, on the partition with row prefix `prefix`.
    pub(crate) fn of(prefix: &[u8], txn: &Txn<'_>) -> Part {
        let (compares, success, registry) = txn.ranges();
        Part {
            body: txn.body().to_vec(),
            compares,
            success,
            registry,
            counts: txn.counts(),
            footprint: Footprint::of(prefix, txn.batch()),
        }
    }

    fn fragments(&self) -> Fragments<'_> {
        Fragments {
            compares: &self.body[self.compares.clone()],
            success: &self.body[self.success.clone()],
            registry: self.registry.clone().map(|r| &self.body[r]),
        }
    }
}

/// Where a waiting batch stands.
#[derive(Debug)]
enum Cell {
    Waiting,
    /// Its turn to lead: the leader before it left its place in flight to it.
    Lead,
    Done(Fate),
}

#[derive(Debug)]
struct Entry {
    part: Part,
    cell: Mutex<Cell>,
    ready: Condvar,
    #[cfg(feature = "etcd-test-hooks")]
    origin: (Partition, Batch),
}

impl Entry {
    fn settle(&self, to: Cell) {
        *self.cell.lock() = to;
        self.ready.notify_one();
    }
}

#[derive(Debug, Default)]
struct Queue {
    in_flight: usize,
    waiting: VecDeque<Arc<Entry>>,
}

/// Test hooks: every transaction's members, before it is sent.
#[cfg(feature = "etcd-test-hooks")]
pub(crate) type GroupHook = Arc<dyn Fn(&[(Partition, Batch)]) + Send + Sync>;

/// The group commit of one store.
pub(crate) struct Grouper {
    queue: Mutex<Queue>,
    in_flight: usize,
    max_txn_ops: usize,
    max_body_bytes: usize,
    #[cfg(feature = "etcd-test-hooks")]
    pub(crate) hook: Option<GroupHook>,
    /// The negative control: overlapping batches share transactions.
    #[cfg(feature = "etcd-test-hooks")]
    pub(crate) group_overlapping: bool,
    /// The negative control of the limits: batches share transactions past etcd's limits.
    #[cfg(feature = "etcd-test-hooks")]
    pub(crate) group_past_limits: bool,
}

impl std::fmt::Debug for Grouper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grouper")
            .field("in_flight", &self.in_flight)
            .field("max_txn_ops", &self.max_txn_ops)
            .finish_non_exhaustive()
    }
}

/// The part of a shared transaction's answer that matters: whether it succeeded.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    succeeded: bool,
}

/// A place in flight held by a leader: handed on by [`Turn::pass`], or, if the leader unwinds
/// before, on drop, where the batches it took learn that their fate is unknown (so each
/// resolves it through its own marker slot; nothing is reported that is not known).
struct Turn<'g> {
    group: &'g Grouper,
    members: Vec<Arc<Entry>>,
    passed: bool,
}

impl<'g> Turn<'g> {
    fn new(group: &'g Grouper) -> Self {
        Turn {
            group,
            members: Vec::new(),
            passed: false,
        }
    }

    fn pass(mut self) {
        self.passed = true;
        self.group.pass_turn();
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.passed {
            self.group.pass_turn();
        }
        for member in self.members.drain(..) {
            member.settle(Cell::Done(Fate::Lost(Failure::Ambiguous(
                "was in a shared transaction whose sender stopped".into(),
            ))));
        }
    }
}

impl Grouper {
    /// At most `in_flight` transactions at once (at least 1), each within `max_txn_ops`
    /// compares and operations and `max_request_bytes` of request.
    pub(crate) fn new(in_flight: usize, max_txn_ops: usize, max_request_bytes: usize) -> Self {
        Grouper {
            queue: Mutex::new(Queue::default()),
            in_flight: in_flight.max(1),
            max_txn_ops,
            max_body_bytes: max_request_bytes,
            #[cfg(feature = "etcd-test-hooks")]
            hook: None,
            #[cfg(feature = "etcd-test-hooks")]
            group_overlapping: false,
            #[cfg(feature = "etcd-test-hooks")]
            group_past_limits: false,
        }
    }

    /// Batches waiting for a transaction (tests).
    #[cfg(feature = "etcd-test-hooks")]
    pub(crate) fn waiting(&self) -> usize {
        self.queue.lock().waiting.len()
    }

    /// Sends `txn`, a first attempt, alone or in a transaction shared with other batches.
    /// `part` makes its share when it has to wait or lead a group.
    pub(crate) fn send(
        &self,
        client: &Client,
        txn: &Txn<'_>,
        part: impl FnOnce() -> Part,
        origin: &Partition,
    ) -> Fate {
        debug_assert!(txn.shareable());
        #[cfg(not(feature = "etcd-test-hooks"))]
        let _ = origin;
        let lone = {
            let mut q = self.queue.lock();
            let lone = q.in_flight < self.in_flight && q.waiting.is_empty();
            q.in_flight += usize::from(lone);
            lone
        };
        if lone {
            let turn = Turn::new(self);
            #[cfg(feature = "etcd-test-hooks")]
            if let Some(hook) = &self.hook {
                hook(&[(origin.clone(), txn.batch().clone())]);
            }
            let fate = Fate::Alone(client.post_bytes(TXN, txn.body()));
            turn.pass();
            return fate;
        }
        let me = Arc::new(Entry {
            part: part(),
            cell: Mutex::new(Cell::Waiting),
            ready: Condvar::new(),
            #[cfg(feature = "etcd-test-hooks")]
            origin: (origin.clone(), txn.batch().clone()),
        });
        let lead = {
            let mut q = self.queue.lock();
            if q.in_flight < self.in_flight {
                q.in_flight += 1;
                true
            } else {
                q.waiting.push_back(Arc::clone(&me));
                false
            }
        };
        if !lead {
            let mut cell = me.cell.lock();
            loop {
                match std::mem::replace(&mut *cell, Cell::Waiting) {
                    Cell::Waiting => me.ready.wait(&mut cell),
                    Cell::Lead => break,
                    Cell::Done(fate) => return fate,
                }
            }
        }
        // This thread holds a place in flight: `turn` hands it on (and, should this thread
        // unwind, tells the batches it took that their fate is unknown).
        let mut turn = Turn::new(self);
        turn.members = self.take_group(&me);
        #[cfg(feature = "etcd-test-hooks")]
        if let Some(hook) = &self.hook {
            let members: Vec<(Partition, Batch)> = std::iter::once(&me)
                .chain(&turn.members)
                .map(|e| e.origin.clone())
                .collect();
            hook(&members);
        }
        if turn.members.is_empty() {
            let fate = Fate::Alone(client.post_bytes(TXN, txn.body()));
            turn.pass();
            return fate;
        }
        let body = shared_body(
            std::iter::once(&me)
                .chain(&turn.members)
                .map(|e| e.part.fragments()),
        );
        let answer = client.post_bytes(TXN, &body);
        log::debug!(
            "etcd group commit: {} batches in one transaction",
            turn.members.len() + 1
        );
        let fate = |answer: &std::result::Result<Vec<u8>, Failure>| match answer {
            Ok(bytes) => match serde_json::from_slice::<Head>(bytes) {
                Ok(head) if head.succeeded => Fate::Committed,
                Ok(_) => Fate::Retry,
                Err(e) => Fate::Lost(Failure::Ambiguous(format!(
                    "sent an answer to a shared transaction that does not decode: {e}"
                ))),
            },
            // Never sent, or refused by etcd itself (which decided: nothing applied).
            Err(Failure::NotSent(_)) => Fate::Retry,
            Err(f) if f.is_transient() => Fate::Lost(f.clone()),
            Err(Failure::Refused { .. } | Failure::Ambiguous(_)) => Fate::Retry,
        };
        let members = std::mem::take(&mut turn.members);
        turn.pass();
        for other in &members {
            other.settle(Cell::Done(fate(&answer)));
        }
        fate(&answer)
    }

    /// Takes from the queue the waiting batches that fit in one transaction with `lead`, oldest
    /// first: none overlaps another member, and the whole stays within etcd's limits.
    fn take_group(&self, lead: &Entry) -> Vec<Arc<Entry>> {
        let mut q = self.queue.lock();
        let (mut compares, mut ops) = lead.part.counts;
        let mut bytes = lead.part.body.len();
        let mut group: Vec<Arc<Entry>> = Vec::new();
        let mut i = 0;
        while i < q.waiting.len() {
            let candidate = &q.waiting[i].part;
            let fits = self.limits_ignored()
                || (compares + candidate.counts.0 <= self.max_txn_ops
                    && ops + candidate.counts.1 <= self.max_txn_ops
                    && bytes + candidate.body.len() <= self.max_body_bytes);
            let apart = self.overlap_ignored()
                || !std::iter::once(&lead.part)
                    .chain(group.iter().map(|e| &e.part))
                    .any(|m| m.footprint.overlaps(&candidate.footprint));
            if fits && apart {
                compares += candidate.counts.0;
                ops += candidate.counts.1;
                bytes += candidate.body.len();
                group.push(q.waiting.remove(i).expect("in range"));
            } else {
                i += 1;
            }
        }
        group
    }

    fn limits_ignored(&self) -> bool {
        #[cfg(feature = "etcd-test-hooks")]
        if self.group_past_limits {
            return true;
        }
        false
    }

    fn overlap_ignored(&self) -> bool {
        #[cfg(feature = "etcd-test-hooks")]
        if self.group_overlapping {
            return true;
        }
        false
    }

    /// A transaction returned: the oldest waiting batch takes its place in flight, or the
    /// place is freed.
    fn pass_turn(&self) {
        let mut q = self.queue.lock();
        match q.waiting.pop_front() {
            Some(next) => next.settle(Cell::Lead),
            None => q.in_flight -= 1,
        }
    }
}

/// One transaction of several batches' compares and operations; a registry key several of them
/// put is put once (etcd refuses a key put twice in one transaction).
fn shared_body<'b>(members: impl Iterator<Item = Fragments<'b>> + Clone) -> Vec<u8> {
    let size: usize = members
        .clone()
        .map(|f| f.compares.len() + f.success.len() + f.registry.map_or(0, <[u8]>::len) + 2)
        .sum();
    let mut body = Body::with_capacity(size + 32);
    body.raw("{\"compare\":[");
    for (i, f) in members.clone().enumerate() {
        if i > 0 {
            body.raw(",");
        }
        body.append(f.compares);
    }
    body.raw("],\"success\":[");
    let mut registries: Vec<&[u8]> = Vec::new();
    for (i, f) in members.enumerate() {
        if i > 0 {
            body.raw(",");
        }
        body.append(f.success);
        if let Some(r) = f.registry
            && !registries.contains(&r)
        {
            registries.push(r);
        }
    }
    for r in registries {
        body.raw(",").append(r);
    }
    body.raw("]}");
    body.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyRange;

    fn print(batch: Batch) -> Footprint {
        Footprint::of(b"Pd\x01x", &batch)
    }

    /// Batches overlap when one writes (a key or a range) what the other writes or guards;
    /// guards alone never overlap, nor do different partitions.
    #[test]
    fn overlap_is_writes_against_writes_and_guards() {
        let put = |k: &str| print(Batch::new().put(k, "1"));
        let guard = |k: &str| print(Batch::new().equals(k, "1"));
        let range = |a: &str, b: &str| print(Batch::new().delete_range(KeyRange::between(a, b)));
        let cases = [
            (put("a"), put("a"), true),
            (put("a"), put("b"), false),
            (put("a"), guard("a"), true),
            (guard("a"), guard("a"), false),
            (range("a", "c"), put("b"), true),
            (range("a", "c"), put("c"), false),
            (range("a", "c"), guard("b"), true),
            (range("a", "c"), range("b", "d"), true),
            (range("a", "c"), range("c", "d"), false),
            (print(Batch::new().delete("a")), guard("a"), true),
            (
                Footprint::of(b"Pd\x01y", &Batch::new().put("a", "1")),
                put("a"),
                false,
            ),
        ];
        for (i, (a, b, expected)) in cases.iter().enumerate() {
            assert_eq!(a.overlaps(b), *expected, "case {i}");
            assert_eq!(b.overlaps(a), *expected, "case {i} reversed");
        }
    }

    /// A shared body is one JSON transaction of every member's compares and operations, with a
    /// registry key several members put written once.
    #[test]
    fn a_shared_body_puts_a_registry_key_once() {
        use super::super::txn::Target;
        let batches = [
            Batch::new().absent("a").put("a", "1"),
            Batch::new().put("b", "2"),
        ];
        let txns: Vec<Txn<'_>> = batches
            .iter()
            .enumerate()
            .map(|(i, batch)| {
                Txn::build(
                    &Target {
                        prefix: b"Pd\x01x",
                        registry: Some(b"Ppx"),
                        slot_key: if i == 0 { b"Pm-1" } else { b"Pm-2" },
                        slot_value: b"i",
                        seq: i as u64 + 1,
                        abort_on_refusal: false,
                        reads_on_failure: false,
                    },
                    batch,
                )
            })
            .collect();
        let parts: Vec<Part> = txns.iter().map(|t| Part::of(b"Pd\x01x", t)).collect();
        let body = shared_body(parts.iter().map(Part::fragments));
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["compare"].as_array().unwrap().len(), 3, "{json}");
        // Two puts, two marker slots, one registry key.
        assert_eq!(json["success"].as_array().unwrap().len(), 5, "{json}");
        assert_eq!(parts[0].counts, (2, 3));
    }
}
