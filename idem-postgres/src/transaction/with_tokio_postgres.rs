//! Transactional calls through tokio-postgres, on a connection of the store's own pool.

use futures_core::Stream;
use idem_runtime::for_macros::AsyncTransactional;
use idem_runtime::{Attempt, Call, Codec, Error, Record, Retries};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};

use super::error::DbError;
use super::statements;
use super::{
    store_error, Driver, Exec, Finished, Run, TransactionError, Transactional, DEFAULT_ATTEMPTS,
};
use crate::fault::Fault;
use crate::sql::Typed;
use crate::store::PgStore;

/// The parameters with their types, as `query_typed` takes them.
fn typed<'a>(params: &'a [Typed<'_>]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params.iter().map(|param| (param.param(), param.sql_type())).collect()
}

impl Exec for tokio_postgres::Transaction<'_> {
    async fn int(&mut self, sql: &str, params: &[Typed<'_>]) -> Result<Option<i64>, DbError> {
        first(&self.query_typed(sql, &typed(params)).await?)
    }

    async fn text(&mut self, sql: &str, params: &[Typed<'_>]) -> Result<Option<String>, DbError> {
        first(&self.query_typed(sql, &typed(params)).await?)
    }

    async fn write_or_read(
        &mut self,
        write: &str,
        write_params: &[Typed<'_>],
        read: &str,
        read_params: &[Typed<'_>],
    ) -> Result<(Option<i64>, Option<String>), DbError> {
        let (write_params, read_params) = (typed(write_params), typed(read_params));
        let (written, found) = tokio::join!(
            self.query_typed(write, &write_params),
            self.query_typed(read, &read_params)
        );
        // A failed write aborts the transaction, and the read fails after it: the write's
        // error is the one to report. A write that landed reads back its own row, unused.
        match first(&written?)? {
            Some(written) => Ok((Some(written), None)),
            None => Ok((None, first(&found?)?)),
        }
    }
}

/// The first column of the first row, if there is one.
fn first<T: for<'r> tokio_postgres::types::FromSql<'r>>(
    rows: &[tokio_postgres::Row],
) -> Result<Option<T>, DbError> {
    Ok(match rows.first() {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

impl Transactional<'_> {
    /// Runs the call: `body` gets a tokio-postgres transaction on a connection of the store's
    /// pool, for its writes; the call's record is written in the same transaction, which
    /// commits when `body` returns `Ok`. A replay returns the committed result without running
    /// `body`. On `Err`, a panic, a dropped future or a dead process, nothing commits and the
    /// key is free. Each run of the transaction calls a clone of `body` (an async closure is
    /// `Clone` when what it captures is): there is more than one run, each rolled back but the
    /// last, when the database refuses one with a serialization failure or a deadlock, or its
    /// connection breaks. A body that captures references still makes a `Send` future.
    ///
    /// A body that commits or rolls back the transaction itself is refused: the key is left in
    /// doubt (what it wrote before its own commit may have been kept), and the error says so.
    ///
    /// The body's error type converts from [`idem_runtime::Error`] (the store's own failures,
    /// a key in doubt, a result that cannot be stored) and says whether it carries a
    /// serialization failure or deadlock ([`TransactionError`]).
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + TransactionError,
        F: for<'t, 'c> AsyncFnOnce(&'t mut tokio_postgres::Transaction<'c>) -> Result<T, E> + Clone,
    {
        run_tokio_postgres(self.store, &self.call, self.retries(), body).await
    }
}

/// What `#[idem::idempotent(…, transactional = "tx", store = …)]` runs for an async tool on a
/// [`PgStore`] whose body takes `tx: &mut tokio_postgres::Transaction<'_>`: the same run as
/// [`Transactional::run`], the body's error being the tool's own. Its own error is not asked
/// for a SQLSTATE (a tool's error type, rmcp's `ErrorData` say, need not implement
/// [`TransactionError`]): a serialization failure or deadlock of idem's statements or the
/// commit, or a broken connection, runs the transaction again, and one the body returns ends
/// the call with the body's error, nothing committed and the key free.
impl<B, T, E> AsyncTransactional<fn(&mut tokio_postgres::Transaction<'_>), B, T, E> for PgStore
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    B: for<'t, 'c> AsyncFnOnce(&'t mut tokio_postgres::Transaction<'c>) -> Result<T, E> + Clone,
{
    async fn run_transactional(&self, call: Call, body: B) -> Result<T, E> {
        let retries = Retries { attempts: DEFAULT_ATTEMPTS, transient: |_: &E| false };
        run_tokio_postgres(self, &call, retries, body).await
    }
}

/// Runs `call` with `body` on the store's pool, attempt after attempt as `retries` says.
async fn run_tokio_postgres<T, E, F>(
    store: &PgStore,
    call: &Call,
    retries: Retries<E>,
    body: F,
) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: for<'t, 'c> AsyncFnOnce(&'t mut tokio_postgres::Transaction<'c>) -> Result<T, E> + Clone,
{
    let (codec, run) = (Codec::<T, E>::serde(), Run::new(store));
    let attempt = || once(&run, call, (codec, retries), body.clone());
    call.transact(codec, store, retries, attempt).await
}

/// One attempt: a pooled connection, a transaction, and the engine's attempt inside it.
async fn once<T, E, F>(
    run: &Run<'_>,
    call: &Call,
    (codec, retries): (Codec<T, E>, Retries<E>),
    body: F,
) -> Attempt<T, E>
where
    F: for<'t, 'c> AsyncFnOnce(&'t mut tokio_postgres::Transaction<'c>) -> Result<T, E>,
{
    let key = call.key().as_str();
    let mut pooled = match lend(run).await {
        Ok(pooled) => pooled,
        Err(e) => return Attempt::failed(call, codec, store_error("cannot connect for", key, e)),
    };
    let client: &mut tokio_postgres::Client = &mut pooled;
    // The key's committed record, read in the `BEGIN`'s round trip, so that a replay takes that
    // one round trip: a simple query, which tokio-postgres sends without waiting for an answer
    // and whose answer does not borrow the client, goes out ahead of the `BEGIN`, and is
    // drained while the `BEGIN` is awaited (the connection hands answers over in order through
    // a bounded channel: an undrained answer in several parts could hold up the `BEGIN`'s).
    let read = match client.simple_query_raw(&committed_sql(run.get, key)).await {
        Ok(read) => read,
        Err(e) => return Attempt::failed(call, codec, store_error("cannot read", key, e.into())),
    };
    let (began, seen) = tokio::join!(client.transaction(), first_text(read));
    let tx = match began {
        Ok(tx) => tx,
        Err(e) => {
            let e = store_error("cannot begin the transaction of", key, e.into());
            return Attempt::failed(call, codec, e);
        }
    };
    let seen = seen.map_err(|e| store_error("cannot read", key, e.into()));
    let seen = match seen.and_then(|json| json.as_deref().map(statements::decode).transpose()) {
        Ok(seen) => seen,
        Err(e) => return Attempt::failed(call, codec, e),
    };
    // Dropped without a commit (a replay, a failure), the transaction sends its `ROLLBACK`
    // without waiting for the answer: the connection goes back to the pool with it queued
    // ahead of anything else.
    let absent = seen.is_none();
    run.attempt(call, codec, retries.transient, Tokio { tx, seen, absent }, body).await
}

/// `get` (`schema::Statements::call_get`) with the key written in, for the simple query
/// protocol, which takes no parameters. A key is 32 hex digits and `get` has no other `$1`
/// (the table's names are plain identifiers), so the literal needs no escaping.
fn committed_sql(get: &str, key: &str) -> String {
    debug_assert!(key.bytes().all(|b| b.is_ascii_hexdigit()), "not a key: {key}");
    get.replace("$1", &format!("'{key}'"))
}

/// The first column of the first row of a simple query's answer, drained to its end.
async fn first_text(
    read: tokio_postgres::SimpleQueryStream,
) -> Result<Option<String>, tokio_postgres::Error> {
    let mut read = std::pin::pin!(read);
    let mut first = None;
    while let Some(message) = std::future::poll_fn(|cx| read.as_mut().poll_next(cx)).await {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = message? {
            first = first.or_else(|| row.get(0).map(str::to_owned));
        }
    }
    Ok(first)
}

/// A tokio-postgres transaction lent to the engine, with the key's record as committed before
/// it began.
struct Tokio<'c> {
    tx: tokio_postgres::Transaction<'c>,
    seen: Option<Record>,
    absent: bool,
}

impl<'c> Driver for Tokio<'c> {
    type Body = tokio_postgres::Transaction<'c>;
    type Exec = tokio_postgres::Transaction<'c>;

    fn body(&mut self) -> &mut Self::Body {
        &mut self.tx
    }

    fn exec(&mut self) -> &mut Self::Exec {
        &mut self.tx
    }

    fn committed_before(&mut self) -> Option<Record> {
        self.seen.take()
    }

    fn absent_before(&self) -> bool {
        self.absent
    }

    /// The check, the result's write and the `COMMIT`, pipelined: one round trip. A failed
    /// check or write aborts the transaction, and the server answers the `COMMIT` with a
    /// rollback, so nothing commits.
    async fn finish(self, check: (&str, &[Typed<'_>]), write: (&str, &[Typed<'_>])) -> Finished {
        let tx = self.tx;
        let (check_params, write_params) = (typed(check.1), typed(write.1));
        let (checked, written, committed) = tokio::join!(
            tx.query_typed(check.0, &check_params),
            tx.query_typed(write.0, &write_params),
            tx.batch_execute("COMMIT")
        );
        // The `COMMIT` above ended the transaction, which tokio-postgres does not know: dropped,
        // it would send a `ROLLBACK` outside any transaction (a warning in the server's log). It
        // holds only the borrow of the client.
        std::mem::forget(tx);
        Finished {
            check: checked.map(drop).map_err(DbError::from),
            written: written.map_err(DbError::from).and_then(|rows| first(&rows)),
            committed: committed.map_err(DbError::from),
        }
    }
}

/// A connection of the store's pool. An idle one is taken right here, with no timer and no
/// hop to another thread (the pool makes new connections on the store's runtime, and hands
/// idle ones out without a round trip); when the pool has none to spare, the wait for one,
/// bounded by the pool's timeouts, runs on the store's runtime, so that any executor may
/// await it.
async fn lend(run: &Run<'_>) -> Result<deadpool_postgres::Object, DbError> {
    let pool = run.store.table_state().pool.clone();
    let at_once = deadpool_postgres::Timeouts {
        wait: Some(std::time::Duration::ZERO),
        create: None,
        recycle: None,
    };
    let lent = match pool.timeout_get(&at_once).await {
        Err(deadpool_postgres::PoolError::Timeout(_)) => {
            run.store.own_runtime().spawn(async move { pool.get().await }).await
        }
        taken => Ok(taken),
    };
    match lent {
        Ok(Ok(pooled)) => Ok(pooled),
        Ok(Err(e)) => {
            let fault = Fault::Pool(e);
            let broken = fault.is_connection();
            let worded = fault.into_store_error("cannot take a connection from the pool");
            Err(if broken { DbError::Broken(worded) } else { DbError::Worded(worded) })
        }
        Err(e) => Err(DbError::Worded(e)),
    }
}
