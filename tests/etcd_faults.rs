//! Faults between `EtcdStore` and etcd (SPEC S11): a lost answer never becomes a wrong
//! `Committed`, and a batch sent again never applies twice; errors say what to do; the declared
//! limits hold against a real etcd. Feature `etcd`; needs the `etcd` binary.
//!
//! A [`FaultProxy`] between the store and a throwaway etcd forwards a request and then drops
//! etcd's answer (etcd has acted on it), or swallows a request (etcd never sees it).
#![cfg(feature = "etcd")]

mod common;

use std::sync::Arc;

use common::etcd::{EtcdServer, Fault, FaultProxy, RawEtcd, row_key};
use portcullis::store::{Batch, EtcdStore, KeyRange, Outcome, Partition, Store};
use portcullis::{Error, ManualClock};

const ROOT: &[u8] = b"faults/";

/// A store through `endpoint`, with its marker slot made (one batch on a scratch partition),
/// so the faults planned next hit batches, not the slot's creation.
fn store_at(endpoint: &str) -> EtcdStore {
    let store = EtcdStore::builder(endpoint)
        .prefix(ROOT)
        .clock(Arc::new(ManualClock::new(1_000)))
        .open()
        .expect("open the etcd store");
    warm(&store);
    store
}

fn warm(store: &EtcdStore) {
    let batch = Batch::new().put(b"w".to_vec(), b"1".to_vec());
    assert_eq!(
        store.apply(&part("warm"), &batch).unwrap(),
        Outcome::Committed
    );
}

fn part(name: &str) -> Partition {
    Partition::new(name).unwrap()
}

/// A batch whose own write makes its guard fail: sent twice without protection it would be
/// reported `PreconditionFailed` the second time.
fn claim(key: &[u8]) -> Batch {
    Batch::new()
        .absent(key.to_vec())
        .put(key.to_vec(), b"mine".to_vec())
}

/// S11: etcd acted on the batch but its answer was lost; the store sends it again, learns from
/// the commit marker that it committed, and reports `Committed`. etcd applied it once.
#[test]
fn lost_answer_is_sent_again_and_commits_once() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let proxy = FaultProxy::start(&etcd.endpoint());
    let store = store_at(&proxy.endpoint());
    let p = part("lost-answer");

    proxy.plan(&[Fault::DropAnswer]);
    assert_eq!(store.apply(&p, &claim(b"k")).unwrap(), Outcome::Committed);
    assert_eq!(proxy.faults_applied(), 1);
    let (value, version) = raw
        .get(&row_key(ROOT, b"lost-answer", b"k"))
        .expect("row in etcd");
    assert_eq!((value.as_slice(), version), (&b"mine"[..], 1));

    // An unguarded put: a second application would show as version 2.
    proxy.plan(&[Fault::DropAnswer, Fault::DropAnswer]);
    let put = Batch::new().put(b"n".to_vec(), b"1".to_vec());
    assert_eq!(store.apply(&p, &put).unwrap(), Outcome::Committed);
    assert_eq!(proxy.faults_applied(), 3);
    let (_, version) = raw.get(&row_key(ROOT, b"lost-answer", b"n")).unwrap();
    assert_eq!(version, 1, "the batch was applied more than once");

    // A batch that etcd refused, whose answer was lost, is reported refused after the resend.
    proxy.plan(&[Fault::DropAnswer]);
    assert_eq!(
        store.apply(&p, &claim(b"k")).unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    assert_eq!(store.get(&p, b"k").unwrap(), Some(b"mine".to_vec()));
}

/// S11: every answer lost: the store cannot learn the batch's fate and says so with
/// `OutcomeUnknown` (code 14), never `Committed`; etcd applied it once all the same.
#[test]
fn every_answer_lost_is_outcome_unknown_and_applied_at_most_once() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let proxy = FaultProxy::start(&etcd.endpoint());
    let store = store_at(&proxy.endpoint());
    let p = part("all-lost");

    proxy.set_default(Fault::DropAnswer);
    let put = Batch::new().put(b"n".to_vec(), b"1".to_vec());
    let err = store.apply(&p, &put).unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(err.code(), 14);
    let msg = err.to_string();
    assert!(
        msg.contains("all-lost") && msg.contains("read back"),
        "{msg}"
    );
    assert!(proxy.faults_applied() >= 2, "the batch was sent again");
    let (_, version) = raw.get(&row_key(ROOT, b"all-lost", b"n")).unwrap();
    assert_eq!(version, 1, "the batch was applied more than once");

    // Requests that never reach etcd: the fate is unknown to the store, and nothing applied.
    // (The slot of the unknown batch is not used again: a new one is made first.)
    proxy.set_default(Fault::Forward);
    warm(&store);
    proxy.set_default(Fault::Swallow);
    let err = store
        .apply(&p, &Batch::new().put(b"m".to_vec(), b"1".to_vec()))
        .unwrap_err();
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err:?}");
    assert_eq!(raw.get(&row_key(ROOT, b"all-lost", b"m")), None);
    proxy.set_default(Fault::Forward);
    assert_eq!(store.get(&p, b"m").unwrap(), None);
    assert_eq!(store.get(&p, b"n").unwrap(), Some(b"1".to_vec()));
}

/// E1/S11: nothing listening: open fails with `Unavailable`, and the message names the
/// endpoint and what to check.
#[test]
fn refused_connection_says_what_to_do() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let err = EtcdStore::builder(endpoint.clone())
        .attempts(2)
        .open()
        .unwrap_err();
    assert_eq!(err.code(), 10, "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "etcd at {endpoint} refused the connection: is it running?"
        )),
        "{msg}"
    );
}

/// S11: after a lost answer, a copy refused by its guard also aborts the batch: a copy of it
/// still on its way (held in the network) finds the marker moved and can never commit, so the
/// `PreconditionFailed` the store reported stays true.
#[test]
fn a_refusal_after_a_lost_answer_aborts_the_copy_still_on_its_way() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let proxy = FaultProxy::start(&etcd.endpoint());
    let store = store_at(&proxy.endpoint());
    let p = part("held");
    let k = b"k".to_vec();
    assert_eq!(
        store
            .apply(&p, &Batch::new().put(k.clone(), b"v0".to_vec()))
            .unwrap(),
        Outcome::Committed
    );
    // The first copy is held in the network; the second finds k at v0 and is refused.
    proxy.plan(&[Fault::Hold]);
    let batch = Batch::new()
        .equals(k.clone(), b"v1".to_vec())
        .put(k.clone(), b"late".to_vec());
    assert_eq!(
        store.apply(&p, &batch).unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    // Now the guard would hold, and the held copy arrives.
    raw.put_txn(&row_key(ROOT, b"held", b"k"), b"v1");
    let answers = proxy.release_held();
    assert_eq!(answers.len(), 1);
    assert!(!answers[0].contains("\"succeeded\":true"), "{}", answers[0]);
    assert_eq!(store.get(&p, b"k").unwrap(), Some(b"v1".to_vec()));
    // The store goes on as usual.
    assert_eq!(store.apply(&p, &batch).unwrap(), Outcome::Committed);
    assert_eq!(store.get(&p, b"k").unwrap(), Some(b"late".to_vec()));
}

/// S11: a marker slot changed behind the store's back (here by hand) makes the next batch
/// fail on the slot alone; the store follows the slot's new value and commits the batch once.
#[test]
fn a_moved_marker_slot_is_followed() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let store = store_at(&etcd.endpoint());
    let p = part("moved");
    assert_eq!(store.apply(&p, &claim(b"a")).unwrap(), Outcome::Committed);
    let mut marker_prefix = ROOT.to_vec();
    marker_prefix.push(b'm');
    assert_eq!(raw.overwrite_prefix(&marker_prefix, b"elsewhere"), 1);
    assert_eq!(store.apply(&p, &claim(b"b")).unwrap(), Outcome::Committed);
    assert_eq!(
        store.apply(&p, &claim(b"b")).unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    let (_, version) = raw.get(&row_key(ROOT, b"moved", b"b")).unwrap();
    assert_eq!(version, 1);
}

/// S11: a batch at every declared limit at once (operations, preconditions, bytes, longest
/// partition name and keys, puts inside its own range delete) fits in one etcd transaction
/// under etcd's default limits and commits.
#[test]
fn a_batch_at_every_declared_limit_commits() {
    let etcd = EtcdServer::start();
    let store = store_at(&etcd.endpoint());
    let limits = store.limits();
    assert_eq!(limits.max_batch_ops, 63);
    assert_eq!(limits.max_batch_bytes, 1 << 20);
    let p = Partition::new(vec![0xff; 255]).unwrap();
    let key = |i: usize| {
        let mut k = vec![0xfe; limits.max_key_bytes];
        k[..8].copy_from_slice(&(i as u64).to_be_bytes());
        k
    };
    let n = limits.max_batch_ops;
    // The guarded keys exist.
    let mut seed = Batch::new();
    for i in 0..n {
        seed = seed.put(key(i), b"x".to_vec());
    }
    assert_eq!(store.apply(&p, &seed).unwrap(), Outcome::Committed);
    let mut batch = Batch::new();
    for i in 0..n {
        batch = batch.present(key(i));
    }
    batch = batch.delete_range(KeyRange::all());
    let puts = n - 1;
    let fixed = n * limits.max_key_bytes + puts * limits.max_key_bytes;
    let value_bytes = limits.max_batch_bytes - fixed;
    for i in 0..puts {
        let share = value_bytes / puts + usize::from(i < value_bytes % puts);
        batch = batch.put(key(i + 1), vec![i as u8; share]);
    }
    assert_eq!(
        batch.validate_within(&limits).unwrap(),
        limits.max_batch_bytes
    );
    assert_eq!(store.apply(&p, &batch).unwrap(), Outcome::Committed);
    assert_eq!(store.get(&p, &key(0)).unwrap(), None);
    let last = store.get(&p, &key(puts)).unwrap().expect("last put");
    assert_eq!(last[0], (puts - 1) as u8);
}

/// The negative control of `lost_answer_is_sent_again_and_commits_once` and
/// `a_refusal_after_a_lost_answer_aborts_the_copy_still_on_its_way`: without the commit marker
/// checked on the resend (and without the abort), a lost answer makes the store apply a batch
/// twice, misreport a committed claim as refused, and let a held copy commit after the store
/// reported `PreconditionFailed`.
#[cfg(feature = "etcd-test-hooks")]
#[test]
fn without_the_commit_marker_a_lost_answer_applies_twice() {
    let etcd = EtcdServer::start();
    let raw = RawEtcd::new(&etcd.endpoint());
    let proxy = FaultProxy::start(&etcd.endpoint());
    let store = EtcdStore::builder(proxy.endpoint())
        .prefix(ROOT)
        .without_commit_marker()
        .open()
        .unwrap();
    warm(&store);
    let p = part("control");
    proxy.plan(&[Fault::DropAnswer]);
    assert_eq!(
        store.apply(&p, &claim(b"k")).unwrap(),
        Outcome::PreconditionFailed { index: 0 },
        "without the marker, the resend is refused by the batch's own write"
    );
    proxy.plan(&[Fault::DropAnswer]);
    let put = Batch::new().put(b"n".to_vec(), b"1".to_vec());
    assert_eq!(store.apply(&p, &put).unwrap(), Outcome::Committed);
    let (_, version) = raw.get(&row_key(ROOT, b"control", b"n")).unwrap();
    assert_eq!(version, 2, "without the marker the put applies twice");

    // A held copy commits after the store reported the batch refused.
    let seed = Batch::new().put(b"h".to_vec(), b"v0".to_vec());
    assert_eq!(store.apply(&p, &seed).unwrap(), Outcome::Committed);
    proxy.plan(&[Fault::Hold]);
    let batch = Batch::new()
        .equals(b"h".to_vec(), b"v1".to_vec())
        .put(b"h".to_vec(), b"late".to_vec());
    assert_eq!(
        store.apply(&p, &batch).unwrap(),
        Outcome::PreconditionFailed { index: 0 }
    );
    raw.put_txn(&row_key(ROOT, b"control", b"h"), b"v1");
    proxy.release_held();
    assert_eq!(
        store.get(&p, b"h").unwrap(),
        Some(b"late".to_vec()),
        "without the abort the held copy commits"
    );
}
