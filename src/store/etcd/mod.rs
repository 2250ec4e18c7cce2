//! The store contract over etcd's v3 JSON gateway (SPEC S9, S11; feature `etcd`).
//!
//! Owns: the etcd backend, [`EtcdStore`]: key layout ([`keys`]), transactions ([`txn`]) and the
//! blocking HTTP client ([`client`]). Calls nothing above the store. docs/etcd.md describes the
//! mapping, the limits and the fault handling.
//!
//! Locks: the pool of marker slots and the set of partitions known to exist, each held only to
//! take or put back an entry, never across a request and never both at once; the group
//! commit's queue ([`group`]), never held with either.

mod apply;
mod builder;
mod client;
mod group;
mod json;
mod keys;
#[cfg(test)]
mod live_tests;
mod normalise;
mod txn;

pub use builder::EtcdStoreBuilder;

use crate::sync::HashSet;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::sync::{Mutex, RwLock};
use serde_json::json;

use self::client::{Client, Failure, RangeResponse, TxnResponse};
use self::group::Grouper;
use self::json::Body;
use self::keys::{Layout, b64, encode_range, successor};
use self::txn::{Answer, Txn};
use super::{
    Batch, Cursor, KeyRange, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
    check_key_within, check_limit,
};
use crate::clock::SharedClock;
use crate::error::{Error, Result};

/// etcd's default `--max-txn-ops`.
pub const ETCD_DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const ETCD_DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// Request bytes kept for what the backend adds to a batch's keys and values: partition
/// prefixes on every key, range bounds, compares, the failure branch's reads, the registry key,
/// the marker and protobuf framing (at most about 300 KiB for a batch at the operation limit).
const REQUEST_OVERHEAD_BYTES: usize = 512 * 1024;
/// Keys asked for per range request; a scan page larger than this is read in several requests
/// pinned to the first one's revision.
const RANGE_PAGE: usize = 512;
/// Partitions remembered as existing (so their registry key is not written again); past this
/// many, batches of other partitions simply write it again.
const KNOWN_PARTITIONS: usize = 1 << 20;

/// Key-value pairs as etcd answered them.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// A commit-marker slot of this client: an etcd key, and the value it holds as last known.
/// Only the batch that took the slot changes it, so the value is exact while the slot is free.
#[derive(Debug)]
struct Slot {
    key: Vec<u8>,
    value: Vec<u8>,
}

/// The store contract over etcd (SPEC S9, S11), through etcd's v3 JSON gateway with a blocking
/// HTTP client. Feature `etcd`.
///
/// A partition is a key prefix; a batch is one transaction whose compares are the batch's
/// guards; `Committed` means etcd committed it (durable on a quorum). etcd cannot evaluate
/// `NotAfter`: [`Store::evaluates_deadlines`] is `false` and a batch carrying one is refused.
/// Batches are limited to 63 operations and about 1 MiB by default ([`Store::limits`]). A batch
/// whose answer was lost is sent again, and a commit marker written in the same transaction
/// makes sure it commits at most once; if its fate cannot be learnt the error is
/// [`Error::OutcomeUnknown`], never `Committed`. See docs/etcd.md.
///
/// ```no_run
/// use portcullis::store::{Batch, EtcdStore, Partition, Store};
/// let store = EtcdStore::builder("127.0.0.1:2379").prefix("app/").open()?;
/// let p = Partition::new("accounts")?;
/// store.apply(&p, &Batch::new().absent(b"alice".to_vec()).put(b"alice".to_vec(), b"10".to_vec()))?;
/// # Ok::<(), portcullis::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdStore {
    client: Client,
    layout: Layout,
    clock: SharedClock,
    limits: StoreLimits,
    attempts: u32,
    /// The revision of this client's put at open: unique among every client of the cluster.
    client_id: u64,
    /// Numbers batches (from 1): a slot holding "c" + n says batch n committed.
    seq: AtomicU64,
    /// Marker slots not in use, with the value each holds in etcd.
    slots: Mutex<Vec<Slot>>,
    next_slot: AtomicU64,
    /// Partitions known to exist: their registry key need not be written again.
    known: RwLock<HashSet<Partition>>,
    /// The group commit of first attempts (none: every batch is sent alone).
    group: Option<Grouper>,
    batches: AtomicU64,
    closed: AtomicBool,
    #[cfg(feature = "etcd-test-hooks")]
    no_marker: bool,
    /// Tests: compact etcd past a refusal's revision before reading it back.
    #[cfg(test)]
    compact_before_read_back: AtomicBool,
    #[cfg(test)]
    compactions: AtomicU64,
}

impl EtcdStore {
    /// A builder for a store on etcd at `endpoint` (`host:port` or `http://host:port`).
    pub fn builder(endpoint: impl Into<String>) -> EtcdStoreBuilder {
        EtcdStoreBuilder::new(endpoint.into())
    }

    /// Test hook: batches waiting for a transaction of the group commit.
    #[cfg(feature = "etcd-test-hooks")]
    pub fn waiting_batches(&self) -> usize {
        self.group.as_ref().map_or(0, Grouper::waiting)
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Sends a request that changes nothing (or changes nothing twice), retrying transient
    /// failures.
    fn request<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T> {
        let body = serde_json::to_vec(body).expect("a JSON value always serialises");
        self.request_bytes(path, &body)
    }

    /// [`Self::request`] with a body already written.
    fn request_bytes<T: serde::de::DeserializeOwned>(&self, path: &str, body: &[u8]) -> Result<T> {
        let mut last = None;
        for attempt in 0..self.attempts {
            if attempt > 0 {
                backoff(&*self.clock, attempt);
            }
            match self.client.post(path, body) {
                Ok(answer) => return Ok(answer),
                Err(f) if f.is_transient() => last = Some(f),
                Err(f) => return Err(self.refusal(f)),
            }
        }
        let f = last.expect("at least one attempt");
        Err(Error::Unavailable {
            reason: format!(
                "{} (after {} attempts)",
                f.describe(self.client.endpoint()),
                self.attempts
            ),
            retry_after_ms: 1000,
        })
    }

    fn refusal(&self, f: Failure) -> Error {
        let what = f.describe(self.client.endpoint());
        match f {
            Failure::Refused { code: 3, message }
                if message.contains("too large") || message.contains("too many") =>
            {
                Error::invalid(format!(
                    "{what}; the server's limits are tighter than this store was told (EtcdStoreBuilder::max_txn_ops, max_request_bytes)"
                ))
            }
            Failure::Refused { code: 11, .. } => Error::Unavailable {
                reason: format!("{what}; the revision was compacted while reading, read again"),
                retry_after_ms: 0,
            },
            _ => Error::Unavailable {
                reason: what,
                retry_after_ms: 1000,
            },
        }
    }

    /// A marker slot for one batch: a free one, or a new one (one put, which gives it a value
    /// that no compare of an older copy of any batch can match).
    fn take_slot(&self) -> Result<Slot> {
        if let Some(slot) = self.slots.lock().pop() {
            return Ok(slot);
        }
        let id = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let key = self.layout.marker_key(self.client_id, id);
        let value = b"i".to_vec();
        let _: client::PutResponse = self.request(
            "/v3/kv/put",
            &json!({"key": b64(&key), "value": b64(&value)}),
        )?;
        Ok(Slot { key, value })
    }

    /// Whether resends are protected by the commit marker (always, but for the negative
    /// control of the fault tests).
    fn marker_checked(&self) -> bool {
        #[cfg(feature = "etcd-test-hooks")]
        if self.no_marker {
            return false;
        }
        true
    }

    /// Remembers that `p` exists (a batch of it committed, or etcd said so).
    fn remember(&self, p: &Partition, known: bool) {
        if !known {
            let mut set = self.known.write();
            if set.len() < KNOWN_PARTITIONS {
                set.insert(p.clone());
            }
        }
    }

    /// One range request.
    fn range(
        &self,
        key: &[u8],
        end: &[u8],
        limit: usize,
        revision: i64,
        keys_only: bool,
    ) -> Result<RangeResponse> {
        let mut body = json!({"key": b64(key), "range_end": b64(end), "limit": limit.to_string()});
        if revision > 0 {
            body["revision"] = revision.to_string().into();
        }
        if keys_only {
            body["keys_only"] = true.into();
        }
        self.request("/v3/kv/range", &body)
    }

    /// Up to `limit` entries of `[start, end)`, read at one revision: several requests when
    /// `limit` exceeds one request's page, pinned to the first one's revision. Returns the
    /// entries and whether more follow.
    fn read_range(
        &self,
        start: Vec<u8>,
        end: &[u8],
        limit: usize,
        keys_only: bool,
    ) -> Result<(Rows, bool)> {
        let mut tries = 0;
        'again: loop {
            tries += 1;
            let mut out = Vec::new();
            let mut from = start.clone();
            let mut revision = 0;
            loop {
                let ask = (limit - out.len()).min(RANGE_PAGE);
                let page = match self.range(&from, end, ask, revision, keys_only) {
                    Err(Error::Unavailable {
                        retry_after_ms: 0, ..
                    }) if tries < 3 => continue 'again,
                    other => other?,
                };
                revision = page.header.revision.0;
                let more = page.more;
                out.extend(page.kvs.into_iter().map(|kv| (kv.key.0, kv.value.0)));
                if !more || out.len() >= limit {
                    return Ok((out, more));
                }
                from = successor(&out.last().expect("more implies entries").0);
            }
        }
    }
}

impl EtcdStore {
    /// The slot and the guarded keys of a refused attempt, read at the revision its compares
    /// saw, and what they mean. A compacted revision is `Unavailable` with no pause.
    fn read_back(&self, txn: &Txn<'_>, revision: i64) -> Result<Answer> {
        #[cfg(test)]
        if self.compact_before_read_back.load(Ordering::Relaxed) {
            self.compact_past(revision)?;
        }
        let answer: TxnResponse = self.request_bytes(client::TXN, &txn.read_back_body(revision))?;
        let ranges: Vec<&RangeResponse> = answer
            .responses
            .iter()
            .filter_map(|r| r.response_range.as_ref())
            .collect();
        txn.settle(&ranges)
    }
}

fn backoff(clock: &dyn crate::clock::Clock, attempt: u32) {
    // 20 ms, 80 ms, 320 ms, then 1 s: enough for a leader election, short for a dropped
    // connection.
    let ms = (20u64 << (2 * attempt.min(4) - 2)).min(1000);
    crate::clock::sleep(clock, Duration::from_millis(ms));
}

impl Store for EtcdStore {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        check_key_within(key, &self.limits)?;
        let mut body = Body::with_capacity(64 + 2 * key.len());
        body.raw("{\"key\":")
            .bytes(&[&self.layout.data_prefix(p), key])
            .raw("}");
        let answer: RangeResponse = self.request_bytes(client::RANGE, body.as_bytes())?;
        Ok(answer.kvs.into_iter().next().map(|kv| kv.value.0))
    }

    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.check_open()?;
        for key in keys {
            check_key_within(key, &self.limits)?;
        }
        let prefix = self.layout.data_prefix(p);
        let chunk = ETCD_DEFAULT_MAX_TXN_OPS.min(self.limits.max_batch_ops * 2);
        let mut out = Vec::with_capacity(keys.len());
        // One read-only transaction per chunk of keys, every one at the first one's revision.
        let mut revision = 0i64;
        for chunk in keys.chunks(chunk) {
            let reads: Vec<_> = chunk
                .iter()
                .map(|k| {
                    let mut r = json!({"key": b64(&Layout::data_key(&prefix, k))});
                    if revision > 0 {
                        r["revision"] = revision.to_string().into();
                    }
                    json!({"request_range": r})
                })
                .collect();
            let answer: TxnResponse = self.request("/v3/kv/txn", &json!({"success": reads}))?;
            if revision == 0 {
                revision = answer.header.revision.0;
            }
            if answer.responses.len() != chunk.len() {
                return Err(Error::Unavailable {
                    reason: format!(
                        "etcd at {} answered {} reads of {}",
                        self.client.endpoint(),
                        answer.responses.len(),
                        chunk.len()
                    ),
                    retry_after_ms: 100,
                });
            }
            for r in answer.responses {
                out.push(
                    r.response_range
                        .and_then(|r| r.kvs.into_iter().next())
                        .map(|kv| kv.value.0),
                );
            }
        }
        Ok(out)
    }

    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        self.check_open()?;
        check_limit(limit)?;
        let range = range.resuming(cursor);
        let prefix = self.layout.data_prefix(p);
        let Some((start, end)) = encode_range(&prefix, &range) else {
            return Ok(ScanPage::default());
        };
        let (found, more) = self.read_range(start, &end, limit, false)?;
        let entries: Vec<(Vec<u8>, Vec<u8>)> = found
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_vec(), v))
            .collect();
        let next = match (more, entries.last()) {
            (true, Some((last, _))) => Some(Cursor(last.clone())),
            _ => None,
        };
        Ok(ScanPage { entries, next })
    }

    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        self.apply_batch(p, batch)
    }

    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        self.check_open()?;
        let (start, end) = self.layout.registry_range(prefix);
        let (found, _) = self.read_range(start, &end, usize::MAX, true)?;
        found
            .iter()
            .map(|(k, _)| {
                let name = self.layout.registry_name(k).ok_or_else(|| {
                    Error::corrupt(
                        "etcd partition registry",
                        format!("key {} outside the registry", k.escape_ascii()),
                    )
                })?;
                Partition::new(name)
            })
            .collect()
    }

    fn contains_partition(&self, p: &Partition) -> Result<bool> {
        self.check_open()?;
        let key = self.layout.registry_key(p);
        let answer: RangeResponse = self.request(
            "/v3/kv/range",
            &json!({"key": b64(&key), "count_only": true}),
        )?;
        let exists = answer.count.0 > 0;
        if exists {
            self.remember(p, false);
        }
        Ok(exists)
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// 63 operations (and preconditions) and 1 MiB per batch with etcd's defaults: a batch
    /// becomes at most twice as many etcd operations plus two, within `--max-txn-ops`, and
    /// 512 KiB of `--max-request-bytes` is kept for what the backend adds.
    fn limits(&self) -> StoreLimits {
        self.limits
    }

    /// etcd has no compare on server time (SPEC S11).
    fn evaluates_deadlines(&self) -> bool {
        false
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            batches: self.batches.load(Ordering::Relaxed),
            ..StoreStats::default()
        }
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // The free slots go. A slot in use by a batch still on its way stays, as does one whose
        // batch's fate was unknown (a handful of small keys per process at most): deleting it
        // would fail that batch's compare and leave its outcome misreported.
        let free = std::mem::take(&mut *self.slots.lock());
        for slot in free {
            let body = json!({"key": b64(&slot.key)});
            if let Err(e) = self.request::<serde_json::Value>("/v3/kv/deleterange", &body) {
                log::warn!(
                    "etcd store {}: could not delete its marker slots: {e}",
                    self.client_id
                );
                break;
            }
        }
        Ok(())
    }

    fn backup(&self, dest: &std::path::Path) -> Result<super::BackupReport> {
        Err(Error::invalid(format!(
            "an etcd store is not copied to a directory ({}): back it up with etcd's own snapshot (etcdctl snapshot save), and read docs/etcd.md, \"Backup\", before restoring one: a restore rolls epochs and leases back, and every namespace must declare recovery (mark_lease_table_recovered) before it serves writes",
            dest.display()
        )))
    }
}
