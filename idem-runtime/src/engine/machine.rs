//! The state machine of one call: [`Call::acquire`] is one `loop { match … }` over the
//! [`assess`]ment of the record found, and a [`Reservation`] is what a call holds while it owns
//! the key. Every transition is a function of `lifecycle/transition.rs`; this file decides which
//! one a call makes, and writes it through [`Reservation::take`] (to own the key) or
//! [`Reservation::settle`] (to give it up). The reservation's `Drop` is only a safety net that
//! makes the same transitions without waiting.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::decide::Next;
use super::heartbeat::{self, Leased};
use super::reconciler::{ask, Reconciled};
use super::settle::{self, Unsettled};
use super::{Call, Codec, DEFAULT_WAIT};
use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::lifecycle::history::{Answer, Change};
use crate::lifecycle::transition::{self, Step};
use crate::lifecycle::{Guard, Owner, Record, Status};
use crate::meter::{self, Outcome};
use crate::store::{Inserted, Store};
use crate::time::deadline_after;

/// What [`Call::acquire`] ends with.
pub(super) enum Acquired<T> {
    /// The key's recorded result, for the caller to return.
    Replay(T),
    /// The key is this call's: run the body.
    Owned(Box<Reservation>),
    /// The key was in doubt and the tool's reconciler found the effect had landed: its result,
    /// now recorded, for the caller to return.
    Reconciled(T),
}

/// What [`Reservation::take`] found.
// Taken apart at once, as `Inserted` is: boxing the record would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Taken {
    /// The key is this call's.
    Mine(Box<Reservation>),
    /// The record was no longer as seen: here it is now (`None`: absent).
    Moved(Option<Record>),
}

/// How asking a reconciler about a key in doubt ended.
enum Reconciliation<T> {
    /// It landed: the result is recorded `Done`.
    Landed(T),
    /// It did not land: the key is released, for the body to run.
    Released,
    /// The key is in doubt again, for `reason`; the record as written.
    InDoubt { record: Box<Record>, reason: String },
    /// Someone else took the record over or settled it first (before the reconciler was asked,
    /// or before its answer was stored): here it is now.
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
    async fn complete(&self, json: String, ttl: Option<Duration>) -> Result<bool, Error> {
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
    async fn release(&mut self) {
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
    async fn record_refused(&self) {
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
    async fn leave_in_doubt(&self, why: &str) {
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
    fn store(&self) -> &Arc<dyn Store> {
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

impl Call {
    fn replay<T, E>(&self, record: &Record, codec: Codec<T, E>) -> Result<T, Error> {
        self.parts().replay(record, codec.decode)
    }

    /// Reserves the key, or finds its result, or waits for its owner, or asks `reconcile`
    /// about a key in doubt (once: it is taken when asked); `waited_since` is set when a wait
    /// for another owner begins.
    pub(super) async fn acquire<T, E, Rf, Fut>(
        &self,
        codec: Codec<T, E>,
        store: &Arc<dyn Store>,
        waited_since: &mut Option<Instant>,
        reconcile: &mut Option<Rf>,
    ) -> Result<Acquired<T>, Error>
    where
        Rf: FnOnce(Key) -> Fut,
        Fut: Future<Output = Result<Reconciled<T>, String>>,
    {
        let failed = |e| self.store_error(e);
        // Taken when the first wait begins: a replay never needs the clock for it.
        let mut deadline = None;
        // Why the reconciler left the key in doubt, once it was asked.
        let mut unsettled = None;
        // Taken when the first wait for a person's decision begins.
        let mut decision_deadline = None;
        // A store whose reads are round trips learns what the key holds from the reservation.
        let mut found = if store.instance().remote_reads() {
            None
        } else {
            store.get(self.key.as_str()).await.map_err(failed)?
        };
        let parts = self.parts();
        loop {
            let (now, instance) = (store.clock(), store.instance().id());
            match parts.next(found.as_ref(), now, instance, reconcile.is_some())? {
                Next::Replay => {
                    let existing = found.as_ref().expect("a replay has a record");
                    return self.replay(existing, codec).map(Acquired::Replay);
                }
                Next::Wait => {
                    let existing = found.take().expect("a wait has a record");
                    let deadline = *deadline.get_or_insert_with(|| {
                        let now = *waited_since.insert(Instant::now());
                        deadline_after(now, self.wait.unwrap_or(DEFAULT_WAIT))
                    });
                    found = parts.wait_for_owner(store.as_ref(), existing, deadline).await?;
                    continue;
                }
                Next::Reconcile => {
                    let existing = found.take().expect("a key in doubt has a record");
                    let ask = reconcile.take().expect("a reconciler to ask");
                    match self.reconcile(codec, store, existing, ask).await? {
                        Reconciliation::Landed(value) => return Ok(Acquired::Reconciled(value)),
                        Reconciliation::Released => found = None,
                        Reconciliation::InDoubt { record, reason } => {
                            unsettled = Some(reason);
                            found = Some(*record);
                        }
                        Reconciliation::Moved(now) => found = now,
                    }
                    continue;
                }
                Next::RefuseInDoubt => {
                    let existing = found.as_ref().expect("a key in doubt has a record");
                    return Err(self.in_doubt_error(existing, unsettled.take()));
                }
                Next::Denied => return Err(self.denied(store.as_ref()).await),
                Next::AwaitDecision => {
                    let existing = found.take().expect("a key awaiting approval has a record");
                    let store = store.as_ref();
                    found = self.await_decision(store, existing, &mut decision_deadline).await?;
                    continue;
                }
                Next::AskApproval => {
                    found = self.request_approval(store.as_ref(), found.take()).await?;
                    continue;
                }
                Next::Claim => {}
            }
            match self.claim(store, found.take()).await.map_err(failed)? {
                Taken::Mine(owned) => return Ok(Acquired::Owned(owned)),
                Taken::Moved(now) => found = now,
            }
        }
    }

    /// The error of a call that finds its key in doubt and may not run, with why the
    /// reconciler (if one was asked) left it so.
    fn in_doubt_error(&self, existing: &Record, reason: Option<String>) -> Error {
        tracing::warn!(key = %self.key, tool = %self.tool, "idem: in doubt: not running");
        Error::InDoubt {
            key: self.key.to_string(),
            tool: self.tool.clone(),
            since_ms: existing.updated_at,
            reason,
        }
    }

    /// Makes this call the owner of its key, found as `found` (`None`: absent): a reservation,
    /// or a takeover.
    async fn claim(
        &self,
        store: &Arc<dyn Store>,
        found: Option<Record>,
    ) -> Result<Taken, StoreError> {
        let owner = Owner::new_call(store.instance().id());
        let function = self.function.as_deref();
        let (key, now, lease) = (self.key.as_str(), store.clock(), store.instance().lease());
        let step = match &found {
            None => transition::reserve(key, &self.tool, &self.scope, function, &owner, now, lease),
            Some(found) => transition::take_over(found, &owner, function, now, lease),
        };
        let takeover = found.is_some();
        let taken = Reservation::take(store, found, step).await?;
        if let Taken::Mine(owned) = &taken {
            if takeover {
                meter::takeover(&self.tool);
                tracing::info!(key = %self.key, tool = %self.tool, attempts = owned.record().attempts, "idem: took over");
            } else {
                tracing::debug!(key = %self.key, tool = %self.tool, "idem: reserved");
            }
        }
        Ok(taken)
    }

    /// Records `json` (the body's result as [`encode_for_replay`] wrote it, or why it cannot be
    /// stored) as the call's result. The effect has landed by now, so a failure leaves the record
    /// in doubt. Only a result that reads back into `T` is recorded. When the write
    /// is refused because the key moved on while the body ran, the caller gets what the store
    /// holds instead (`Some`: the result recorded in its place), or [`Error::Superseded`]: never
    /// its own result as if it were recorded.
    pub(super) async fn complete<T, E>(
        &self,
        codec: Codec<T, E>,
        owned: Box<Reservation>,
        json: Result<String, String>,
    ) -> Result<Option<T>, Error> {
        let json = match json {
            Ok(json) => json,
            Err(reason) => {
                owned.leave_in_doubt("its result could not be stored").await;
                return Err(Error::Result {
                    key: self.key.to_string(),
                    tool: self.tool.clone(),
                    reason,
                });
            }
        };
        if owned.complete(json, self.ttl).await? {
            tracing::debug!(key = %self.key, tool = %self.tool, "idem: done");
            return Ok(None);
        }
        // Someone settled or took the record over while the body ran (an operator, or a fleet
        // peer after our lease lapsed): their write stands, ours is refused, and the history
        // says a stale owner came back.
        tracing::warn!(key = %self.key, tool = %self.tool, "idem: the record changed hands while the body ran; its result was not stored");
        owned.record_refused().await;
        let store = owned.store();
        let now = store.get(self.key.as_str()).await.map_err(|e| self.store_error(e))?;
        match now {
            Some(record) if record.status == Status::Done => self.replay(&record, codec).map(Some),
            now => Err(Error::Superseded {
                key: self.key.to_string(),
                tool: self.tool.clone(),
                now: now.map_or("absent", |record| record.status.as_str()).to_owned(),
            }),
        }
    }

    /// Asks `ask_it` whether the effect of the call that left `existing` in doubt landed,
    /// holding the key meanwhile, and settles the record by the answer.
    async fn reconcile<T, E, Rf, Fut>(
        &self,
        codec: Codec<T, E>,
        store: &Arc<dyn Store>,
        existing: Record,
        ask_it: Rf,
    ) -> Result<Reconciliation<T>, Error>
    where
        Rf: FnOnce(Key) -> Fut,
        Fut: Future<Output = Result<Reconciled<T>, String>>,
    {
        let failed = |e| self.store_error(e);
        let function = self.function.as_deref();
        let pending = match Reservation::take_to_reconcile(store, existing, function).await {
            Ok(Taken::Mine(pending)) => pending,
            Ok(Taken::Moved(now)) => return Ok(Reconciliation::Moved(now)),
            Err(e) => return Err(failed(e)),
        };
        // Unsettled until one of the settling writes below lands: a cancelled call, or a write
        // that fails, puts the key back in doubt as the reservation drops.
        let (answer, reason) = match ask(ask_it, self.key.clone()).await {
            Ok(Reconciled::Landed(value)) => match encode_for_replay(codec, &value) {
                Ok(json) => {
                    let (stored, _) = pending
                        .settle_reconciled(Ok(Some(json)), self.ttl)
                        .await
                        .map_err(failed)?;
                    if !stored {
                        // Its answer is not what the key records: the call decides again over
                        // what the store holds, as a caller whose result was refused does.
                        tracing::warn!(key = %self.key, tool = %self.tool, "idem: the record changed hands while the reconciler ran; its answer was not stored");
                        let now = store.get(self.key.as_str()).await.map_err(failed)?;
                        return Ok(Reconciliation::Moved(now));
                    }
                    return Ok(Reconciliation::Landed(value));
                }
                Err(reason) => (Answer::Erred, format!("its answer cannot be recorded: {reason}")),
            },
            Ok(Reconciled::NotLanded) => {
                pending.settle_reconciled(Ok(None), self.ttl).await.map_err(failed)?;
                return Ok(Reconciliation::Released);
            }
            Ok(Reconciled::CannotTell) => (Answer::CannotTell, "it could not tell".to_owned()),
            Err(reason) => (Answer::Erred, reason),
        };
        let (_, written) =
            pending.settle_reconciled(Err((answer, &reason)), self.ttl).await.map_err(failed)?;
        let record = Box::new(written.expect("still in doubt leaves a record"));
        Ok(Reconciliation::InDoubt { record, reason })
    }

    /// Settles the record after the body returned `Err`: released, unless the body said its
    /// effect may have landed, in which case it is left in doubt.
    pub(super) async fn after_error(&self, mut owned: Box<Reservation>, may_have_landed: bool) {
        if may_have_landed {
            owned.leave_in_doubt("the body failed after it said its effect may have landed").await
        } else {
            owned.release().await
        }
    }
}

/// `value` as the JSON text a `Done` record keeps, only if it reads back into `T`: what is
/// recorded `Done` must replay, and JSON cannot carry some values (NaN is written as `null`,
/// and a value nested past serde_json's 128 levels does not read back).
pub(super) fn encode_for_replay<T, E>(codec: Codec<T, E>, value: &T) -> Result<String, String> {
    let json = (codec.encode)(value).map_err(|e| e.to_string())?;
    match (codec.decode)(&json) {
        Ok(_) => Ok(json),
        Err(e) => Err(format!(
            "it would not replay: its JSON does not read back into the return type ({e}); JSON \
             has no NaN or infinity and reads at most 128 levels deep, so return a type that fits"
        )),
    }
}
