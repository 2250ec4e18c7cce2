//! Reading and advancing the epoch (SPEC F1), and declaring a recovered lease table (F6).

use super::rows::{self, RecoveryRow};
use super::{Fence, guard_as_read, unfenced};
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::store::Batch;

/// The largest step one bump may take (SPEC F1).
pub const MAX_EPOCH_STEP: u64 = 1024;
/// How many compare-and-set races a bump loses before answering `Unavailable` (SPEC F1, F8).
const MAX_BUMP_ATTEMPTS: usize = 8;

impl Fence {
    /// The namespace's current epoch (0 until the first bump). One store read.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// assert_eq!(fence.current_epoch(&ns)?, 0);
    /// fence.bump_epoch(&ns, 3)?;
    /// assert_eq!(fence.current_epoch(&ns)?, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn current_epoch(&self, ns: &Namespace) -> Result<u64> {
        let raw = self
            .inner
            .store
            .get(&ns.coordinator_partition(), &self.inner.keys.current())?;
        rows::decode_epoch(raw.as_deref())
    }

    /// Compare-and-sets the epoch to `new` (SPEC F1).
    ///
    /// `new` must exceed the current epoch by 1 to 1,024, else `InvalidArgument` and nothing
    /// changes. A lost race re-reads and re-classifies; finding `new` installed by a concurrent
    /// winner is success. Repeated contention answers `Unavailable` with a retry hint. A
    /// namespace declared unfenced ([`Fence::declare_unfenced`]) has no epoch to bump:
    /// `InvalidArgument`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// // Take the namespace over: bump, then revoke until no older write can commit.
    /// fence.bump_epoch(&ns, 1)?;
    /// while fence.revoke_step(&ns, RevokeBudget::default())? != RevokeProgress::Complete {}
    /// assert!(fence.write(&job, 0, Batch::new()).is_err()); // epoch 0 is fenced out
    /// assert!(fence.write(&job, 1, Batch::new()).is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub fn bump_epoch(&self, ns: &Namespace, new: u64) -> Result<()> {
        let coordinator = ns.coordinator_partition();
        let key = self.inner.keys.current();
        let unfenced_key = self.inner.keys.unfenced();
        if self.known_unfenced(ns) {
            return Err(unfenced::bump_refused(self, ns));
        }
        let mut lost_a_race = false;
        for _ in 0..MAX_BUMP_ATTEMPTS {
            let read = self
                .inner
                .store
                .get_many(&coordinator, &[&key, &unfenced_key])?;
            let raw = &read[0];
            if unfenced::decode_unfenced(read[1].as_deref())?.is_some() {
                self.remember_unfenced(ns);
                return Err(unfenced::bump_refused(self, ns));
            }
            let current = rows::decode_epoch(raw.as_deref())?;
            if lost_a_race && current == new {
                // A concurrent bump installed the same value: that is what we wanted.
                return Ok(());
            }
            let step = new.saturating_sub(current);
            if step == 0 || step > MAX_EPOCH_STEP {
                return Err(Error::invalid(format!(
                    "a bump must advance the {kind:?} of {ns} by 1 to {MAX_EPOCH_STEP}: it is {current}, asked for {new}",
                    kind = self.inner.kind
                )));
            }
            // Guarded on "not unfenced" too: a concurrent declaration and this bump never
            // both succeed.
            let batch = guard_as_read(Batch::new(), &key, raw.as_deref())
                .absent(unfenced_key.clone())
                .put(key.clone(), rows::encode(&new));
            if self.inner.store.apply(&coordinator, &batch)?.is_committed() {
                log::debug!("{:?} of {ns} bumped {current} -> {new}", self.inner.kind);
                self.told_bumped(ns, new);
                return Ok(());
            }
            lost_a_race = true;
        }
        Err(Error::Unavailable {
            reason: format!(
                "the {:?} of {ns} is contended; the bump lost {MAX_BUMP_ATTEMPTS} races",
                self.inner.kind
            ),
            retry_after_ms: 10,
        })
    }

    /// Advances the epoch by `step` (1 to 1,024) from whatever it is now; answers the new
    /// epoch. `InvalidArgument` if the step is out of range or the epoch would overflow.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// assert_eq!(fence.advance_epoch(&ns, 1)?, 1);
    /// assert_eq!(fence.advance_epoch(&ns, 5)?, 6);
    /// # Ok(())
    /// # }
    /// ```
    pub fn advance_epoch(&self, ns: &Namespace, step: u64) -> Result<u64> {
        if step == 0 || step > MAX_EPOCH_STEP {
            return Err(Error::invalid(format!(
                "an epoch step must be 1 to {MAX_EPOCH_STEP}, got {step}"
            )));
        }
        let current = self.current_epoch(ns)?;
        let new = current.checked_add(step).ok_or_else(|| {
            Error::invalid(format!("the epoch of {ns} ({current}) would overflow"))
        })?;
        self.bump_epoch(ns, new)?;
        Ok(new)
    }

    /// Declares that the namespace's lease table was restored or rebuilt (SPEC F6): records
    /// `resumed_at_ms = now`, so revocation cannot complete before
    /// `now + epoch_lease_ms + lease_margin_ms`. Call it before serving writes.
    ///
    /// The marker never moves backwards: over a marker already there it writes the later of
    /// `now` and one millisecond past that marker (so a planner whose clock lags, or a mark
    /// racing another, never shortens a hold-off, and every revocation checkpoint made before
    /// is invalid), guarded on the marker as read. `Unavailable` after 8 lost races.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portcullis::fence::{Fence, FenceConfig, RevokeBudget, RevokeProgress, WriteOutcome};
    /// use portcullis::store::{Batch, MemoryStore};
    /// use portcullis::{EntityId, ManualClock, Namespace};
    ///
    /// # fn main() -> portcullis::Result<()> {
    /// let clock = Arc::new(ManualClock::new(0));
    /// let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    /// let fence = Fence::new(store, clock.clone(), FenceConfig::default());
    /// let ns = Namespace::new("jobs")?;
    /// let job = EntityId::in_namespace(ns.clone(), "job-1")?;
    /// fence.mark_lease_table_recovered(&ns)?;
    /// // Revocation waits out a whole lease (and its margin) after the recovery.
    /// assert!(matches!(fence.revoke_step(&ns, RevokeBudget::default())?, RevokeProgress::Pending { .. }));
    /// clock.advance(35_000);
    /// assert_eq!(fence.revoke_step(&ns, RevokeBudget::default())?, RevokeProgress::Complete);
    /// # Ok(())
    /// # }
    /// ```
    pub fn mark_lease_table_recovered(&self, ns: &Namespace) -> Result<()> {
        let coordinator = ns.coordinator_partition();
        let key = self.inner.keys.recovery();
        let mut marked = None;
        for _ in 0..MAX_BUMP_ATTEMPTS {
            let raw = self.inner.store.get(&coordinator, &key)?;
            let before: Option<RecoveryRow> = rows::decode_opt("recovery marker", raw.as_deref())?;
            // Never backwards (a lagging clock, or a racing mark), and always a new value, so
            // the hold-off lasts at least as long as either mark asked and every revocation
            // checkpoint made before becomes invalid (SPEC F6).
            let now = self.now();
            let resumed_at_ms = match before {
                Some(b) if !self.switches().unguarded_recovery_marker => {
                    now.max(b.resumed_at_ms.saturating_add(1))
                }
                _ => now,
            };
            let row = rows::encode(&RecoveryRow { resumed_at_ms });
            let batch = if self.switches().unguarded_recovery_marker {
                Batch::new().put(key.clone(), row)
            } else {
                guard_as_read(Batch::new(), &key, raw.as_deref()).put(key.clone(), row)
            };
            if self.inner.store.apply(&coordinator, &batch)?.is_committed() {
                marked = Some(resumed_at_ms);
                break;
            }
        }
        let Some(now) = marked else {
            return Err(Error::Unavailable {
                reason: format!(
                    "the recovery marker of {ns} is contended; the mark lost {MAX_BUMP_ATTEMPTS} races"
                ),
                retry_after_ms: 10,
            });
        };
        log::warn!(
            "{:?} lease table of {ns} declared recovered at {now} ms; revocation holds off until {} ms",
            self.inner.kind,
            now.saturating_add(
                self.inner.config.epoch_lease_ms() + self.inner.config.lease_margin_ms()
            )
        );
        Ok(())
    }
}
