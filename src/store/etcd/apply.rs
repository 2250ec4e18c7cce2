//! Applying one batch on etcd (SPEC S2, S11): its first attempt, alone or in a transaction
//! shared with other batches ([`super::group`]), then, after a lost answer, resends alone under
//! its commit marker until its fate is known.
//!
//! Owns: the attempts of one batch and what each answer means for it (docs/etcd.md, "Faults").

use crate::sync::atomic::Ordering;

use super::client::{self, Failure};
use super::group::{Fate, Part};
use super::txn::{Answer, Target, Txn};
use super::{EtcdStore, backoff};
use crate::error::{Error, Result};
use crate::store::{Batch, Outcome, Partition, refuse_deadlines};

impl EtcdStore {
    /// [`crate::store::Store::apply`]: a first attempt, alone or shared with other batches
    /// ([`super::group`]), then resends alone after a lost answer.
    pub(super) fn apply_batch(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        self.check_open()?;
        batch.validate_within(&self.limits)?;
        refuse_deadlines(batch, "etcd")?;
        let prefix = self.layout.data_prefix(p);
        let registry = self.layout.registry_key(p);
        let known = self.known.read().contains(p);
        let mut slot = self.take_slot()?;
        #[cfg_attr(not(feature = "etcd-test-hooks"), allow(unused_mut))]
        let mut seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut maybe_sent: Option<String> = None;
        let mut reads_on_failure = false;
        let mut last = String::new();
        for attempt in 0..self.attempts {
            if attempt > 0 {
                backoff(&*self.clock, attempt);
                #[cfg(feature = "etcd-test-hooks")]
                if self.no_marker {
                    // The negative control: each attempt under a fresh number, so a resend
                    // cannot see that an earlier copy committed.
                    seq = self.seq.fetch_add(1, Ordering::Relaxed);
                }
            }
            let txn = Txn::build(
                &Target {
                    prefix: &prefix,
                    registry: (!known).then_some(registry.as_slice()),
                    slot_key: &slot.key,
                    slot_value: &slot.value,
                    seq,
                    abort_on_refusal: maybe_sent.is_some() && self.marker_checked(),
                    reads_on_failure,
                },
                batch,
            );
            // A first attempt may share a transaction with other batches; a resend goes alone.
            let sent = match &self.group {
                Some(group) if attempt == 0 && txn.shareable() => {
                    group.send(&self.client, &txn, || Part::of(&prefix, &txn), p)
                }
                _ => Fate::Alone(self.client.post_bytes(client::TXN, txn.body())),
            };
            let read = |answer: std::result::Result<Vec<u8>, Failure>| {
                answer.and_then(|a| {
                    txn.outcome(&a)
                        .map_err(|e| Failure::Ambiguous(e.to_string()))
                })
            };
            let answer = match sent {
                Fate::Alone(answer) => read(answer),
                Fate::Committed => Ok(txn.committed()),
                // The shared transaction applied nothing: this batch alone, now.
                Fate::Retry => read(self.client.post_bytes(client::TXN, txn.body())),
                // Its fate is unknown: resolved through its slot by the resends below.
                Fate::Lost(f) => Err(f),
            };
            let answer = match answer {
                // Refused, and nothing was applied: learn which guard failed (or whether the
                // slot moved) from what the compares saw.
                Ok(Answer::ReadBack { revision }) => match self.read_back(&txn, revision) {
                    Ok(answer) => Ok(answer),
                    Err(Error::Unavailable {
                        retry_after_ms: 0, ..
                    }) => {
                        // The revision was compacted away: send the batch again with reads in
                        // its failure branch.
                        reads_on_failure = true;
                        last = "the revision of a refusal was compacted".into();
                        continue;
                    }
                    // Nothing was applied; the slot is left alone (its value may not be the
                    // one expected, or it may be gone), and the next batch makes a new one.
                    Err(e) => return Err(e),
                },
                other => other,
            };
            match answer {
                Ok(Answer::ReadBack { .. }) => unreachable!("read back above"),
                Ok(Answer::Decided { outcome, slot: now }) => {
                    slot.value = now;
                    self.slots.lock().push(slot);
                    if outcome.is_committed() {
                        self.batches.fetch_add(1, Ordering::Relaxed);
                        self.remember(p, known);
                    }
                    return Ok(outcome);
                }
                Ok(Answer::SlotMoved { slot: now }) => {
                    // An earlier copy was aborted: nothing of the batch applied, and no copy
                    // sent so far can commit any more. Try again from the slot's new value.
                    slot.value = now;
                    maybe_sent = None;
                    last = "an earlier copy was aborted".into();
                }
                Err(f) if f.is_transient() => {
                    last = f.describe(self.client.endpoint());
                    if !matches!(f, Failure::NotSent(_)) {
                        log::warn!(
                            "etcd store {}: the answer to a batch on {p} was lost ({last}); \
                         sending it again",
                            self.client_id
                        );
                        maybe_sent = Some(last.clone());
                    }
                }
                Err(f) => {
                    if let Some(earlier) = maybe_sent {
                        // Refused now, but an earlier copy may have committed; the slot's
                        // value is unknown, so it is not used again.
                        return Err(Error::OutcomeUnknown {
                            partition: p.to_string(),
                            detail: format!(
                                "{earlier}, then {}",
                                f.describe(self.client.endpoint())
                            ),
                        });
                    }
                    self.slots.lock().push(slot);
                    return Err(self.refusal(f));
                }
            }
        }
        match maybe_sent {
            // The slot's value is unknown (a copy may still commit): it is not used again,
            // and a copy still on its way finds no later batch expecting its value.
            Some(earlier) => Err(Error::OutcomeUnknown {
                partition: p.to_string(),
                detail: format!(
                    "{earlier}; {} attempts, none answered (last: {last})",
                    self.attempts
                ),
            }),
            None => {
                self.slots.lock().push(slot);
                Err(Error::Unavailable {
                    reason: format!(
                        "{last} (after {} attempts, nothing was applied)",
                        self.attempts
                    ),
                    retry_after_ms: 1000,
                })
            }
        }
    }
}
