//! Transactional calls on the SQLite store: the body's rows and idem's record commit in one
//! transaction on the store's file, or neither does. In one process (commit, error, panic,
//! replay, racing threads, a wait for a plain call's owner in another process, a person's
//! approval) and across processes: racing children run each body once, and a child killed with
//! SIGKILL at every point of its transaction, approved or not, leaves rows and record that
//! agree.

mod children;

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{self, Decision};
use idem_runtime::block_on;
use idem_runtime::history::Event;
use idem_runtime::{Call, Error, SqliteStore, Status, Store};

use self::children::{start, Running};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The crash points, as the child names them. The first three are the body's own; the last
/// two are idem's (the `failpoints` feature): the result is written and `COMMIT` not yet
/// called, and the commit has returned and no one has been told.
const BEFORE_FIRST_WRITE: &str = "before_first_write";
const BETWEEN_WRITES: &str = "between_writes";
const AFTER_LAST_WRITE: &str = "after_last_write";
const BEFORE_COMMIT: &str = "txn_before_commit";
const AFTER_COMMIT: &str = "txn_after_commit";

fn path(dir: &Path) -> std::path::PathBuf {
    dir.join("shop.sqlite")
}

/// The store, and the application's tables in its file (made once the store has marked the
/// file as idem's: a file with another program's tables and no mark is refused).
fn open(dir: &Path) -> SqliteStore {
    let store = SqliteStore::builder(path(dir))
        .busy_timeout(Duration::from_secs(60))
        .open()
        .expect("the store opens");
    let conn = rusqlite::Connection::open(path(dir)).unwrap();
    conn.busy_timeout(Duration::from_secs(60)).unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, order_id INTEGER, cents INTEGER);
         CREATE TABLE IF NOT EXISTS ledger (refund_id INTEGER, cents INTEGER);",
    )
    .unwrap();
    store
}

fn count(dir: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path(dir)).unwrap();
    conn.busy_timeout(Duration::from_secs(60)).unwrap();
    conn.query_row(sql, [], |row| row.get(0)).unwrap()
}

/// (refunds, ledger rows) of `order`.
fn rows(dir: &Path, order: i64) -> (i64, i64) {
    let refunds = count(dir, &format!("SELECT count(*) FROM refunds WHERE order_id = {order}"));
    let ledger = count(
        dir,
        &format!(
            "SELECT count(*) FROM ledger WHERE refund_id IN \
             (SELECT id FROM refunds WHERE order_id = {order})"
        ),
    );
    (refunds, ledger)
}

fn call(order: i64) -> Call {
    Call::new("refund", format!("order-{order}"), &serde_json::json!({ "cents": 1250 })).unwrap()
}

/// Stops the process here when the crash test asks for `point`: says so, and waits to be
/// killed.
fn stop_at(point: &str) {
    if std::env::var("IDEM_FAILPOINT").as_deref() == Ok(point) {
        println!("STOPPED_AT {point}");
        std::io::stdout().flush().unwrap();
        loop {
            std::thread::park();
        }
    }
}

/// The refund tool: a refund row, then a ledger row naming it; its value is the refund's id.
async fn refund(store: &SqliteStore, order: i64, runs: &Arc<AtomicUsize>) -> Result<i64, BoxError> {
    refund_as(store, call(order), order, runs).await
}

/// The refund tool for a refund that needs a person's approval.
async fn approved_refund(
    store: &SqliteStore,
    order: i64,
    runs: &Arc<AtomicUsize>,
) -> Result<i64, BoxError> {
    refund_as(store, call(order).approve(true), order, runs).await
}

/// The refund tool, as `call`.
async fn refund_as(
    store: &SqliteStore,
    call: Call,
    order: i64,
    runs: &Arc<AtomicUsize>,
) -> Result<i64, BoxError> {
    let runs = Arc::clone(runs);
    store
        .transactional(call)
        .run(move |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            stop_at(BEFORE_FIRST_WRITE);
            tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, 1250)", [order])?;
            let id = tx.last_insert_rowid();
            stop_at(BETWEEN_WRITES);
            tx.execute("INSERT INTO ledger (refund_id, cents) VALUES (?1, -1250)", [id])?;
            stop_at(AFTER_LAST_WRITE);
            Ok::<_, BoxError>(id)
        })
        .await
}

fn events(store: &SqliteStore, order: i64) -> Vec<Event> {
    let key = call(order).key().clone();
    block_on(store.history(key.as_str())).unwrap().into_iter().map(|e| e.event).collect()
}

/// The key's record is `done` with `id`, and its history is one reservation and its result.
fn assert_done(store: &SqliteStore, order: i64, id: i64) {
    let key = call(order).key().clone();
    let record = block_on(store.get(key.as_str())).unwrap().expect("the record");
    assert_eq!((record.status, record.result), (Status::Done, Some(id.to_string())));
    assert_eq!(events(store, order), [Event::Reserved, Event::Done]);
}

fn assert_free(store: &SqliteStore, dir: &Path, order: i64) {
    let key = call(order).key().clone();
    assert!(block_on(store.get(key.as_str())).unwrap().is_none(), "no record");
    assert!(events(store, order).is_empty(), "no history");
    assert_eq!(rows(dir, order), (0, 0), "no rows");
}

#[test]
fn the_body_s_rows_and_the_record_commit_together_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let runs = Arc::new(AtomicUsize::new(0));
    let id = block_on(refund(&store, 17, &runs)).unwrap();
    assert_eq!(rows(dir.path(), 17), (1, 1));
    assert_done(&store, 17, id);
    // A replay reads the result and does not run the body.
    assert_eq!(block_on(refund(&store, 17, &runs)).unwrap(), id);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(rows(dir.path(), 17), (1, 1));
    // So does a plain call of the same key, in another process's store instance.
    let other = SqliteStore::open(path(dir.path())).unwrap();
    let replayed: i64 = call(17)
        .store(Arc::new(other))
        .run(|| -> Result<i64, Error> { panic!("a plain call replays the transactional result") })
        .unwrap();
    assert_eq!(replayed, id);
}

#[test]
fn the_body_runs_as_the_current_call() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (key, token) = block_on(store.transactional(call(5)).run(|_tx| {
        Ok::<_, Error>((idem_runtime::try_current_key(), idem_runtime::try_fencing_token()))
    }))
    .unwrap();
    assert_eq!(key.as_ref(), Some(call(5).key()));
    assert!(token.is_some_and(|t| t > 0), "a fencing token: {token:?}");
}

#[test]
fn an_error_rolls_the_body_s_rows_back_and_frees_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let failed = block_on(store.transactional(call(17)).run(|tx| {
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (17, 1250)", [])?;
        Err::<i64, BoxError>("the payment provider said no".into())
    }));
    assert_eq!(failed.unwrap_err().to_string(), "the payment provider said no");
    assert_free(&store, dir.path(), 17);
    let runs = Arc::new(AtomicUsize::new(0));
    let id = block_on(refund(&store, 17, &runs)).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the key was free: the next call runs the body");
    assert_done(&store, 17, id);
}

#[test]
fn a_panic_in_the_body_rolls_back_and_reaches_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        block_on(store.transactional(call(17)).run(|tx| -> Result<i64, BoxError> {
            tx.execute("INSERT INTO refunds (order_id, cents) VALUES (17, 1250)", [])?;
            panic!("the body panics after its first write");
        }))
    }));
    let payload = panicked.expect_err("the panic reaches the caller");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the body panics after its first write"));
    assert_free(&store, dir.path(), 17);
    let id = block_on(refund(&store, 17, &Arc::new(AtomicUsize::new(0)))).unwrap();
    assert_done(&store, 17, id);
}

/// The idem error of a refund that did not happen.
fn idem_error(answer: Result<i64, BoxError>) -> Error {
    *answer.expect_err("the refund did not happen").downcast::<Error>().expect("an idem error")
}

/// Asks for the approval of refund `order`, and has a person approve it.
fn ask_and_approve(store: &SqliteStore, order: i64) {
    let runs = Arc::new(AtomicUsize::new(0));
    let asked = idem_error(block_on(approved_refund(store, order, &runs)));
    assert!(matches!(asked, Error::AwaitingApproval { .. }), "{asked:?}");
    let key = call(order).key().clone();
    admin::decide(store, &key, Decision::Approve, "ann@ops", None).expect("approved");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran before the approval");
}

#[test]
fn a_call_that_needs_approval_asks_then_runs_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        match idem_error(block_on(approved_refund(&store, 17, &runs))) {
            Error::AwaitingApproval { key, .. } => assert_eq!(key, call(17).key().to_string()),
            other => panic!("expected AwaitingApproval, got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");
    assert_eq!(rows(dir.path(), 17), (0, 0));
    let key = call(17).key().clone();
    admin::decide(&store, &key, Decision::Approve, "ann@ops", None).unwrap();
    let id = block_on(approved_refund(&store, 17, &runs)).expect("the approved call runs");
    assert_eq!(block_on(approved_refund(&store, 17, &runs)).unwrap(), id, "replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(rows(dir.path(), 17), (1, 1));
    assert_eq!(
        events(&store, 17),
        [Event::ApprovalRequested, Event::Approved, Event::TookOver, Event::Done]
    );
}

#[test]
fn a_key_awaiting_a_person_s_decision_is_refused_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    // A plain call of the same tool that needs approval asks for it first.
    let asked: Result<i64, Error> =
        call(17).approve(true).store(store.clone()).run(|| panic!("not approved yet"));
    assert!(matches!(asked, Err(Error::AwaitingApproval { .. })), "{asked:?}");
    let runs = Arc::new(AtomicUsize::new(0));
    let refused = block_on(refund(&store, 17, &runs)).unwrap_err();
    let refused = refused.downcast::<Error>().expect("an idem error");
    assert!(matches!(*refused, Error::AwaitingApproval { .. }), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");
    assert_eq!(rows(dir.path(), 17), (0, 0));
    let key = call(17).key().clone();
    let record = block_on(store.get(key.as_str())).unwrap().expect("the request stays");
    assert_eq!(record.status, Status::AwaitingApproval);
}

/// A transactional call's future dropped while its body runs (a timeout, a cancelled request):
/// the run goes on to its end on its own thread, and what it commits replays.
#[test]
fn a_call_dropped_during_its_body_commits_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (started, body_started) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let mut run = Box::pin(store.transactional(call(17)).run(move |tx| {
        counted.fetch_add(1, Ordering::SeqCst);
        started.send(()).unwrap();
        released.recv().unwrap();
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (17, 1250)", [])?;
        Ok::<_, BoxError>(tx.last_insert_rowid())
    }));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(run.as_mut().poll(&mut cx).is_pending(), "the body waits");
    body_started.recv_timeout(Duration::from_secs(60)).expect("the body started");
    drop(run);
    release.send(()).unwrap();
    // The run commits on its own: wait until its record says so.
    let key = call(17).key().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut seen = block_on(store.get(key.as_str())).unwrap();
    while !seen.as_ref().is_some_and(|record| record.status == Status::Done) {
        assert!(std::time::Instant::now() < deadline, "the dropped run never committed");
        seen = match &seen {
            Some(record) => block_on(store.watch(key.as_str(), record, deadline)).unwrap(),
            // Nothing is visible until the commit: look again shortly.
            None => {
                std::thread::sleep(Duration::from_millis(5));
                block_on(store.get(key.as_str())).unwrap()
            }
        };
    }
    let done = seen.unwrap();
    let id: i64 = done.result.unwrap().parse().unwrap();
    assert_eq!(rows(dir.path(), 17), (1, 0), "the body's row committed with the record");
    let again = block_on(refund(&store, 17, &runs)).unwrap();
    assert_eq!(again, id, "a later call replays the dropped call's result");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

/// A body that ends idem's transaction itself, with `COMMIT; BEGIN` (which a check of the
/// connection's autocommit alone misses) or `ROLLBACK; BEGIN`, then carries on: nothing it
/// wrote is kept, whether it then returns `Ok` or `Err`, the error says why, and the key is free.
#[test]
fn a_body_that_commits_or_rolls_back_by_itself_keeps_nothing_and_frees_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (n, own_end) in ["COMMIT; BEGIN", "ROLLBACK; BEGIN", "COMMIT"].iter().enumerate() {
        for fails in [false, true] {
            let order = 100 + 10 * n as i64 + i64::from(fails);
            let ended = block_on(store.transactional(call(order)).run(move |tx| {
                tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, 1250)", [order])?;
                // Whatever SQLite answers, the body carries on, as a careless one would.
                let _ = tx.execute_batch(own_end);
                let _ =
                    tx.execute("INSERT INTO ledger (refund_id, cents) VALUES (?1, -1250)", [order]);
                if fails {
                    return Err::<i64, BoxError>("the body fails after its own end".into());
                }
                Ok(order)
            }));
            let error = ended.expect_err(&format!("{own_end}: the run is refused"));
            let message = error.to_string();
            assert!(message.contains("ended the transaction itself"), "{own_end}: {message}");
            assert!(message.contains(call(order).key().as_str()), "names the key: {message}");
            let ledger = count(
                dir.path(),
                &format!("SELECT count(*) FROM ledger WHERE refund_id = {order}"),
            );
            assert_eq!((rows(dir.path(), order).0, ledger), (0, 0), "{own_end}: nothing kept");
            assert_free(&store, dir.path(), order);
        }
    }
    // The connection the body had is lent again, its watch gone: the next run commits.
    let id = block_on(refund(&store, 17, &Arc::new(AtomicUsize::new(0)))).unwrap();
    assert_done(&store, 17, id);
}

#[test]
fn a_result_that_cannot_be_stored_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let failed = block_on(store.transactional(call(17)).run(|tx| {
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (17, 1250)", []).unwrap();
        Ok::<_, Error>(f64::NAN)
    }));
    assert!(matches!(failed, Err(Error::Result { .. })), "{failed:?}");
    assert_free(&store, dir.path(), 17);
}

#[test]
fn racing_threads_run_the_body_once_and_all_get_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    let runs = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (store, runs, start) = (Arc::clone(&store), Arc::clone(&runs), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                block_on(refund(&store, 17, &runs)).unwrap()
            })
        })
        .collect();
    let values: Vec<i64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert!(values.iter().all(|v| *v == values[0]), "one value for all: {values:?}");
    assert_eq!(rows(dir.path(), 17), (1, 1));
    assert_done(&store, 17, values[0]);
}

/// In a child: the refund tool once (`refund`; `approved`, a refund a person approved),
/// holding a plain call of its key in flight
/// until a line comes on stdin (`plain`), or a race over `IDEM_KEYS` orders (`race`).
#[test]
fn sqlite_txn_child() {
    let Some((mode, dir)) = children::role() else { return };
    let store =
        SqliteStore::builder(path(&dir)).busy_timeout(Duration::from_secs(60)).open().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    match mode.as_str() {
        "refund" => {
            let id = block_on(refund(&store, 17, &runs)).unwrap();
            println!("DONE {id}");
        }
        "approved" => {
            let id = block_on(approved_refund(&store, 17, &runs)).unwrap();
            println!("DONE {id}");
        }
        "plain" => {
            let value: i64 = call(17)
                .store(Arc::new(store))
                .run(|| {
                    println!("IN_BODY");
                    std::io::stdout().flush().unwrap();
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line).unwrap();
                    Ok::<_, Error>(-1)
                })
                .unwrap();
            println!("DONE {value}");
        }
        _ => {
            let keys: i64 = std::env::var("IDEM_KEYS").unwrap().parse().unwrap();
            let offset: i64 = std::env::var("IDEM_OFFSET").unwrap().parse().unwrap();
            println!("READY");
            std::io::stdout().flush().unwrap();
            let mut go = String::new();
            std::io::stdin().read_line(&mut go).unwrap();
            for i in 0..keys {
                let order = (i + offset) % keys;
                let id = block_on(refund(&store, order, &runs)).unwrap();
                println!("RESULT {order} {id}");
            }
        }
    }
    std::io::stdout().flush().unwrap();
}

fn child(dir: &Path, mode: &str) -> std::process::Command {
    children::child("sqlite_txn_child", mode, dir)
}

#[test]
fn a_plain_call_in_flight_in_another_process_is_waited_for_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut owner = start(&mut child(dir.path(), "plain"));
    owner.until_line("IN_BODY");
    let key = call(17).key().to_string();
    let runs = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let (path, runs) = (path(dir.path()), Arc::clone(&runs));
        std::thread::spawn(move || {
            let store = SqliteStore::open(path).unwrap();
            block_on(refund(&store, 17, &runs))
        })
    };
    while idem_runtime::waiting(&key) == 0 {
        std::thread::sleep(Duration::from_millis(1));
        assert!(!waiter.is_finished(), "the transactional call returned without waiting");
    }
    writeln!(owner.process.stdin.as_mut().unwrap(), "finish").unwrap();
    owner.until_line("DONE -1");
    assert!(owner.finish().1.success());
    assert_eq!(waiter.join().unwrap().unwrap(), -1, "the plain call's result replays");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the transactional body never ran");
    assert_eq!(rows(dir.path(), 17), (0, 0));
    let record = block_on(store.get(&key)).unwrap().unwrap();
    assert_eq!(record.result.as_deref(), Some("-1"));
}

#[test]
fn racing_processes_run_each_body_once_and_all_get_its_value() {
    const PROCESSES: usize = 6;
    const KEYS: i64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut racers: Vec<Running> = (0..PROCESSES)
        .map(|n| {
            start(
                child(dir.path(), "race")
                    .env("IDEM_KEYS", KEYS.to_string())
                    .env("IDEM_OFFSET", (n * 2).to_string()),
            )
        })
        .collect();
    for racer in &mut racers {
        racer.until_line("READY");
    }
    for racer in &mut racers {
        writeln!(racer.process.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let mut results = std::collections::BTreeMap::<i64, Vec<i64>>::new();
    for mut racer in racers {
        let (rest, status) = racer.finish();
        assert!(status.success(), "a racing process failed");
        for line in rest.iter().filter_map(|l| l.strip_prefix("RESULT ")) {
            let (order, id) = line.split_once(' ').unwrap();
            results.entry(order.parse().unwrap()).or_default().push(id.parse().unwrap());
        }
    }
    assert_eq!(results.len(), KEYS as usize);
    for (order, ids) in results {
        assert_eq!(ids.len(), PROCESSES, "every process called order {order}");
        assert_eq!(rows(dir.path(), order), (1, 1), "order {order}: one refund, one ledger row");
        let id = count(dir.path(), &format!("SELECT id FROM refunds WHERE order_id = {order}"));
        assert!(ids.iter().all(|got| *got == id), "order {order}: all got {id}: {ids:?}");
        assert_done(&store, order, id);
    }
}

/// Kills a child running the refund at `point`, with `waiters` callers of the same key started
/// in this process first; then the rows and the record agree: both absent and the next call
/// runs the body once, or (`committed`) both present and every call replays.
fn killed_at(point: &str, waiters: usize, committed: bool) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    let mut victim = start(child(dir.path(), "refund").env("IDEM_FAILPOINT", point));
    let said = if point.starts_with("txn_") {
        format!("IDEM_FAILPOINT_REACHED {point}")
    } else {
        format!("STOPPED_AT {point}")
    };
    victim.until_line(&said);
    // The callers start while the child holds the file's write lock (up to its commit): each
    // is at, or waiting in, its `BEGIN IMMEDIATE` when the child dies. SQLite does not show
    // which; the outcome must be the same either way.
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, starts) = std::sync::mpsc::channel();
    let callers: Vec<_> = (0..waiters)
        .map(|_| {
            let (store, runs, started) = (Arc::clone(&store), Arc::clone(&runs), started.clone());
            std::thread::spawn(move || {
                started.send(()).unwrap();
                block_on(refund(&store, 17, &runs)).unwrap()
            })
        })
        .collect();
    for _ in 0..waiters {
        starts.recv().unwrap();
    }
    victim.process.kill().expect("SIGKILL the child");
    victim.process.wait().unwrap();
    let mut values: Vec<i64> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    if waiters == 0 {
        if committed {
            assert_eq!(rows(dir.path(), 17), (1, 1), "{point}: the commit landed whole");
        } else {
            assert_free(&store, dir.path(), 17);
        }
        values.push(block_on(refund(&store, 17, &runs)).unwrap());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        usize::from(!committed),
        "{point}: runs after the kill"
    );
    assert_eq!(rows(dir.path(), 17), (1, 1), "{point}: one refund and its ledger row");
    let id = count(dir.path(), "SELECT id FROM refunds");
    assert!(values.iter().all(|v| *v == id), "{point}: every caller got refund {id}: {values:?}");
    assert_done(&store, 17, id);
    let again = block_on(refund(&store, 17, &Arc::new(AtomicUsize::new(0)))).unwrap();
    assert_eq!(again, id, "{point}: a later call replays");
}

/// Kills a child running an approved refund at every point of its transaction: before the
/// commit, the key is still approved and the next call runs the body once; after it, the
/// refund replays. Never a second run, and never a run without the approval.
#[test]
fn a_child_killed_during_an_approved_run_leaves_the_approval_or_its_result() {
    let points =
        [BEFORE_FIRST_WRITE, BETWEEN_WRITES, AFTER_LAST_WRITE, BEFORE_COMMIT, AFTER_COMMIT];
    for point in points {
        let committed = point == AFTER_COMMIT;
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        ask_and_approve(&store, 17);
        let mut victim = start(child(dir.path(), "approved").env("IDEM_FAILPOINT", point));
        victim.until_line(&if point.starts_with("txn_") {
            format!("IDEM_FAILPOINT_REACHED {point}")
        } else {
            format!("STOPPED_AT {point}")
        });
        victim.process.kill().expect("SIGKILL the child");
        victim.process.wait().unwrap();
        let key = call(17).key().clone();
        let status = block_on(store.get(key.as_str())).unwrap().map(|record| record.status);
        let expected = if committed { Status::Done } else { Status::Approved };
        assert_eq!(status, Some(expected), "{point}: the approval, or the committed run");
        assert_eq!(rows(dir.path(), 17), if committed { (1, 1) } else { (0, 0) }, "{point}");
        let runs = Arc::new(AtomicUsize::new(0));
        let id = block_on(approved_refund(&store, 17, &runs)).expect("the approved refund");
        assert_eq!(runs.load(Ordering::SeqCst), usize::from(!committed), "{point}: runs");
        assert_eq!(rows(dir.path(), 17), (1, 1), "{point}: one refund and its ledger row");
        assert_eq!(block_on(approved_refund(&store, 17, &runs)).unwrap(), id, "{point}: replayed");
        assert_eq!(
            events(&store, 17),
            [Event::ApprovalRequested, Event::Approved, Event::TookOver, Event::Done],
            "{point}"
        );
    }
}

#[test]
fn killed_before_the_first_write_leaves_neither_rows_nor_record() {
    killed_at(BEFORE_FIRST_WRITE, 0, false);
    killed_at(BEFORE_FIRST_WRITE, 8, false);
}

#[test]
fn killed_between_two_writes_leaves_neither_rows_nor_record() {
    killed_at(BETWEEN_WRITES, 0, false);
    killed_at(BETWEEN_WRITES, 8, false);
}

#[test]
fn killed_after_the_last_write_leaves_neither_rows_nor_record() {
    killed_at(AFTER_LAST_WRITE, 0, false);
    killed_at(AFTER_LAST_WRITE, 8, false);
}

#[test]
fn killed_with_the_result_written_before_the_commit_leaves_neither() {
    killed_at(BEFORE_COMMIT, 0, false);
    killed_at(BEFORE_COMMIT, 8, false);
}

#[test]
fn killed_after_the_commit_leaves_both_and_the_result_replays() {
    killed_at(AFTER_COMMIT, 0, true);
    killed_at(AFTER_COMMIT, 8, true);
}

#[test]
fn a_plain_call_s_key_left_in_doubt_fails_and_is_taken_over_under_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut owner = start(&mut child(dir.path(), "plain"));
    owner.until_line("IN_BODY");
    owner.process.kill().unwrap(); // SIGKILL: its record stays in flight, its lock goes
    owner.process.wait().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let refused = block_on(refund(&store, 17, &runs)).unwrap_err();
    assert!(
        matches!(refused.downcast_ref::<Error>(), Some(Error::InDoubt { .. })),
        "in doubt under `fail`: {refused}"
    );
    assert_eq!((runs.load(Ordering::SeqCst), rows(dir.path(), 17)), (0, (0, 0)));
    let rerun = call(17).in_doubt(idem_runtime::InDoubtPolicy::Rerun);
    let runs_now = Arc::clone(&runs);
    let id = block_on(store.transactional(rerun).run(move |tx| {
        runs_now.fetch_add(1, Ordering::SeqCst);
        tx.execute("INSERT INTO refunds (order_id, cents) VALUES (17, 1250)", [])?;
        Ok::<_, BoxError>(tx.last_insert_rowid())
    }))
    .unwrap();
    assert_eq!((runs.load(Ordering::SeqCst), rows(dir.path(), 17)), (1, (1, 0)));
    let key = call(17).key().to_string();
    let record = block_on(store.get(&key)).unwrap().unwrap();
    assert_eq!((record.status, record.result), (Status::Done, Some(id.to_string())));
    assert_eq!(events(&store, 17), [Event::Reserved, Event::TookOver, Event::Done]);
}

#[test]
fn an_expired_result_is_taken_over_and_the_body_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let short = || call(17).ttl(Duration::from_millis(1));
    let first = block_on(store.transactional(short()).run(|_tx| Ok::<_, Error>(1))).unwrap();
    // Past the result's ttl on every clock.
    std::thread::sleep(Duration::from_millis(20));
    let second = block_on(store.transactional(short()).run(|_tx| Ok::<_, Error>(2))).unwrap();
    assert_eq!((first, second), (1, 2), "the expired result is not replayed");
    assert_eq!(events(&store, 17), [Event::Reserved, Event::Done, Event::TookOver, Event::Done]);
}
