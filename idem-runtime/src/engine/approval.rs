//! A call of a tool that needs a person's approval: it records its key as awaiting approval
//! instead of reserving it, waits for the decision if it may, and reads a denial back. The
//! state machine (`machine.rs`) decides when; the transitions are the lifecycle's.

use std::time::Instant;

use super::waiting::Waiting;
use super::Call;
use crate::error::Error;
use crate::failpoint::failpoint;
use crate::lifecycle::transition;
use crate::lifecycle::{Guard, Owner, Record, Status};
use crate::meter::{self, ApprovalEvent};
use crate::store::{Inserted, Store};
use crate::time::deadline_after;

impl Call {
    /// Records the key as awaiting approval over `found` (absent, an expired result, or an
    /// expired approval); the record as it stands afterwards: the request, or what another
    /// caller wrote first.
    pub(super) async fn request_approval(
        &self,
        store: &dyn Store,
        found: Option<Record>,
    ) -> Result<Option<Record>, Error> {
        let failed = |e| self.store_error(e);
        let owner = Owner::new_call(store.instance().id());
        let (key, now, function) = (self.key.as_str(), store.clock(), self.function.as_deref());
        let step = match &found {
            None => {
                transition::request_approval(key, &self.tool, &self.scope, function, &owner, now)
            }
            Some(found) => transition::request_approval_again(found, &owner, function, now),
        };
        let new = step.new.expect("a request for approval leaves a record");
        let written = match &found {
            None => match store.insert_if_absent(&new, step.change).await.map_err(failed)? {
                Inserted::New { .. } => true,
                Inserted::Existing(existing) => return Ok(Some(existing)),
            },
            Some(found) => {
                let guard = Guard::of(found.fence(), step.change.by(), store.instance().id());
                let written = store.compare_and_swap(found, guard, Some(&new), step.change);
                written.await.map_err(failed)?.is_some()
            }
        };
        if !written {
            return store.get(key).await.map_err(failed);
        }
        failpoint("after_approval_request");
        if found.as_ref().is_some_and(|found| found.status == Status::Approved) {
            meter::approval(&self.tool, ApprovalEvent::Expired);
        }
        meter::approval(&self.tool, ApprovalEvent::Requested);
        tracing::info!(key = %self.key, tool = %self.tool, scope = %self.scope, "idem: awaiting a person's approval");
        Ok(Some(new))
    }

    /// Waits for a person to decide `existing`, a key awaiting approval, until `deadline` (set
    /// at the first wait from `approve_wait`); the record once it changed.
    /// [`Error::AwaitingApproval`] when the call may not wait, or no one decided in time.
    pub(super) async fn await_decision(
        &self,
        store: &dyn Store,
        existing: Record,
        deadline: &mut Option<Instant>,
    ) -> Result<Option<Record>, Error> {
        let asked = |existing: &Record| self.parts().awaiting_approval(existing);
        let Some(wait) = self.approval.and_then(|approval| approval.wait) else {
            return Err(asked(&existing));
        };
        let deadline = *deadline.get_or_insert_with(|| deadline_after(Instant::now(), wait));
        if Instant::now() >= deadline {
            return Err(asked(&existing));
        }
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: waiting for a person's decision");
        let key = self.key.as_str();
        let _waiting = Waiting::start(key);
        match store.watch(key, &existing, deadline).await.map_err(|e| self.store_error(e))? {
            Some(now) if now.is_as(&existing) => Err(asked(&now)),
            now => Ok(now),
        }
    }

    /// The error of a call that finds its key denied, with who denied it and their note, as
    /// the key's history has them.
    pub(super) async fn denied(&self, store: &dyn Store) -> Error {
        let history = store.history(self.key.as_str()).await;
        if let Err(e) = &history {
            tracing::warn!(key = %self.key, tool = %self.tool, error = %e, "idem: cannot read who denied the key");
        }
        self.parts().denied(history.as_deref().ok())
    }
}
