//! Transactional calls through sqlx, on a connection of the application's own sqlx pool.

use std::future::Future;

use idem_runtime::Error;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::postgres::{PgArguments, PgConnection, PgPool, Postgres};
use sqlx::query::Query;
use sqlx::Row as _;

use super::error::DbError;
use super::statements::Param;
use super::{failpoint, Driving, Ended, Exec, Run, TransactionError, Transactional};

/// `sql` with its parameters bound, unnamed (not prepared on the session).
fn bound<'q>(sql: &'q str, params: &[Param]) -> Query<'q, Postgres, PgArguments> {
    params.iter().fold(sqlx::query(sql).persistent(false), |query, param| match param {
        Param::Text(value) => query.bind(value.clone()),
        Param::Int(value) => query.bind(*value),
        Param::Bool(value) => query.bind(*value),
    })
}

impl Exec for PgConnection {
    fn int(
        &mut self,
        sql: &str,
        params: &[Param],
    ) -> impl Future<Output = Result<Option<i64>, DbError>> + Send {
        let query = bound(sql, params);
        async move {
            let row = query.fetch_optional(&mut *self).await?;
            Ok(match row {
                Some(row) => Some(row.try_get::<i64, _>(0)?),
                None => None,
            })
        }
    }

    fn text(
        &mut self,
        sql: &str,
        params: &[Param],
    ) -> impl Future<Output = Result<Option<String>, DbError>> + Send {
        let query = bound(sql, params);
        async move {
            let row = query.fetch_optional(&mut *self).await?;
            Ok(match row {
                Some(row) => Some(row.try_get::<String, _>(0)?),
                None => None,
            })
        }
    }
}

impl Transactional<'_> {
    /// [`Transactional::run`] through sqlx: `body` gets the connection of a transaction begun
    /// on `pool` (the application's sqlx pool, which must reach the store's database: the
    /// call's record is written to the store's table through it), for its writes. Same
    /// guarantees, same retries. The body takes `&mut PgConnection` rather than the
    /// `sqlx::Transaction` itself, which it must not commit; every query it runs on it is
    /// inside the transaction.
    ///
    /// ```no_run
    /// # type BoxError = Box<dyn std::error::Error + Send + Sync>;
    /// # async fn refund(store: &idem_postgres::PgStore, pool: &sqlx::PgPool)
    /// # -> Result<(), BoxError> {
    /// let call = idem_runtime::Call::new("refund", "order-17", &1250)?;
    /// let id: i64 = store
    ///     .transactional(call)
    ///     .run_sqlx(pool, async |tx| {
    ///         let id = sqlx::query_scalar("INSERT INTO refunds (order_id, cents) VALUES (17, 1250) RETURNING id")
    ///             .fetch_one(&mut *tx)
    ///             .await?;
    ///         Ok::<i64, BoxError>(id)
    ///     })
    ///     .await?;
    /// # let _ = id; Ok(()) }
    /// ```
    pub async fn run_sqlx<T, E, F>(self, pool: &PgPool, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + TransactionError,
        F: for<'t> AsyncFnOnce(&'t mut PgConnection) -> Result<T, E> + Clone,
    {
        if let Some(refused) = self.refused() {
            return refused;
        }
        let run = Run::new(self.store, &self.call);
        let mut driving = Driving::new();
        loop {
            let ended = once(&run, pool, &body).await;
            if let Some(outcome) = self.next(&mut driving, ended).await {
                return outcome;
            }
        }
    }
}

/// One run: a transaction on the pool, the claim, the body, the commit.
async fn once<T, E, F>(run: &Run<'_>, pool: &PgPool, body: &F) -> Ended<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error> + TransactionError,
    F: for<'t> AsyncFnOnce(&'t mut PgConnection) -> Result<T, E> + Clone,
{
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return run.failed("begin the transaction of", e.into()),
    };
    match run.within(&mut *tx, body).await {
        Ok((value, completion)) => {
            let written = tx.int(run.completion_sql(), &completion).await;
            if let Err(ended) = run.completed(written) {
                let _ = tx.rollback().await;
                return ended;
            }
            failpoint("txn_before_commit");
            match tx.commit().await {
                Ok(()) => Ended::Fresh(value),
                Err(e) => run.failed("commit", e.into()),
            }
        }
        Err(ended) => {
            let _ = tx.rollback().await;
            ended
        }
    }
}
