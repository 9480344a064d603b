//! Transactional calls on PostgreSQL: the body's writes and the call's record commit in one
//! PostgreSQL transaction, or neither does. The engine runs them (idem-runtime's
//! `engine/transact.rs`, the path every store's transactional calls take); this module lends it
//! a transaction on the database (PostgreSQL's default isolation, `READ COMMITTED`), for each
//! driver:
//!
//! - idem's writes are the store's own insert and fenced update, sent unnamed inside the
//!   transaction. A concurrent transaction inserting the same key waits on the primary key's
//!   unique index for this one to end; then its `ON CONFLICT DO NOTHING` finds the committed
//!   record (or, after a rollback, inserts its own). The write that makes the key this
//!   transaction's also marks the transaction as the call's (`set_config('idem.call', key,
//!   true)`, which ends with the transaction).
//! - The completion checks that mark first: a body that committed or rolled back the
//!   transaction itself has ended it, the mark with it, and the check fails (aborting whatever
//!   the body began after), so the record is not written done behind its back; the engine then
//!   leaves the key in doubt, since what the body wrote before its own commit may have been kept.
//!   The check, the result's write and the `COMMIT` go in one round trip where the driver
//!   pipelines (tokio-postgres).
//! - Serialization failures, deadlocks and broken connections (from idem's statements, the
//!   commit, or the body's error as [`TransactionError`] reports it) run the whole transaction
//!   again with the same key, at most [`Transactional::attempts`] times.

use std::future::Future;

use idem_runtime::history::Change;
use idem_runtime::store::{Committed, Guard, Inserted, StoreError, Transaction};
use idem_runtime::{Attempt, Call, Codec, Kind, Record, Retries, Site, Store, ToolInfo};

use crate::sql::Typed;
use crate::store::PgStore;

mod error;
mod statements;
#[cfg(feature = "sqlx")]
mod with_sqlx;
#[cfg(feature = "sqlx")]
pub use self::with_sqlx::SqlxStore;
mod with_tokio_postgres;

use self::error::DbError;
pub use self::error::TransactionError;

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
/// A tool whose effects are all in the transaction is idempotent in the strict sense. In a tool,
/// prefer the attribute (`#[idem::idempotent(scope = "…", transactional = "tx", store = …)]` on
/// an `async fn` taking `tx: &mut tokio_postgres::Transaction<'_>`), which classifies it too;
/// called by hand, give MCP its hints with [`tool_info`], never a second `#[idem::idempotent]`
/// around this call (which would write a second record).
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

    /// The engine's retry policy for this call: the body's errors are asked for their SQLSTATE.
    fn retries<E: TransactionError>(&self) -> Retries<E> {
        Retries { attempts: self.attempts, transient: |e: &E| error::transient(e.sqlstate()) }
    }
}

/// What an attempt needs of the store: its statements and its lease.
struct Run<'a> {
    store: &'a PgStore,
    insert: &'a str,
    update: &'a str,
    complete: &'a str,
    get: &'a str,
    check: &'a str,
}

impl<'a> Run<'a> {
    fn new(store: &'a PgStore) -> Run<'a> {
        let table = store.table_state();
        let statements = &table.statements;
        Run {
            store,
            insert: &statements.call_insert,
            update: &statements.call_update,
            complete: &statements.call_complete,
            get: &statements.call_get,
            check: &statements.call_check,
        }
    }

    /// Runs one attempt of `call` in `driver`'s transaction, just begun.
    async fn attempt<D, T, E, F>(
        &self,
        call: &Call,
        codec: Codec<T, E>,
        transient: fn(&E) -> bool,
        driver: D,
        body: F,
    ) -> Attempt<T, E>
    where
        D: Driver,
        F: AsyncFnOnce(&mut D::Body) -> Result<T, E>,
    {
        let store = self.store;
        let clock = || store.clock();
        let site = Site { instance: store.instance(), clock: &clock };
        let tx = PgTransaction { run: self, driver };
        let mut body = Some(body);
        call.attempt(codec, &site, tx, &mut body, Some(store), transient).await
    }
}

/// The error of a statement of idem's own, as a store error the engine reads (another attempt
/// runs when it is transient).
fn store_error(doing: &str, key: &str, e: DbError) -> StoreError {
    let transient = e.is_transient();
    let worded = e.into_store_error(&format!("{doing} key {key}"));
    if transient {
        worded.transient()
    } else {
        worded
    }
}

/// A transaction of one driver, as idem writes through it.
pub(crate) trait Driver: Send {
    /// What the body gets: the driver's transaction (or its connection).
    type Body;
    /// idem's statements inside the transaction.
    type Exec: Exec;

    /// The body's handle on the transaction.
    fn body(&mut self) -> &mut Self::Body;

    /// idem's statements.
    fn exec(&mut self) -> &mut Self::Exec;

    /// The key's record as committed before the transaction began, if the driver read it in
    /// the round trip that began it (given once).
    fn committed_before(&mut self) -> Option<Record> {
        None
    }

    /// Whether the driver read the key as the transaction began and found no record.
    fn absent_before(&self) -> bool {
        false
    }

    /// Runs `check`, then `write` (returning a `bigint` when it wrote), then `COMMIT`: in one
    /// round trip where the driver pipelines. A failed check aborts the transaction, so that
    /// the write fails and the commit rolls back.
    fn finish(
        self,
        check: (&str, &[Typed<'_>]),
        write: (&str, &[Typed<'_>]),
    ) -> impl Future<Output = Finished> + Send;
}

/// What [`Driver::finish`] found: each statement's outcome.
pub(crate) struct Finished {
    check: Result<(), DbError>,
    written: Result<Option<i64>, DbError>,
    committed: Result<(), DbError>,
}

/// A driver's transaction lent to the engine.
struct PgTransaction<'r, D> {
    run: &'r Run<'r>,
    driver: D,
}

/// SQLSTATE 22012: the check's division by zero, which says the mark is gone.
const NOT_THE_CALLS: &str = "22012";

/// SQLSTATE 26000, an unnamed statement that is gone between its parse and its execution: what
/// a pooler in transaction mode answers once the body's own end released the server connection
/// (outside a transaction it may run the two on different connections). Inside idem's
/// transaction the connection is pinned, so this too says the transaction is no longer the
/// call's.
const RELEASED_BY_POOLER: &str = "26000";

impl<D: Driver> Transaction for PgTransaction<'_, D> {
    type Body = D::Body;

    fn body(&mut self) -> &mut D::Body {
        self.driver.body()
    }

    async fn get(&mut self, key: &str) -> Result<Option<Record>, StoreError> {
        let params = [Typed::Text(Some(key))];
        let row = self.driver.exec().text(self.run.get, &params).await;
        match row.map_err(|e| store_error("cannot read", key, e))? {
            Some(json) => statements::decode(&json).map(Some),
            None => Ok(None),
        }
    }

    async fn insert_if_absent(
        &mut self,
        record: &Record,
        change: &Change<'_>,
    ) -> Result<Inserted, StoreError> {
        let key = record.key.as_str();
        let params = statements::insert_params(record, change);
        let read = [Typed::Text(Some(key))];
        // A key absent as the transaction began most likely still is: the first insert goes
        // without the read behind it (a statement less for a fresh call), which then follows
        // only if the insert found a record after all.
        let mut alone = self.driver.absent_before();
        // The insert waits for a concurrent one of the key; when that rolls back, it inserts.
        for _ in 0..3 {
            let (exec, insert, get) = (self.driver.exec(), self.run.insert, self.run.get);
            let written = if std::mem::take(&mut alone) {
                write_then_read(exec, (insert, &params), (get, &read)).await
            } else {
                exec.write_or_read(insert, &params, get, &read).await
            };
            match written.map_err(|e| store_error("cannot reserve", key, e))? {
                (Some(seq), _) => {
                    return Ok(Inserted::New { token: u64::try_from(seq).unwrap_or(0) })
                }
                (None, Some(json)) => return statements::decode(&json).map(Inserted::Existing),
                // Committed and then removed before the read: insert again.
                (None, None) => continue,
            }
        }
        Err(StoreError::new(format!(
            "key {key} was inserted and removed by others three times while this transaction \
             tried to reserve it; try again"
        ))
        .transient())
    }

    async fn compare_and_swap(
        &mut self,
        expected: &Record,
        guard: Guard,
        new: &Record,
        change: &Change<'_>,
    ) -> Result<Option<u64>, StoreError> {
        let now = self.run.store.clock();
        let params = statements::update_params(expected, guard, new, change, now);
        let written = self.driver.exec().int(self.run.update, &params).await;
        let written = written.map_err(|e| store_error("cannot take over", &expected.key, e))?;
        Ok(written.map(|seq| u64::try_from(seq).unwrap_or(0)))
    }

    fn committed_before(&mut self) -> Option<Record> {
        self.driver.committed_before()
    }

    fn body_starts(&mut self) {}

    async fn body_ended(&mut self) -> Result<Option<bool>, StoreError> {
        // Told at the completion, whose check is pipelined with it.
        Ok(None)
    }

    async fn complete_and_commit(
        self,
        held: &Record,
        guard: Guard,
        done: &Record,
        change: &Change<'_>,
    ) -> Result<Committed, StoreError> {
        let now = self.run.store.clock();
        let key = held.key.as_str();
        let check = [Typed::Text(Some(key))];
        let params = statements::update_params(held, guard, done, change, now);
        let finished =
            self.driver.finish((self.run.check, &check), (self.run.complete, &params)).await;
        match finished.check {
            Ok(()) => {}
            Err(e) if matches!(e.sqlstate(), Some(NOT_THE_CALLS | RELEASED_BY_POOLER)) => {
                return Ok(Committed::EndedByBody { landed: true });
            }
            Err(e) => return Err(store_error("cannot record the result of", key, e)),
        }
        let written =
            finished.written.map_err(|e| store_error("cannot record the result of", key, e))?;
        finished.committed.map_err(|e| store_error("cannot commit the transaction of", key, e))?;
        Ok(match written {
            Some(_) => Committed::Committed,
            None => Committed::NotAsLeft,
        })
    }
}

/// A transaction's statements, for both drivers: each is sent unnamed, with typed parameters.
pub(crate) trait Exec: Send {
    /// Runs `sql`, and returns the first column of its row (a `bigint`), if it gave one.
    fn int(
        &mut self,
        sql: &str,
        params: &[Typed<'_>],
    ) -> impl Future<Output = Result<Option<i64>, DbError>> + Send;

    /// Runs `sql`, and returns the first column of its row (a `text`), if it gave one.
    fn text(
        &mut self,
        sql: &str,
        params: &[Typed<'_>],
    ) -> impl Future<Output = Result<Option<String>, DbError>> + Send;

    /// Runs `write` (an insert or update returning a `bigint` when it wrote), and when it wrote
    /// nothing, `read` (returning a `text`). A driver that can pipelines the read behind the
    /// write, one round trip for both: the read is a statement of its own, whose snapshot (at
    /// `READ COMMITTED`) shows a row committed while the write waited for it.
    fn write_or_read(
        &mut self,
        write: &str,
        write_params: &[Typed<'_>],
        read: &str,
        read_params: &[Typed<'_>],
    ) -> impl Future<Output = Result<(Option<i64>, Option<String>), DbError>> + Send {
        write_then_read(self, (write, write_params), (read, read_params))
    }
}

/// [`Exec::write_or_read`] one statement after the other: `read` runs only when `write` wrote
/// nothing.
async fn write_then_read<X: Exec + ?Sized>(
    exec: &mut X,
    write: (&str, &[Typed<'_>]),
    read: (&str, &[Typed<'_>]),
) -> Result<(Option<i64>, Option<String>), DbError> {
    match exec.int(write.0, write.1).await? {
        Some(written) => Ok((Some(written), None)),
        None => Ok((None, exec.text(read.0, read.1).await?)),
    }
}
