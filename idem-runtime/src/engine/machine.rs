//! The state machine of one call: [`Call::acquire`] is one `loop { match … }` over the
//! [`assess`]ment of the record found. Every transition is a function of
//! `lifecycle/transition.rs`; this file decides which one a call makes, and writes it through the
//! [`Reservation`] the call holds while it owns the key (`reservation.rs`): [`Reservation::take`]
//! to own the key, [`Reservation::settle`] to give it up.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use super::decide::Next;
use super::reconciler::{ask, Reconciled};
use super::reservation::{Reservation, Taken};
use super::{Call, Codec, DEFAULT_WAIT};
use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::lifecycle::history::Answer;
use crate::lifecycle::transition;
use crate::lifecycle::{Owner, Record, Status};
use crate::meter;
use crate::store::Store;
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
