//! Transactional calls through sqlx, on a connection of the application's own sqlx pool.

use std::future::Future;
use std::sync::Arc;

use idem_runtime::for_macros::AsyncTransactional;
use idem_runtime::{Attempt, Call, Codec, Error, Retries};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::postgres::{PgArguments, PgConnection, PgPool, Postgres};
use sqlx::query::Query;
use sqlx::Row as _;

use super::error::DbError;
use super::{
    store_error, Driver, Exec, Finished, Run, TransactionError, Transactional, DEFAULT_ATTEMPTS,
};
use crate::sql::Typed;
use crate::store::PgStore;

/// `sql` with its parameters bound, unnamed (not prepared on the session).
fn bound<'q>(sql: &'q str, params: &[Typed<'_>]) -> Query<'q, Postgres, PgArguments> {
    params.iter().fold(sqlx::query(sql).persistent(false), |query, param| match param {
        Typed::Text(value) => query.bind(value.map(str::to_owned)),
        Typed::Int(value) => query.bind(*value),
        Typed::Bool(value) => query.bind(*value),
    })
}

impl Exec for PgConnection {
    fn int(
        &mut self,
        sql: &str,
        params: &[Typed<'_>],
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
        params: &[Typed<'_>],
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
        run_sqlx(self.store, &self.call, pool, self.retries(), body).await
    }
}

/// A [`PgStore`] with the application's sqlx pool, on the same database: the store a
/// transactional tool whose body takes `tx: &mut sqlx::PgConnection` names
/// (`#[idem::idempotent(scope = "…", transactional = "tx", store = STORE)]`, `STORE` giving an
/// `Arc<SqlxStore>`). Each call runs as [`Transactional::run_sqlx`] does, on a transaction
/// begun on the pool; a `PgStore` alone lends tokio-postgres transactions only.
///
/// ```no_run
/// # async fn open(url: &str) -> Result<idem_postgres::SqlxStore, Box<dyn std::error::Error>> {
/// let store = idem_postgres::PgStore::builder(url).connect_async().await?;
/// let pool = sqlx::PgPool::connect(url).await?;
/// # Ok(
/// idem_postgres::SqlxStore::new(std::sync::Arc::new(store), pool)
/// # ) }
/// ```
#[derive(Clone)]
pub struct SqlxStore {
    store: Arc<PgStore>,
    pool: PgPool,
}

impl SqlxStore {
    /// `store`, whose calls' transactions are begun on `pool` (which must reach the store's
    /// database: the call's record is written through it).
    pub fn new(store: Arc<PgStore>, pool: PgPool) -> SqlxStore {
        SqlxStore { store, pool }
    }

    /// The store the records are in.
    pub fn store(&self) -> &Arc<PgStore> {
        &self.store
    }

    /// The pool the transactions are begun on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// What `#[idem::idempotent(…, transactional = "tx", store = …)]` runs for an async tool on a
/// [`SqlxStore`] whose body takes `tx: &mut sqlx::PgConnection`: the same run as
/// [`Transactional::run_sqlx`], the body's error being the tool's own, not asked for a SQLSTATE
/// (as for tokio-postgres: idem's own serialization failures, deadlocks and broken connections
/// run the transaction again).
impl<B, T, E> AsyncTransactional<fn(&mut PgConnection), B, T, E> for SqlxStore
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    B: for<'t> AsyncFnOnce(&'t mut PgConnection) -> Result<T, E> + Clone,
{
    async fn run_transactional(&self, call: Call, body: B) -> Result<T, E> {
        let retries = Retries { attempts: DEFAULT_ATTEMPTS, transient: |_: &E| false };
        run_sqlx(&self.store, &call, &self.pool, retries, body).await
    }
}

/// Runs `call` with `body` on transactions begun on `pool`, attempt after attempt as `retries`
/// says.
async fn run_sqlx<T, E, F>(
    store: &PgStore,
    call: &Call,
    pool: &PgPool,
    retries: Retries<E>,
    body: F,
) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: for<'t> AsyncFnOnce(&'t mut PgConnection) -> Result<T, E> + Clone,
{
    let (codec, run) = (Codec::<T, E>::serde(), Run::new(store));
    let attempt = || once(&run, call, pool, (codec, retries), body.clone());
    call.transact(codec, store, retries, attempt).await
}

/// One attempt: a transaction on the pool, and the engine's attempt inside it.
async fn once<T, E, F>(
    run: &Run<'_>,
    call: &Call,
    pool: &PgPool,
    (codec, retries): (Codec<T, E>, Retries<E>),
    body: F,
) -> Attempt<T, E>
where
    F: for<'t> AsyncFnOnce(&'t mut PgConnection) -> Result<T, E>,
{
    let tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => {
            let e = store_error("cannot begin the transaction of", call.key().as_str(), e.into());
            return Attempt::failed(call, codec, e);
        }
    };
    // Dropped without a commit, sqlx's transaction rolls back as its connection goes back.
    run.attempt(call, codec, retries.transient, Sqlx(tx), async move |conn: &mut PgConnection| {
        body(conn).await
    })
    .await
}

/// A sqlx transaction lent to the engine; the body gets its connection.
struct Sqlx<'c>(sqlx::Transaction<'c, Postgres>);

impl Driver for Sqlx<'_> {
    type Body = PgConnection;
    type Exec = PgConnection;

    fn body(&mut self) -> &mut PgConnection {
        &mut self.0
    }

    fn exec(&mut self) -> &mut PgConnection {
        &mut self.0
    }

    /// The check, then the result's write, then the commit, one after the other (sqlx does not
    /// pipeline); a failed check or write rolls back instead.
    async fn finish(
        mut self,
        check: (&str, &[Typed<'_>]),
        write: (&str, &[Typed<'_>]),
    ) -> Finished {
        let checked = self.0.int(check.0, check.1).await.map(drop);
        if checked.is_err() {
            let _ = self.0.rollback().await;
            return Finished { check: checked, written: Ok(None), committed: Ok(()) };
        }
        let written = self.0.int(write.0, write.1).await;
        if !matches!(written, Ok(Some(_))) {
            let _ = self.0.rollback().await;
            return Finished { check: Ok(()), written, committed: Ok(()) };
        }
        let committed = self.0.commit().await.map_err(DbError::from);
        Finished { check: Ok(()), written, committed }
    }
}
