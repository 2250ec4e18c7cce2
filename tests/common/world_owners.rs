//! The owner-level steps of the engine property test's world (see `world`): a crash and the
//! restart that waits out the dead owner's lease, the warm, `fold_all`, and a take-over in one
//! call (SPEC F12), with the checks these steps make (a warm or fold never refuses or fails on
//! another owner's namespace), the ownership check made after every step (a namespace moves
//! only on a completed revocation, and at most one owner serves it at its current epoch) with
//! the proof of completion it reads before an explicit adoption, and
//! the read check (a serving owner's state is the fold of its committed log).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use portcullis::Error;
use portcullis::engine::{Engine, TakeOver};
use portcullis::fence::{
    CheckpointRow, FenceKind, RecoveryRow, RevokeBudget, RevokeProgress, ScanPosition, decode_row,
};
use portcullis::store::Store;

use super::owners::{ListMachine, OwnerStore};
use super::steps::namespace;
use super::world::World;

impl World {
    /// The owner's process dies (no clean close); an engine with its owner id is refused while
    /// the dead one's lease is live, and opens once it has expired.
    pub(super) fn crash(&self, o: usize) -> Result<(), String> {
        let skew = self.owner(o).store.skew_ms.load(Ordering::SeqCst);
        let dead = self.owners[o].lock().take().expect("open");
        // Its lease runs until the start of its last renewal plus the lease, on its
        // clock (the margin before that is the engine's own safety, SPEC F12).
        let expires =
            dead.engine.stats().owner_lease.valid_until_ms + self.config.lease_margin_ms();
        dead.store.dead.store(true, Ordering::SeqCst);
        drop(dead); // its clean close fails: the store refuses the dead process
        self.tally("crash");
        let store = Arc::new(OwnerStore::new(
            Arc::clone(&self.base),
            o,
            skew,
            Arc::clone(&self.shared),
        ));
        let now = store.now_ms();
        if now < expires {
            // Its owner lease is still live: an engine with its owner id is refused
            // until it expires (SPEC F12), so the process restarts once it has.
            let early = Engine::builder(ListMachine)
                .store(store as Arc<dyn Store>)
                .owner(format!("owner-{o}"))
                .renew_owner_lease(false)
                .open();
            match early {
                Err(Error::OwnerLive { .. }) => self.tally("reopen refused: lease live"),
                other => {
                    return Err(format!(
                        "a reopen {} ms before the dead owner's lease expires: {other:?}",
                        expires - now
                    ));
                }
            }
            self.clock.advance(expires - now);
        }
        self.open(o, skew);
        Ok(())
    }

    /// A warm of owner `o`: it restores only namespaces `o` serves (adopting free ones on first
    /// use), so every entity it refused is in a namespace `o` served before or after it.
    pub(super) fn warm(&self, o: usize) -> Result<(), String> {
        let engine = self.owner(o).engine;
        let served = |engine: &super::world::Eng| -> Vec<portcullis::Namespace> {
            (0..self.shape.namespaces)
                .map(namespace)
                .filter(|ns| engine.grant(ns).is_some())
                .collect()
        };
        let before = served(&engine);
        let progress = match engine.warm().and_then(|w| w.wait()) {
            Ok(progress) => progress,
            Err(err) => return self.expected("warm", err),
        };
        self.tally("warm");
        let after = served(&engine);
        for e in &progress.refused_entities {
            self.tally("warm refused");
            let ns = e.namespace();
            if !before.contains(ns) && !after.contains(ns) {
                return Err(format!(
                    "owner {o}'s warm refused {e}, of a namespace it does not serve: {progress:?}"
                ));
            }
        }
        Ok(())
    }

    /// `fold_all` of owner `o`: it folds what `o` serves and never fails on, or adopts, a
    /// namespace another owner holds.
    pub(super) fn fold_all(&self, o: usize) -> Result<(), String> {
        let engine = self.owner(o).engine;
        match engine.fold_all(0usize, |n, _, s| n + s.records.len()) {
            Ok(_) => {
                self.tally("fold_all");
                Ok(())
            }
            Err(err @ Error::NotServed { .. }) => Err(format!(
                "owner {o}'s fold_all failed on a namespace it does not serve: {err}"
            )),
            Err(err) => self.expected("fold_all", err),
        }
    }

    /// A take-over in one call (SPEC F12). On success the owner's writes count under the new
    /// grant, and one more slice that answers `Complete` tells the checker revocation completed
    /// at the grant (a namespace nobody held, or one that was released, is adopted with no
    /// revocation at all, so that slice may push, touch and repair entities).
    pub(super) fn take_over_call(&self, o: usize, ns: usize, force: bool) -> Result<(), String> {
        let owner = self.owner(o);
        let name = namespace(ns);
        let before = owner.engine.grant(&name);
        // At most 16 slices, as the step by hand: a revocation held off by a declared recovery
        // (or leases that need more slices) answers Unavailable, to be resumed later.
        let how = TakeOver::new().force(force).max_slices(16);
        match owner.engine.take_over(&name, how) {
            Ok(grant) => {
                self.tally(if force {
                    "take_over forced"
                } else {
                    "take_over"
                });
                // The engine serves under `grant` from now on, the checker's slice included:
                // its touches restore (and repair) entities under the new holding.
                if before != Some(grant) {
                    owner.units.forget(&name);
                }
                owner.store.grants.lock().insert(name.clone(), grant);
                self.disarm(); // the next slice is the checker's, not the step's
                let slice = owner.engine.revoke_step(&name, RevokeBudget::default());
                if slice.map_err(|e| e.to_string())? == RevokeProgress::Complete {
                    self.completed(FenceKind::Epoch, owner.engine.fence(), ns)?;
                }
                Ok(())
            }
            Err(Error::Unavailable { reason, .. }) if reason.contains("still pending") => {
                self.tally("take_over pending");
                Ok(())
            }
            Err(err) => self.expected("take_over", err),
        }
    }

    /// Before owner `o`'s explicit adoption of `ns`: if the coordinator holds the proof an
    /// adoption reads (docs/fencing.md, "The proof of completion"), revocation has completed at
    /// the current epoch even though no slice may have said so. The proof is the checkpoint for
    /// the current epoch and recovery marker with its cursor `Done`, and no recovery hold-off
    /// pending on `o`'s clock: a slice by `o` would answer `Complete` now without pushing to
    /// anything (the last one answered `Pending` only for the hold-off, which time has ended
    /// since). Recorded as a completion, with the same check of the leases as a slice's
    /// `Complete` gets; read from the rows here, never from the engine's own verdict.
    pub(super) fn proof_of_completion(&self, o: usize, ns: usize) -> Result<(), String> {
        let owner = self.owner(o);
        let name = namespace(ns);
        let keys = owner.engine.fence().keys();
        let p = name.coordinator_partition();
        let wanted = [
            keys.current(),
            keys.recovery(),
            keys.checkpoint(),
            keys.unfenced(),
        ];
        let wanted: Vec<&[u8]> = wanted.iter().map(Vec::as_slice).collect();
        let rows = self.base.get_many(&p, &wanted).map_err(|e| e.to_string())?;
        let epoch: u64 = match &rows[0] {
            Some(raw) => decode_row("epoch", raw).map_err(|e| e.to_string())?,
            None => 0,
        };
        let marker = match &rows[1] {
            Some(raw) => Some(decode_row::<RecoveryRow>("marker", raw).map_err(|e| e.to_string())?),
            None => None,
        };
        let Some(raw) = &rows[2] else { return Ok(()) };
        let checkpoint: CheckpointRow = decode_row("checkpoint", raw).map_err(|e| e.to_string())?;
        let resumed_at = marker.map(|m| m.resumed_at_ms);
        let held_off = resumed_at.is_some_and(|r| {
            owner.store.now_ms() < r + self.config.epoch_lease_ms() + self.config.lease_margin_ms()
        });
        let proven = checkpoint.epoch == epoch
            && checkpoint.recovery == resumed_at
            && checkpoint.cursor == ScanPosition::Done
            && !held_off
            && rows[3].is_none();
        if proven && self.shared.completed(FenceKind::Epoch, &name) < epoch {
            self.tally("completion proof read");
            self.completed(FenceKind::Epoch, owner.engine.fence(), ns)?;
        }
        Ok(())
    }

    /// Only a completed take-over moves a namespace (SPEC F12): a namespace held (not
    /// released) moves to another owner, or to a later incarnation of its owner at a later
    /// epoch, only at an epoch whose revocation completed (a slice reported `Complete` for it,
    /// or the proof an adoption reads was in the coordinator just before an explicit
    /// adoption: see [`World::proof_of_completion`]). And never more than one owner serves a
    /// namespace at its current epoch: the holder its owner row names.
    pub fn ownership(&self) -> Result<(), String> {
        for ns in 0..self.shape.namespaces {
            let name = namespace(ns);
            let now = self
                .owner(0)
                .engine
                .owner_of(&name)
                .map_err(|e| e.to_string())?;
            let before = std::mem::replace(&mut self.holders.lock()[ns], now.clone());
            if let (Some(b), Some(a)) = (&before, &now) {
                let moved = b.owner != a.owner || b.incarnation != a.incarnation;
                let restart = b.owner == a.owner && a.epoch == b.epoch;
                let done = self.shared.completed(FenceKind::Epoch, &name);
                if moved && !b.released && !restart && (a.epoch <= b.epoch || done < a.epoch) {
                    return Err(format!(
                        "{name} moved from {b:?} to {a:?} without a revocation completed at \
                         epoch {} (completed: {done})",
                        a.epoch
                    ));
                }
            }
            let current = self
                .owner(0)
                .engine
                .current_epoch(&name)
                .map_err(|e| e.to_string())?;
            let serving: Vec<usize> = (0..self.shape.owners)
                .filter(|&o| self.owner(o).engine.grant(&name) == Some(current))
                .collect();
            if serving.len() > 1 {
                return Err(format!(
                    "owners {serving:?} all serve {name} at its current epoch {current}"
                ));
            }
            if let Some(&o) = serving.first() {
                let engine = self.owner(o).engine;
                let named = now.as_ref().is_some_and(|r| {
                    r.owner == engine.owner() && r.incarnation == engine.incarnation()
                });
                if !named {
                    return Err(format!(
                        "owner {o} serves {name} at epoch {current}, but its owner row says {now:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The record at `seq` of `entity` committed with `payload`.
    pub(super) fn check_at(
        &self,
        entity: &portcullis::EntityId,
        seq: u64,
        payload: &[u8],
    ) -> Result<(), String> {
        let ghost = self.shared.ghost_of(entity);
        match ghost.iter().find(|(s, _)| *s == seq) {
            Some((_, p)) if p == payload => Ok(()),
            other => Err(format!(
                "{entity}: the engine answered seq {seq} for {:?}, the log holds {other:?}",
                String::from_utf8_lossy(payload)
            )),
        }
    }

    /// Reads an entity through owner `o`; if `o` serves its namespace at the current epoch,
    /// its state must equal the fold of every record committed to it.
    pub fn read(&self, o: usize, e: usize) -> Result<(), String> {
        let (engine, x) = (self.owner(o).engine, self.entity(e));
        let state = match engine.read(&x, |s| s.records.clone()) {
            Ok(state) => state,
            Err(err) => return self.expected("read", err),
        };
        let current = engine
            .current_epoch(x.namespace())
            .map_err(|e| e.to_string())?;
        if engine.grant(x.namespace()) != Some(current) {
            return Ok(()); // a deposed owner's reads may be stale (docs/fencing.md, limits)
        }
        let ghost = self.shared.ghost_of(&x);
        if state != ghost {
            return Err(format!(
                "owner {o}: the state of {x} is not the fold of its committed log:\n  state {:?}\n  log   {:?}",
                super::world::show(&state),
                super::world::show(&ghost)
            ));
        }
        Ok(())
    }
}
