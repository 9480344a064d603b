//! Which failures a transactional call tries again, and how a driver's error is worded.

use idem_runtime::StoreError;

/// SQLSTATE 40001: the transaction could not be serialized with a concurrent one.
const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE 40P01: the transaction was chosen as a deadlock's victim.
const DEADLOCK_DETECTED: &str = "40P01";

/// Whether a failure with this SQLSTATE is cured by running the whole transaction again.
pub(crate) fn transient(sqlstate: Option<&str>) -> bool {
    matches!(sqlstate, Some(SERIALIZATION_FAILURE | DEADLOCK_DETECTED))
}

/// An error a transactional body returns, asked whether the database refused the transaction
/// in a way that running it again cures: a serialization failure (`40001`) or a deadlock
/// (`40P01`). Those runs are rolled back and tried again with the same key, a bounded number of
/// times ([`Transactional::attempts`](crate::Transactional::attempts)).
///
/// Implemented for the drivers' errors, for [`idem_runtime::Error`], `String` and
/// `Box<dyn Error + Send + Sync>` (which it searches for a driver's error). For an error type of
/// your own, return the SQLSTATE of the database error it carries, if any:
///
/// ```
/// enum RefundError {
///     Db(tokio_postgres::Error),
///     Idem(idem_runtime::Error),
/// }
///
/// impl idem_postgres::TransactionError for RefundError {
///     fn sqlstate(&self) -> Option<&str> {
///         match self {
///             RefundError::Db(e) => idem_postgres::TransactionError::sqlstate(e),
///             RefundError::Idem(_) => None,
///         }
///     }
/// }
/// ```
pub trait TransactionError {
    /// The SQLSTATE of the database error behind this one, if there is one.
    fn sqlstate(&self) -> Option<&str>;
}

impl TransactionError for tokio_postgres::Error {
    fn sqlstate(&self) -> Option<&str> {
        self.code().map(tokio_postgres::error::SqlState::code)
    }
}

impl TransactionError for idem_runtime::Error {
    fn sqlstate(&self) -> Option<&str> {
        None
    }
}

impl TransactionError for String {
    fn sqlstate(&self) -> Option<&str> {
        None
    }
}

impl TransactionError for Box<dyn std::error::Error + Send + Sync> {
    fn sqlstate(&self) -> Option<&str> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self.as_ref());
        while let Some(error) = cause {
            if let Some(e) = error.downcast_ref::<tokio_postgres::Error>() {
                return e.sqlstate();
            }
            #[cfg(feature = "sqlx")]
            if let Some(e) = error.downcast_ref::<sqlx::Error>() {
                return e.sqlstate();
            }
            cause = error.source();
        }
        None
    }
}

#[cfg(feature = "sqlx")]
impl TransactionError for sqlx::Error {
    fn sqlstate(&self) -> Option<&str> {
        let database = self.as_database_error()?;
        database.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().map(|e| e.code())
    }
}

/// A statement of idem's own that failed inside the caller's transaction.
#[derive(Debug)]
pub(crate) enum DbError {
    /// From tokio-postgres.
    Pg(tokio_postgres::Error),
    /// From sqlx.
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::Error),
    /// Already worded, and not cured by another run (a damaged row, a pool that cannot connect).
    Worded(StoreError),
    /// Already worded, and cured by another run (the pool's connection broke).
    Broken(StoreError),
}

impl DbError {
    /// Whether running the whole transaction again may cure it: a serialization failure or a
    /// deadlock, or a connection that broke (the next run's insert waits for whatever the broken
    /// one left behind, and finds its result if its commit landed).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            DbError::Pg(e) => pg_transient(e),
            #[cfg(feature = "sqlx")]
            DbError::Sqlx(e) => sqlx_transient(e),
            DbError::Worded(_) => false,
            DbError::Broken(_) => true,
        }
    }

    /// The SQLSTATE the server answered with, if it answered with one.
    pub(crate) fn sqlstate(&self) -> Option<&str> {
        match self {
            DbError::Pg(e) => TransactionError::sqlstate(e),
            #[cfg(feature = "sqlx")]
            DbError::Sqlx(e) => TransactionError::sqlstate(e),
            DbError::Worded(_) | DbError::Broken(_) => None,
        }
    }

    /// Worded for the user: `doing` says what the call was doing, then the server's reason.
    pub(crate) fn into_store_error(self, doing: &str) -> StoreError {
        match self {
            DbError::Pg(e) => crate::fault::Fault::Db(e).into_store_error(doing),
            #[cfg(feature = "sqlx")]
            DbError::Sqlx(e) => {
                let code = e.sqlstate().map(|c| format!(" (SQLSTATE {c})")).unwrap_or_default();
                StoreError::with_source(
                    format!(
                        "PostgreSQL store: {doing}: {e}{code}; check that the sqlx pool reaches \
                         the store's database and that its table exists"
                    ),
                    e,
                )
            }
            DbError::Worded(e) | DbError::Broken(e) => e,
        }
    }
}

/// Whether another run may get through where tokio-postgres failed.
pub(crate) fn pg_transient(e: &tokio_postgres::Error) -> bool {
    use std::error::Error as _;
    transient(e.sqlstate())
        || e.is_closed()
        || e.source().is_some_and(|s| s.is::<std::io::Error>())
        || e.sqlstate().is_some_and(|code| code.starts_with("08"))
}

/// Whether another run may get through where sqlx failed.
#[cfg(feature = "sqlx")]
pub(crate) fn sqlx_transient(e: &sqlx::Error) -> bool {
    transient(e.sqlstate())
        || matches!(e, sqlx::Error::Io(_))
        || e.sqlstate().is_some_and(|code| code.starts_with("08"))
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> DbError {
        DbError::Pg(e)
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> DbError {
        DbError::Sqlx(e)
    }
}
