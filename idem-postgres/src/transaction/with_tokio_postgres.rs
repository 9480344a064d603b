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
        let rows = self.query_typed(sql, &typed(params)).await?;
        Ok(match rows.first() {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        })
    }

    async fn text(&mut self, sql: &str, params: &[Param]) -> Result<Option<String>, DbError> {
        let rows = self.query_typed(sql, &typed(params)).await?;
        Ok(match rows.first() {
            Some(row) => Some(row.try_get(0)?),
            None => None,
        })
    }
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
        let run = Run::new(self.store, &self.call);
        let mut driving = Driving::default();
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
        Ok(value) => {
            failpoint("txn_before_commit");
            match tx.commit().await {
                Ok(()) => Ended::Value(value),
                Err(e) => run.failed("commit", e.into()),
            }
        }
        Err(ended) => {
            // A broken connection has rolled back already; its error says nothing new.
            let _ = tx.rollback().await;
            ended
        }
    }
}

/// A connection of the store's pool, taken on the store's runtime (a new connection's task
/// must outlive the caller's runtime).
async fn lend(run: &Run<'_>) -> Result<deadpool_postgres::Object, DbError> {
    let pool = run.store.table_state().pool.clone();
    let lent = run.store.own_runtime().spawn(async move { pool.get().await });
    match lent.await {
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
