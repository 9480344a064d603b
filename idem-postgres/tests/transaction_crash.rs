//! A transactional call's process killed by SIGKILL at every point of its transaction: before
//! the body's first write, between two writes, after the last write, after the body returned
//! and before idem sends the result's write and the commit, and during the commit. After each, the application's rows and
//! idem's record agree: both absent, and the next call runs the body once; or both present,
//! and the next call replays the result. Each point again with 64 callers of the same key
//! waiting on the dead transaction. Directly, and through a pooler when `IDEM_TEST_POOLER_URL`
//! names one (a transaction-mode PgBouncer in front of the same database).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::{Call, Status, Store};
use tokio_postgres::types::Type;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The points, as the child names them. `txn_before_commit` is idem's own crash point (the
/// `failpoints` feature): the body has returned, and the result's write and the `COMMIT`
/// (pipelined, in one round trip) are not sent yet.
const BEFORE_FIRST_WRITE: &str = "before_first_write";
const BETWEEN_WRITES: &str = "between_writes";
const AFTER_LAST_WRITE: &str = "after_last_write";
const BEFORE_COMMIT: &str = "txn_before_commit";
/// Not a crash point in the child: the parent holds the commit up (a deferred trigger waits for
/// an advisory lock the parent holds) and kills the child while its `COMMIT` is on the server.
const DURING_COMMIT: &str = "during_commit";

/// The crash tests share the server's connections with other tests: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Connections of the parent's store: the 64 callers queue for them, and each one holding a
/// connection waits on the dead transaction's key.
const POOL: usize = 16;
const CALLERS: usize = 64;

fn call() -> Call {
    Call::new("refund", "order-17", &serde_json::json!({ "order": 17, "cents": 1250 })).unwrap()
}

/// The refund tool: a refund row, then a ledger row naming it; its value is the refund's id.
/// In the child, it stops at the point `IDEM_FAILPOINT` names, says so, and waits to be killed.
async fn refund(store: &PgStore, schema: &str, runs: &AtomicUsize) -> Result<i64, BoxError> {
    let refund = format!(
        "INSERT INTO \"{schema}\".refunds (order_id, cents) VALUES (17, 1250) RETURNING id"
    );
    let ledger = format!("INSERT INTO \"{schema}\".ledger (refund_id, cents) VALUES ($1, -1250)");
    store
        .transactional(call())
        .run(async |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            stop_at(BEFORE_FIRST_WRITE);
            let id: i64 = tx.query_typed_one(&refund, &[]).await?.get(0);
            stop_at(BETWEEN_WRITES);
            tx.execute_typed(&ledger, &[(&id, Type::INT8)]).await?;
            stop_at(AFTER_LAST_WRITE);
            Ok(id)
        })
        .await
}

fn stop_at(point: &str) {
    if std::env::var("IDEM_FAILPOINT").as_deref() == Ok(point) {
        common::say(&format!("at {point}"));
        loop {
            std::thread::park();
        }
    }
}

/// In a child: run the refund once (the parent kills it on the way).
#[test]
fn txn_crash_child() {
    if std::env::var(common::CHILD_ROLE).as_deref() != Ok("txn-crash") {
        return;
    }
    let url = std::env::var("IDEM_TXN_URL").unwrap();
    let schema = std::env::var("IDEM_PG_TEST_SCHEMA").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = PgStore::builder(&url).schema(&schema).pool_size(2).connect_async().await;
        let id = refund(&store.unwrap(), &schema, &AtomicUsize::new(0)).await.unwrap();
        common::say(&format!("done {id}"));
    });
}

/// One scenario: where the child dies, how many callers wait on it, and the URL every store
/// connects through (the database directly, or a pooler in front of it).
struct Scenario<'a> {
    point: &'static str,
    callers: usize,
    store_url: &'a str,
    direct_url: &'a str,
}

/// A connection of the parent's own, for looking and for holding locks.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn count(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.unwrap().get(0)
}

/// Waits until `sql` counts at least `n`, checking every 20 ms for at most a minute.
async fn until_counted(db: &tokio_postgres::Client, sql: &str, n: i64) {
    for _ in 0..3000 {
        if count(db, sql).await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never counted {n}: {sql}");
}

/// Lines of the child's stdout, whole (the child's own and idem's crash point's).
fn lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_for_point(lines: &std::sync::mpsc::Receiver<String>, point: &str) {
    let said = format!("{}at {point}", common::CHILD_SAYS);
    let reached = format!("IDEM_FAILPOINT_REACHED {point}");
    loop {
        let line =
            lines.recv_timeout(Duration::from_secs(120)).expect("the child reaches the point");
        if line.contains(&said) || line.contains(&reached) {
            return;
        }
    }
}

impl Scenario<'_> {
    fn run(&self) {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let (_, schema, _guard) = common::with_schema(self.direct_url.to_owned(), "txk");
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(self.crash_and_check(&schema));
    }

    async fn crash_and_check(&self, schema: &str) {
        let store = PgStore::builder(self.store_url).schema(schema).pool_size(POOL).connect_async();
        let store = Arc::new(store.await.expect("the store connects"));
        let db = connect(self.direct_url).await;
        db.batch_execute(&format!(
            "CREATE TABLE \"{schema}\".refunds (id bigserial PRIMARY KEY, order_id bigint, cents bigint); \
             CREATE TABLE \"{schema}\".ledger (refund_id bigint, cents bigint);"
        ))
        .await
        .unwrap();
        // During the commit: a deferred trigger makes the commit wait for a lock the parent
        // holds, so that the child can be killed while its COMMIT is on the server.
        let lock =
            i64::from(std::process::id()) * 1000 + (idem_runtime::store::now_ms() % 1000) as i64;
        let holder = connect(self.direct_url).await;
        if self.point == DURING_COMMIT {
            db.batch_execute(&format!(
                "CREATE FUNCTION \"{schema}\".hold() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN PERFORM pg_advisory_xact_lock_shared({lock}); RETURN NULL; END $$; \
                 CREATE CONSTRAINT TRIGGER hold AFTER INSERT ON \"{schema}\".ledger \
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION \"{schema}\".hold();"
            ))
            .await
            .unwrap();
            holder.batch_execute(&format!("SELECT pg_advisory_lock({lock})")).await.unwrap();
        }

        let mut child = common::spawn_child(
            "txn_crash_child",
            "txn-crash",
            &[
                ("IDEM_TXN_URL", self.store_url),
                ("IDEM_PG_TEST_SCHEMA", schema),
                ("IDEM_FAILPOINT", self.point),
            ],
        );
        let said = lines(&mut child);
        if self.point == DURING_COMMIT {
            let waiting = format!(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND objid = {lock} AND classid = 0"
            );
            until_counted(&db, &waiting, 1).await;
        } else {
            wait_for_point(&said, self.point);
        }

        let runs = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..self.callers)
            .map(|_| {
                let (store, schema, runs) =
                    (Arc::clone(&store), schema.to_owned(), Arc::clone(&runs));
                tokio::spawn(async move { refund(&store, &schema, &runs).await.unwrap() })
            })
            .collect();
        if self.callers > 0 {
            // Every connection of the store is a caller waiting on the dead transaction's key
            // (through a pooler, whose pool size the test does not know, at least one).
            let on_key = format!(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%{schema}%' AND pid <> pg_backend_pid()"
            );
            let expected = if self.store_url == self.direct_url { POOL as i64 } else { 1 };
            until_counted(&db, &on_key, expected).await;
        }

        child.kill().expect("SIGKILL the child");
        child.wait().unwrap();
        drop(holder); // releases the commit the child left on the server, if any

        let committed = self.point == DURING_COMMIT;
        let mut values = Vec::new();
        for caller in callers {
            values.push(caller.await.unwrap());
        }
        if self.callers == 0 {
            if committed {
                // The dead client's backend finishes the commit it was given.
                let done =
                    format!("SELECT count(*) FROM \"{schema}\".records WHERE status = 'done'");
                until_counted(&db, &done, 1).await;
            } else {
                let key = call().key().clone();
                assert!(
                    store.get(key.as_str()).await.unwrap().is_none(),
                    "{}: no record",
                    self.point
                );
                let rows = format!("SELECT count(*) FROM \"{schema}\".refunds");
                assert_eq!(count(&db, &rows).await, 0, "{}: no refund", self.point);
            }
            values.push(refund(&store, schema, &runs).await.unwrap());
        }
        self.check(&store, &db, schema, &values, runs.load(Ordering::SeqCst)).await;
    }

    /// The rows and the record agree, the body ran once in all (none after a committed
    /// crash), and every caller got the committed refund's id.
    async fn check(
        &self,
        store: &PgStore,
        db: &tokio_postgres::Client,
        schema: &str,
        values: &[i64],
        runs: usize,
    ) {
        let point = self.point;
        let committed = point == DURING_COMMIT;
        assert_eq!(runs, usize::from(!committed), "{point}: runs of the body after the crash");
        let refunds = count(db, &format!("SELECT count(*) FROM \"{schema}\".refunds")).await;
        let ledger = count(db, &format!("SELECT count(*) FROM \"{schema}\".ledger")).await;
        assert_eq!((refunds, ledger), (1, 1), "{point}: one refund and its ledger row");
        let id = count(db, &format!("SELECT id FROM \"{schema}\".refunds")).await;
        assert!(
            values.iter().all(|v| *v == id),
            "{point}: every caller got refund {id}: {values:?}"
        );
        let record = store.get(call().key().as_str()).await.unwrap().expect("the record");
        assert_eq!((record.status, record.result), (Status::Done, Some(id.to_string())), "{point}");
        let again = refund(store, schema, &AtomicUsize::new(0)).await.unwrap();
        assert_eq!(again, id, "{point}: a later call replays");
    }
}

/// Every point, with no caller and with 64 waiting, on `store_url`.
fn matrix(point: &'static str) {
    let Some(url) = common::database_url() else { return };
    // In CI's second pass DATABASE_URL is the pooler itself: the server is behind it, and the
    // expected count of callers blocked on the key is the direct one only on the server.
    let direct_url = common::server_url(&url);
    let pooler = std::env::var("IDEM_TEST_POOLER_URL").ok().filter(|url| !url.is_empty());
    if pooler.is_none() {
        eprintln!("note: IDEM_TEST_POOLER_URL is not set, so {point} runs directly only");
    }
    for store_url in std::iter::once(direct_url.clone()).chain(pooler) {
        for callers in [0, CALLERS] {
            Scenario { point, callers, store_url: &store_url, direct_url: &direct_url }.run();
        }
    }
}

#[test]
fn killed_before_the_first_write_leaves_neither_rows_nor_record() {
    matrix(BEFORE_FIRST_WRITE);
}

#[test]
fn killed_between_two_writes_leaves_neither_rows_nor_record() {
    matrix(BETWEEN_WRITES);
}

#[test]
fn killed_after_the_last_write_leaves_neither_rows_nor_record() {
    matrix(AFTER_LAST_WRITE);
}

#[test]
fn killed_after_the_body_returned_before_the_commit_leaves_neither() {
    matrix(BEFORE_COMMIT);
}

#[test]
fn killed_during_the_commit_leaves_both_and_the_result_replays() {
    matrix(DURING_COMMIT);
}
