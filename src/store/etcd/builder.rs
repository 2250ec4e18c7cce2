//! Configuration and opening of an [`EtcdStore`].

use crate::sync::HashSet;
use crate::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use crate::sync::{Mutex, RwLock};
use serde_json::json;

use super::client::{Client, PutResponse};
use super::group::Grouper;
use super::keys::{Layout, b64};
use super::txn::RESERVED_OPS;
use super::{
    ETCD_DEFAULT_MAX_REQUEST_BYTES, ETCD_DEFAULT_MAX_TXN_OPS, EtcdStore, REQUEST_OVERHEAD_BYTES,
};
use crate::clock::{SharedClock, SystemClock};
use crate::error::{Error, Result};
use crate::store::{MAX_KEY_BYTES, StoreLimits};

/// Builds an [`EtcdStore`]. See [`EtcdStore::builder`].
#[derive(Debug, Clone)]
pub struct EtcdStoreBuilder {
    endpoint: String,
    root: Vec<u8>,
    clock: SharedClock,
    timeout: Duration,
    attempts: u32,
    max_txn_ops: usize,
    max_request_bytes: usize,
    connections: usize,
    in_flight: usize,
    #[cfg(feature = "etcd-test-hooks")]
    no_marker: bool,
    #[cfg(feature = "etcd-test-hooks")]
    group_hook: HookSlot,
    #[cfg(feature = "etcd-test-hooks")]
    group_overlapping: bool,
    #[cfg(feature = "etcd-test-hooks")]
    group_past_limits: bool,
}

impl EtcdStoreBuilder {
    pub(super) fn new(endpoint: String) -> Self {
        EtcdStoreBuilder {
            endpoint,
            root: b"portcullis/".to_vec(),
            clock: Arc::new(SystemClock),
            timeout: Duration::from_secs(10),
            attempts: 4,
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
            max_request_bytes: ETCD_DEFAULT_MAX_REQUEST_BYTES,
            connections: 64,
            in_flight: 2,
            #[cfg(feature = "etcd-test-hooks")]
            no_marker: false,
            #[cfg(feature = "etcd-test-hooks")]
            group_hook: HookSlot::default(),
            #[cfg(feature = "etcd-test-hooks")]
            group_overlapping: false,
            #[cfg(feature = "etcd-test-hooks")]
            group_past_limits: false,
        }
    }

    /// The root prefix of every key this store writes (default `portcullis/`, 1 to 64 bytes).
    /// Stores that share one etcd need roots of which none is a prefix of another.
    pub fn prefix(mut self, root: impl Into<Vec<u8>>) -> Self {
        self.root = root.into();
        self
    }

    /// The clock [`Store::now_ms`](crate::store::Store::now_ms) reads (default: the system
    /// clock). etcd evaluates no deadline, so nothing in the store depends on it.
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long etcd may stay silent (on one read or write of a request) before the request's
    /// answer counts as lost (default 10 s); also the bound on making a connection.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times a request is sent before giving up (default 4; at least 1). A batch
    /// whose answer was lost is sent again under the same commit marker, which makes a second
    /// commit impossible.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
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

    /// Group commit (default 2): how many transactions the store keeps in flight at once.
    /// Batches applied while that many are in flight wait, and the next transaction to go
    /// carries every waiting batch that fits with it (none writes what another writes or
    /// guards; within etcd's limits), so etcd logs and syncs one request for all of them. A
    /// batch applied with room to spare goes at once, alone. 0 turns grouping off: every batch
    /// is sent at once in its own transaction. Each batch's outcome is its own (docs/etcd.md).
    pub fn group_commit(mut self, in_flight: usize) -> Self {
        self.in_flight = in_flight;
        self
    }

    /// Test hook: called with the batches (and their partitions) of every transaction a first
    /// attempt goes in, before it is sent, outside the store's locks.
    #[cfg(feature = "etcd-test-hooks")]
    pub fn on_group(
        mut self,
        hook: impl Fn(&[(crate::store::Partition, crate::store::Batch)]) + Send + Sync + 'static,
    ) -> Self {
        self.group_hook = HookSlot(Some(std::sync::Arc::new(hook)));
        self
    }

    /// Test hook: batches that overlap share transactions too (the negative control of the
    /// group commit's overlap rule).
    #[cfg(feature = "etcd-test-hooks")]
    pub fn group_overlapping(mut self) -> Self {
        self.group_overlapping = true;
        self
    }

    /// Test hook: batches share transactions past etcd's limits too (the negative control of
    /// the group commit's limits).
    #[cfg(feature = "etcd-test-hooks")]
    pub fn group_past_limits(mut self) -> Self {
        self.group_past_limits = true;
        self
    }

    /// Test hook: each attempt of a batch under a fresh commit marker, so a resend after a lost
    /// answer cannot see that an earlier copy committed (the negative control of the fault
    /// tests).
    #[cfg(feature = "etcd-test-hooks")]
    pub fn without_commit_marker(mut self) -> Self {
        self.no_marker = true;
        self
    }

    /// Connects and names this client (one put, whose revision is unique in the cluster).
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
            .with_max_value_bytes(batch_bytes - MAX_KEY_BYTES);
        let client = Client::new(&self.endpoint, self.timeout, self.connections)?;
        let mut store = EtcdStore {
            client,
            layout: Layout::new(self.root),
            clock: self.clock,
            limits,
            attempts: self.attempts,
            client_id: 0,
            seq: AtomicU64::new(1),
            slots: Mutex::new(Vec::new()),
            next_slot: AtomicU64::new(0),
            known: RwLock::new(HashSet::default()),
            group: (self.in_flight > 0).then(|| {
                #[cfg_attr(not(feature = "etcd-test-hooks"), allow(unused_mut))]
                let mut group =
                    Grouper::new(self.in_flight, self.max_txn_ops, self.max_request_bytes);
                #[cfg(feature = "etcd-test-hooks")]
                {
                    group.hook = self.group_hook.0.clone();
                    group.group_overlapping = self.group_overlapping;
                    group.group_past_limits = self.group_past_limits;
                }
                group
            }),
            batches: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            #[cfg(feature = "etcd-test-hooks")]
            no_marker: self.no_marker,
            #[cfg(test)]
            compact_before_read_back: AtomicBool::new(false),
            #[cfg(test)]
            compactions: AtomicU64::new(0),
        };
        let named: PutResponse = store.request(
            "/v3/kv/put",
            &json!({"key": b64(&store.layout.client_key())}),
        )?;
        store.client_id = u64::try_from(named.header.revision.0).unwrap_or(0);
        log::info!(
            "etcd store opened at {} (client {}, root {})",
            store.client.endpoint(),
            store.client_id,
            store.layout.root().escape_ascii()
        );
        Ok(store)
    }
}

/// The group hook of a builder (printed as whether there is one).
#[cfg(feature = "etcd-test-hooks")]
#[derive(Clone, Default)]
struct HookSlot(Option<super::group::GroupHook>);

#[cfg(feature = "etcd-test-hooks")]
impl std::fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Some(hook)"
        } else {
            "None"
        })
    }
}
