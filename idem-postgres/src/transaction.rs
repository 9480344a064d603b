//! Transactional calls: the body's writes and the call's record commit in one PostgreSQL
//! transaction, or neither does.
//!
//! One run, inside one transaction (PostgreSQL's default isolation, `READ COMMITTED`):
//!
//! 1. Insert the call's record, in flight, with its `reserved` history row (the store's own
//!    insert statement). The row is invisible to everyone else until the commit. A concurrent
//!    transaction inserting the same key waits on the primary key's unique index for this one
//!    to end; then its `ON CONFLICT DO NOTHING` finds the committed record (or, after a
//!    rollback, inserts its own).
//! 2. Run the body with the transaction, for its writes.
//! 3. On `Ok`, update the record to `done` with the result (and its `done` row), then commit.
//!    On `Err`, a panic, a dropped future or a dead process, the transaction rolls back: the
//!    record and the body's writes are gone together, and the key is free.
//!
//! A key that is already there is assessed by the lifecycle as every call's is: a result
//! replays, an expired one is taken over inside the transaction, a key in doubt fails (or is
//! taken over under `InDoubtPolicy::Rerun`), and an in-flight record of a plain call is waited
//! for. Serialization failures, deadlocks and broken connections run the whole transaction
//! again with the same key, at most [`Transactional::attempts`] times.

use std::future::Future;
use std::time::{Duration, Instant};

use idem_runtime::for_stores::{
    as_current, count_call, deadline_after, new_call, transition, CallParts, Next, Outcome,
};
use idem_runtime::{Call, Error, Kind, Record, Store, ToolInfo};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::PgStore;

mod error;
mod statements;
#[cfg(feature = "sqlx")]
mod with_sqlx;
mod with_tokio_postgres;

use self::error::DbError;
pub use self::error::TransactionError;
use self::statements::Param;

/// The classification of a transactional tool, for MCP hints (`idem::mcp::annotate`): its
/// effects are all in one transaction, kept or undone together, so repeating the call is
/// harmless and it is [`Kind::Idempotent`]. `destructive` says whether it may change or delete
/// rows already there (false when it only adds).
///
/// ```
/// const REFUND: idem_runtime::ToolInfo = idem_postgres::tool_info("refund", "order_id", false);
/// assert!(REFUND.annotations().idempotent_hint);
/// ```
pub const fn tool_info(name: &'static str, scope: &'static str, destructive: bool) -> ToolInfo {
    ToolInfo::new(name, Kind::Idempotent { scope }).destructive(destructive)
}

/// How many times a transactional call runs its transaction at most, by default: the first run
/// and four more after serialization failures, deadlocks or broken connections.
pub const DEFAULT_ATTEMPTS: u32 = 5;

/// A transactional call on a [`PgStore`]: [`PgStore::transactional`] makes one, and
/// [`Transactional::run`] (tokio-postgres) or `Transactional::run_sqlx` (sqlx, with the `sqlx`
/// feature) runs it. See the README's "Effects in your own database".
///
/// **The body must write only to this database, through the transaction it is given.** What it
/// does elsewhere (an HTTP request, an email, a file) is not rolled back and may run again when
/// the transaction is retried or rolled back; such effects belong in an ordinary idem call.
/// A tool whose effects are all in the transaction is idempotent in the strict sense: give MCP
/// its hints with [`tool_info`], not a second `#[idem::idempotent]` (which would write a second
/// record).
#[must_use = "a transactional call does nothing until it is run"]
pub struct Transactional<'s> {
    store: &'s PgStore,
    call: Call,
    attempts: u32,
}

impl PgStore {
    /// A transactional call of `call` on this store: its body gets a transaction on the store's
    /// database, and its writes commit with the call's record, or not at all. The call's
    /// `.store(…)` is ignored: the record is written to this store.
    ///
    /// ```no_run
    /// # async fn refund() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use idem_runtime::Call;
    ///
    /// let store = idem_postgres::PgStore::builder("postgres://app@db/shop").connect_async().await?;
    /// let call = Call::new("refund", "order-17", &serde_json::json!({ "cents": 1250 }))?;
    /// let refund_id: i64 = store
    ///     .transactional(call)
    ///     .run(async |tx| {
    ///         let row = tx
    ///             .query_one("INSERT INTO refunds (order_id, cents) VALUES (17, 1250) RETURNING id", &[])
    ///             .await?;
    ///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(row.get(0))
    ///     })
    ///     .await?;
    /// # let _ = refund_id; Ok(()) }
    /// ```
    pub fn transactional(&self, call: Call) -> Transactional<'_> {
        Transactional { store: self, call, attempts: DEFAULT_ATTEMPTS }
    }
}

impl Transactional<'_> {
    /// How many times the transaction runs at most ([`DEFAULT_ATTEMPTS`]; at least 1). A run
    /// ended by a serialization failure or a deadlock (SQLSTATE `40001`, `40P01`, from idem's
    /// statements, the commit, or the body's error as [`TransactionError`] reports it) or by a
    /// broken connection is rolled back and run again with the same key.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// The refusal of a call no run can serve (one that needs a person's approval), counted,
    /// before anything is written.
    fn refused<T, E: From<Error>>(&self) -> Option<Result<T, E>> {
        let parts = self.call.parts();
        parts.needs_approval().then(|| {
            count_call(parts.tool, Outcome::Error, Duration::ZERO);
            Err(E::from(parts.cannot_ask_in_a_transaction()))
        })
    }

    /// What follows a run that ended as `ended`: the call's outcome, or `None` to run again
    /// (after a pause, or after waiting for a plain call that holds the key).
    async fn next<T, E: From<Error>>(
        &self,
        driving: &mut Driving,
        ended: Ended<T, E>,
    ) -> Option<Result<T, E>> {
        let parts = self.call.parts();
        let count = |outcome| count_call(parts.tool, outcome, driving.started.elapsed());
        match ended {
            Ended::Fresh(value) => {
                count(if driving.waited { Outcome::Waited } else { Outcome::Fresh });
                Some(Ok(value))
            }
            Ended::Replay(value) => {
                count(if driving.waited { Outcome::Waited } else { Outcome::Replay });
                Some(Ok(value))
            }
            Ended::Fail(e, outcome) => {
                count(outcome);
                Some(Err(e))
            }
            Ended::Transient(e, outcome) => {
                driving.failed += 1;
                if driving.failed >= self.attempts {
                    count(outcome);
                    return Some(Err(e));
                }
                tracing::debug!(key = %parts.key, tool = parts.tool, failed = driving.failed, "idem: transaction failed; running it again");
                pause(self.store, backoff(driving.failed)).await;
                None
            }
            Ended::Wait(record) => {
                driving.waited = true;
                let deadline = *driving.deadline.get_or_insert_with(|| {
                    deadline_after(
                        Instant::now(),
                        parts.wait.unwrap_or_else(|| self.store.default_wait()),
                    )
                });
                let waited = parts.wait_for_owner(self.store, *record, deadline).await;
                waited.err().map(|e| {
                    count(Outcome::of_error(&e));
                    Err(E::from(e))
                })
            }
        }
    }
}

/// The pause before run `failed + 1`: 5 ms doubling, with a little spread so that two
/// transactions that deadlocked do not meet again at once.
fn backoff(failed: u32) -> Duration {
    let base = 5u64 << failed.min(6);
    let spread = idem_runtime::store::now_ms() % base.max(1);
    Duration::from_millis(base + spread / 2)
}

/// Sleeps for `pause` on the store's runtime, so that any executor may await it.
async fn pause(store: &PgStore, pause: Duration) {
    let _ = store.own_runtime().spawn(tokio::time::sleep(pause)).await;
}

/// What the runs of one call so far have left: when it started, how many runs failed, whether
/// it waited for a plain call and when that wait ends.
struct Driving {
    started: Instant,
    failed: u32,
    waited: bool,
    deadline: Option<Instant>,
}

impl Driving {
    fn new() -> Driving {
        Driving { started: Instant::now(), failed: 0, waited: false, deadline: None }
    }
}

/// How one run of the transaction ended; a failure carries how the metrics count it (the
/// body's own error released the key: nothing committed).
enum Ended<T, E> {
    /// The call's value, fresh and committed.
    Fresh(T),
    /// The call's value, replayed from the committed record.
    Replay(T),
    /// The call fails with this error; nothing was committed.
    Fail(E, Outcome),
    /// Rolled back for a reason another run may cure; the error if no run is left.
    Transient(E, Outcome),
    /// A plain call holds the key in flight: wait for it, then run again.
    Wait(Box<Record>),
}

/// What a run needs of the call and the store, inside the transaction.
struct Run<'a> {
    parts: CallParts<'a>,
    store: &'a PgStore,
    insert: &'a str,
    update: &'a str,
    get: String,
    lease_ms: u64,
}

/// How the claim of the key inside the transaction ended.
enum Claimed<T> {
    /// The key is this transaction's, with the record as written and its fencing token.
    Mine(Record, u64),
    /// The key's result, read back.
    Replay(T),
    /// The call cannot own the key; this error says why.
    Refused(Error),
    /// A plain call holds the key.
    Wait(Box<Record>),
}

/// A transaction's statements, for both drivers: each is sent unnamed, with typed parameters.
pub(crate) trait Exec: Send {
    /// Runs `sql`, and returns the first column of its row (a `bigint`), if it gave one.
    fn int(
        &mut self,
        sql: &str,
        params: &[Param],
    ) -> impl Future<Output = Result<Option<i64>, DbError>> + Send;

    /// Runs `sql`, and returns the first column of its row (a `text`), if it gave one.
    fn text(
        &mut self,
        sql: &str,
        params: &[Param],
    ) -> impl Future<Output = Result<Option<String>, DbError>> + Send;

    /// Runs `write` (an insert or update returning a `bigint` when it wrote), and when it wrote
    /// nothing, `read` (returning a `text`). A driver that can pipelines the read behind the
    /// write, one round trip for both: the read is a statement of its own, whose snapshot (at
    /// `READ COMMITTED`) shows a row committed while the write waited for it.
    fn write_or_read(
        &mut self,
        write: &str,
        write_params: &[Param],
        read: &str,
        read_params: &[Param],
    ) -> impl Future<Output = Result<(Option<i64>, Option<String>), DbError>> + Send {
        async move {
            match self.int(write, write_params).await? {
                Some(written) => Ok((Some(written), None)),
                None => Ok((None, self.text(read, read_params).await?)),
            }
        }
    }
}

impl<'a> Run<'a> {
    fn new(store: &'a PgStore, call: &'a Call) -> Run<'a> {
        let table = store.table_state();
        Run {
            parts: call.parts(),
            store,
            insert: &table.statements.insert.text,
            update: &table.statements.update.text,
            get: statements::get(&table.names.qualified()),
            lease_ms: u64::try_from(table.lease.as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn store_error(&self, doing: &str, e: DbError) -> Error {
        let source = e.into_store_error(&format!("{doing} key {}", self.parts.key));
        Error::Store {
            key: Some(self.parts.key.to_string()),
            tool: Some(self.parts.tool.into()),
            source,
        }
    }

    /// A failed statement of idem's own, as the run's end.
    fn failed<T, E: From<Error>>(&self, doing: &str, e: DbError) -> Ended<T, E> {
        if e.is_transient() {
            Ended::Transient(E::from(self.store_error(doing, e)), Outcome::Error)
        } else {
            Ended::Fail(E::from(self.store_error(doing, e)), Outcome::Error)
        }
    }

    /// Makes the key this transaction's: inserts the record when the key looks absent, else
    /// decides by the lifecycle's assessment of the record found. The first try inserts without
    /// reading, so a fresh call pays no read.
    async fn claim<T, X>(&self, tx: &mut X) -> Result<Claimed<T>, (&'static str, DbError)>
    where
        T: DeserializeOwned,
        X: Exec,
    {
        let owner = new_call(self.store.instance());
        let mut found: Option<Record> = None;
        loop {
            let now = self.store.clock();
            let next = match self.parts.next(found.as_ref(), now, self.store.instance(), false) {
                Ok(next) => next,
                Err(refused) => return Ok(Claimed::Refused(refused)),
            };
            let step = match (next, &found) {
                (Next::Claim, None) => {
                    let (key, tool, scope) =
                        (self.parts.key.as_str(), self.parts.tool, self.parts.scope);
                    transition::reserve(key, tool, scope, self.parts.function, &owner, now)
                }
                (Next::Claim, Some(record)) => {
                    transition::take_over(record, &owner, self.parts.function, now)
                }
                (Next::Replay, _) => {
                    let record = found.expect("a replay has a record");
                    let replayed = self.parts.replay(&record, |json| serde_json::from_str(json));
                    return Ok(replayed.map_or_else(Claimed::Refused, Claimed::Replay));
                }
                (Next::Wait, _) => {
                    return Ok(Claimed::Wait(Box::new(found.expect("a wait has a record"))));
                }
                (Next::RefuseInDoubt, _) => {
                    let record = found.expect("a key in doubt has a record");
                    return Ok(Claimed::Refused(Error::InDoubt {
                        key: self.parts.key.to_string(),
                        tool: self.parts.tool.to_owned(),
                        since_ms: record.updated_at,
                        reason: None,
                    }));
                }
                // A person decides first: a transactional call does not ask, nor wait.
                (Next::AwaitDecision, _) => {
                    let record = found.expect("a key awaiting approval has a record");
                    return Ok(Claimed::Refused(self.parts.awaiting_approval(&record)));
                }
                (Next::AskApproval | Next::Reconcile, _) => {
                    return Ok(Claimed::Refused(self.parts.cannot_ask_in_a_transaction()));
                }
                (Next::Denied, _) => {
                    let history = self.store.history(self.parts.key.as_str()).await.ok();
                    return Ok(Claimed::Refused(self.parts.denied(history.as_deref())));
                }
            };
            let new = step.new.expect("a reservation or takeover leaves a record");
            let key = [Param::Text(Some(self.parts.key.to_string()))];
            let (written, row) = match &found {
                None => {
                    let params = statements::insert_params(&new, &step.change, self.lease_ms);
                    let read = tx.write_or_read(self.insert, &params, &self.get, &key);
                    read.await.map_err(|e| ("reserve", e))?
                }
                Some(before) => {
                    let change = &step.change;
                    let params =
                        statements::update_params(before, &new, false, change, self.lease_ms, now);
                    let read = tx.write_or_read(self.update, &params, &self.get, &key);
                    read.await.map_err(|e| ("take over", e))?
                }
            };
            if let Some(seq) = written {
                return Ok(Claimed::Mine(new, u64::try_from(seq).unwrap_or(0)));
            }
            // Someone else's record, committed (the insert waited for it if it was not yet).
            found = match row {
                Some(json) => Some(
                    statements::decode(&json)
                        .map_err(|source| ("read", DbError::Worded(source)))?,
                ),
                None => None,
            };
        }
    }

    /// The parameters of the write that records the body's result (in flight → done, inside
    /// the transaction); an idem error when the value cannot be stored (nothing commits).
    fn completion<T>(&self, held: &Record, value: &T) -> Result<Vec<Param>, Error>
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
        let now = self.store.clock();
        let step = transition::complete(held, json, self.parts.ttl, now);
        let new = step.new.as_ref().expect("a completion leaves a record");
        Ok(statements::update_params(held, new, true, &step.change, self.lease_ms, now))
    }

    /// The completion's outcome (the `seq` of its history row, if it wrote one) as the run's.
    fn completed<T, E: From<Error>>(
        &self,
        written: Result<Option<i64>, DbError>,
    ) -> Result<(), Ended<T, E>> {
        match written {
            Ok(Some(_)) => Ok(()),
            // The row is this transaction's, locked and invisible to others: nothing but the
            // body itself writing to idem's table can have changed it.
            Ok(None) => Err(self.failed(
                "record the result of",
                DbError::Worded(idem_runtime::StoreError::new(
                    "the record was not as the call left it: does the body write to idem's table?",
                )),
            )),
            Err(e) => Err(self.failed("record the result of", e)),
        }
    }

    /// The statement that records the result, for a driver to send.
    fn completion_sql(&self) -> &str {
        self.update
    }

    /// One run inside `tx`, up to the result's write, which the driver makes with the commit:
    /// `Ok` with the body's value and the parameters of the completion (write it, then
    /// commit), else how the run ended (roll back).
    async fn within<T, E, X, F>(&self, tx: &mut X, body: &F) -> Result<(T, Vec<Param>), Ended<T, E>>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + TransactionError,
        X: Exec,
        F: AsyncFnOnce(&mut X) -> Result<T, E> + Clone,
    {
        let (held, token) = match self.claim::<T, X>(tx).await {
            Ok(Claimed::Mine(held, token)) => (held, token),
            Ok(Claimed::Replay(value)) => return Err(Ended::Replay(value)),
            Ok(Claimed::Refused(e)) => {
                let outcome = Outcome::of_error(&e);
                return Err(Ended::Fail(E::from(e), outcome));
            }
            Ok(Claimed::Wait(record)) => return Err(Ended::Wait(record)),
            Err((doing, e)) => return Err(self.failed(doing, e)),
        };
        match as_current(self.parts.key, token, (body.clone())(tx)).await {
            Ok(value) => match self.completion(&held, &value) {
                Ok(params) => Ok((value, params)),
                Err(e) => Err(Ended::Fail(E::from(e), Outcome::Error)),
            },
            Err(e) if error::transient(e.sqlstate()) => Err(Ended::Transient(e, Outcome::Released)),
            Err(e) => Err(Ended::Fail(e, Outcome::Released)),
        }
    }
}

/// Stops the process at `name` when a crash test asks for it (`IDEM_FAILPOINT`), with the
/// `failpoints` feature; nothing otherwise.
#[cfg(feature = "failpoints")]
fn failpoint(name: &str) {
    use std::io::Write;
    if std::env::var("IDEM_FAILPOINT").as_deref() == Ok(name) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "\nIDEM_FAILPOINT_REACHED {name}");
        let _ = out.flush();
        drop(out);
        loop {
            std::thread::park();
        }
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn failpoint(_name: &str) {}
