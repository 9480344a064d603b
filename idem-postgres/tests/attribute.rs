//! `#[idem::idempotent(scope = "…", transactional = "tx", store = …)]` on an `async fn` whose
//! store is a `PgStore`: the tool's writes through `tx` commit with its record, on the engine's
//! transactional path, as `PgStore::transactional(call).run(…)` does by hand; with `approve`,
//! after a person approved it, and never when they denied it; and through sqlx, on a
//! `SqlxStore` (the store with the application's sqlx pool), as `run_sqlx` does.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use idem_postgres::{PgStore, SqlxStore};
use idem_runtime::admin::{self, Decision};
use idem_runtime::history::Event;
use idem_runtime::{Error, Key, Status, Store};
use tokio_postgres::types::Type;

/// The store of this test, on a schema of its own: the tool names it by this function.
static SHOP: OnceLock<Arc<PgStore>> = OnceLock::new();

fn shop() -> Result<Arc<PgStore>, idem::Error> {
    Ok(Arc::clone(SHOP.get().expect("the test opens the store before calling the tool")))
}

/// Runs of the tool's body, all calls together.
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// The key of the body's last run (`idem::current_key()`).
static LAST_KEY: Mutex<String> = Mutex::new(String::new());

fn last_key() -> String {
    LAST_KEY.lock().unwrap().clone()
}

/// What a refund's body does after its insert.
#[derive(Clone, Copy, serde::Serialize)]
enum Then {
    /// Returns the row's id: the call commits.
    Return,
    /// Returns an error: nothing commits.
    Fail,
    /// Commits the transaction itself, which idem refuses.
    Commit,
}

/// A refund of `order`: one row in `refunds`, and the id and key as the tool's answer.
#[idem::idempotent(scope = "order", transactional = "tx", store = shop)]
async fn refund(
    order: i64,
    then: Then,
    table: String,
    tx: &mut tokio_postgres::Transaction<'_>,
) -> Result<(i64, String), String> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    let key = idem::current_key().to_string();
    *LAST_KEY.lock().unwrap() = key.clone();
    let sql = format!("INSERT INTO {table} (order_id) VALUES ($1) RETURNING id");
    let row = tx.query_typed_one(&sql, &[(&order, Type::INT8)]).await.map_err(|e| e.to_string())?;
    match then {
        Then::Return => Ok((row.get(0), key)),
        Then::Fail => Err(format!("refused {key}")),
        Then::Commit => {
            tx.batch_execute("COMMIT").await.map_err(|e| e.to_string())?;
            Ok((row.get(0), key))
        }
    }
}

/// A tool as a method: `&self` is part of the body, not of the key.
struct Desk {
    table: String,
}

impl Desk {
    #[idem::idempotent(scope = "order", transactional = "tx", store = shop)]
    async fn refund(
        &self,
        order: i64,
        tx: &mut tokio_postgres::Transaction<'_>,
    ) -> Result<i64, String> {
        let sql = format!("INSERT INTO {} (order_id) VALUES ($1) RETURNING id", self.table);
        let row =
            tx.query_typed_one(&sql, &[(&order, Type::INT8)]).await.map_err(|e| e.to_string())?;
        Ok(row.get(0))
    }
}

/// The application's `refunds` table of a test, on its schema, and a connection of the test's
/// own to count its rows.
struct Refunds {
    table: String,
    client: tokio_postgres::Client,
}

impl Refunds {
    /// Creates the table; its name too, as the tools take it.
    async fn create(url: &str, schema: &str) -> (String, Refunds) {
        let table = format!("\"{schema}\".refunds");
        let (client, connection) =
            tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let sql =
            format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, order_id bigint NOT NULL)");
        client.batch_execute(&sql).await.unwrap();
        (table.clone(), Refunds { table, client })
    }

    /// How many rows `order` has.
    async fn rows(&self, order: i64) -> i64 {
        let sql = format!("SELECT count(*) FROM {} WHERE order_id = {order}", self.table);
        self.client.query_typed(&sql, &[]).await.unwrap()[0].get(0)
    }
}

/// The tool's future is `Send`, as rmcp and `tokio::spawn` need it.
fn sendable<F: std::future::Future + Send>(future: F) -> F {
    future
}

#[tokio::test(flavor = "multi_thread")]
async fn an_async_transactional_tool_commits_its_writes_with_one_record() {
    let Some((url, schema, guard)) = common::scratch_schema("txattr") else { return };
    let store = PgStore::builder(&url).schema(&schema).connect_async().await;
    let store = SHOP.get_or_init(|| Arc::new(store.expect("the store connects")));
    let (table, refunds) = Refunds::create(&url, &schema).await;

    // Three calls of one intent, at once: one run, one row, one record, three equal answers.
    let (a, b, c) = tokio::join!(
        sendable(refund(17, Then::Return, table.clone())),
        refund(17, Then::Return, table.clone()),
        refund(17, Then::Return, table.clone()),
    );
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert_eq!((&b, &c), (&a, &a), "the three callers get one answer");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(refunds.rows(17).await, 1, "one refund row");
    let key = a.1;
    let record = store.get(&key).await.unwrap().expect("the record committed");
    assert_eq!(record.status, Status::Done);
    let events: Vec<String> = store
        .history(&key)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| entry.event.as_str().to_owned())
        .collect();
    assert_eq!(events, ["reserved", "done"], "one record, committed once");

    // A body that returns an error: no row, no record, and the key is free for the next call.
    let refused = refund(18, Then::Fail, table.clone()).await.expect_err("the body failed");
    let key = last_key();
    assert_eq!(refused, format!("refused {key}"), "the body's own error");
    assert_eq!(refunds.rows(18).await, 0, "the failed call's row rolled back");
    assert!(store.get(&key).await.unwrap().is_none(), "no record: the key is free");
    assert!(store.history(&key).await.unwrap().is_empty(), "and no history");

    // A body that commits the transaction itself: refused, and the key left in doubt.
    let before = RUNS.load(Ordering::SeqCst);
    let ended = refund(19, Then::Commit, table.clone()).await.expect_err("its own commit");
    assert!(ended.contains("ended the transaction itself"), "{ended}");
    assert_eq!(RUNS.load(Ordering::SeqCst), before + 1, "it ran once");
    let key = last_key();
    assert!(ended.contains(&key), "the error names the key: {ended}");
    let status = store.get(&key).await.unwrap().map(|record| record.status);
    assert_eq!(status, Some(Status::InDoubt), "what it wrote may have been kept: in doubt");
    // A method: the same, with `&self` in the body.
    let desk = Desk { table: table.clone() };
    let (first, again) = (desk.refund(20).await.unwrap(), desk.refund(20).await.unwrap());
    assert_eq!(first, again, "the repeat replays");
    assert_eq!(refunds.rows(20).await, 1, "one row");
    drop(refunds);
    let _ = std::thread::spawn(move || drop(guard)).join();
}

/// The store of the approval test, on a schema of its own.
static DESK: OnceLock<Arc<PgStore>> = OnceLock::new();

fn desk() -> Result<Arc<PgStore>, idem::Error> {
    Ok(Arc::clone(DESK.get().expect("the test opens the store before calling the tool")))
}

/// Runs of the approved refund's body.
static APPROVED_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Why an approved refund did not happen: idem's answer, or the database's.
#[derive(Debug)]
enum NotRefunded {
    Idem(Error),
    Database(String),
}

impl From<Error> for NotRefunded {
    fn from(error: Error) -> Self {
        NotRefunded::Idem(error)
    }
}

/// A refund a person approves first, for exactly its order.
#[idem::idempotent(scope = "order", transactional = "tx", store = desk, approve)]
async fn approved_refund(
    order: i64,
    table: String,
    tx: &mut tokio_postgres::Transaction<'_>,
) -> Result<i64, NotRefunded> {
    APPROVED_RUNS.fetch_add(1, Ordering::SeqCst);
    let sql = format!("INSERT INTO {table} (order_id) VALUES ($1) RETURNING id");
    let row = tx.query_typed_one(&sql, &[(&order, Type::INT8)]).await;
    Ok(row.map_err(|e| NotRefunded::Database(e.to_string()))?.get(0))
}

/// The idem error of a refund that did not happen.
fn idem_error(answer: Result<i64, NotRefunded>) -> Error {
    match answer {
        Err(NotRefunded::Idem(error)) => error,
        Err(NotRefunded::Database(reason)) => panic!("the database refused the refund: {reason}"),
        Ok(id) => panic!("expected an idem error, got refund {id}"),
    }
}

/// A person decides `key` (as `idem approve` or `idem deny` would), off the async runtime.
async fn decide(key: &str, decision: Decision, note: Option<&'static str>) {
    let (store, key) = (desk().unwrap(), key.parse::<Key>().unwrap());
    tokio::task::spawn_blocking(move || {
        admin::decide(store.as_ref(), &key, decision, "ann@ops", note).unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approved_transactional_tool_runs_once_approved_and_never_when_denied() {
    let Some((url, schema, guard)) = common::scratch_schema("txappr") else { return };
    let store = PgStore::builder(&url).schema(&schema).connect_async().await;
    let store = DESK.get_or_init(|| Arc::new(store.expect("the store connects")));
    let (table, refunds) = Refunds::create(&url, &schema).await;

    // Asked: the key awaits a person, and nothing of the body ran.
    let key = match idem_error(sendable(approved_refund(1, table.clone())).await) {
        Error::AwaitingApproval { key, .. } => key,
        other => panic!("expected AwaitingApproval, got {other:?}"),
    };
    assert!(matches!(
        idem_error(approved_refund(1, table.clone()).await),
        Error::AwaitingApproval { key: again, .. } if again == key
    ));
    assert_eq!((APPROVED_RUNS.load(Ordering::SeqCst), refunds.rows(1).await), (0, 0));
    let shown = store.get(&key).await.unwrap().expect("idem show finds the request");
    assert_eq!(shown.status, Status::AwaitingApproval);

    // Approved: one run, its row and its record committed together; the retry replays.
    decide(&key, Decision::Approve, Some("ok")).await;
    let first = approved_refund(1, table.clone()).await.expect("the approved refund is made");
    let again = approved_refund(1, table.clone()).await.expect("the retry is answered");
    assert_eq!(again, first, "replayed");
    assert_eq!((APPROVED_RUNS.load(Ordering::SeqCst), refunds.rows(1).await), (1, 1));
    let events: Vec<Event> =
        store.history(&key).await.unwrap().iter().map(|entry| entry.event).collect();
    assert_eq!(events, [Event::ApprovalRequested, Event::Approved, Event::TookOver, Event::Done]);

    // Denied: every call is refused with the note; no row.
    let key = match idem_error(approved_refund(2, table.clone()).await) {
        Error::AwaitingApproval { key, .. } => key,
        other => panic!("expected AwaitingApproval, got {other:?}"),
    };
    decide(&key, Decision::Deny, Some("over the limit")).await;
    for _ in 0..2 {
        match idem_error(approved_refund(2, table.clone()).await) {
            Error::Denied { by, note, .. } => {
                assert_eq!((by.as_str(), note.as_deref()), ("ann@ops", Some("over the limit")));
            }
            other => panic!("expected Denied, got {other:?}"),
        }
    }
    assert_eq!((APPROVED_RUNS.load(Ordering::SeqCst), refunds.rows(2).await), (1, 0));
    drop(refunds);
    let _ = std::thread::spawn(move || drop(guard)).join();
}

/// The store of the sqlx test, with the application's sqlx pool.
static SQLX_SHOP: OnceLock<Arc<SqlxStore>> = OnceLock::new();

fn sqlx_shop() -> Arc<SqlxStore> {
    Arc::clone(SQLX_SHOP.get().expect("the test opens the store before calling the tool"))
}

/// Runs of the sqlx refund's body.
static SQLX_RUNS: AtomicUsize = AtomicUsize::new(0);

/// A refund through sqlx: one row, written on the connection of idem's transaction.
#[idem::idempotent(scope = "order", transactional = "tx", store = sqlx_shop)]
async fn sqlx_refund(
    order: i64,
    fail: bool,
    table: String,
    tx: &mut sqlx::PgConnection,
) -> Result<i64, String> {
    SQLX_RUNS.fetch_add(1, Ordering::SeqCst);
    let sql = format!("INSERT INTO {table} (order_id) VALUES ($1) RETURNING id");
    // Unnamed: the suite also runs through a pooler in transaction mode.
    let query = sqlx::query_scalar(&sql).persistent(false).bind(order);
    let id: i64 = query.fetch_one(&mut *tx).await.map_err(|e| e.to_string())?;
    if fail {
        return Err(format!("refund {id} refused"));
    }
    Ok(id)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sqlx_transactional_tool_commits_its_writes_with_one_record() {
    let Some((url, schema, guard)) = common::scratch_schema("txsqlx") else { return };
    let store = PgStore::builder(&url).schema(&schema).connect_async().await;
    let store = Arc::new(store.expect("the store connects"));
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(4).connect(&url).await;
    let shop = SqlxStore::new(store, pool.expect("the pool connects"));
    let shop = SQLX_SHOP.get_or_init(|| Arc::new(shop));
    let (table, refunds) = Refunds::create(&url, &schema).await;

    // A body's error: no row, no record, the key free.
    let refused = sqlx_refund(7, true, table.clone()).await.expect_err("the body failed");
    assert!(refused.contains("refused"), "the body's own error: {refused}");
    assert_eq!(refunds.rows(7).await, 0, "the row rolled back");

    // Three calls of one intent at once: one run, one row, one record, equal answers.
    let before = SQLX_RUNS.load(Ordering::SeqCst);
    let (a, b, c) = tokio::join!(
        sendable(sqlx_refund(8, false, table.clone())),
        sqlx_refund(8, false, table.clone()),
        sqlx_refund(8, false, table.clone()),
    );
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert_eq!((b, c), (a, a), "the three callers get one answer");
    assert_eq!(SQLX_RUNS.load(Ordering::SeqCst), before + 1, "the body ran once");
    assert_eq!(refunds.rows(8).await, 1, "one refund row");
    let records = Store::scan_page(shop.store().as_ref(), None, usize::MAX).await.unwrap();
    let done: Vec<_> = records
        .into_records()
        .filter_map(Result::ok)
        .filter(|record| record.tool == "sqlx_refund")
        .map(|record| (record.scope, record.status, record.result))
        .collect();
    assert_eq!(done, [("8".to_owned(), Status::Done, Some(a.to_string()))], "one record, done");
    drop(refunds);
    let _ = std::thread::spawn(move || drop(guard)).join();
}
