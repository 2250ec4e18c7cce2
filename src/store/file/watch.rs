//! What the file store tells its listener and its stats about itself (SPEC E8): the standing
//! conditions that make it degraded, the compaction counters, the findings of open, and the
//! delivery of its events (see [`crate::observe`], "Delivery").
//!
//! Owns `Watch` (held in `Inner`) and the guard that delivers at the end of a call. Calls only
//! the event hub; the journal keeps its own sync latencies and stalls.

use crate::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::compaction::CompactionReport;
use super::{FileStoreBuilder, Inner, OpenReport};
use crate::error::{Error, Result};
use crate::observe::{CompactionTrigger, Degraded, DegradedCause, Event, Events, Health, Listener};

/// The default stall threshold (see [`FileStoreBuilder::stall_threshold`]).
pub const DEFAULT_STALL_THRESHOLD: Duration = Duration::from_millis(500);

impl FileStoreBuilder {
    /// Tells `listener` what the store does and finds (SPEC E8): commit stalls, failed syncs,
    /// compactions, what open recovered, failed or stopped snapshots, background threads that
    /// ended. The listener is called with no lock of the store held, on the thread that did
    /// the work: at the end of the store call that emitted the event, or of the background
    /// task (see [`crate::observe`], "Delivery"); it may call the store. Default: none (events
    /// cost nothing).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use portcullis::observe::Event;
    /// use portcullis::store::{Batch, FileStore, Partition, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let store = FileStore::builder(dir.path())
    ///     .segment_bytes(4096) // small segments: a few commits seal one
    ///     .auto_compact(false)
    ///     .listener(Arc::new(move |e: &Event| log.lock().unwrap().push(e.name())))
    ///     .open()?;
    /// let p = Partition::new("p")?;
    /// for i in 0..100u32 {
    ///     store.apply(&p, &Batch::new().put("k", i.to_be_bytes()))?;
    /// }
    /// store.compact()?; // delivered before compact returns
    /// assert_eq!(*seen.lock().unwrap(), ["compaction_started", "compaction_finished"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn listener(mut self, listener: Arc<dyn Listener>) -> Self {
        self.events = Events::new(listener, false);
        self.events_inline = true;
        self
    }

    /// A journal sync, or a group-commit leader's wait for the commits under way, that takes
    /// longer than this is a commit stall: counted in
    /// [`StoreStats::stalls`](crate::store::StoreStats::stalls) and told to the listener
    /// ([`Event::CommitStall`]). Default: 500 ms.
    ///
    /// # Examples
    ///
    /// ```
    /// use portcullis::store::{FileStore, Store};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let dir = tempfile::tempdir().expect("a temporary directory");
    /// let store = FileStore::builder(dir.path())
    ///     .stall_threshold(std::time::Duration::from_millis(50))
    ///     .open()?;
    /// assert_eq!(store.stats().stalls, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stall_threshold(mut self, threshold: Duration) -> Self {
        self.stall_threshold = threshold;
        self
    }

    /// The hub of the engine that opens this store: its events go to the engine's listener,
    /// and the engine delivers them (its calls may hold its own locks around a store call).
    pub(crate) fn engine_events(mut self, events: Events) -> Self {
        self.events = events;
        self.events_inline = false;
        self
    }

    /// Test only (feature `test-hooks`): [`listener`](Self::listener) with the lock rule's
    /// negative control: each event is handed to the listener where it is emitted, under
    /// whatever lock the emitting code holds. Never use this outside a negative control.
    #[cfg(feature = "test-hooks")]
    pub fn listener_at_emit_for_test(mut self, listener: Arc<dyn Listener>) -> Self {
        self.events = Events::new(listener, true);
        self.events_inline = true;
        self
    }
}

/// The store's health and counters beyond the journal's.
#[derive(Debug, Default)]
pub(super) struct Watch {
    pub(super) health: Health,
    compactions_failed: AtomicU64,
    bytes_copied: AtomicU64,
    bytes_removed: AtomicU64,
    /// Test only: the periodic sync thread panics at its next round.
    #[cfg(feature = "test-hooks")]
    pub(super) kill_syncer: crate::sync::atomic::AtomicBool,
}

impl Watch {
    pub(super) fn compactions_failed(&self) -> u64 {
        self.compactions_failed.load(Ordering::Relaxed)
    }

    pub(super) fn bytes_copied(&self) -> u64 {
        self.bytes_copied.load(Ordering::Relaxed)
    }

    pub(super) fn bytes_removed(&self) -> u64 {
        self.bytes_removed.load(Ordering::Relaxed)
    }
}

/// Delivers the store's events when dropped, if the store delivers on its callers' threads
/// (opened on its own, not by an engine: see [`Inner::deliver_after_call`]).
pub(super) struct DeliverAfter<'a>(&'a Inner);

impl Drop for DeliverAfter<'_> {
    fn drop(&mut self) {
        if self.0.config.events_inline {
            self.0.config.events.deliver();
        }
    }
}

impl Inner {
    /// A guard, taken first in a public call (so it drops after every lock of the call), that
    /// delivers the events the call emitted. A store an engine opened leaves that to the
    /// engine, which may hold its own locks around the call.
    #[inline]
    pub(super) fn deliver_after_call(&self) -> DeliverAfter<'_> {
        DeliverAfter(self)
    }

    /// Delivers from a background task of the store's own, which holds no lock of the store
    /// or of an engine.
    pub(super) fn deliver_in_background(&self) {
        self.config.events.deliver();
    }

    /// The gravest condition standing now, if any (SPEC E8).
    pub(super) fn degraded(&self) -> Option<Degraded> {
        let latched = self.journal.failed().map(|reason| {
            Degraded::new(
                DegradedCause::SyncFailed,
                format!(
                    "a journal write or sync failed and every commit is refused: {reason}; reopen the store (it re-reads what reached the disk)"
                ),
            )
        });
        self.watch.health.worst(latched)
    }

    /// A background heads snapshot failed (or panicked) with `error`.
    pub(super) fn snapshot_failed(&self, error: String) {
        self.watch.health.set(
            DegradedCause::SnapshotFailed,
            format!(
                "a background heads snapshot failed: {error}; the next open scans more journal, and compaction waits for a snapshot"
            ),
        );
        self.config.events.emit(|| Event::SnapshotFailed { error });
    }

    /// A heads snapshot was written: a failure before it no longer stands.
    pub(super) fn snapshot_written(&self) {
        self.watch.health.clear(DegradedCause::SnapshotFailed);
    }

    /// The store stopped writing heads snapshots (a damaged page of the one open read).
    pub(super) fn snapshots_stopped(&self) {
        let reason = "a page of the heads snapshot is damaged, so no snapshot is written any more; reopen the store to rebuild the heads from the journal".to_owned();
        self.watch
            .health
            .set(DegradedCause::SnapshotsStopped, reason.clone());
        self.config
            .events
            .emit(|| Event::SnapshotsStopped { reason });
    }

    /// A background thread of the store ended without being asked to.
    pub(super) fn thread_ended(&self, thread: &str, reason: String) {
        self.watch.health.set(
            DegradedCause::BackgroundThreadEnded,
            format!("thread {thread} ended: {reason}"),
        );
        self.config.events.emit(|| Event::BackgroundThreadEnded {
            thread: thread.to_owned(),
            reason,
        });
    }

    /// A compaction took `victims` segments.
    pub(super) fn compaction_started(&self, trigger: CompactionTrigger, victims: usize) {
        self.config.events.emit(|| Event::CompactionStarted {
            trigger,
            victims: victims as u32,
        });
    }

    /// What became of a compaction that took victims (`elapsed` since it took them).
    pub(super) fn compaction_ended(
        &self,
        trigger: CompactionTrigger,
        outcome: &Result<CompactionReport>,
        elapsed: Duration,
    ) {
        match outcome {
            Ok(report) => {
                self.watch
                    .bytes_copied
                    .fetch_add(report.bytes_copied, Ordering::Relaxed);
                self.watch
                    .bytes_removed
                    .fetch_add(report.bytes_removed, Ordering::Relaxed);
                self.watch.health.clear(DegradedCause::CompactionFailed);
                self.config.events.emit(|| Event::CompactionFinished {
                    trigger,
                    report: report.clone(),
                    elapsed,
                });
            }
            Err(Error::Closed) => {}
            Err(e) => {
                self.watch
                    .compactions_failed
                    .fetch_add(1, Ordering::Relaxed);
                self.watch.health.set(
                    DegradedCause::CompactionFailed,
                    format!(
                        "a compaction failed: {e}; its segments stay and are tried again after a later commit"
                    ),
                );
                let error = e.to_string();
                self.config
                    .events
                    .emit(|| Event::CompactionFailed { trigger, error });
            }
        }
    }
}

/// Tells the listener what open found: a rebuild, a torn tail, damage (SPEC S4).
pub(super) fn open_findings(events: &crate::observe::Events, report: &OpenReport) {
    if let Some(reason) = &report.rebuild_reason {
        events.emit(|| Event::Rebuilt {
            reason: reason.clone(),
        });
    }
    if let Some(tail) = &report.torn_tail {
        events.emit(|| Event::TornTail { tail: tail.clone() });
    }
    for record in &report.damaged {
        events.emit(|| Event::Damaged {
            record: record.clone(),
        });
    }
}

impl super::FileStore {
    /// Test-only negative control (feature `test-hooks`): the store's stats never say it is
    /// degraded, whatever stands.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn set_health_off_for_test(&self, off: bool) {
        self.inner.watch.health.set_off(off);
    }

    /// Test only (feature `test-hooks`): the periodic sync thread
    /// ([`SyncPolicy::PeriodicMayLoseRecent`](super::SyncPolicy)) panics at its next round,
    /// so a test can show the store says it is degraded.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn kill_periodic_sync_for_test(&self) {
        self.inner.watch.kill_syncer.store(true, Ordering::Relaxed);
    }
}
