//! The store contract over etcd's v3 JSON gateway (SPEC S9, S11; feature `etcd`).
//!
//! Owns: the etcd backend, [`EtcdStore`]: key layout ([`keys`]), transactions ([`txn`]) and the
//! blocking HTTP client ([`client`]). Calls nothing above the store. docs/etcd.md describes the
//! mapping, the limits and the fault handling.
//!
//! Lock order: the lease mutex is the only lock; it is held while a new lease is granted (one
//! request, once per half lease lifetime) and never while a batch is sent.

mod client;
mod keys;
mod txn;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;

use self::client::{Client, Failure, LeaseGrantResponse, PutResponse, RangeResponse, TxnResponse};
use self::keys::{Layout, b64, encode_range, successor};
use self::txn::{RESERVED_OPS, Txn};
use super::{
    Batch, Cursor, KeyRange, Outcome, Partition, ScanPage, Store, StoreLimits, StoreStats,
    check_key_within, check_limit, refuse_deadlines,
};
use crate::clock::{SharedClock, SystemClock};
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

/// Key-value pairs as etcd answered them.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// Builds an [`EtcdStore`]. See [`EtcdStore::builder`].
#[derive(Debug, Clone)]
pub struct EtcdStoreBuilder {
    endpoint: String,
    root: Vec<u8>,
    clock: SharedClock,
    timeout: Duration,
    attempts: u32,
    marker_ttl: Duration,
    max_txn_ops: usize,
    max_request_bytes: usize,
    connections: usize,
    #[cfg(feature = "etcd-test-hooks")]
    no_marker: bool,
}

impl EtcdStoreBuilder {
    /// The root prefix of every key this store writes (default `portcullis/`). Stores that share
    /// one etcd need roots of which none is a prefix of another.
    pub fn prefix(mut self, root: impl Into<Vec<u8>>) -> Self {
        self.root = root.into();
        self
    }

    /// The clock [`Store::now_ms`] reads (default: the system clock). etcd evaluates no
    /// deadline, so nothing in the store depends on it.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long one request may take before its answer counts as lost (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times a request is sent before giving up (default 4; at least 1). A write whose
    /// answer was lost is sent again unchanged: its commit marker makes a second commit
    /// impossible.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// How long commit markers live (default 10 minutes, at least 10 s). A request must never
    /// be delayed longer than half of this inside the network or etcd (docs/etcd.md).
    pub fn marker_ttl(mut self, ttl: Duration) -> Self {
        self.marker_ttl = ttl.max(Duration::from_secs(10));
        self
    }

    /// The server's `--max-txn-ops` (default 128), from which the batch limits are derived.
    pub fn max_txn_ops(mut self, ops: usize) -> Self {
        self.max_txn_ops = ops;
        self
    }

    /// The server's `--max-request-bytes` (default 1.5 MiB), from which the batch limits are
    /// derived.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// Idle connections kept for reuse (default 64): at least the number of threads that use
    /// the store at once, or connections are opened and closed per request.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections.max(1);
        self
    }

    /// Test hook: send batches without a commit marker, so a lost answer followed by a resend
    /// can apply a batch twice (the negative control of the fault tests).
    #[cfg(feature = "etcd-test-hooks")]
    pub fn without_commit_marker(mut self) -> Self {
        self.no_marker = true;
        self
    }

    /// Connects: names this client (one put) and grants the lease its commit markers live on.
    /// Fails with [`Error::Unavailable`] when etcd cannot be reached.
    pub fn open(self) -> Result<EtcdStore> {
        if self.root.is_empty() || self.root.len() > 64 {
            return Err(Error::invalid("an etcd root prefix must be 1 to 64 bytes"));
        }
        let max_ops = self.max_txn_ops.saturating_sub(RESERVED_OPS) / 2;
        if max_ops < 8 || self.max_request_bytes < REQUEST_OVERHEAD_BYTES + 64 * 1024 {
            return Err(Error::invalid(format!(
                "etcd limits of {} operations and {} bytes per request leave no room for a \
                 batch; use etcd's defaults (128, 1.5 MiB) or larger",
                self.max_txn_ops, self.max_request_bytes
            )));
        }
        let batch_bytes = self.max_request_bytes - REQUEST_OVERHEAD_BYTES;
        let limits = StoreLimits::DEFAULT
            .with_max_batch_ops(max_ops)
            .with_max_batch_bytes(batch_bytes)
            .with_max_value_bytes(batch_bytes - super::MAX_KEY_BYTES);
        let client = Client::new(&self.endpoint, self.timeout, self.connections)?;
        let layout = Layout::new(self.root);
        let store = EtcdStore {
            client,
            layout,
            clock: self.clock,
            limits,
            attempts: self.attempts,
            marker_ttl: self.marker_ttl,
            client_id: 0,
            seq: AtomicU64::new(0),
            lease: Mutex::new(Lease {
                id: 0,
                granted: Instant::now(),
            }),
            batches: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            #[cfg(feature = "etcd-test-hooks")]
            no_marker: self.no_marker,
        };
        let named: PutResponse = store.request(
            "/v3/kv/put",
            &json!({"key": b64(&store.layout.client_key())}),
        )?;
        let mut store = store;
        store.client_id = named.header.revision.0 as u64;
        store.renew_lease(&mut store.lease.lock())?;
        log::info!(
            "etcd store opened at {} (client {}, root {})",
            store.client.endpoint(),
            store.client_id,
            store.layout.root().escape_ascii()
        );
        Ok(store)
    }
}

#[derive(Debug)]
struct Lease {
    id: i64,
    granted: Instant,
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
    marker_ttl: Duration,
    /// The revision of this client's put at open: unique among every client of the cluster.
    client_id: u64,
    seq: AtomicU64,
    lease: Mutex<Lease>,
    batches: AtomicU64,
    closed: AtomicBool,
    #[cfg(feature = "etcd-test-hooks")]
    no_marker: bool,
}

impl EtcdStore {
    /// A builder for a store on etcd at `endpoint` (`host:port` or `http://host:port`).
    pub fn builder(endpoint: impl Into<String>) -> EtcdStoreBuilder {
        EtcdStoreBuilder {
            endpoint: endpoint.into(),
            root: b"portcullis/".to_vec(),
            clock: Arc::new(SystemClock),
            timeout: Duration::from_secs(10),
            attempts: 4,
            marker_ttl: Duration::from_secs(600),
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
            max_request_bytes: ETCD_DEFAULT_MAX_REQUEST_BYTES,
            connections: 64,
            #[cfg(feature = "etcd-test-hooks")]
            no_marker: false,
        }
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
        let mut last = None;
        for attempt in 0..self.attempts {
            if attempt > 0 {
                backoff(attempt);
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

    /// Grants a fresh lease for commit markers. Called with the lease mutex held.
    fn renew_lease(&self, lease: &mut Lease) -> Result<()> {
        let ttl = self.marker_ttl.as_secs();
        let granted: LeaseGrantResponse =
            self.request("/v3/lease/grant", &json!({"TTL": ttl.to_string()}))?;
        *lease = Lease {
            id: granted.id.0,
            granted: Instant::now(),
        };
        log::debug!("etcd store {}: marker lease {:x}", self.client_id, lease.id);
        Ok(())
    }

    /// The lease for a marker written now: one with at least half its lifetime left.
    fn lease_id(&self, force_new: bool) -> Result<i64> {
        let mut lease = self.lease.lock();
        if force_new || lease.granted.elapsed() > self.marker_ttl / 2 {
            self.renew_lease(&mut lease)?;
        }
        Ok(lease.id)
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

fn backoff(attempt: u32) {
    // 20 ms, 80 ms, 320 ms, then 1 s: enough for a leader election, short for a dropped
    // connection.
    let ms = (20u64 << (2 * attempt.min(4) - 2)).min(1000);
    std::thread::sleep(Duration::from_millis(ms));
}

impl Store for EtcdStore {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        check_key_within(key, &self.limits)?;
        let k = Layout::data_key(&self.layout.data_prefix(p), key);
        let answer: RangeResponse = self.request("/v3/kv/range", &json!({"key": b64(&k)}))?;
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
        let range = match cursor {
            Some(c) => range.after(&c.0),
            None => range.clone(),
        };
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
        self.check_open()?;
        batch.validate_within(&self.limits)?;
        refuse_deadlines(batch, "etcd")?;
        let prefix = self.layout.data_prefix(p);
        let registry = self.layout.registry_key(p);
        let build = || {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            Txn::build(
                &prefix,
                &registry,
                &self.layout.marker_key(self.client_id, seq),
                batch,
            )
        };
        #[cfg_attr(not(feature = "etcd-test-hooks"), allow(unused_mut))]
        let mut txn = build();
        let mut maybe_sent: Option<String> = None;
        let mut last = String::new();
        let mut new_lease = false;
        for attempt in 0..self.attempts {
            if attempt > 0 {
                backoff(attempt);
                #[cfg(feature = "etcd-test-hooks")]
                if self.no_marker {
                    // The negative control: every attempt under a fresh marker, so a resend
                    // cannot see that an earlier attempt committed.
                    txn = build();
                }
            }
            let body = txn.body(self.lease_id(new_lease)?);
            new_lease = false;
            match self.client.post::<TxnResponse>("/v3/kv/txn", &body) {
                Ok(answer) => {
                    let outcome = txn.outcome(&answer)?;
                    if outcome.is_committed() {
                        self.batches.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(outcome);
                }
                Err(Failure::Refused {
                    code: 5,
                    ref message,
                }) if message.contains("lease") => {
                    // The marker's lease is gone (expired, revoked): etcd applied nothing.
                    log::warn!(
                        "etcd store {}: marker lease lost ({message}); granting another",
                        self.client_id
                    );
                    new_lease = true;
                    last = message.clone();
                }
                Err(f) if f.is_transient() => {
                    last = f.describe(self.client.endpoint());
                    if !matches!(f, Failure::NotSent(_)) {
                        log::warn!(
                            "etcd store {}: the answer to a batch on {p} was lost ({last}); sending it again",
                            self.client_id
                        );
                        maybe_sent = Some(last.clone());
                    }
                }
                Err(f) => {
                    if let Some(earlier) = maybe_sent {
                        // A later attempt was refused, but an earlier one may have committed.
                        return Err(Error::OutcomeUnknown {
                            partition: p.to_string(),
                            detail: format!(
                                "{earlier}, then {}",
                                f.describe(self.client.endpoint())
                            ),
                        });
                    }
                    return Err(self.refusal(f));
                }
            }
        }
        match maybe_sent {
            Some(earlier) => Err(Error::OutcomeUnknown {
                partition: p.to_string(),
                detail: format!(
                    "{earlier}; {} attempts, none answered (last: {last})",
                    self.attempts
                ),
            }),
            None => Err(Error::Unavailable {
                reason: format!(
                    "{last} (after {} attempts, nothing was applied)",
                    self.attempts
                ),
                retry_after_ms: 1000,
            }),
        }
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
        Ok(answer.count.0 > 0)
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
        // The marker lease is left to expire: revoking it would delete markers that a request
        // still in flight may need.
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}
