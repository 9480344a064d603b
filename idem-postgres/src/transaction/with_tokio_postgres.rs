//! Transactional calls through tokio-postgres, on a connection of the store's own pool.

use idem_runtime::Error;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};

use super::error::DbError;
use super::statements::Param;
use super::{failpoint, Driving, Ended, Exec, Run, TransactionError, Transactional};
use crate::fault::Fault;

/// The parameters with their types, as `query_typed` takes them.
fn typed(params: &[Param]) -> Vec<(&(dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|param| match param {
            Param::Text(value) => (value as &(dyn ToSql + Sync), Type::TEXT),
            Param::Int(value) => (value as &(dyn ToSql + Sync), Type::INT8),
            Param::Bool(value) => (value as &(dyn ToSql + Sync), Type::BOOL),
        })
        .collect()
}

impl Exec for tokio_postgres::Transaction<'_> {
    async fn int(&mut self, sql: &str, params: &[Param]) -> Result<Option<i64>, DbError> {
        first(&self.query_typed(sql, &typed(params)).await?)
    }

    async fn text(&mut self, sql: &str, params: &[Param]) -> Result<Option<String>, DbError> {
        first(&self.query_typed(sql, &typed(params)).await?)
    }

    async fn write_or_read(
        &mut self,
        write: &str,
        write_params: &[Param],
        read: &str,
        read_params: &[Param],
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
    /// The body's error type converts from [`idem_runtime::Error`] (the store's own failures,
    /// a key in doubt, a result that cannot be stored) and says whether it carries a
    /// serialization failure or deadlock ([`TransactionError`]).
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + TransactionError,
        F: for<'t, 'c> AsyncFnOnce(&'t mut tokio_postgres::Transaction<'c>) -> Result<T, E> + Clone,
    {
        if let Some(refused) = self.refused() {
            return refused;
        }
        let run = Run::new(self.store, &self.call);
        let mut driving = Driving::new();
        loop {
            let ended = once(&run, &body).await;
            if let Some(outcome) = self.next(&mut driving, ended).await {
                return outcome;
            }
        }
    }
}

/// One run: a pooled connection, a transaction, the claim, the body, the commit.
async fn once<T, E, F>(run: &Run<'_>, body: &F) -> Ended<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error> + TransactionError,
    F: for<'t, 'c> AsyncFnOnce(&'t mut tokio_postgres::Transaction<'c>) -> Result<T, E> + Clone,
{
    let mut pooled = match lend(run).await {
        Ok(pooled) => pooled,
        Err(e) => return run.failed("connect for", e),
    };
    let client: &mut tokio_postgres::Client = &mut pooled;
    let mut tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return run.failed("begin the transaction of", e.into()),
    };
    match run.within(&mut tx, body).await {
        Ok((value, completion)) => {
            failpoint("txn_before_commit");
            match complete_and_commit(run, tx, &completion).await {
                Ok(()) => Ended::Fresh(value),
                Err(ended) => ended,
            }
        }
        Err(ended) => {
            // Dropped, the transaction sends its `ROLLBACK` without waiting for the answer: the
            // connection goes back to the pool with it queued ahead of anything else.
            drop(tx);
            ended
        }
    }
}

/// Writes the result and commits, in one round trip: the `COMMIT` is pipelined behind the
/// result's write on the connection. When the write fails, the server has aborted the
/// transaction and answers that `COMMIT` with a rollback, so nothing commits.
async fn complete_and_commit<T, E: From<Error>>(
    run: &Run<'_>,
    tx: tokio_postgres::Transaction<'_>,
    completion: &[Param],
) -> Result<(), Ended<T, E>> {
    let typed = typed(completion);
    let (written, committed) =
        tokio::join!(tx.query_typed(run.completion_sql(), &typed), tx.batch_execute("COMMIT"));
    // The `COMMIT` above ended the transaction, which tokio-postgres does not know: dropped,
    // it would send a `ROLLBACK` outside any transaction (a warning in the server's log). It
    // holds only the borrow of the client.
    std::mem::forget(tx);
    let written = written.map_err(DbError::from).and_then(|rows| match rows.first() {
        Some(row) => Ok(Some(row.try_get::<_, i64>(0)?)),
        None => Ok(None),
    });
    run.completed(written)?;
    committed.map_err(|e| run.failed("commit", e.into()))
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
