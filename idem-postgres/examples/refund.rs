//! A refund tool whose effect is a row in the application's own table, in the database that
//! holds idem's records. The refund row, its ledger row and idem's record commit in one
//! transaction, so killing the process anywhere leaves the table and idem agreeing, with no
//! operator and no reconciler.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run -p idem-agent-postgres --example refund --features failpoints
//! ```
//!
//! The example runs itself as a child process for each crash point, kills it with SIGKILL
//! there, and prints what the table and idem hold, then calls the tool again. Point it at the
//! server itself, not at a pooler in transaction mode: the supervisor holds a session-level
//! advisory lock to stop the child inside its COMMIT, which such a pooler cannot keep.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::{Call, Store};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "refund_demo";
/// Held by the supervisor to stop the child inside its COMMIT (see `hold_commits`).
const COMMIT_LOCK: i64 = 4_711_017;

/// The points, in the order of the transaction; `txn_before_commit` is idem's own.
const POINTS: [&str; 5] = [
    "before_first_write",
    "between_writes",
    "after_last_write",
    "txn_before_commit",
    "during_commit",
];

/// The tool: refund order 17 once, whatever happens to the process.
async fn refund_order_17(store: &PgStore, runs: &AtomicUsize) -> Result<i64, BoxError> {
    let call =
        Call::new("refund_order", "order-17", &serde_json::json!({ "order": 17, "cents": 1250 }))?;
    store
        .transactional(call)
        .run(async |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            crash_point("before_first_write");
            let row = tx
                .query_one(
                    "INSERT INTO refund_demo.refunds (order_id, cents) VALUES (17, 1250) RETURNING id",
                    &[],
                )
                .await?;
            let id: i64 = row.get(0);
            crash_point("between_writes");
            tx.execute("INSERT INTO refund_demo.ledger (refund_id, cents) VALUES ($1, -1250)", &[&id])
                .await?;
            crash_point("after_last_write");
            Ok(id)
        })
        .await
}

/// In the child: say where it is and wait there to be killed.
fn crash_point(point: &str) {
    if std::env::var("IDEM_FAILPOINT").as_deref() == Ok(point) {
        println!("IDEM_FAILPOINT_REACHED {point}");
        loop {
            std::thread::park();
        }
    }
}

fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/test")?;
    let runtime = tokio::runtime::Runtime::new()?;
    if std::env::var("IDEM_FAILPOINT").is_ok() {
        let store = PgStore::builder(&url).schema(SCHEMA).connect()?;
        runtime.block_on(refund_order_17(&store, &AtomicUsize::new(0)))?;
        return Ok(());
    }
    println!(
        "{:<20} {:>12} {:>16}   then the next call",
        "killed at", "refund rows", "idem record"
    );
    for point in POINTS {
        runtime.block_on(crash_at(&url, point))?;
    }
    println!("\nThe table and idem agreed after every crash; no operator, no reconciler.");
    Ok(())
}

async fn crash_at(url: &str, point: &str) -> Result<(), BoxError> {
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")).await?;
    let store = PgStore::builder(url).schema(SCHEMA).connect_async().await?;
    db.batch_execute(
        "CREATE TABLE refund_demo.refunds (id bigserial PRIMARY KEY, order_id bigint, cents bigint);
         CREATE TABLE refund_demo.ledger (refund_id bigint, cents bigint);",
    )
    .await?;
    if point == "during_commit" {
        hold_commits(&db).await?;
    }
    let mut child = Command::new(std::env::current_exe()?)
        .env("IDEM_FAILPOINT", point)
        .stdout(Stdio::piped())
        .spawn()?;
    let mut committing = None;
    if point == "during_commit" {
        // The child's COMMIT waits on the lock: kill it there.
        let waiting = format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = {COMMIT_LOCK}"
        );
        while committing.is_none() {
            committing = db.query_opt(&waiting, &[]).await?.map(|row| row.get::<_, i32>(0));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        // Read on a thread of its own, so that a child that never gets there fails the run
        // after two minutes instead of hanging it.
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let (told, reached) = std::sync::mpsc::channel();
        let wanted = point.to_owned();
        std::thread::spawn(move || {
            let _ = told.send(stdout.lines().map_while(Result::ok).any(|l| l.ends_with(&wanted)));
        });
        let reached = reached.recv_timeout(Duration::from_secs(120)).unwrap_or(false);
        assert!(reached, "the child reached {point} within two minutes");
    }
    child.kill()?; // SIGKILL
    child.wait()?;
    db.batch_execute("SELECT pg_advisory_unlock_all()").await?;
    // The dead client's server process finishes the COMMIT it was given, then finds its client
    // gone and exits: wait for that.
    if let Some(pid) = committing {
        let alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1";
        while db.query_one(alive, &[&pid]).await?.get::<_, i64>(0) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let rows: i64 = db.query_one("SELECT count(*) FROM refund_demo.refunds", &[]).await?.get(0);
    let key =
        Call::new("refund_order", "order-17", &serde_json::json!({ "order": 17, "cents": 1250 }))?;
    let record = store.get(key.key().as_str()).await?;
    let shown = record.as_ref().map_or("absent", |r| r.status.as_str());
    let agree = (rows == 1) == record.is_some();
    let runs = AtomicUsize::new(0);
    let id = refund_order_17(&store, &runs).await?;
    let rows_after: i64 =
        db.query_one("SELECT count(*) FROM refund_demo.refunds", &[]).await?.get(0);
    let next = match runs.load(Ordering::SeqCst) {
        0 => format!("replayed refund {id}"),
        n => format!("ran the body {n}× → refund {id}"),
    };
    println!("{point:<20} {rows:>12} {shown:>16}   {next}; {rows_after} refund row");
    if !agree || rows_after != 1 {
        return Err(format!("after a crash {point}, the table and idem disagree").into());
    }
    Ok(())
}

/// Makes every commit that wrote a ledger row wait for `COMMIT_LOCK`, and takes that lock: the
/// child's COMMIT then stays on the server until the supervisor lets it go.
async fn hold_commits(db: &tokio_postgres::Client) -> Result<(), BoxError> {
    db.batch_execute(&format!(
        "CREATE FUNCTION refund_demo.hold() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_advisory_xact_lock_shared({COMMIT_LOCK}); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER hold AFTER INSERT ON refund_demo.ledger
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refund_demo.hold();
         SELECT pg_advisory_lock({COMMIT_LOCK});"
    ))
    .await?;
    Ok(())
}
