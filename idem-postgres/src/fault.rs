//! What went wrong talking to PostgreSQL: whether a fresh connection could cure it, and the
//! message a user reads, with the server's own words, its SQLSTATE and advice that fits the cause.

use std::error::Error as _;
use std::time::{Duration, Instant};

use deadpool_postgres::PoolError;
use idem_runtime::StoreError;
use tokio_postgres::error::SqlState;

/// A failed step of a store operation, before it is worded for the user.
#[derive(Debug)]
pub(crate) enum Fault {
    /// No connection could be had from the pool.
    Pool(PoolError),
    /// A statement (or its preparation) failed.
    Db(tokio_postgres::Error),
    /// The statement ran, but what it read is not usable (a damaged row); already worded.
    Store(StoreError),
}

impl From<PoolError> for Fault {
    fn from(e: PoolError) -> Fault {
        Fault::Pool(e)
    }
}

impl From<tokio_postgres::Error> for Fault {
    fn from(e: tokio_postgres::Error) -> Fault {
        Fault::Db(e)
    }
}

/// Whether the connection broke (or none could be made) rather than the statement being refused:
/// the same statement on a fresh connection may well succeed.
fn broken(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() || e.source().is_some_and(|s| s.is::<std::io::Error>()) {
        return true;
    }
    let Some(code) = e.code().map(SqlState::code) else { return false };
    // Class 08 is "connection exception"; 57P01-57P05 end the session (a server shutting down,
    // crashing or starting, a dropped database, an idle-session timeout); 53300 is a server out
    // of connection slots for now.
    code.starts_with("08")
        || code.starts_with("57P")
        || code == SqlState::TOO_MANY_CONNECTIONS.code()
}

impl Fault {
    /// Whether a fresh connection may cure this fault.
    pub(crate) fn is_connection(&self) -> bool {
        match self {
            Fault::Pool(PoolError::Backend(e)) => broken(e),
            Fault::Pool(PoolError::Timeout(kind)) => {
                !matches!(kind, deadpool_postgres::TimeoutType::Wait)
            }
            Fault::Pool(_) | Fault::Store(_) => false,
            Fault::Db(e) => broken(e),
        }
    }

    /// The fault worded for the user: `doing` says what the store was doing ("cannot read key
    /// K"), then the server's reason and SQLSTATE, then what to do about it.
    pub(crate) fn into_store_error(self, doing: &str) -> StoreError {
        let worded = |(reason, advice): (String, &str)| {
            format!("PostgreSQL store: {doing}: {reason}; {advice}")
        };
        match self {
            Fault::Db(e) => StoreError::with_source(worded((describe(&e), advise(&e))), e),
            Fault::Pool(e) => StoreError::with_source(worded(pool_reason(&e)), e),
            Fault::Store(e) => e,
        }
    }
}

/// Why no connection could be had, and what to do about it.
fn pool_reason(e: &PoolError) -> (String, &'static str) {
    match e {
        PoolError::Backend(e) => (describe(e), advise(e)),
        PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => (
            "every pooled connection stayed busy for the pool's whole wait".to_owned(),
            "raise the builder's pool_size, or run fewer calls at once",
        ),
        PoolError::Timeout(_) => (
            "connecting to the server timed out".to_owned(),
            "check that the server is up and reachable",
        ),
        other => (other.to_string(), "this is a bug in idem-postgres"),
    }
}

/// The server's message and SQLSTATE when the server answered, else the driver's error and its
/// cause (such as the I/O error of a dropped connection).
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(", {detail}"));
        }
        return text;
    }
    match e.source() {
        Some(cause) => format!("{e} ({cause})"),
        None => e.to_string(),
    }
}

/// What a user can do about `e`, judged by its cause.
fn advise(e: &tokio_postgres::Error) -> &'static str {
    let Some(code) = e.code() else {
        return if broken(e) {
            "the connection to the server broke or could not be made: check that the server is up \
             and reachable"
        } else {
            "see the cause above"
        };
    };
    match code.code() {
        "57014" => {
            "the server cancelled the statement: check the statement_timeout of the role, the \
             database or the URL's options, or whether an operator cancelled it"
        }
        "42501" => "grant the role the privileges it needs on the schema and table",
        "42P01" | "3F000" => {
            "the records table is gone: reconnect with create(true), or run PgStore::migrate"
        }
        "3D000" => "the database named in the URL does not exist: check the URL",
        "25006" => "the server is read-only (a standby?): point the URL at the primary",
        "53100" => "the server's disk is full: free space on it",
        "53300" => {
            "the server has no free connection slot: lower pool_size or raise max_connections"
        }
        "55P03" | "40001" | "40P01" => "another transaction held the row: retry the call",
        "P0001" => {
            "a trigger or rule on the records table refused the write: check the table's triggers"
        }
        // A named prepared statement that vanished or clashed: the symptom of a pooler in
        // transaction mode handing a session's statements to several server connections. This
        // store sends none, so something else shares the connection, or the pooler mixes
        // sessions.
        "26000" | "42P05" => POOLED_SESSION,
        // PgBouncer's own refusals (an unsupported startup parameter, a client limit, a server
        // connection it lost) come as protocol violations.
        "08P01" => {
            "a connection pooler between this store and the server (PgBouncer?) refused or ended \
             the session: check its log; for an unsupported startup parameter, add it to the \
             pooler's ignore_startup_parameters or take it out of the URL"
        }
        c if c.starts_with("28") => "check the user and password in the URL",
        c if c.starts_with("08") || c.starts_with("57P") => {
            "the connection to the server broke: check that the server is up and reachable"
        }
        _ => "see the server's message",
    }
}

/// The advice for the symptoms of a pooler in transaction mode under a program that expects a
/// session of its own.
const POOLED_SESSION: &str = "this looks like a connection pooler in transaction mode \
    (PgBouncer's pool_mode = transaction, or a hosted database's pooler) between this program \
    and the server: idem-postgres sends no named prepared statements, so another user of the \
    connection does, or an older idem-postgres: upgrade it, point that part at a session-mode or \
    direct URL, or (PgBouncer 1.21 and later) set max_prepared_statements in the pooler";

/// Runs `attempt` until it succeeds, fails for a reason a fresh connection cannot cure, or
/// `deadline` passes; words the last fault with `doing`.
macro_rules! retrying {
    ($deadline:expr, $doing:expr, $attempt:expr) => {{
        let mut retry = $crate::fault::Retry::until($deadline);
        loop {
            match $attempt.await {
                Ok(value) => break Ok(value),
                Err(fault) if retry.again(&fault).await => {}
                Err(fault) => break Err(fault.into_store_error(&$doing)),
            }
        }
    }};
}

pub(crate) use retrying;

/// Paces the retries of one operation on fresh connections, up to its deadline.
pub(crate) struct Retry {
    deadline: Instant,
    pause: Duration,
}

impl Retry {
    pub(crate) fn until(deadline: Instant) -> Retry {
        Retry { deadline, pause: Duration::ZERO }
    }

    /// Whether to try again after `fault`; waits first, a little longer each time. The first
    /// retry is immediate: a killed backend is usually replaced by a fresh connection at once.
    pub(crate) async fn again(&mut self, fault: &Fault) -> bool {
        if !fault.is_connection() {
            return false;
        }
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        tracing::debug!(error = ?fault, "idem: PostgreSQL connection fault; retrying on a fresh connection");
        let wake = now.checked_add(self.pause).map_or(self.deadline, |at| at.min(self.deadline));
        tokio::time::sleep_until(wake.into()).await;
        self.pause = (self.pause * 2).clamp(Duration::from_millis(10), Duration::from_millis(200));
        true
    }
}
