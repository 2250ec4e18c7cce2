//! Owner liveness (SPEC F12): this engine's incarnation is live while it renews the lease on
//! its owner's lease row (`s/engine`, `owner.lease/<owner id>`), and other owners judge a
//! holder live or not by reading that row.
//!
//! A renewal writes the lease until `now + owner_lease`, guarded on the incarnation row still
//! being this incarnation's: if it is not, another engine with this owner id opened after this
//! one's lease expired (it took this one for crashed) and this engine is *superseded*: it
//! stops serving everything for good. The engine takes itself for live only until
//! `start of its last successful renewal + owner_lease - lease_margin`: other engines read the
//! lease on their own clocks, which may run ahead by less than the margin, so it stops serving
//! before any of them can see the lease expired. A call made after that renews first, on its
//! own thread (a renewal on demand), so an engine whose background renewals were late (or off)
//! never serves on a lapsed lease.
//!
//! The background renewal runs on the engine's background thread (`background.rs`: one per
//! engine, so a slow store delays only its own engine's renewals), every
//! `(owner_lease - lease_margin) / 2` of real time; the lease itself is on the engine's clock
//! (SPEC E4), so a manual clock decides when it expires. The re-reading
//! of the held namespaces that a renewal also does (prompt deposition) is in `owner.rs`.
//!
//! Calls: the store (the system partition) and the clock. Locks: `renewing` is held across a
//! renewal's store calls; nothing else is taken under it except the owners' map (leaf).

use std::sync::Arc;
use std::time::Duration;

use crate::sync::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::incarnation::{self, Incarnation, LeaseRow, system_partition};
use crate::clock::SharedClock;
use crate::error::{Error, Result};
use crate::log::encode_row;
use crate::store::{Batch, Outcome, Store};

/// The default owner lease (SPEC F12): see
/// [`EngineBuilder::owner_lease`](super::EngineBuilder::owner_lease).
///
/// # Examples
///
/// ```
/// use portcullis::engine::DEFAULT_OWNER_LEASE;
/// // Renewed every 2.5 s with the fence's default 5 s margin.
/// assert_eq!(DEFAULT_OWNER_LEASE.as_secs(), 10);
/// ```
pub const DEFAULT_OWNER_LEASE: Duration = Duration::from_secs(10);

/// Whether a holder named in an owner row is live, as its lease row says now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HolderLease {
    pub(crate) live: bool,
    /// When its lease expires (if it has one for that incarnation).
    pub(crate) expires_at_ms: Option<u64>,
}

/// This engine's lease (see the module documentation).
pub(crate) struct Liveness {
    store: Arc<dyn Store>,
    clock: SharedClock,
    owner: String,
    incarnation: Incarnation,
    lease_ms: u64,
    margin_ms: u64,
    /// This engine takes itself for live until then (engine clock, ms).
    valid_until: AtomicU64,
    /// The incarnation of this owner id that superseded this one (0: none).
    superseded_by: AtomicU64,
    /// No renewal any more (closed, or crashed in a test).
    ended: AtomicBool,
    /// Held across a renewal's store calls, so calls that find the lease lapsed renew once.
    pub(super) renewing: Mutex<()>,
    renewals: AtomicU64,
    failures: AtomicU64,
    /// Why the most recent renewal failed, until one succeeds (SPEC E8: the engine is
    /// degraded meanwhile).
    last_failure: Mutex<Option<String>>,
}

impl Liveness {
    /// The lease `incarnation::begin` wrote at `began_at_ms`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        clock: SharedClock,
        owner: String,
        incarnation: Incarnation,
        (lease_ms, margin_ms): (u64, u64),
        began_at_ms: u64,
    ) -> Self {
        Liveness {
            store,
            clock,
            owner,
            incarnation,
            lease_ms,
            margin_ms,
            valid_until: AtomicU64::new(valid_until(began_at_ms, lease_ms, margin_ms)),
            superseded_by: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            renewing: Mutex::new(()),
            renewals: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            last_failure: Mutex::new(None),
        }
    }

    /// Records how a renewal ended: a failure stands until a renewal succeeds. A renewal
    /// refused because the engine closed is neither.
    pub(crate) fn note_renewal(&self, outcome: &Result<()>) {
        match outcome {
            Ok(()) => *self.last_failure.lock() = None,
            Err(Error::Closed) => {}
            Err(e) => *self.last_failure.lock() = Some(e.to_string()),
        }
    }

    /// Why the most recent renewal failed, if it did and none succeeded since.
    pub(crate) fn renewal_failure(&self) -> Option<String> {
        self.last_failure.lock().clone()
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Whether this engine may serve now: superseded never, else until `valid_until`.
    #[inline]
    pub(crate) fn valid_now(&self) -> bool {
        self.superseded_by.load(Ordering::Acquire) == 0
            && self.clock.now_ms() < self.valid_until.load(Ordering::Acquire)
    }

    pub(crate) fn valid_until_ms(&self) -> u64 {
        self.valid_until.load(Ordering::Acquire)
    }

    /// How long this engine may still serve (0 once superseded or lapsed), and whether a
    /// renewal is due: at most half the validity is left (the background renewal renews every
    /// half validity), when a write renews first rather than plan on what is left. One clock
    /// read: every engine write asks.
    pub(crate) fn validity_left(&self) -> (u64, bool) {
        if self.superseded_by.load(Ordering::Acquire) != 0 {
            return (0, true);
        }
        let left = self
            .valid_until
            .load(Ordering::Acquire)
            .saturating_sub(self.clock.now_ms());
        let half = self.lease_ms.saturating_sub(self.margin_ms) / 2;
        (left, left <= half)
    }

    /// Renewals that succeeded and failed so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.renewals.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }

    /// The refusal of a superseded engine, if it is one.
    pub(crate) fn superseded(&self) -> Option<Error> {
        let by = self.superseded_by.load(Ordering::Acquire);
        (by != 0).then(|| Error::OwnerLive {
            owner: self.owner.clone(),
            incarnation: by,
            expires_in_ms: 0,
            detail: format!(
                "this engine (incarnation {}) let its lease expire and a newer engine with its \
                 owner id took it for crashed; it serves nothing any more: close it",
                self.incarnation.number
            ),
        })
    }

    /// Writes the lease until `started + owner_lease` (the caller holds `renewing`). Answers
    /// the start time, from which `commit` sets `valid_until` once the held namespaces were
    /// re-read too.
    /// `unguarded` is a test-only negative control (the write is not guarded on the incarnation
    /// row).
    pub(crate) fn write_lease(&self, unguarded: bool) -> Result<u64> {
        if let Some(e) = self.superseded() {
            return Err(e);
        }
        if self.ended.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let started = self.clock.now_ms();
        let p = system_partition();
        let lease = encode_row(&LeaseRow {
            incarnation: self.incarnation.number,
            expires_at_ms: started.saturating_add(self.lease_ms),
            handle: self.store.exclusive_handle().unwrap_or(0),
        });
        let guard = if unguarded {
            Batch::new()
        } else {
            Batch::new().equals(
                self.incarnation.key.clone(),
                self.incarnation.written.clone(),
            )
        };
        let batch = guard.put(self.incarnation.lease_key.clone(), lease);
        match self.store.apply(&p, &batch) {
            Ok(Outcome::Committed) => Ok(started),
            Ok(_) => {
                // Another engine with this owner id began an incarnation: ours is over.
                let by = incarnation::read_owner(&*self.store, &self.owner)
                    .ok()
                    .and_then(|rows| rows.incarnation)
                    .filter(|n| *n != self.incarnation.number)
                    .unwrap_or(u64::MAX);
                self.superseded_by.store(by, Ordering::Release);
                ::log::error!(
                    "owner {:?} incarnation {} was superseded by incarnation {by} (its lease had \
                     expired); it stops serving",
                    self.owner,
                    self.incarnation.number
                );
                Err(self.superseded().expect("just set"))
            }
            Err(e) => {
                self.failed();
                Err(e)
            }
        }
    }

    /// A renewal that started at `started` and re-read every held namespace succeeded.
    pub(crate) fn commit(&self, started: u64) {
        self.valid_until.fetch_max(
            valid_until(started, self.lease_ms, self.margin_ms),
            Ordering::AcqRel,
        );
        self.renewals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the holder `owner`/`incarnation` of some namespace is live now, as its lease
    /// row says on this engine's clock (one store read).
    pub(crate) fn holder(&self, owner: &str, incarnation: u64) -> Result<HolderLease> {
        let lease = incarnation::read_owner(&*self.store, owner)?
            .lease
            .filter(|l| l.incarnation == incarnation);
        let reader = self.store.exclusive_handle();
        Ok(HolderLease {
            live: lease.is_some_and(|l| l.live_at(self.clock.now_ms(), reader)),
            expires_at_ms: lease.map(|l| l.expires_at_ms),
        })
    }

    /// No renewal from now on (close, or a crash in a test).
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// Test-only: lets the lease lapse at once, as if its time had passed (the engine crashed
    /// and nobody renews it any more). Guarded on the incarnation row still being ours.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn lapse(&self) -> Result<()> {
        self.end();
        let batch = Batch::new()
            .equals(
                self.incarnation.key.clone(),
                self.incarnation.written.clone(),
            )
            .delete(self.incarnation.lease_key.clone());
        self.store.apply(&system_partition(), &batch).map(|_| ())
    }
}

fn valid_until(started: u64, lease_ms: u64, margin_ms: u64) -> u64 {
    started.saturating_add(lease_ms.saturating_sub(margin_ms))
}
