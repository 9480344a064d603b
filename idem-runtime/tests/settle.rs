//! A settling write that fails after the body ran (its result, a key marked in doubt) is not
//! lost: the call says so, and the engine tries the write again in the background until the
//! store takes it. The store here is a real SQLite file whose write lock another connection
//! holds past the store's busy timeout, as another program writing to the file would.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::block_on;
use idem_runtime::{Call, Error, Record, SqliteStore, Status, Store};

/// How long the store waits for the file's write lock before a write fails.
const BUSY: Duration = Duration::from_millis(100);

fn open(path: &Path) -> Arc<dyn Store> {
    let store = SqliteStore::builder(path).busy_timeout(BUSY).open().expect("the store opens");
    Arc::new(store)
}

/// Another connection to the file that holds its write lock until dropped.
struct Blocker(rusqlite::Connection);

impl Blocker {
    fn take(path: &Path) -> Blocker {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").expect("the write lock is free");
        Blocker(conn)
    }
}

impl Drop for Blocker {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("ROLLBACK");
    }
}

fn call(store: &Arc<dyn Store>) -> Call {
    Call::new("charge_card", "order-17", &serde_json::json!({ "cents": 4200 }))
        .unwrap()
        .store(Arc::clone(store))
}

fn record(store: &Arc<dyn Store>) -> Option<Record> {
    block_on(store.get(call(store).key().as_str())).unwrap()
}

/// Waits, for at most a minute, until the key's record is no longer `seen`; the record then.
fn changed_from(store: &Arc<dyn Store>, seen: &Record) -> Option<Record> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let key = call(store).key().clone();
    let mut now = Some(seen.clone());
    while now.as_ref().is_some_and(|record| record.is_as(seen)) && Instant::now() < deadline {
        now = block_on(store.watch(key.as_str(), seen, deadline)).unwrap();
    }
    now
}

#[test]
fn a_result_the_store_refused_is_recorded_in_the_background_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let store = open(&path);
    let runs = AtomicUsize::new(0);
    let mut blocker = None;
    let charged: Result<String, Error> = call(&store).run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        // The charge is made; then another program takes the file's write lock.
        blocker = Some(Blocker::take(&path));
        Ok("ch_1".to_owned())
    });
    let error = charged.expect_err("the result could not be written");
    assert!(matches!(error, Error::Unrecorded { .. }), "{error:?}");
    let message = error.to_string();
    let key = call(&store).key().clone();
    assert!(message.contains(key.as_str()), "the error names the key: {message}");
    assert!(message.contains("the effect ran"), "the error says the effect ran: {message}");
    assert!(error.is_retryable(), "calling again waits for the result and replays it");
    let held = record(&store).expect("the key is still held");
    assert_eq!(held.status, Status::InFlight, "nothing else could be written meanwhile");

    // The other program lets go: the result is recorded, and every call replays it.
    drop(blocker.take());
    let done = changed_from(&store, &held).expect("a record");
    assert_eq!((done.status, done.result.as_deref()), (Status::Done, Some("\"ch_1\"")));
    let again: String = call(&store)
        .run(|| -> Result<String, Error> { panic!("the charge is not made twice") })
        .unwrap();
    assert_eq!(again, "ch_1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_key_the_store_could_not_mark_in_doubt_is_marked_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    let store = open(&path);
    let mut blocker = None;
    let failed: Result<String, Error> = call(&store).run(|| {
        // The request went out and its answer was lost: the charge may have been made.
        idem_runtime::may_have_landed();
        blocker = Some(Blocker::take(&path));
        Err(Error::Key { tool: "charge_card".into(), reason: "the vendor timed out".into() })
    });
    assert!(failed.is_err());
    let held = record(&store).expect("the key is still held");
    assert_eq!(held.status, Status::InFlight, "nothing else could be written meanwhile");

    drop(blocker.take());
    let marked = changed_from(&store, &held).expect("a record");
    assert_eq!(marked.status, Status::InDoubt, "never released: the effect may have landed");
    let again: Result<String, Error> = call(&store).run(|| panic!("an in-doubt key does not run"));
    assert!(matches!(again, Err(Error::InDoubt { .. })), "{again:?}");
}
