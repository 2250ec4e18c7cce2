//! Tests of the backend's internals against a real etcd (the throwaway server of
//! `tests/common/etcd.rs`): paths no fault of the network can reach from outside.

#[path = "../../../tests/common/etcd.rs"]
#[allow(dead_code)]
mod etcd_support;

use crate::sync::atomic::Ordering;

use serde_json::json;

use super::keys::b64;
use super::{EtcdStore, client};
use crate::error::Result;
use crate::store::{Batch, Outcome, Partition, Store};

impl EtcdStore {
    /// Writes a scratch key and compacts etcd at its revision, beyond `revision` (called
    /// before a refusal is read back, when `compact_before_read_back` is set).
    pub(super) fn compact_past(&self, revision: i64) -> Result<()> {
        let mut key = self.layout.root().to_vec();
        key.push(b't');
        let put: client::PutResponse =
            self.request("/v3/kv/put", &json!({"key": b64(&key), "value": b64(b"t")}))?;
        let at = put.header.revision.0;
        assert!(at > revision);
        let _: serde_json::Value =
            self.request("/v3/kv/compaction", &json!({"revision": at.to_string()}))?;
        self.compactions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A refusal is read back at the revision its compares saw; when that revision was compacted
/// first, the batch is sent again with the reads in its failure branch, and the refusal still
/// names the first guard that failed. Nothing of the batch is applied.
#[test]
fn a_refusal_whose_revision_was_compacted_still_names_its_guard() {
    let etcd = etcd_support::EtcdServer::start();
    let store = EtcdStore::builder(etcd.endpoint())
        .prefix("live/")
        .open()
        .unwrap();
    let p = Partition::new("p").unwrap();
    let seed = Batch::new().put(b"a".to_vec(), b"1".to_vec());
    assert_eq!(store.apply(&p, &seed).unwrap(), Outcome::Committed);

    store
        .compact_before_read_back
        .store(true, Ordering::Relaxed);
    let batch = Batch::new()
        .present(b"a".to_vec())
        .equals(b"a".to_vec(), b"2".to_vec())
        .put(b"b".to_vec(), b"x".to_vec());
    assert_eq!(
        store.apply(&p, &batch).unwrap(),
        Outcome::PreconditionFailed { index: 1 }
    );
    assert_eq!(store.compactions.load(Ordering::Relaxed), 1);
    store
        .compact_before_read_back
        .store(false, Ordering::Relaxed);
    assert_eq!(store.get(&p, b"b").unwrap(), None);

    // Read back as usual, then committed once the guard holds.
    assert_eq!(
        store.apply(&p, &batch).unwrap(),
        Outcome::PreconditionFailed { index: 1 }
    );
    let fix = Batch::new().put(b"a".to_vec(), b"2".to_vec());
    assert_eq!(store.apply(&p, &fix).unwrap(), Outcome::Committed);
    assert_eq!(store.apply(&p, &batch).unwrap(), Outcome::Committed);
    assert_eq!(store.get(&p, b"b").unwrap(), Some(b"x".to_vec()));
    assert_eq!(store.compactions.load(Ordering::Relaxed), 1);
}
