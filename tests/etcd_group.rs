//! Group commit on etcd (SPEC S2, S11): batches applied at once share one etcd transaction only
//! when none writes what another writes or guards; each batch gets its own outcome, exactly
//! once, whether the shared transaction commits, is refused or loses its answer; a shared
//! transaction keeps within etcd's limits. Feature `etcd-test-hooks`; needs the `etcd` binary.
//!
//! A [`Gate`] (the store's group hook) records every transaction's batches and holds the one
//! carrying a batch of the partition `gate` before it is sent, so that the batches applied
//! meanwhile wait, in a known order, for the next transaction.
#![cfg(feature = "etcd-test-hooks")]

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::etcd::{EtcdServer, Fault, FaultProxy, RawEtcd, row_key};
use portcullis::store::{
    Batch, EtcdStore, EtcdStoreBuilder, Op, Outcome, Partition, Precondition, Store,
};

const ROOT: &[u8] = b"group/";

type Members = Vec<(Partition, Batch)>;

/// The group hook of a test: records each transaction's batches, holds a transaction with a
/// batch of the partition `gate` until [`Gate::release`], and panics in the sender of a shared
/// transaction with a batch of the partition `stop`.
#[derive(Default)]
struct Gate {
    groups: Mutex<Vec<Members>>,
    /// (a gate transaction is being held, released)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    fn on(builder: EtcdStoreBuilder, gate: &Arc<Gate>) -> EtcdStoreBuilder {
        let gate = Arc::clone(gate);
        builder.on_group(move |members: &[(Partition, Batch)]| {
            gate.groups.lock().unwrap().push(members.to_vec());
            if members.len() > 1 && members.iter().any(|(p, _)| p.as_bytes() == b"stop") {
                panic!("the sender of a shared transaction stops");
            }
            if members.iter().any(|(p, _)| p.as_bytes() == b"gate") {
                let mut state = gate.state.lock().unwrap();
                state.0 = true;
                gate.changed.notify_all();
                while !state.1 {
                    state = gate.changed.wait(state).unwrap();
                }
            }
        })
    }

    fn holding(&self) -> bool {
        self.state.lock().unwrap().0
    }

    fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }

    /// The recorded transactions that carried more than one batch.
    fn shared(&self) -> Vec<Members> {
        let groups = self.groups.lock().unwrap();
        groups.iter().filter(|g| g.len() > 1).cloned().collect()
    }

    /// The batches of the transaction that carried `batch`.
    fn group_of(&self, batch: &Batch) -> Vec<Batch> {
        let groups = self.groups.lock().unwrap();
        let group = groups
            .iter()
            .rev()
            .find(|g| g.iter().any(|(_, b)| b == batch))
            .expect("the batch went in a transaction");
        group.iter().map(|(_, b)| b.clone()).collect()
    }
}

/// Waits (without sleeping) until `done`, for at most 30 s.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::yield_now();
    }
}

fn part(name: &str) -> Partition {
    Partition::new(name).unwrap()
}

/// A store with one transaction in flight at most, recorded and gated by `gate`.
fn open(
    endpoint: &str,
    gate: &Arc<Gate>,
    tweak: fn(EtcdStoreBuilder) -> EtcdStoreBuilder,
) -> EtcdStore {
    let builder = EtcdStore::builder(endpoint).prefix(ROOT).group_commit(1);
    tweak(Gate::on(builder, gate))
        .open()
        .expect("open the etcd store")
}

/// Holds a gate transaction in flight, applies `batches` to `p` from threads one after another
/// (each waits for the next transaction before the next is applied), runs `before_release`,
/// lets the gate go, and returns the batches' outcomes.
fn queued(
    store: &EtcdStore,
    gate: &Gate,
    p: &Partition,
    batches: &[Batch],
    before_release: impl FnOnce(),
) -> Vec<Outcome> {
    thread::scope(|s| {
        let first = s.spawn(|| store.apply(&part("gate"), &Batch::new().put("g", "1")));
        wait_until("the gate holds a transaction", || gate.holding());
        let mut waiting = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            waiting.push(s.spawn(move || store.apply(p, batch)));
            wait_until("the batch waits", || store.waiting_batches() == i + 1);
        }
        before_release();
        gate.release();
        assert_eq!(first.join().unwrap().unwrap(), Outcome::Committed);
        waiting
            .into_iter()
            .map(|h| h.join().unwrap().expect("apply"))
            .collect()
    })
}

fn claim(key: &str) -> Batch {
    Batch::new().absent(key).put(key, "mine")
}

/// The keys a batch writes and the keys it guards (no range deletes in these tests).
fn keys(batch: &Batch) -> (Vec<&[u8]>, Vec<&[u8]>) {
    let writes = batch
        .ops()
        .iter()
        .map(|op| match op {
            Op::Put(k, _) | Op::Delete(k) => k.as_slice(),
            Op::DeleteRange(_) => panic!("no range deletes here"),
        })
        .collect();
    let guards = batch
        .guards()
        .iter()
        .filter_map(|g| match g {
            Precondition::Equals(k, _) | Precondition::Absent(k) | Precondition::Present(k) => {
                Some(k.as_slice())
            }
            Precondition::NotAfter(_) => None,
        })
        .collect();
    (writes, guards)
}

/// Whether two batches of the same partition overlap: one writes what the other writes or
/// guards.
fn overlap(a: &(Partition, Batch), b: &(Partition, Batch)) -> bool {
    if a.0 != b.0 {
        return false;
    }
    let ((wa, ga), (wb, gb)) = (keys(&a.1), keys(&b.1));
    wa.iter().any(|k| wb.contains(k) || gb.contains(k)) || wb.iter().any(|k| ga.contains(k))
}

/// Two batches that guard each other's writes (write skew) and one apart from both, queued in
/// that order behind a gate: what each batch got, the batches that shared the first one's
/// transaction, and the rows after.
fn crossed(
    tweak: fn(EtcdStoreBuilder) -> EtcdStoreBuilder,
) -> (Vec<Outcome>, Vec<Batch>, Vec<Option<Vec<u8>>>) {
    let etcd = EtcdServer::start();
    let gate = Gate::new();
    let store = open(&etcd.endpoint(), &gate, tweak);
    let p = part("skew");
    let seed = Batch::new().put("k", "v0").put("j", "0");
    assert_eq!(store.apply(&p, &seed).unwrap(), Outcome::Committed);
    let b = Batch::new().equals("k", "v0").put("j", "1");
    let c = Batch::new().equals("j", "0").put("k", "v1");
    let d = Batch::new().put("other", "1");
    let outcomes = queued(&store, &gate, &p, &[b.clone(), c, d], || {});
    let rows = store.get_many(&p, &[b"k", b"j", b"other"]).unwrap();
    (outcomes, gate.group_of(&b), rows)
}

/// S2: batches that overlap never share a transaction, so the outcomes are those of a serial
/// order: b and d go together, c (which guards what b writes) waits for the next transaction
/// and is refused, as it would be after b.
#[test]
fn overlapping_batches_never_share_a_transaction() {
    let (outcomes, group, rows) = crossed(|b| b);
    assert_eq!(
        outcomes,
        vec![
            Outcome::Committed,
            Outcome::PreconditionFailed { index: 0 },
            Outcome::Committed
        ]
    );
    assert_eq!(group.len(), 2, "b and d share a transaction: {group:?}");
    assert!(group.contains(&Batch::new().put("other", "1")));
    let v = |s: &str| Some(s.as_bytes().to_vec());
    assert_eq!(rows, vec![v("v0"), v("1"), v("1")]);
}

/// The negative control of `overlapping_batches_never_share_a_transaction`: with overlapping
/// batches allowed to share a transaction, both crossed batches commit (each guard is checked
/// before either write), a result no serial order gives.
#[test]
fn sharing_overlapping_batches_breaks_serial_order() {
    let (outcomes, group, rows) = crossed(EtcdStoreBuilder::group_overlapping);
    assert_eq!(group.len(), 3, "{group:?}");
    assert_eq!(outcomes, vec![Outcome::Committed; 3]);
    let v = |s: &str| Some(s.as_bytes().to_vec());
    assert_eq!(rows, vec![v("v1"), v("1"), v("1")], "write skew");
}

/// S2: a shared transaction whose compares fail applies nothing; each batch is then sent
/// alone, and its own guards decide its outcome (a refusal names the batch's own guard).
#[test]
fn a_refused_shared_transaction_sends_each_batch_alone() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let gate = Gate::new();
    let store = open(&etcd.endpoint(), &gate, |b| b);
    let p = part("refused");
    assert_eq!(
        store.apply(&p, &Batch::new().put("a", "1")).unwrap(),
        Outcome::Committed
    );
    let refused = Batch::new().present("a").equals("a", "2").put("b", "1");
    let batches = [
        refused.clone(),
        claim("c"),
        Batch::new().equals("a", "1").put("d", "1"),
    ];
    let outcomes = queued(&store, &gate, &p, &batches, || {});
    assert_eq!(
        outcomes,
        vec![
            Outcome::PreconditionFailed { index: 1 },
            Outcome::Committed,
            Outcome::Committed
        ]
    );
    assert_eq!(
        gate.group_of(&refused).len(),
        3,
        "the three shared a transaction"
    );
    assert_eq!(store.get(&p, b"b").unwrap(), None);
    for key in [b"c", b"d"] {
        let (_, version) = raw.get(&row_key(ROOT, b"refused", key)).unwrap();
        assert_eq!(version, 1, "applied once");
    }
}

/// S11: a shared transaction whose answer is lost (etcd committed it): each batch sends itself
/// again alone, learns from its own commit marker that it committed, and reports `Committed`;
/// each applied once.
#[test]
fn a_lost_answer_for_a_shared_transaction_resolves_each_batch_once() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let proxy = FaultProxy::start(&etcd.endpoint());
    let gate = Gate::new();
    let store = open(&proxy.endpoint(), &gate, |b| b);
    let p = part("lost");
    let batches = [claim("k1"), Batch::new().put("n", "1"), claim("k2")];
    let outcomes = queued(&store, &gate, &p, &batches, || {
        // The gate's transaction goes through; the shared one's answer is dropped.
        proxy.plan(&[Fault::Forward, Fault::DropAnswer]);
    });
    assert_eq!(outcomes, vec![Outcome::Committed; 3]);
    assert_eq!(proxy.faults_applied(), 1);
    assert_eq!(gate.group_of(&batches[0]).len(), 3);
    for key in [&b"k1"[..], b"n", b"k2"] {
        let (_, version) = raw.get(&row_key(ROOT, b"lost", key)).unwrap();
        assert_eq!(version, 1, "{} applied more than once", key.escape_ascii());
    }
}

/// S11: a shared transaction held in the network while its batches, sent again alone, commit
/// or are refused (and aborted): when the held copy arrives it fails on their marker slots and
/// applies nothing, so the outcomes reported stay true.
#[test]
fn a_held_shared_copy_never_commits_after_its_batches_went_alone() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let proxy = FaultProxy::start(&etcd.endpoint());
    let gate = Gate::new();
    let store = open(&proxy.endpoint(), &gate, |b| b);
    let p = part("held");
    assert_eq!(
        store.apply(&p, &Batch::new().put("g", "v0")).unwrap(),
        Outcome::Committed
    );
    let late = Batch::new().equals("g", "v1").put("g", "late");
    let batches = [claim("k1"), late];
    let outcomes = queued(&store, &gate, &p, &batches, || {
        proxy.plan(&[Fault::Forward, Fault::Hold]);
    });
    assert_eq!(
        outcomes,
        vec![Outcome::Committed, Outcome::PreconditionFailed { index: 0 }]
    );
    assert_eq!(gate.group_of(&batches[0]).len(), 2);
    // Now the refused batch's guard would hold, and the held shared copy arrives.
    raw.put_txn(&row_key(ROOT, b"held", b"g"), b"v1");
    let answers = proxy.release_held();
    assert_eq!(answers.len(), 1);
    assert!(!answers[0].contains("\"succeeded\":true"), "{}", answers[0]);
    assert_eq!(store.get(&p, b"g").unwrap(), Some(b"v1".to_vec()));
    let (_, version) = raw.get(&row_key(ROOT, b"held", b"k1")).unwrap();
    assert_eq!(version, 1);
}

/// Three batches of 50 puts each (50 operations, the marker slot and the registry key: 52 etcd
/// operations), queued behind a gate: what each got, and how many batches the first and the
/// last went with.
fn wide_batches(store: &EtcdStore, gate: &Gate, p: &Partition) -> (Vec<Outcome>, usize, usize) {
    let wide = |n: usize| (0..50).fold(Batch::new(), |b, i| b.put(format!("w{n}-{i:02}"), "x"));
    let batches = [wide(0), wide(1), wide(2)];
    let outcomes = queued(store, gate, p, &batches, || {});
    (
        outcomes,
        gate.group_of(&batches[0]).len(),
        gate.group_of(&batches[2]).len(),
    )
}

/// A sender that stops (unwinds) before its shared transaction is sent hands its place in
/// flight on, and the batches it took resolve their fate alone, as after a lost answer: they
/// commit once; the store goes on.
#[test]
fn a_sender_that_stops_leaves_its_batches_to_resolve_alone() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let gate = Gate::new();
    let store = open(&etcd.endpoint(), &gate, |b| b);
    let p = part("stop");
    thread::scope(|s| {
        let first = s.spawn(|| store.apply(&part("gate"), &Batch::new().put("g", "1")));
        wait_until("the gate holds a transaction", || gate.holding());
        let sender = s.spawn(|| store.apply(&p, &claim("a")));
        wait_until("the batch waits", || store.waiting_batches() == 1);
        let other = s.spawn(|| store.apply(&p, &claim("b")));
        wait_until("the batch waits", || store.waiting_batches() == 2);
        gate.release();
        assert_eq!(first.join().unwrap().unwrap(), Outcome::Committed);
        assert!(sender.join().is_err(), "the sender stopped");
        assert_eq!(other.join().unwrap().unwrap(), Outcome::Committed);
    });
    assert_eq!(store.get(&p, b"a").unwrap(), None, "never sent");
    let (_, version) = raw.get(&row_key(ROOT, b"stop", b"b")).unwrap();
    assert_eq!(version, 1);
    assert_eq!(store.apply(&p, &claim("c")).unwrap(), Outcome::Committed);
}

/// S11: a shared transaction stays within etcd's limits (128 operations; the request size):
/// batches that would take it over wait for the next one; a batch over the store's limits is
/// still refused, never split. Every batch commits.
#[test]
fn a_shared_transaction_keeps_within_etcds_limits() {
    let etcd = EtcdServer::start();
    let gate = Gate::new();
    let store = open(&etcd.endpoint(), &gate, |b| b);
    let p = part("limits");
    // Two fit in etcd's 128 operations, three do not.
    assert_eq!(
        wide_batches(&store, &gate, &p),
        (vec![Outcome::Committed; 3], 2, 1)
    );
    // 600 KB values: one such request is within etcd's 1.5 MiB, two are not.
    let gate = Gate::new();
    let store = open(&etcd.endpoint(), &gate, |b| b);
    let big = |n: u8| Batch::new().put(format!("big{n}"), vec![n; 600_000]);
    let batches = [big(0), big(1), big(2)];
    let outcomes = queued(&store, &gate, &p, &batches, || {});
    assert_eq!(outcomes, vec![Outcome::Committed; 3]);
    assert!(
        gate.shared().is_empty(),
        "no two big batches shared a transaction"
    );
    // A batch over the limits is refused whole.
    let over = (0..64).fold(Batch::new(), |b, i| b.put(format!("o{i:02}"), "x"));
    let err = store.apply(&p, &over).unwrap_err();
    assert_eq!(err.code(), 2, "{err:?}");
    assert_eq!(store.get(&p, b"o00").unwrap(), None);
}

/// The negative control of `a_shared_transaction_keeps_within_etcds_limits`: with the limits
/// ignored, the three wide batches share one transaction, which etcd refuses (too many
/// operations); each batch is then sent alone and still commits, so only the wasted request
/// shows.
#[test]
fn sharing_past_etcds_limits_is_refused_by_etcd() {
    let etcd = EtcdServer::start();
    let gate = Gate::new();
    let store = open(&etcd.endpoint(), &gate, EtcdStoreBuilder::group_past_limits);
    let p = part("limits");
    assert_eq!(
        wide_batches(&store, &gate, &p),
        (vec![Outcome::Committed; 3], 3, 3)
    );
    for key in [b"w0-00", b"w1-49", b"w2-10"] {
        assert_eq!(store.get(&p, key).unwrap(), Some(b"x".to_vec()));
    }
}

/// S2, S11: threads applying claims and guarded increments at once through the default group
/// commit: every claim commits and is applied once, every increment's outcome is its own (the
/// counter ends at the number of increments reported committed), and no transaction carried
/// two batches that overlap.
#[test]
fn concurrent_batches_commit_exactly_once_with_their_own_outcomes() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 25;
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let gate = Gate::new();
    let store = Gate::on(EtcdStore::builder(etcd.endpoint()).prefix(ROOT), &gate)
        .open()
        .unwrap();
    let (claims, counter) = (part("claims"), part("counter"));
    let committed: usize = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, claims, counter) = (&store, &claims, &counter);
                s.spawn(move || {
                    let mut increments = 0;
                    for i in 0..ROUNDS {
                        let key = format!("t{t}-{i}");
                        assert_eq!(
                            store.apply(claims, &claim(&key)).unwrap(),
                            Outcome::Committed
                        );
                        let n = store.get(counter, b"n").unwrap();
                        let next = n.as_deref().map_or(0, |v| {
                            std::str::from_utf8(v).unwrap().parse::<usize>().unwrap()
                        }) + 1;
                        let guard = match n {
                            Some(v) => Batch::new().equals("n", v),
                            None => Batch::new().absent("n"),
                        };
                        match store
                            .apply(counter, &guard.put("n", next.to_string()))
                            .unwrap()
                        {
                            Outcome::Committed => increments += 1,
                            Outcome::PreconditionFailed { index: 0 } => {}
                            other => panic!("{other:?}"),
                        }
                    }
                    increments
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let n = store.get(&counter, b"n").unwrap().expect("the counter");
    assert_eq!(std::str::from_utf8(&n).unwrap(), committed.to_string());
    for t in 0..THREADS {
        for i in 0..ROUNDS {
            let key = format!("t{t}-{i}");
            let (value, version) = raw
                .get(&row_key(ROOT, b"claims", key.as_bytes()))
                .expect("claimed");
            assert_eq!((value.as_slice(), version), (&b"mine"[..], 1), "{key}");
        }
    }
    let shared = gate.shared();
    assert!(!shared.is_empty(), "no transaction was shared");
    for group in &shared {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                assert!(
                    !overlap(a, b),
                    "overlapping batches shared a transaction: {group:?}"
                );
            }
        }
    }
}

/// Closing the store while a batch is on its way leaves that batch's marker slot alone, so the
/// batch commits and says so (SPEC S11). Close used to delete every slot of the client, and the
/// batch's compare on its own slot then failed.
#[test]
fn a_batch_on_its_way_while_the_store_closes_still_commits() {
    let etcd = EtcdServer::start();
    let gate = Gate::new();
    let store = open(&etcd.endpoint(), &gate, |b| b);
    let outcome = thread::scope(|s| {
        let held = s.spawn(|| store.apply(&part("gate"), &Batch::new().put("g", "1")));
        wait_until("the gate holds a transaction", || gate.holding());
        store.close().expect("close");
        gate.release();
        held.join().unwrap()
    });
    assert_eq!(outcome.expect("apply"), Outcome::Committed);
    let reopened = EtcdStore::builder(etcd.endpoint())
        .prefix(ROOT)
        .open()
        .expect("reopen");
    assert_eq!(
        reopened.get(&part("gate"), b"g").unwrap(),
        Some(b"1".to_vec())
    );
}
