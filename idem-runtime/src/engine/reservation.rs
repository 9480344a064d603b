//! What a call holds while it owns its key: a [`Reservation`], made by one write
//! ([`Reservation::take`]) and given up by one ([`Reservation::settle`]), each a transition of
//! `lifecycle/transition.rs`. Its `Drop` is only a safety net that makes the same transitions
//! without waiting. Which transition a call makes, and when, is decided in `machine.rs`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::heartbeat::{self, Leased};
use super::settle::{self, Unsettled};
use crate::error::{Error, StoreError};
use crate::lifecycle::history::{Answer, Change};
use crate::lifecycle::transition::{self, Step};
use crate::lifecycle::{Guard, Owner, Record};
use crate::meter::{self, Outcome};
use crate::store::{Inserted, Store};

/// What [`Reservation::take`] found.
// Taken apart at once, as `Inserted` is: boxing the record would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Taken {
    /// The key is this call's.
    Mine(Box<Reservation>),
    /// The record was no longer as seen: here it is now (`None`: absent).
    Moved(Option<Record>),
}

/// The reservation a call holds while it owns the key: a first reservation, a takeover and a
/// takeover to reconcile alike, from the moment the write that makes it is sent.
pub(super) struct Reservation {
    store: Arc<dyn Store>,
    record: Record,
    /// What [`transition::undo`] puts back if the call ends before its body starts: the record
    /// a takeover replaced (for a reconciliation, the key in doubt); `None` for a first
    /// reservation, which is then deleted.
    before: Option<Record>,
    /// Whether the body has started: from then on the effect may have landed.
    started: bool,
    /// The fencing token the store gave this owner (0 until the write that makes it lands).
    token: u64,
    /// Whether a settling write landed (an atomic, so that settling takes `&self` while the
    /// transition borrows the held record).
    settled: AtomicBool,
    /// The record's lease, renewed by the store's heartbeat from the write that makes this
    /// reservation until the write that settles it (`None`: the store leases nothing).
    lease: Option<Leased>,
}

impl Reservation {
    /// Makes `step` (a reservation or a takeover, whose new record is in flight) over `found`,
    /// the record the call saw (`None`: absent). Guarded from before the write is sent, so that
    /// a call dropped while the write is under way undoes it.
    pub(super) async fn take(
        store: &Arc<dyn Store>,
        found: Option<Record>,
        step: Step<'_>,
    ) -> Result<Taken, StoreError> {
        let record = step.new.expect("a reservation or takeover leaves a record in flight");
        let mut pending = Box::new(Reservation {
            store: Arc::clone(store),
            record,
            before: found,
            started: false,
            token: 0,
            settled: AtomicBool::new(false),
            lease: None,
        });
        let written = match &pending.before {
            None => match store.insert_if_absent(&pending.record, step.change).await? {
                Inserted::New { token } => Ok(token),
                Inserted::Existing(existing) => Err(Some(existing)),
            },
            Some(before) => {
                let guard = Guard::of(before.fence(), step.change.by(), store.instance().id());
                let written =
                    store.compare_and_swap(before, guard, Some(&pending.record), step.change);
                match written.await? {
                    Some(token) => Ok(token),
                    None => Err(store.get(&pending.record.key).await?),
                }
            }
        };
        match written {
            Ok(token) => {
                pending.token = token;
                pending.lease = heartbeat::hold(store, &pending.record);
                Ok(Taken::Mine(pending))
            }
            Err(now) => {
                pending.settled.store(true, Ordering::Relaxed);
                Ok(Taken::Moved(now))
            }
        }
    }

    /// The fencing token the store gave this owner: greater than every earlier owner's.
    pub(super) fn token(&self) -> u64 {
        self.token
    }

    /// Takes `found` (in doubt, or in flight under an owner that no longer holds it) over to ask
    /// the tool's reconciler, for a new call of `store`; `function` is the calling function's
    /// path (a sweep has none, and keeps the record's).
    pub(super) async fn take_to_reconcile(
        store: &Arc<dyn Store>,
        found: Record,
        function: Option<&str>,
    ) -> Result<Taken, StoreError> {
        let owner = Owner::new_call(store.instance().id());
        let (now, lease) = (store.clock(), store.instance().lease());
        let step = transition::take_over_to_reconcile(&found, &owner, function, now, lease);
        Reservation::take(store, Some(found), step).await
    }

    /// From here on, the body runs: dropping the reservation leaves the key in doubt.
    pub(super) fn start(&mut self) {
        self.started = true;
    }

    /// Writes `step`, a transition away from the held record; whether it was stored (`false`:
    /// the record changed hands meanwhile, and that write stands), and the record it wrote.
    /// Should the store fail, the write is handed to the settling thread, which tries it again
    /// until the store takes it (`settle.rs`), and the error is returned; a write the store
    /// refuses for good ([`StoreError::lasting`]: a result too large) is not tried again.
    async fn settle(&self, step: Step<'_>) -> Result<(bool, Option<Record>), StoreError> {
        let Step { new, change } = step;
        let guard = Guard::of(self.record.fence(), change.by(), self.store.instance().id());
        let written =
            self.store.compare_and_swap(&self.record, guard, new.as_ref(), change.clone()).await;
        self.settled.store(true, Ordering::Relaxed);
        // Written, refused or failed, the lease is no longer renewed: a failed write lets it
        // lapse, so that the key turns in doubt for others, as after a crash.
        if let Some(lease) = &self.lease {
            lease.forget();
        }
        match written {
            Ok(token) => Ok((token.is_some(), new)),
            Err(e) => {
                if e.is_retryable() {
                    settle::keep_trying(self.unsettled(new, change));
                }
                Err(e)
            }
        }
    }

    /// `new`, written with `change` over the held record, as a write for the settling thread.
    fn unsettled(&self, new: Option<Record>, change: Change<'_>) -> Unsettled {
        Unsettled::Swap {
            store: Arc::downgrade(&self.store),
            expected: self.record.clone(),
            new,
            change: change.into_owned(),
        }
    }

    /// in-flight → done with `json`, the body's result. The effect has landed: should the
    /// store fail, the result is recorded later, by the settling thread, and the call says so.
    pub(super) async fn complete(
        &self,
        json: String,
        ttl: Option<Duration>,
    ) -> Result<bool, Error> {
        let step = transition::complete(&self.record, json, ttl, self.store.clock());
        match self.settle(step).await {
            Ok((stored, _)) => Ok(stored),
            // The store will never take this result: the key is left in doubt instead.
            Err(e) if !e.is_retryable() => {
                self.leave_in_doubt("its result could not be stored").await;
                Err(Error::store(Some(&self.record.key), Some(&self.record.tool), e))
            }
            Err(e) => {
                let (key, tool) = (&self.record.key, &self.record.tool);
                meter::call(tool, Outcome::InDoubt, Duration::ZERO);
                tracing::error!(key = %key, tool = %tool, error = %e, "idem: the effect ran but its result could not be recorded; trying again in the background");
                Err(Error::Unrecorded {
                    key: key.clone(),
                    tool: tool.clone(),
                    reason: e.to_string(),
                })
            }
        }
    }

    /// in-flight → absent: nothing landed, so the next call runs the body.
    pub(super) async fn release(&mut self) {
        // Nothing landed: should the release fail, the settling thread tries it again, rather
        // than marking the key in doubt.
        self.started = false;
        meter::call(&self.record.tool, Outcome::Released, Duration::ZERO);
        let step = transition::release(&self.record);
        let (key, tool) = (&self.record.key, &self.record.tool);
        match self.settle(step).await {
            Ok(_) => tracing::debug!(key = %key, tool = %tool, "idem: released after an error"),
            Err(e) => {
                tracing::error!(key = %key, tool = %tool, error = %e, "idem: cannot release the key after an error")
            }
        }
    }

    /// Records in the key's history that the fence refused this owner's final write: the key
    /// moved on while the body ran, and the effect ran anyway. Should the store fail, the
    /// settling thread appends it later: the call's outcome is what the record says, whatever
    /// its history.
    pub(super) async fn record_refused(&self) {
        let (key, tool) = (&self.record.key, &self.record.tool);
        let change = transition::refuse_late_write(&self.record);
        if let Err(e) = self.store.append_history(key, change.clone()).await {
            tracing::error!(key = %key, tool = %tool, error = %e, "idem: cannot record the refused late write in the key's history; trying again in the background");
            let (store, key, change) =
                (Arc::downgrade(&self.store), key.clone(), change.into_owned());
            settle::keep_trying(Unsettled::History { store, key, change });
        }
    }

    /// in-flight → in-doubt, for the reason `why`.
    pub(super) async fn leave_in_doubt(&self, why: &str) {
        let step = transition::leave_in_doubt(&self.record, why, self.store.clock());
        let (key, tool) = (&self.record.key, &self.record.tool);
        match self.settle(step).await {
            Ok((false, _)) => {
                // Counted as before: the call still ends as one whose effect may have landed.
                meter::call(tool, Outcome::InDoubt, Duration::ZERO);
                tracing::warn!(key = %key, tool = %tool, "idem: the record changed hands while the body ran; it was not marked in doubt");
                self.record_refused().await;
            }
            Ok(_) => {
                meter::call(tool, Outcome::InDoubt, Duration::ZERO);
                tracing::warn!(key = %key, tool = %tool, "idem: in doubt: the body failed after its effect may have landed");
            }
            // The settling thread tries it again.
            Err(e) => {
                tracing::error!(key = %key, tool = %tool, error = %e, "idem: cannot mark the key in doubt")
            }
        }
    }

    /// Settles a reconciliation by the reconciler's answer: landed (`Ok(json)`), not landed
    /// (`None`), or still in doubt (`Err((answer, reason))`). Returns whether it was stored,
    /// and the record written.
    pub(super) async fn settle_reconciled(
        &self,
        answer: Result<Option<String>, (Answer, &str)>,
        ttl: Option<Duration>,
    ) -> Result<(bool, Option<Record>), StoreError> {
        let now = self.store.clock();
        let record = &self.record;
        let (step, counted) = match answer {
            Ok(Some(json)) => (transition::settle_landed(record, json, ttl, now), Answer::Landed),
            Ok(None) => (transition::settle_not_landed(record), Answer::NotLanded),
            Err((answer, reason)) => {
                (transition::settle_cannot_tell(record, answer, reason, now), answer)
            }
        };
        let (stored, written) = self.settle(step).await?;
        // Only the answer is counted here: a call that then returns `Error::InDoubt` is counted
        // as it returns, and a sweep is no call.
        meter::reconciliation(&record.tool, counted);
        tracing::info!(key = %record.key, tool = %record.tool, answer = counted.as_str(), stored, "idem: reconciled");
        Ok((stored, written))
    }

    /// The record as this reservation wrote it.
    pub(super) fn record(&self) -> &Record {
        &self.record
    }

    /// The store this reservation writes to.
    pub(super) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

impl Drop for Reservation {
    /// The safety net of a call that ended without settling: a panic, a dropped future, or a
    /// settling write that failed. It makes the same transitions, without waiting.
    fn drop(&mut self) {
        if self.settled.swap(true, Ordering::Relaxed) {
            return;
        }
        let step = if self.started {
            meter::call(&self.record.tool, Outcome::InDoubt, Duration::ZERO);
            tracing::warn!(key = %self.record.key, tool = %self.record.tool, "idem: in doubt: the body panicked or its future was dropped");
            transition::leave_in_doubt(&self.record, transition::DROPPED, self.store.clock())
        } else {
            transition::undo(&self.record, self.before.as_ref(), self.store.clock())
        };
        let guard = Guard::of(self.record.fence(), step.change.by(), self.store.instance().id());
        // Sent now (the store's write goes on without anyone awaiting it); should it fail, the
        // settling thread tries it again.
        let sent = self.store.compare_and_swap(
            &self.record,
            guard,
            step.new.as_ref(),
            step.change.clone(),
        );
        settle::watch_sent(sent, self.unsettled(step.new, step.change));
    }
}
