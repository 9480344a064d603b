//! Transactional calls: the body's writes and the call's record commit in one transaction of
//! the store's database, or neither does. This is the engine's run path for them, whatever the
//! store: a store only lends a [`Transaction`] (idem's writes inside it, and its commit), and
//! the engine decides what to write, with the same decision table as every call.
//!
//! One attempt ([`Call::attempt`]) runs inside one transaction:
//!
//! 1. Insert the call's record, in flight, with its `reserved` history row, unless the record
//!    the store read as the transaction began ([`Transaction::committed_before`]) replays. A
//!    record already there is decided by [`CallParts::next`]: a result replays, an expired one,
//!    an approved one (or one in doubt under `InDoubtPolicy::Rerun`) is taken over inside the
//!    transaction, a key in doubt fails, and another call's record in flight is waited for,
//!    after the transaction ends. A key that needs a person (to ask for approval, to wait for a
//!    decision, or to read a denial) is left to [`Call::transact`] too: the transaction rolls
//!    back having written nothing, and the body does not run.
//! 2. Run the body with the transaction, for its writes, watched for a commit or rollback of
//!    its own.
//! 3. On `Ok`, write the record `done` with the result and commit, together. On `Err`, a panic,
//!    a dropped future or a dead process, the transaction rolls back: the record and the body's
//!    writes are gone together, and the key is free.
//!
//! [`Call::transact`] runs attempts until one ends the call: between them, with no transaction
//! open, it waits for another owner, or does what a key that needs a person needs (records it
//! as awaiting approval, waits for the decision, or reads the denial: `approval.rs`, as for
//! every call), and it counts the call's outcome once. The approval request is a write of its
//! own, committed before any transaction runs the body; the run it lets through takes the
//! approved record over inside its transaction, so that the record and the body's writes
//! commit together, and a crash between any two writes leaves the key awaiting approval,
//! approved, or done with the body's writes.

use std::future::Future;
use std::time::Instant;

use super::codec::{reports_failure, Codec};
use super::machine::encode_for_replay;
use super::parts::CallParts;
use super::{as_current, Call, Next, DEFAULT_WAIT};
use crate::error::{Error, StoreError};
use crate::failpoint::failpoint;
use crate::lifecycle::transition;
use crate::lifecycle::{Guard, Owner, Record, Status};
use crate::meter::{self, Outcome};
use crate::retry::raise;
use crate::store::transaction::{Committed, Transaction};
use crate::store::{Inserted, Instance, Store};
use crate::time::deadline_after;

/// How one attempt of a transactional call ended: what [`Call::attempt`] answers, and what a
/// store's own failure before it (a connection it could not lend) is, for [`Call::transact`].
/// With it, the approval the attempt's run used, when its body failed.
#[doc(hidden)]
pub struct Attempt<T, E>(Ended<T, E>, Option<Box<Used>>);

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
    /// The key needs a person: rolled back having written nothing (the body did not run), for
    /// [`Call::transact`] to do what it needs with no transaction open.
    Person(Box<Person>),
}

/// An approval that let a run through whose body failed: the record as the rollback left it
/// (approved), and the run's owner. Once the call ends with that failure, [`Call::transact`]
/// spends it ([`transition::spend_approval`]).
struct Used {
    approved: Record,
    owner: Owner,
}

/// What a key that needs a person needs, by the decision table ([`Next::AskApproval`],
/// [`Next::AwaitDecision`], [`Next::Denied`]).
enum Person {
    /// Record the key as awaiting approval over the record found (`None`: absent; an expired
    /// result; an approval past the call's `approval_ttl`).
    Ask(Option<Record>),
    /// Wait for a person to decide this record, awaiting approval, if the call may wait.
    Await(Record),
    /// Read who denied the key, and their note.
    Denied,
}

impl<T, E> Attempt<T, E> {
    /// An attempt that ended before it began: the store could not lend a transaction. Another
    /// attempt runs when the error is [`StoreError::is_transient`].
    pub fn failed(call: &Call, codec: Codec<T, E>, source: StoreError) -> Attempt<T, E> {
        let again = source.is_transient();
        let error = (codec.error)(raise(call.store_error(source)));
        Attempt::of(if again {
            Ended::Again(error, Outcome::Error)
        } else {
            Ended::Fail(error, Outcome::Error)
        })
    }

    fn of(ended: Ended<T, E>) -> Attempt<T, E> {
        Attempt(ended, None)
    }

    fn fail(codec: Codec<T, E>, error: Error) -> Attempt<T, E> {
        let outcome = Outcome::of_error(&error);
        let again = matches!(&error, Error::Store { source, .. } if source.is_transient());
        let error = (codec.error)(raise(error));
        Attempt::of(if again { Ended::Again(error, outcome) } else { Ended::Fail(error, outcome) })
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

/// Where an attempt runs: the store's instance (whose owners it writes, on whose lease terms)
/// and its clock.
#[doc(hidden)]
pub struct Site<'a> {
    /// The instance the store writes owners as, with the terms of its leases.
    pub instance: &'a Instance,
    /// The store's clock, in milliseconds.
    pub clock: &'a (dyn Fn() -> u64 + Sync),
}

/// How the claim of the key inside the transaction ended.
enum Claimed {
    /// The key is this transaction's: the record as written, its fencing token, and the
    /// approved record it took over, if it took one.
    Mine { held: Record, token: u64, approved: Option<Box<Record>> },
    /// A finished record: replay its result.
    Replay(Record),
    /// Another call holds the key.
    Wait(Record),
    /// The key needs a person.
    Person(Person),
}

impl Call {
    /// Runs a transactional call to its end: `attempt` runs one transaction (which
    /// [`Call::attempt`] fills), and is run again after waiting for another owner of the key on
    /// `store`, or after doing what a key that needs a person needs there. Counts the call once.
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
        let (mut deadline, mut failed) = (None, 0);
        // Taken when the first wait for a person's decision begins.
        let mut decision_deadline = None;
        loop {
            let waited = deadline.is_some();
            let Attempt(ended, used) = attempt().await;
            // The run an approval let through failed: once the call ends so, it is used.
            let spend = async || {
                if let Some(used) = used {
                    self.spend_approval(store, *used).await;
                }
            };
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
                    spend().await;
                    count(Outcome::Released);
                    return Ok(value);
                }
                Ended::Fail(e, outcome) => {
                    spend().await;
                    count(outcome);
                    return Err(e);
                }
                Ended::Again(e, outcome) => {
                    failed += 1;
                    if failed >= retries.attempts.max(1) {
                        spend().await;
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
                        return Err((codec.error)(raise(e)));
                    }
                }
                Ended::Person(person) => {
                    // Then the next attempt decides again over what the key holds.
                    let done = match *person {
                        Person::Ask(found) => self.request_approval(store, found).await.map(drop),
                        Person::Await(record) => {
                            let decided =
                                self.await_decision(store, record, &mut decision_deadline);
                            decided.await.map(drop)
                        }
                        Person::Denied => Err(self.denied(store).await),
                    };
                    if let Err(e) = done {
                        count(Outcome::of_error(&e));
                        return Err((codec.error)(raise(e)));
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
        let (held, token, approved) = match parts.claim_in(&mut tx, site).await {
            Ok(Claimed::Mine { held, token, approved }) => (held, token, approved),
            Ok(Claimed::Replay(record)) => {
                return match parts.replay(&record, codec.decode) {
                    Ok(value) => Attempt::of(Ended::Replay(value)),
                    Err(e) => fail(e),
                };
            }
            Ok(Claimed::Wait(record)) => return Attempt::of(Ended::Wait(Box::new(record))),
            Ok(Claimed::Person(person)) => return Attempt::of(Ended::Person(Box::new(person))),
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
        // The body failed: dropping `tx` rolls back (the record and the body's writes go
        // together), and an approval it took over is used.
        let failed = |ended| {
            let used =
                approved.map(|approved| Used { approved: *approved, owner: held.owner.clone() });
            Attempt(ended, used.map(Box::new))
        };
        let value = match ran {
            Ok(value) => value,
            Err(e) if transient(&e) => return failed(Ended::Again(e, Outcome::Released)),
            Err(e) => return failed(Ended::Fail(e, Outcome::Released)),
        };
        let json = match encode_for_replay(codec, &value) {
            // The body told the model it failed: its writes roll back with the record.
            Ok(json) if reports_failure(&json) => return failed(Ended::Unrecorded(value)),
            Ok(json) => json,
            Err(reason) => {
                let (key, tool) = (self.key.to_string(), self.tool.clone());
                return fail(Error::Result { key, tool, reason });
            }
        };
        let step = transition::complete(&held, json, self.ttl, (site.clock)());
        let done = step.new.as_ref().expect("a completion leaves a record");
        failpoint("txn_before_commit");
        let guard = Guard::of(held.fence(), step.change.by(), site.instance.id());
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
        Attempt::of(Ended::Fresh(value))
    }

    /// Spends the approval of a run whose body failed inside its transaction: the rollback put
    /// the record back approved, and as a plain call's failed run releases its key, the next
    /// call asks again. Should the write fail, the key stays approved (which the person
    /// allowed), and a later call runs with it.
    async fn spend_approval(&self, store: &dyn Store, used: Used) {
        let step = transition::spend_approval(&used.owner);
        let guard = Guard::of(used.approved.fence(), step.change.by(), store.instance().id());
        let spent = store.compare_and_swap(&used.approved, guard, None, step.change).await;
        match spent {
            Ok(Some(_)) => {
                tracing::debug!(key = %self.key, tool = %self.tool, "idem: the approved run failed; the next call asks again")
            }
            // Someone changed the key meanwhile: theirs stands.
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(key = %self.key, tool = %self.tool, error = %e, "idem: cannot spend the approval of a failed run; the key stays approved")
            }
        }
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
            let guard = Guard::of(held.fence(), step.change.by(), store.instance().id());
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
    /// Makes the key the transaction's, as [`CallParts::next`] decides about the record found:
    /// inserts the record when the key is absent, or takes the record found over. A key in
    /// doubt is refused (a transactional call has no reconciler), and one that needs a person
    /// is handed back, for [`Call::transact`].
    async fn claim_in<X: Transaction>(
        &self,
        tx: &mut X,
        site: &Site<'_>,
    ) -> Result<Claimed, Error> {
        let failed = |e| Error::store(Some(self.key.as_str()), Some(self.tool), e);
        let owner = Owner::new_call(site.instance.id());
        let (now, lease) = ((site.clock)(), site.instance.lease());
        let key = self.key.as_str();
        // A finished record read as the transaction began replays at once, nothing written.
        if let Some(record) = tx.committed_before() {
            if let Ok(Next::Replay) = self.next(Some(&record), now, site.instance.id(), false) {
                return Ok(Claimed::Replay(record));
            }
        }
        // Absent at first: the insert reads the record only when there is one.
        let (mut found, mut read) = (None, false);
        // A record that changes under every swap is a store that does not hold its rows
        // while the transaction runs: give up rather than loop.
        for _ in 0..CLAIMS {
            let next = self.next(found.as_ref(), now, site.instance.id(), false)?;
            let Some(record) = found.take() else {
                // Absent (at first, or after a concurrent transaction rolled its insert back).
                if next == Next::AskApproval {
                    if !read {
                        // A call that needs approval writes no insert: read what is there (its
                        // request, once asked), rather than take the key as absent.
                        (found, read) = (tx.get(key).await.map_err(failed)?, true);
                        continue;
                    }
                    return Ok(Claimed::Person(Person::Ask(None)));
                }
                let (tool, scope, function) = (self.tool, self.scope, self.function);
                let step = transition::reserve(key, tool, scope, function, &owner, now, lease);
                let new = step.new.expect("a reservation leaves a record");
                match tx.insert_if_absent(&new, &step.change).await.map_err(failed)? {
                    Inserted::New { token } => {
                        return Ok(Claimed::Mine { held: new, token, approved: None })
                    }
                    Inserted::Existing(now) => found = Some(now),
                }
                continue;
            };
            match next {
                Next::Replay => return Ok(Claimed::Replay(record)),
                Next::Wait => return Ok(Claimed::Wait(record)),
                // Without a reconciler, `Reconcile` is never the answer.
                Next::RefuseInDoubt | Next::Reconcile => {
                    return Err(Error::InDoubt {
                        key: key.to_owned(),
                        tool: self.tool.to_owned(),
                        since_ms: record.updated_at,
                        reason: None,
                    })
                }
                Next::AskApproval => return Ok(Claimed::Person(Person::Ask(Some(record)))),
                Next::AwaitDecision => return Ok(Claimed::Person(Person::Await(record))),
                Next::Denied => return Ok(Claimed::Person(Person::Denied)),
                Next::Claim => {
                    let step = transition::take_over(&record, &owner, self.function, now, lease);
                    let new = step.new.expect("a takeover leaves a record");
                    let guard = Guard::of(record.fence(), step.change.by(), site.instance.id());
                    let taken = tx.compare_and_swap(&record, guard, &new, &step.change).await;
                    match taken.map_err(failed)? {
                        Some(token) => {
                            let approved =
                                (record.status == Status::Approved).then(|| Box::new(record));
                            return Ok(Claimed::Mine { held: new, token, approved });
                        }
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
