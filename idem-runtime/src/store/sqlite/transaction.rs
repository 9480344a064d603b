//! Transactional calls: the body's writes and the call's record commit in one SQLite
//! transaction on the store's file, or neither does.
//!
//! One run, on a connection of its own and a thread of its own (rusqlite is synchronous, and the
//! transaction may wait for the file's write lock):
//!
//! 1. `BEGIN IMMEDIATE` takes the file's write lock before anything is read, so every other
//!    writer of the file (another run of the same key, a plain call's reservation, in this
//!    process or another) waits for this transaction to end, for at most the busy timeout.
//! 2. The store's own reservation reads the key and inserts the record in flight with its
//!    `reserved` history row. A record already there is assessed by the lifecycle as every
//!    call's is: a result replays, an expired one (or one in doubt under
//!    `InDoubtPolicy::Rerun`) is taken over with the store's fenced swap, a key in doubt fails,
//!    and a plain call's record in flight is waited for, with no lock held.
//! 3. The body runs with the transaction. On `Ok`, the store's fenced swap makes the record
//!    `done` with its `done` row, and the transaction commits, as durably as the store's
//!    writes (the connection has the store's `synchronous`). On `Err`, a panic or a dead
//!    process, the transaction rolls back: the record and the body's writes are gone together,
//!    and the key is free.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rusqlite::{Connection, Transaction, TransactionBehavior};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{fault, reserve, schema, swap, Shared, SqliteStore};
use crate::engine::{as_current_sync, Call, CallParts, Next};
use crate::error::{Error, StoreError};
use crate::failpoint::failpoint;
use crate::lifecycle::{now_ms, transition, Owner, Record};
use crate::meter::{self, Outcome};
use crate::store::Inserted;
use crate::time::deadline_after;

/// A transactional call on a [`SqliteStore`]: [`SqliteStore::transactional`] makes one, and
/// [`SqliteTransactional::run`] runs it. See the README's "Effects in your own database".
///
/// **The body must write only to the store's file, through the transaction it is given.** What
/// it does elsewhere (an HTTP request, an email, another file) is not rolled back with it;
/// such effects belong in an ordinary idem call. A tool whose effects are all in the
/// transaction is idempotent in the strict sense: classify it `#[idem::idempotent]` for MCP.
#[must_use = "a transactional call does nothing until it is run"]
pub struct SqliteTransactional<'s> {
    store: &'s SqliteStore,
    call: Call,
}

impl SqliteStore {
    /// A transactional call of `call` on this store: its body gets a `rusqlite::Transaction` on
    /// the store's file, and its writes commit with the call's record, or not at all. The
    /// call's `.store(…)` is ignored: the record is written to this store.
    ///
    /// ```
    /// # async fn refund() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_runtime::{Call, SqliteStore};
    ///
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("shop.sqlite");
    /// let store = SqliteStore::open(&path)?;
    /// # rusqlite::Connection::open(&path)?
    /// #     .execute_batch("CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id, cents)")?;
    /// let call = Call::new("refund", "order-17", &serde_json::json!({ "cents": 1250 }))?;
    /// let refund_id: i64 = store
    ///     .transactional(call)
    ///     .run(|tx| {
    ///         tx.execute("INSERT INTO refunds (order_id, cents) VALUES (17, 1250)", [])?;
    ///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(tx.last_insert_rowid())
    ///     })
    ///     .await?;
    /// # assert_eq!(refund_id, 1); Ok(()) }
    /// # idem_runtime::for_stores::block_on(refund()).unwrap();
    /// ```
    pub fn transactional(&self, call: Call) -> SqliteTransactional<'_> {
        SqliteTransactional { store: self, call }
    }
}

impl SqliteTransactional<'_> {
    /// Runs the call: `body` gets a transaction on a connection of the store's own to its
    /// file, for its writes; the call's record is written in the same transaction, which
    /// commits when `body` returns `Ok`. A replay returns the committed result without running
    /// `body`. On `Err` or a panic (which then goes on to the caller), nothing commits and the
    /// key is free; a process that dies leaves nothing of the run either.
    ///
    /// `body` runs at most once, on a thread of its own (so that it may wait for the file's
    /// write lock without holding up an async runtime), which is why it and its value must be
    /// `Send + 'static`. A dropped future does not stop a run that has begun: it runs to its
    /// end, and what it commits replays. There is no retry: `BEGIN IMMEDIATE` takes the write
    /// lock before the first read, so SQLite has no serialization failure or deadlock to
    /// report; a lock another writer keeps past the store's
    /// [busy timeout](super::SqliteStoreBuilder::busy_timeout) fails the call with an error
    /// that says so, having written nothing.
    ///
    /// The body holds the file's write lock while it runs, and every other writer of the file
    /// waits: keep it to its writes.
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, E> + Send + 'static,
    {
        let mut body = body;
        let mut deadline = None;
        let started = Instant::now();
        let parts = self.call.parts();
        let count = |outcome| meter::call(parts.tool, outcome, started.elapsed());
        if parts.needs_approval() {
            count(Outcome::Error);
            return Err(E::from(parts.cannot_ask_in_a_transaction()));
        }
        loop {
            let waited = deadline.is_some();
            match self.once(body).await {
                Ended::Fresh(value) => {
                    count(if waited { Outcome::Waited } else { Outcome::Fresh });
                    return Ok(value);
                }
                Ended::Replay(value) => {
                    count(if waited { Outcome::Waited } else { Outcome::Replay });
                    return Ok(value);
                }
                Ended::Fail(e, outcome) => {
                    count(outcome);
                    return Err(e);
                }
                Ended::Panicked(panic) => {
                    count(Outcome::Released);
                    std::panic::resume_unwind(panic)
                }
                Ended::Wait(record, back) => {
                    body = back;
                    let deadline = *deadline.get_or_insert_with(|| {
                        let wait = parts.wait.unwrap_or(self.store.shared.options.default_wait);
                        deadline_after(Instant::now(), wait)
                    });
                    if let Err(e) = parts.wait_for_owner(self.store, *record, deadline).await {
                        count(Outcome::of_error(&e));
                        return Err(E::from(e));
                    }
                }
            }
        }
    }

    /// One run of the transaction, on a thread of its own.
    async fn once<T, E, F>(&self, body: F) -> Ended<T, E, F>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
        F: FnOnce(&Transaction<'_>) -> Result<T, E> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let (shared, call) = (Arc::clone(&self.store.shared), self.call.clone());
        let spawned =
            std::thread::Builder::new().name("idem-sqlite-transaction".into()).spawn(move || {
                let run = Run { shared: &shared, parts: call.parts() };
                // The caller may have gone: the run has ended all the same.
                let _ = answer.send(run.on_connection(body));
            });
        let parts = self.call.parts();
        let stopped = |source| Ended::Fail(E::from(store_error(&parts, source)), Outcome::Error);
        if let Err(e) = spawned {
            return stopped(StoreError::with_source(
                "cannot start a thread for the transaction: the system refused one",
                e,
            ));
        }
        answered.await.unwrap_or_else(|_| {
            stopped(StoreError::new("the transaction's thread stopped before it answered"))
        })
    }
}

/// Watches a run's connection, while the body has it, for a COMMIT or ROLLBACK the body makes
/// itself (`COMMIT; BEGIN` included, which leaves the connection in a transaction): a commit is
/// refused, so SQLite rolls it back and nothing of the run lands, and either is noted. The
/// hooks go when the watch drops, before the connection is lent again.
struct OwnEnd<'c> {
    conn: &'c Connection,
    seen: Arc<AtomicBool>,
}

impl<'c> OwnEnd<'c> {
    fn watch(conn: &'c Connection) -> OwnEnd<'c> {
        let seen = Arc::new(AtomicBool::new(false));
        let (committed, rolled_back) = (Arc::clone(&seen), Arc::clone(&seen));
        conn.commit_hook(Some(move || {
            committed.store(true, Ordering::SeqCst);
            // `true` turns the commit into a rollback.
            true
        }));
        conn.rollback_hook(Some(move || rolled_back.store(true, Ordering::SeqCst)));
        OwnEnd { conn, seen }
    }

    /// Whether the body committed or rolled back by itself.
    fn seen(&self) -> bool {
        self.seen.load(Ordering::SeqCst)
    }
}

impl Drop for OwnEnd<'_> {
    fn drop(&mut self) {
        self.conn.commit_hook(None::<fn() -> bool>);
        self.conn.rollback_hook(None::<fn()>);
    }
}

/// How one run ended.
enum Ended<T, E, F> {
    /// The call's value, committed by this run.
    Fresh(T),
    /// The call's value, replayed from the committed record.
    Replay(T),
    /// The call fails with this error, counted as the outcome; nothing was committed.
    Fail(E, Outcome),
    /// A plain call holds the key in flight: wait for it, then run again with the body, which
    /// did not run.
    Wait(Box<Record>, F),
    /// The body panicked; the transaction was rolled back.
    Panicked(Box<dyn Any + Send>),
}

/// How the claim of the key inside the transaction ended.
enum Claimed {
    /// The key is this transaction's, with the record as written and its fencing token.
    Mine(Record, u64),
    /// A finished record: replay its result.
    Replay(Record),
    /// The call cannot own the key; this error says why.
    Refused(Error),
    /// A plain call holds the key.
    Wait(Record),
}

fn store_error(parts: &CallParts<'_>, source: StoreError) -> Error {
    Error::store(Some(parts.key.as_str()), Some(parts.tool), source)
}

/// One run on the transaction's thread.
struct Run<'a> {
    shared: &'a Shared,
    parts: CallParts<'a>,
}

impl Run<'_> {
    /// A failed statement of idem's own (`doing`, such as "cannot reserve"), as the call's
    /// error, worded as the store words it.
    fn failed(&self, doing: &str, e: rusqlite::Error) -> Error {
        let doing = format!("{doing} key {}", self.parts.key);
        store_error(&self.parts, fault::store_error(&self.shared.what, &doing, e))
    }

    /// The run on a connection of the store's transactional ones, given back when the run left
    /// it outside any transaction.
    fn on_connection<T, E, F>(&self, body: F) -> Ended<T, E, F>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(&Transaction<'_>) -> Result<T, E>,
    {
        let shared = self.shared;
        let mut conn = match shared.transacting.take(&shared.options, &shared.what) {
            Ok(conn) => conn,
            Err(e) => return Ended::Fail(E::from(store_error(&self.parts, e)), Outcome::Error),
        };
        let ended = self.within(&mut conn, body);
        // A connection whose rollback failed is still in its transaction: it is dropped (which
        // rolls back), never lent again.
        if conn.is_autocommit() {
            shared.transacting.give_back(conn);
        }
        ended
    }

    fn within<T, E, F>(&self, conn: &mut Connection, body: F) -> Ended<T, E, F>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(&Transaction<'_>) -> Result<T, E>,
    {
        let fail = |e: Error| {
            let outcome = Outcome::of_error(&e);
            Ended::Fail(E::from(e), outcome)
        };
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => return fail(self.failed("cannot begin the transaction of", e)),
        };
        let (held, token) = match self.claim(&tx) {
            Ok(Claimed::Mine(held, token)) => (held, token),
            Ok(Claimed::Replay(record)) => {
                let replayed = self.parts.replay(&record, |json| serde_json::from_str(json));
                return replayed.map_or_else(fail, Ended::Replay);
            }
            Ok(Claimed::Refused(e)) => return fail(e),
            Ok(Claimed::Wait(record)) => return Ended::Wait(Box::new(record), body),
            Err((doing, e)) => return fail(self.failed(doing, e)),
        };
        let key = self.parts.key;
        let watch = OwnEnd::watch(&tx);
        let ran = catch_unwind(AssertUnwindSafe(|| as_current_sync(key, token, || body(&tx))));
        let ended_itself = watch.seen();
        drop(watch);
        // Returning drops `tx`, which rolls back: the record and the body's writes go together.
        if ended_itself || tx.is_autocommit() {
            if let Err(panic) = ran {
                return Ended::Panicked(panic);
            }
            return fail(store_error(
                &self.parts,
                StoreError::new(
                    "the body ended the transaction itself (a COMMIT or ROLLBACK of its own); \
                     idem turned it into a rollback, so nothing the body wrote was kept and the \
                     key is free: write through the transaction only, and let idem end it",
                )
                .lasting(),
            ));
        }
        let value = match ran {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => return Ended::Fail(e, Outcome::Released),
            Err(panic) => return Ended::Panicked(panic),
        };
        if let Err(e) = self.complete(&tx, &held, &value) {
            return fail(e);
        }
        failpoint("txn_before_commit");
        if let Err(e) = tx.commit() {
            return fail(self.failed("cannot commit the transaction of", e));
        }
        failpoint("txn_after_commit");
        self.shared.announce(key.as_str());
        Ended::Fresh(value)
    }

    /// Makes the key this transaction's with the store's reservation, or else decides by the
    /// lifecycle's assessment of the record found.
    fn claim(&self, tx: &Transaction<'_>) -> Result<Claimed, (&'static str, rusqlite::Error)> {
        let parts = &self.parts;
        let (shared, key) = (self.shared, parts.key.as_str());
        let owner = Owner::new_call(&shared.instance);
        let now = now_ms();
        let step = transition::reserve(key, parts.tool, parts.scope, parts.function, &owner, now);
        let new = step.new.expect("a reservation leaves a record");
        let found = match reserve(tx, shared, &new, &step.change) {
            Ok(Inserted::New { token }) => return Ok(Claimed::Mine(new, token)),
            Ok(Inserted::Existing(found)) => found,
            Err(e) => return Err(("cannot reserve", e)),
        };
        let (key, tool) = (key.to_owned(), parts.tool.to_owned());
        let next = match parts.next(Some(&found), now, &shared.instance, false) {
            Ok(next) => next,
            Err(refused) => return Ok(Claimed::Refused(refused)),
        };
        Ok(match next {
            Next::Replay => Claimed::Replay(found),
            Next::Wait => Claimed::Wait(found),
            Next::RefuseInDoubt => Claimed::Refused(Error::InDoubt {
                key,
                tool,
                since_ms: found.updated_at,
                reason: None,
            }),
            // A transactional call asks no one: a key that waits for a person is not its.
            Next::AwaitDecision => Claimed::Refused(parts.awaiting_approval(&found)),
            Next::AskApproval | Next::Reconcile => {
                Claimed::Refused(parts.cannot_ask_in_a_transaction())
            }
            Next::Denied => {
                let history = schema::history(tx, &key).map_err(|e| ("cannot read", e))?;
                Claimed::Refused(parts.denied(Some(&history)))
            }
            Next::Claim => {
                let step = transition::take_over(&found, &owner, parts.function, now);
                let new = step.new.expect("a takeover leaves a record");
                match swap(tx, shared, &found, Some(&new), &step.change) {
                    Ok((Some(token), _)) => Claimed::Mine(new, token),
                    // Nothing else writes while this transaction holds the lock.
                    Ok((None, _)) => Claimed::Refused(store_error(
                        parts,
                        StoreError::new(format!(
                            "key {key} changed while the transaction held the write lock: \
                             something writes to {} without locking it",
                            shared.what
                        )),
                    )),
                    Err(e) => return Err(("cannot take over", e)),
                }
            }
        })
    }

    /// Writes the body's result (in flight → done, with its history row) inside the
    /// transaction; an idem error when the value cannot be stored (nothing commits).
    fn complete<T>(&self, tx: &Transaction<'_>, held: &Record, value: &T) -> Result<(), Error>
    where
        T: Serialize + DeserializeOwned,
    {
        let unstorable = |reason: String| Error::Result {
            key: self.parts.key.to_string(),
            tool: self.parts.tool.to_owned(),
            reason,
        };
        let json = serde_json::to_string(value).map_err(|e| unstorable(e.to_string()))?;
        // Only a value that reads back is stored, so that whatever commits replays.
        serde_json::from_str::<T>(&json).map_err(|e| unstorable(e.to_string()))?;
        let step = transition::complete(held, json, self.parts.ttl, now_ms());
        let done = step.new.as_ref().expect("a completion leaves a record");
        match swap(tx, self.shared, held, Some(done), &step.change) {
            Ok((Some(_), _)) => Ok(()),
            // The row is this transaction's, invisible to others and under the write lock:
            // only the body writing to idem's tables can have changed it.
            Ok((None, _)) => Err(store_error(
                &self.parts,
                StoreError::new(
                    "the record was not as the call left it when its result was written: does \
                     the body write to idem's tables?",
                ),
            )),
            Err(e) => Err(self.failed("cannot record the result of", e)),
        }
    }
}
