//! How the namespaces an engine holds follow its owner lease (SPEC F12): the check every call
//! makes before it is served, the renewal that also re-reads every namespace held and deposes
//! those a take-over moved (prompt deposition), which namespaces the warm and `fold_all` touch,
//! and the refusal that names a namespace's holder.
//!
//! Calls the store through the fence (`coordinator_view`) and `liveness`; takes the liveness's
//! `renewing` lock (after `adopting`, never before) and, briefly, the owners' map.

use super::{Mode, OWNER_KEY, OwnerRow, Owners, Status, not_served};
use crate::entity::Namespace;
use crate::error::{Error, Result};
use crate::fence::CoordinatorView;
use crate::observe::Event;

impl Owners {
    /// Whether the warm and `fold_all` should touch the entities of `ns` (SPEC F12): this
    /// engine serves it, or adopts it now on first use (only a namespace no other owner
    /// holds). A refusal means no: another owner's entities are neither restored, nor counted
    /// as refused, nor given slots. Other errors mean yes, so the touch reports them.
    pub(crate) fn may_serve(&self, ns: &Namespace) -> bool {
        if self.switches.touch_foreign_namespaces {
            return true;
        }
        if let Some(h) = self.map.read().get(ns) {
            return h.status == Status::Serving && self.liveness.superseded().is_none();
        }
        if !self.adopt_on_first_use {
            return false;
        }
        !matches!(
            self.serving(ns),
            Err(Error::NotServed { .. } | Error::Fenced { .. } | Error::OwnerLive { .. })
        )
    }

    /// Whether the background warm at open restores `ns` (SPEC R6, R3): this engine holds it,
    /// or resumes it after its own crash (an earlier incarnation of its owner id holds it,
    /// unreleased), adopting it on first use as a call would. Never another owner's namespace,
    /// nor a free one.
    pub(crate) fn resumes(&self, ns: &Namespace) -> bool {
        if self.held(ns).is_some() {
            return true;
        }
        if !self.adopt_on_first_use || self.map.read().contains_key(ns) {
            return false;
        }
        match self.lookup(ns) {
            Ok((_, Some(row)))
                if row.owner == self.owner
                    && row.incarnation < self.incarnation
                    && !row.released =>
            {
                self.serving(ns).is_ok()
            }
            _ => false,
        }
    }

    /// Answers whether this engine may serve now (SPEC F12): while its lease is valid, from
    /// memory; after that, once a renewal on this thread (or one that another call was making)
    /// succeeded. A superseded engine never may.
    pub(crate) fn live(&self) -> Result<()> {
        if self.liveness.valid_now() || self.switches.ignore_lease_expiry {
            return Ok(());
        }
        if let Some(e) = self.liveness.superseded() {
            return Err(e);
        }
        let _renewing = self.liveness.renewing.lock();
        if self.liveness.valid_now() {
            return Ok(()); // another call renewed it meanwhile
        }
        self.told(self.renew_locked()).map_err(|e| match e {
            e @ (Error::OwnerLive { .. } | Error::Closed) => e,
            e => Error::Unavailable {
                reason: format!(
                    "this engine's owner lease lapsed and could not be renewed ({e}); it serves \
                     nothing until a renewal succeeds"
                ),
                retry_after_ms: 100,
            },
        })
    }

    /// Renews this engine's owner lease and re-reads every namespace it holds, deposing those a
    /// take-over moved (SPEC F12). The background renewer and `Engine::renew_owner_lease` call
    /// it.
    pub(crate) fn renew(&self) -> Result<()> {
        let _renewing = self.liveness.renewing.lock();
        self.told(self.renew_locked())
    }

    /// Records how a renewal ended and tells the listener of a failure (SPEC E8).
    fn told(&self, renewed: Result<()>) -> Result<()> {
        self.liveness.note_renewal(&renewed);
        if let Err(e) = &renewed
            && !matches!(e, Error::Closed)
        {
            self.fence.events().emit(|| Event::RenewalFailed {
                error: e.to_string(),
            });
        }
        renewed
    }

    fn renew_locked(&self) -> Result<()> {
        let started = self.liveness.write_lease(self.switches.unguarded_renewal)?;
        if !self.switches.skip_held_recheck
            && let Err(e) = self.recheck_held()
        {
            self.liveness.failed();
            return Err(e);
        }
        self.liveness.commit(started);
        Ok(())
    }

    /// Re-reads the epoch and owner row of every namespace held (one store call each) and
    /// deposes those whose epoch moved past the grant, or whose row another owner wrote.
    fn recheck_held(&self) -> Result<()> {
        for (ns, h) in self.all_held() {
            let view = self.fence.coordinator_view(&ns, &[OWNER_KEY])?;
            let moved = view.extra[0].as_deref() != Some(h.written.as_slice());
            if (h.mode == Mode::Fenced && view.epoch > h.grant) || moved {
                self.depose(&ns, h.grant, view.epoch.max(h.grant));
            }
        }
        Ok(())
    }

    /// Why adopting `ns` from the holder of `old` is refused: who holds it, whether its lease
    /// is live, and what to do.
    pub(super) fn refusal(
        &self,
        ns: &Namespace,
        old: &OwnerRow,
        view: &CoordinatorView,
        first_use: bool,
    ) -> Error {
        let state = match self.liveness.holder(&old.owner, old.incarnation) {
            Ok(h) if h.live => "live",
            Ok(_) => "its lease has expired",
            Err(_) => "liveness unknown",
        };
        let what = if first_use {
            "adoption on first use never takes a namespace from another owner: take it over \
             with Engine::take_over, or have it released"
                .to_string()
        } else if old.epoch >= view.epoch {
            "take it over with Engine::take_over (bump, revoke to Complete, adopt), or have it \
             released"
                .to_string()
        } else {
            format!(
                "revocation to epoch {} has not completed ({}): run Engine::revoke_step until \
                 it answers Complete, or use Engine::take_over",
                view.epoch, view.pending
            )
        };
        not_served(
            ns,
            &format!(
                "owner {:?} (incarnation {}, {state}) holds it at epoch {}; {what}",
                old.owner, old.incarnation, old.epoch
            ),
        )
    }
}
