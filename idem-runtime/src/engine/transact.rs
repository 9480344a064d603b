//! Transactional calls: the body's writes and the call's record commit in one transaction of
//! the store's database, or neither does. This is the engine's run path for them, whatever the
//! store: a store only lends a [`Transaction`] (idem's writes inside it, and its commit), and
//! the engine decides what to write, with the same decision table as every call.
//!
//! One attempt ([`Call::attempt`]) runs inside one transaction:
//!
//! 1. Insert the call's record, in flight, with its `reserved` history row. A record already
//!    there is decided by [`CallParts::next`]: a result replays, an expired one (or one in
//!    doubt under `InDoubtPolicy::Rerun`) is taken over inside the transaction, a key in doubt
//!    fails, and another call's record in flight is waited for, after the transaction ends.
//! 2. Run the body with the transaction, for its writes, watched for a commit or rollback of
//!    its own.
//! 3. On `Ok`, write the record `done` with the result and commit, together. On `Err`, a panic,
//!    a dropped future or a dead process, the transaction rolls back: the record and the body's
//!    writes are gone together, and the key is free.
//!
//! [`Call::transact`] runs attempts until one ends the call: it waits for another owner between
//! them, and counts the call's outcome once.

use std::future::Future;
use std::time::Instant;

use super::machine::encode_for_replay;
use super::{as_current, reports_failure, Call, CallParts, Codec, Next, DEFAULT_WAIT};
use crate::error::{Error, StoreError};
use crate::failpoint::failpoint;
use crate::lifecycle::transition;
use crate::lifecycle::{Guard, Owner, Record};
use crate::meter::{self, Outcome};
use crate::store::transaction::{Committed, Transaction};
use crate::store::{Inserted, Store};
use crate::time::deadline_after;

/// How one attempt of a transactional call ended: what [`Call::attempt`] answers, and what a
/// store's own failure before it (a connection it could not lend) is, for [`Call::transact`].
#[doc(hidden)]
pub struct Attempt<T, E>(Ended<T, E>);

enum Ended<T, E> {
    /// The call's value, committed by this attempt.
    Fresh(T),
    /// The call's value, replayed from the committed record.
    Replay(T),
    /// The call fails with this error, counted as this outcome; nothing of it was committed
    /// (or, for an error in doubt, what was is recorded so).
    Fail(E, Outcome),
    /// Rolled back for a reason another attempt may cure; the error if none is left.
    Again(E, Outcome),
    /// Another call holds the key in flight: wait for it, then try again (the body did not run).
    Wait(Box<Record>),
    /// The body's value says it failed (`reports_failure`): rolled back, and handed to the
    /// caller unrecorded.
    Unrecorded(T),
}

impl<T, E> Attempt<T, E> {
    /// An attempt that ended before it began: the store could not lend a transaction. Another
    /// attempt runs when the error is [`StoreError::is_transient`].
    pub fn failed(call: &Call, codec: Codec<T, E>, source: StoreError) -> Attempt<T, E> {
        let again = source.is_transient();
        let error = (codec.error)(call.store_error(source));
        Attempt(if again {
            Ended::Again(error, Outcome::Error)
        } else {
            Ended::Fail(error, Outcome::Error)
        })
    }

    fn fail(codec: Codec<T, E>, error: Error) -> Attempt<T, E> {
        let outcome = Outcome::of_error(&error);
        let again = matches!(&error, Error::Store { source, .. } if source.is_transient());
        let error = (codec.error)(error);
        Attempt(if again { Ended::Again(error, outcome) } else { Ended::Fail(error, outcome) })
    }
}

/// How a transactional call's transaction is run again after a failure another attempt may
/// cure: at most `attempts` times in all, and `transient` says which of the body's own errors
/// are such failures (the store's say so themselves, [`StoreError::is_transient`]).
#[doc(hidden)]
pub struct Retries<E> {
    /// How many attempts at most (at least 1).
    pub attempts: u32,
    /// Whether the body's error is one another attempt may cure.
    pub transient: fn(&E) -> bool,
}

impl<E> Clone for Retries<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Retries<E> {}

impl<E> Retries<E> {
    /// One attempt: nothing is run again (SQLite, whose `BEGIN IMMEDIATE` leaves it no
    /// serialization failure or deadlock to report).
    pub fn once() -> Retries<E> {
        Retries { attempts: 1, transient: |_| false }
    }
}

/// Where an attempt runs: the store's instance (whose owners it writes) and its clock.
#[doc(hidden)]
pub struct Site<'a> {
    /// The instance the store writes owners as.
    pub instance: &'a str,
    /// The store's clock, in milliseconds.
    pub clock: &'a (dyn Fn() -> u64 + Sync),
}

/// How the claim of the key inside the transaction ended.
enum Claimed {
    /// The key is this transaction's, with the record as written and its fencing token.
    Mine(Record, u64),
    /// A finished record: replay its result.
    Replay(Record),
    /// Another call holds the key.
    Wait(Record),
}

impl Call {
    /// Runs a transactional call to its end: `attempt` runs one transaction (which
    /// [`Call::attempt`] fills), and is run again after waiting for another owner of the key on
    /// `store`. Counts the call once. A call that needs a person's approval is refused before
    /// anything is written: a transactional call asks no one.
    #[doc(hidden)]
    pub async fn transact<T, E, A, Fut>(
        &self,
        codec: Codec<T, E>,
        store: &dyn Store,
        retries: Retries<E>,
        mut attempt: A,
    ) -> Result<T, E>
    where
        A: FnMut() -> Fut,
        Fut: Future<Output = Attempt<T, E>>,
    {
        let started = Instant::now();
        let parts = self.parts();
        let count = |outcome| meter::call(parts.tool, outcome, started.elapsed());
        if parts.needs_approval() {
            count(Outcome::Error);
            return Err((codec.error)(parts.cannot_ask_in_a_transaction()));
        }
        let (mut deadline, mut failed) = (None, 0);
        loop {
            let waited = deadline.is_some();
            let Attempt(ended) = attempt().await;
            match ended {
                Ended::Fresh(value) => {
                    count(if waited { Outcome::Waited } else { Outcome::Fresh });
                    return Ok(value);
                }
                Ended::Replay(value) => {
                    count(if waited { Outcome::Waited } else { Outcome::Replay });
                    return Ok(value);
                }
                Ended::Unrecorded(value) => {
                    count(Outcome::Released);
                    return Ok(value);
                }
                Ended::Fail(e, outcome) => {
                    count(outcome);
                    return Err(e);
                }
                Ended::Again(e, outcome) => {
                    failed += 1;
                    if failed >= retries.attempts.max(1) {
                        count(outcome);
                        return Err(e);
                    }
                    tracing::debug!(key = %self.key, tool = %self.tool, failed, "idem: the transaction failed; running it again");
                    crate::exec::sleep_until(Instant::now() + backoff(failed)).await;
                }
                Ended::Wait(record) => {
                    let deadline = *deadline.get_or_insert_with(|| {
                        let wait = parts.wait.unwrap_or(DEFAULT_WAIT);
                        deadline_after(Instant::now(), wait)
                    });
                    if let Err(e) = parts.wait_for_owner(store, *record, deadline).await {
                        count(Outcome::of_error(&e));
                        return Err((codec.error)(e));
                    }
                }
            }
        }
    }

    /// One attempt inside `tx`, a transaction just begun: claim the key, run the body (taken
    /// from `body` only when the key is this call's), record its result and commit. `store`
    /// is where a record the body's own commit kept is marked in doubt.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub async fn attempt<X, T, E, F>(
        &self,
        codec: Codec<T, E>,
        site: &Site<'_>,
        mut tx: X,
        body: &mut Option<F>,
        store: Option<&dyn Store>,
        transient: fn(&E) -> bool,
    ) -> Attempt<T, E>
    where
        X: Transaction,
        F: AsyncFnOnce(&mut X::Body) -> Result<T, E>,
    {
        let parts = self.parts();
        let fail = |e: Error| Attempt::fail(codec, e);
        let (held, token) = match parts.claim_in(&mut tx, site).await {
            Ok(Claimed::Mine(held, token)) => (held, token),
            Ok(Claimed::Replay(record)) => {
                return match parts.replay(&record, codec.decode) {
                    Ok(value) => Attempt(Ended::Replay(value)),
                    Err(e) => fail(e),
                };
            }
            Ok(Claimed::Wait(record)) => return Attempt(Ended::Wait(Box::new(record))),
            Err(e) => return fail(e),
        };
        let Some(body) = body.take() else {
            return fail(self.store_error(StoreError::new(
                "the transactional call's body was already run by an earlier attempt",
            )));
        };
        tx.body_starts();
        // Called inside the current call's scope, so that a sync body's work (done when it is
        // called) sees it too.
        let ran = as_current(&self.key, token, async { body(tx.body()).await }).await;
        match tx.body_ended().await {
            Ok(None) => {}
            Ok(Some(landed)) => return fail(self.ended_by_body(&held, landed, site, store).await),
            Err(e) => return fail(self.store_error(e)),
        }
        let value = match ran {
            Ok(value) => value,
            // Dropping `tx` rolls back: the record and the body's writes go together.
            Err(e) if transient(&e) => return Attempt(Ended::Again(e, Outcome::Released)),
            Err(e) => return Attempt(Ended::Fail(e, Outcome::Released)),
        };
        let json = match encode_for_replay(codec, &value) {
            // The body told the model it failed: its writes roll back with the record.
            Ok(json) if reports_failure(&json) => return Attempt(Ended::Unrecorded(value)),
            Ok(json) => json,
            Err(reason) => {
                let (key, tool) = (self.key.to_string(), self.tool.clone());
                return fail(Error::Result { key, tool, reason });
            }
        };
        let step = transition::complete(&held, json, self.ttl, (site.clock)());
        let done = step.new.as_ref().expect("a completion leaves a record");
        failpoint("txn_before_commit");
        let guard = Guard::of(held.fence(), step.change.by(), site.instance);
        match tx.complete_and_commit(&held, guard, done, &step.change).await {
            Ok(Committed::Committed) => {}
            Ok(Committed::NotAsLeft) => {
                return fail(self.store_error(StoreError::new(
                    "the record was not as the call left it when its result was written, so \
                     nothing was committed: does the body write to idem's tables?",
                )));
            }
            Ok(Committed::EndedByBody { landed }) => {
                return fail(self.ended_by_body(&held, landed, site, store).await);
            }
            Err(e) => return fail(self.store_error(e)),
        }
        failpoint("txn_after_commit");
        tracing::debug!(key = %self.key, tool = %self.tool, "idem: done, in one transaction");
        Attempt(Ended::Fresh(value))
    }

    /// The error of a call whose body committed or rolled back its transaction itself. When
    /// its commit may have kept its writes (and the record in flight with them), the record is
    /// marked in doubt on `store`: what the body wrote is never reported as not landed.
    async fn ended_by_body(
        &self,
        held: &Record,
        landed: bool,
        site: &Site<'_>,
        store: Option<&dyn Store>,
    ) -> Error {
        const ADVICE: &str = "write through the transaction only, and let idem end it";
        if !landed {
            return self.store_error(
                StoreError::new(format!(
                    "the body ended the transaction itself (a COMMIT or ROLLBACK of its own); \
                     idem turned it into a rollback, so nothing the body wrote was kept and the \
                     key is free: {ADVICE}"
                ))
                .lasting(),
            );
        }
        let reason = format!(
            "the body ended the transaction itself (a COMMIT or ROLLBACK of its own), so what it \
             wrote may have been kept without its result: {ADVICE}"
        );
        let step = transition::leave_in_doubt(held, reason.as_str(), (site.clock)());
        if let (Some(store), Some(in_doubt)) = (store, step.new.as_ref()) {
            // The body's commit kept the record in flight: mark it. A rollback of the body's
            // took it away, though what the body wrote after may have landed: put it back in
            // doubt.
            let guard = Guard::of(held.fence(), step.change.by(), store.instance());
            let marked = match store
                .compare_and_swap(held, guard, Some(in_doubt), step.change.clone())
                .await
            {
                Ok(Some(_)) => Ok(()),
                Ok(None) => store.insert_if_absent(in_doubt, step.change).await.map(drop),
                Err(e) => Err(e),
            };
            if let Err(e) = marked {
                tracing::error!(key = %self.key, tool = %self.tool, error = %e, "idem: cannot mark the key in doubt after the body ended its transaction");
            }
        }
        tracing::warn!(key = %self.key, tool = %self.tool, "idem: in doubt: the body committed its transaction itself");
        Error::InDoubt {
            key: self.key.to_string(),
            tool: self.tool.clone(),
            since_ms: (site.clock)(),
            reason: Some(reason),
        }
    }
}

impl CallParts<'_> {
    /// Makes the key the transaction's: inserts the record when the key is absent, else
    /// decides by [`CallParts::next`] about the record found. A transactional call asks no one:
    /// a key in doubt, awaiting a decision or denied is refused.
    async fn claim_in<X: Transaction>(
        &self,
        tx: &mut X,
        site: &Site<'_>,
    ) -> Result<Claimed, Error> {
        let failed = |e| Error::store(Some(self.key.as_str()), Some(self.tool), e);
        let owner = Owner::new_call(site.instance);
        let now = (site.clock)();
        let key = self.key.as_str();
        // Absent at first: the insert reads the record only when there is one.
        let mut found = None;
        // A record that changes under every swap is a store that does not hold its rows
        // while the transaction runs: give up rather than loop.
        for _ in 0..CLAIMS {
            let Some(record) = found.take() else {
                // Absent (at first, or after a concurrent transaction rolled its insert back).
                let step =
                    transition::reserve(key, self.tool, self.scope, self.function, &owner, now);
                let new = step.new.expect("a reservation leaves a record");
                match tx.insert_if_absent(&new, &step.change).await.map_err(failed)? {
                    Inserted::New { token } => return Ok(Claimed::Mine(new, token)),
                    Inserted::Existing(now) => found = Some(now),
                }
                continue;
            };
            match self.next(Some(&record), now, site.instance, false)? {
                Next::Replay => return Ok(Claimed::Replay(record)),
                Next::Wait => return Ok(Claimed::Wait(record)),
                Next::RefuseInDoubt => {
                    return Err(Error::InDoubt {
                        key: key.to_owned(),
                        tool: self.tool.to_owned(),
                        since_ms: record.updated_at,
                        reason: None,
                    })
                }
                Next::AwaitDecision => return Err(self.awaiting_approval(&record)),
                Next::AskApproval | Next::Reconcile => {
                    return Err(self.cannot_ask_in_a_transaction())
                }
                Next::Denied => {
                    let history = tx.history(key).await.ok();
                    return Err(self.denied(history.as_deref()));
                }
                Next::Claim => {
                    let step = transition::take_over(&record, &owner, self.function, now);
                    let new = step.new.expect("a takeover leaves a record");
                    let guard = Guard::of(record.fence(), step.change.by(), site.instance);
                    let taken = tx.compare_and_swap(&record, guard, &new, &step.change).await;
                    match taken.map_err(failed)? {
                        Some(token) => return Ok(Claimed::Mine(new, token)),
                        // Changed by a transaction that committed meanwhile: decide again.
                        None => found = tx.get(key).await.map_err(failed)?,
                    }
                }
            }
        }
        Err(failed(StoreError::new(format!(
            "key {key} changed under each of {CLAIMS} takeovers inside one transaction: does \
             something write to idem's tables without taking their locks?"
        ))))
    }
}

/// The pause before attempt `failed + 1`: 5 ms doubling, with a little spread so that two
/// transactions that deadlocked do not meet again at once.
fn backoff(failed: u32) -> std::time::Duration {
    let base = 5u64 << failed.min(6);
    let spread = crate::lifecycle::now_ms() % base.max(1);
    std::time::Duration::from_millis(base + spread / 2)
}

/// How many writes a claim inside one transaction tries (inserts, and takeovers the store
/// refused) before it gives up.
const CLAIMS: usize = 8;
