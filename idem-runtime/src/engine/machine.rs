//! The state machine of one call, every transition in this file:
//!
//! ```text
//! absent ──reserve──▶ in-flight ──complete──▶ done ──(ttl passes)──▶ taken over ──▶ in-flight
//!                        │  ▲
//!           release ◀────┤  └──take over (in_doubt = "rerun")── in-doubt
//!  (Err; dropped before  │
//!   the body: undone)    └──leave_in_doubt──▶ in-doubt
//!                           (Err after may_have_landed(), a panic, a future dropped while
//!                            the body ran, a result that cannot be stored)
//!
//! in-doubt ──take over to reconcile──▶ in-flight (same attempts; the reconciler runs)
//!                                        ├─ landed(v) ──settle_landed──▶ done(v)
//!                                        ├─ not landed ──settle_not_landed──▶ absent (reserve again)
//!                                        └─ cannot tell, an error, a panic, a dropped future
//!                                             ──settle_cannot_tell──▶ in-doubt
//! ```
//!
//! [`Call::acquire`] is one `loop { match … }` over the [`assess`]ment of the record found.
//! A [`Reservation`] is what a call holds while it owns the key; it is settled by an explicit
//! call ([`Reservation::complete`], [`Reservation::release`],
//! [`Reservation::leave_in_doubt`]), and its `Drop` is only a safety net that calls the same
//! transitions without waiting. Outside the engine, two more transitions exist: a sled store
//! marks at open the in-flight records a dead process left in doubt, and an operator settles an
//! in-doubt record (`admin::resolve`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::reconcile::{ask, Reconciled};
use super::{Call, Codec, InDoubtPolicy};
use crate::error::{Error, StoreError};
use crate::history::{Answer, Change, Event};
use crate::key::Key;
use crate::meter::{self, Outcome};
use crate::protocol::{assess, Assessment, Owner, Status};
use crate::record::{now_ms, Record};
use crate::store::{Reserved, Store};
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

/// How asking a reconciler about a key in doubt ended.
pub(super) enum Reconciliation<T> {
    /// It landed: the result is recorded `Done`.
    Landed(T),
    /// It did not land: the key is released, for the body to run.
    Released,
    /// The key is in doubt again, for `reason`; the record as written.
    InDoubt { record: Box<Record>, reason: String },
    /// Someone else took the record over or settled it first: nothing was asked.
    Moved,
}

/// The reservation a call holds while it owns the key: a first reservation and a takeover
/// alike, from the moment the write that makes it is sent.
pub(super) struct Reservation {
    store: Arc<dyn Store>,
    record: Record,
    /// What is put back if the call ends before its body starts: the record a takeover
    /// replaced, or for a reconciliation the key in doubt, written as this call; `None` for a
    /// first reservation, which is then deleted.
    before: Option<Record>,
    /// Whether the body has started: from then on the effect may have landed.
    started: bool,
    settled: bool,
}

impl Reservation {
    fn new(store: &Arc<dyn Store>, record: Record, before: Option<Record>) -> Reservation {
        Reservation { store: Arc::clone(store), record, before, started: false, settled: false }
    }

    /// From here on, the body runs: dropping the reservation leaves the key in doubt.
    pub(super) fn start(&mut self) {
        self.started = true;
    }

    /// The description of a change this call makes to its record, for the key's history.
    fn change(&self, event: Event) -> Change<'_> {
        Change::new(event, self.record.owner.as_str())
    }

    /// in-flight → done: records `json`, the body's result. Returns whether it was stored
    /// (`false`: the record changed hands while the body ran, and that write stands).
    async fn complete(&mut self, json: String, ttl: Option<Duration>) -> Result<bool, Error> {
        let done = self.record.done_json(json, now_ms(), ttl);
        let change = self.change(Event::Done);
        let stored = self.store.replace(&self.record, Some(&done), change).await.map_err(|e| {
            // Unsettled, the reservation leaves the key in doubt as it drops.
            Error::store(Some(&self.record.key), Some(&self.record.tool), e)
        })?;
        self.settled = true;
        Ok(stored)
    }

    /// in-flight → absent: nothing landed, so the next call runs the body.
    async fn release(&mut self) {
        // Nothing landed: should the release fail, the reservation tries the release once more
        // as it drops, rather than marking the key in doubt.
        self.started = false;
        meter::call(&self.record.tool, Outcome::Released, Duration::ZERO);
        match self.store.replace(&self.record, None, self.change(Event::Released)).await {
            Ok(_) => {
                self.settled = true;
                tracing::debug!(key = %self.record.key, tool = %self.record.tool, "idem: released after an error")
            }
            Err(e) => {
                tracing::error!(key = %self.record.key, tool = %self.record.tool, error = %e, "idem: cannot release the key after an error")
            }
        }
    }

    /// in-flight → in-doubt: the effect may have landed, and only an operator or the
    /// `in_doubt` policy may decide; `why` goes into the key's history.
    async fn leave_in_doubt(&mut self, why: &str) {
        let doubt = self.record.in_doubt(now_ms());
        let change = self.change(Event::InDoubt).note(why);
        match self.store.replace(&self.record, Some(&doubt), change).await {
            Ok(_) => {
                self.settled = true;
                meter::call(&self.record.tool, Outcome::InDoubt, Duration::ZERO);
                tracing::warn!(key = %self.record.key, tool = %self.record.tool, "idem: in doubt: the body failed after its effect may have landed");
            }
            // Unsettled, the reservation tries once more as it drops.
            Err(e) => {
                tracing::error!(key = %self.record.key, tool = %self.record.tool, error = %e, "idem: cannot mark the key in doubt")
            }
        }
    }

    /// in-doubt → in-flight, to ask the reconciler: takes `existing` (in doubt, or in flight
    /// under a dead owner) over for a new call of `store`, with the same `attempts`. Guarded from
    /// before the write is sent, like a takeover: dropped unsettled (the call is cancelled while
    /// the reconciler runs), it puts the key back in doubt. `None` when the record had moved on.
    /// `function` is the calling function's path, recorded as a rerun records it (a sweep has
    /// none, and keeps the record's).
    pub(super) async fn take_over_to_reconcile(
        store: &Arc<dyn Store>,
        existing: &Record,
        function: Option<&str>,
    ) -> Result<Option<Box<Reservation>>, StoreError> {
        let now = now_ms();
        let mut record = existing.reconciling(Owner::new_call(store.owner_id()), now);
        if let Some(function) = function {
            record.function = Some(function.to_owned());
        }
        // What a cancelled reconciliation puts back: in doubt, written as this call, so that a
        // store with leases takes it as the owner's own settling write.
        let doubt = record.in_doubt(now);
        let mut pending = Box::new(Reservation::new(store, record, Some(doubt)));
        let change = Change::new(Event::TookOver, pending.record.owner.as_str())
            .note("to ask the tool's reconciler whether the effect landed");
        if store.replace(existing, Some(&pending.record), change).await? {
            tracing::info!(key = %existing.key, tool = %existing.tool, "idem: took over to reconcile");
            Ok(Some(pending))
        } else {
            pending.settled = true;
            Ok(None)
        }
    }

    /// in-flight (reconciling) → done: the reconciler found the effect landed, with `json`.
    /// Returns whether it was stored (`false`: the record changed hands meanwhile, as when an
    /// operator resolved it; that write stands).
    pub(super) async fn settle_landed(
        &mut self,
        json: String,
        ttl: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let done = self.record.done_json(json, now_ms(), ttl);
        let change = self.change(Event::Reconciled { answer: Answer::Landed });
        let stored = self.store.replace(&self.record, Some(&done), change).await?;
        self.settled = true;
        meter::reconciliation(&self.record.tool, Answer::Landed);
        tracing::info!(key = %self.record.key, tool = %self.record.tool, "idem: reconciled: the effect landed; its result is recorded");
        Ok(stored)
    }

    /// in-flight (reconciling) → absent: the reconciler found the effect did not land, so the
    /// key is released and the next reservation runs the body.
    pub(super) async fn settle_not_landed(&mut self) -> Result<bool, StoreError> {
        let change = self.change(Event::Reconciled { answer: Answer::NotLanded });
        let released = self.store.replace(&self.record, None, change).await?;
        self.settled = true;
        meter::reconciliation(&self.record.tool, Answer::NotLanded);
        tracing::info!(key = %self.record.key, tool = %self.record.tool, "idem: reconciled: the effect did not land; the key is released");
        Ok(released)
    }

    /// in-flight (reconciling) → in-doubt: the reconciler could not tell, erred or panicked
    /// (`reason` says which), or its answer cannot be stored. Returns the record as written.
    pub(super) async fn settle_cannot_tell(
        &mut self,
        answer: Answer,
        reason: &str,
    ) -> Result<Record, StoreError> {
        let doubt = self.record.in_doubt(now_ms());
        let change = self.change(Event::Reconciled { answer }).note(reason);
        self.store.replace(&self.record, Some(&doubt), change).await?;
        self.settled = true;
        // Only the answer is counted here: a call that then returns `Error::InDoubt` is counted
        // as it returns, and a sweep is no call.
        meter::reconciliation(&self.record.tool, answer);
        tracing::warn!(key = %self.record.key, tool = %self.record.tool, reason, "idem: still in doubt: the reconciler did not settle it");
        Ok(doubt)
    }

    /// in-flight → as it was before this call, without waiting, for `Drop`: the body never
    /// started, so nothing landed. A first reservation is deleted; a takeover puts back the
    /// record it replaced (an in-doubt key stays in doubt, an expired result stays expired), and
    /// a reconciliation puts the key back in doubt.
    fn undo_detached(&mut self) {
        self.settled = true;
        // Put back as this call's own write: on a store with leases, only the owner may replace
        // an in-flight record while its lease holds, and this call's lease holds until the
        // write lands (it would otherwise be renewed, and the key kept in flight, for as long
        // as the store lives). The owner of a record that is not in flight means nothing else.
        let back =
            self.before.take().map(|before| Record { owner: self.record.owner.clone(), ..before });
        let change = Change::new(Event::Undone, self.record.owner.as_str())
            .note("the call ended before its body started");
        self.store.replace_detached(&self.record, back, change);
    }

    /// [`Reservation::leave_in_doubt`] without waiting, for `Drop`.
    fn leave_in_doubt_detached(&mut self) {
        self.settled = true;
        meter::call(&self.record.tool, Outcome::InDoubt, Duration::ZERO);
        tracing::warn!(key = %self.record.key, tool = %self.record.tool, "idem: in doubt: the body panicked or its future was dropped");
        let change = self
            .change(Event::InDoubt)
            .note("the body panicked, its future was dropped, or its result could not be stored");
        self.store.replace_detached(&self.record, Some(self.record.in_doubt(now_ms())), change);
    }
}

impl Drop for Reservation {
    /// The safety net of a call that ended without settling: a panic, a dropped future, or a
    /// settling write that failed.
    fn drop(&mut self) {
        if !self.settled {
            if self.started {
                self.leave_in_doubt_detached();
            } else {
                self.undo_detached();
            }
        }
    }
}

impl Call {
    /// A record for this call, owned by a new call of `store`.
    fn fresh_record(&self, store: &dyn Store) -> Record {
        let mut record = Record::reserve(
            self.key.as_str(),
            &self.tool,
            &self.scope,
            Owner::new_call(store.owner_id()),
            now_ms(),
        );
        record.function.clone_from(&self.function);
        record
    }

    /// Refuses a record another function wrote: the two share a tool name, and so its keys.
    /// Records that name no function (written by `Call` without one, or by another language's
    /// client) are taken as this call's.
    fn check_function(&self, found: &Record) -> Result<(), Error> {
        match (&found.function, &self.function) {
            (Some(recorded), Some(calling)) if recorded != calling => Err(Error::SharedToolName {
                key: self.key.to_string(),
                tool: self.tool.clone(),
                recorded: recorded.clone(),
                calling: calling.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn replay<T, E>(&self, record: &Record, codec: Codec<T, E>) -> Result<T, Error> {
        // A unit result of the first (JSON) sled format reads back as no result: `null`.
        let json = record.result.as_deref().unwrap_or("null");
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: replay");
        (codec.decode)(json).map_err(|source| Error::Replay {
            key: self.key.to_string(),
            tool: self.tool.clone(),
            source,
        })
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
        let key = self.key.as_str();
        let failed = |e| self.store_error(e);
        // Taken when the first wait begins: a replay never needs the clock for it.
        let mut deadline = None;
        // Why the reconciler left the key in doubt, once it was asked.
        let mut unsettled = None;
        let mut found = store.peek(key).await.map_err(failed)?;
        loop {
            if let Some(found) = &found {
                self.check_function(found)?;
            }
            let takeover = match assess(found.as_ref(), now_ms(), |r| store.owner_alive(r)) {
                Assessment::Absent => {
                    let fresh = self.fresh_record(store.as_ref());
                    let mut pending = Reservation::new(store, fresh, None);
                    let change = Change::new(Event::Reserved, pending.record.owner.as_str());
                    match store.reserve(&pending.record, change).await {
                        Ok(Reserved::Mine) => {
                            tracing::debug!(key = %self.key, tool = %self.tool, "idem: reserved");
                            return Ok(Acquired::Owned(Box::new(pending)));
                        }
                        Ok(Reserved::Taken(existing)) => {
                            pending.settled = true;
                            found = Some(existing);
                            continue;
                        }
                        // The insert may or may not have happened: the reservation undoes it if
                        // it did.
                        Err(e) => return Err(failed(e)),
                    }
                }
                Assessment::Replay => {
                    let existing = found.as_ref().expect("assessed a found record");
                    return self.replay(existing, codec).map(Acquired::Replay);
                }
                Assessment::Expired => self.fresh_record(store.as_ref()),
                Assessment::Running => {
                    let existing = found.take().expect("assessed a found record");
                    tracing::debug!(key = %self.key, tool = %self.tool, "idem: waiting for the owner");
                    let deadline = *deadline.get_or_insert_with(|| {
                        let now = *waited_since.insert(Instant::now());
                        deadline_after(now, self.wait.unwrap_or_else(|| store.default_wait()))
                    });
                    found = store.changed(key, &existing, deadline).await.map_err(failed)?;
                    let unchanged =
                        found.as_ref().is_some_and(|now| now.fence() == existing.fence());
                    if unchanged && Instant::now() >= deadline {
                        return Err(Error::InFlight {
                            key: self.key.to_string(),
                            tool: self.tool.clone(),
                            since_ms: existing.created_at,
                        });
                    }
                    continue;
                }
                Assessment::InDoubt if reconcile.is_some() => {
                    let existing = found.take().expect("assessed a found record");
                    let ask = reconcile.take().expect("a reconciler to ask");
                    match self.reconcile(codec, store, &existing, ask).await? {
                        Reconciliation::Landed(value) => return Ok(Acquired::Reconciled(value)),
                        Reconciliation::Released => found = None,
                        Reconciliation::InDoubt { record, reason } => {
                            unsettled = Some(reason);
                            found = Some(*record);
                        }
                        Reconciliation::Moved => found = store.get(key).await.map_err(failed)?,
                    }
                    continue;
                }
                Assessment::InDoubt => {
                    let existing = found.as_ref().expect("assessed a found record");
                    match self.in_doubt {
                        InDoubtPolicy::Fail => {
                            tracing::warn!(key = %self.key, tool = %self.tool, "idem: in doubt: not running");
                            return Err(Error::InDoubt {
                                key: self.key.to_string(),
                                tool: self.tool.clone(),
                                since_ms: existing.updated_at,
                                reason: unsettled.take(),
                            });
                        }
                        InDoubtPolicy::Rerun => {
                            let mut takeover =
                                existing.taken_over(Owner::new_call(store.owner_id()), now_ms());
                            if self.function.is_some() {
                                takeover.function.clone_from(&self.function);
                            }
                            takeover
                        }
                    }
                }
            };
            // Expired or in doubt: take the record over, if it is still as it was found. Guarded
            // like a first reservation from before the write is sent, so that a call dropped
            // while it waits for the write undoes it instead of leaving the key in flight.
            let existing = found.take().expect("assessed a found record");
            let mut pending = Reservation::new(store, takeover, Some(existing));
            let before = pending.before.as_ref().expect("a takeover replaces a record");
            let why = match before.status {
                Status::Done => "its result expired",
                _ => "in doubt, and the call reruns it (in_doubt = \"rerun\")",
            };
            let change = Change::new(Event::TookOver, pending.record.owner.as_str()).note(why);
            match store.replace(before, Some(&pending.record), change).await {
                Ok(true) => {
                    meter::takeover(&self.tool);
                    tracing::info!(key = %self.key, tool = %self.tool, attempts = pending.record.attempts, "idem: took over");
                    return Ok(Acquired::Owned(Box::new(pending)));
                }
                Ok(false) => pending.settled = true,
                // The write may or may not have happened: the reservation undoes it if it did.
                Err(e) => return Err(failed(e)),
            }
            found = store.get(key).await.map_err(failed)?;
        }
    }

    /// Records `value` as the call's result. The effect has landed by now, so a failure leaves
    /// the record in doubt. Only a result that reads back into `T` is recorded: what is recorded
    /// `Done` must replay, and JSON cannot carry some values (NaN is written as `null`, and a
    /// value nested past serde_json's 128 levels does not read back).
    pub(super) async fn complete<T, E>(
        &self,
        codec: Codec<T, E>,
        mut owned: Box<Reservation>,
        value: &T,
    ) -> Result<(), Error> {
        let json = match encode_for_replay(codec, value) {
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
        } else {
            // Someone settled or took the record over while the body ran (an operator, or a
            // fleet peer after our lease lapsed): their write stands, ours is refused.
            tracing::warn!(key = %self.key, tool = %self.tool, "idem: the record changed hands while the body ran; its result was not stored");
        }
        Ok(())
    }

    /// Asks `ask` whether the effect of the call that left `existing` in doubt landed, holding
    /// the key meanwhile, and settles the record by the answer.
    async fn reconcile<T, E, Rf, Fut>(
        &self,
        codec: Codec<T, E>,
        store: &Arc<dyn Store>,
        existing: &Record,
        ask_it: Rf,
    ) -> Result<Reconciliation<T>, Error>
    where
        Rf: FnOnce(Key) -> Fut,
        Fut: Future<Output = Result<Reconciled<T>, String>>,
    {
        let failed = |e| self.store_error(e);
        let Some(mut pending) =
            Reservation::take_over_to_reconcile(store, existing, self.function.as_deref())
                .await
                .map_err(failed)?
        else {
            return Ok(Reconciliation::Moved);
        };
        // Unsettled until one of the settling writes below lands: a cancelled call, or a write
        // that fails, puts the key back in doubt as the reservation drops.
        let (answer, reason) = match ask(ask_it, self.key.clone()).await {
            Ok(Reconciled::Landed(value)) => match encode_for_replay(codec, &value) {
                Ok(json) => {
                    if !pending.settle_landed(json, self.ttl).await.map_err(failed)? {
                        tracing::warn!(key = %self.key, tool = %self.tool, "idem: the record changed hands while the reconciler ran; its answer was not stored");
                    }
                    return Ok(Reconciliation::Landed(value));
                }
                Err(reason) => (Answer::Erred, format!("its answer cannot be recorded: {reason}")),
            },
            Ok(Reconciled::NotLanded) => {
                pending.settle_not_landed().await.map_err(failed)?;
                return Ok(Reconciliation::Released);
            }
            Ok(Reconciled::CannotTell) => (Answer::CannotTell, "it could not tell".to_owned()),
            Err(reason) => (Answer::Erred, reason),
        };
        let record = pending.settle_cannot_tell(answer, &reason).await.map_err(failed)?;
        Ok(Reconciliation::InDoubt { record: Box::new(record), reason })
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
