//! A result that says it failed (an MCP tool result with `isError: true`, as rmcp's
//! `CallToolResult::error` writes it) is how a tool tells the model of an error: it is not
//! recorded, so a later call runs the body again instead of replaying the error for ever. The
//! key is released, or left in doubt when the body said its effect may have landed; a tool
//! records an error as the intent's answer only by marking it final. On a real SQLite store,
//! plain and transactional.

#![cfg(feature = "sqlite")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_runtime::{block_on, Call, Error, SqliteStore, Status, Store};
use serde_json::{json, Value};

fn error_result(text: &str) -> Value {
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}

fn open(dir: &std::path::Path) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(dir.join("desk.sqlite")).unwrap())
}

fn call(store: &Arc<SqliteStore>, scope: &str) -> Call {
    Call::new("open_case", scope, &json!({ "title": "printer" })).unwrap().store(store.clone())
}

fn status(store: &SqliteStore, call: &Call) -> Option<Status> {
    block_on(store.get(call.key().as_str())).unwrap().map(|record| record.status)
}

#[test]
fn an_error_result_is_not_recorded_and_the_next_call_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let runs = AtomicUsize::new(0);
    let attempt = |answer: Value| {
        call(&store, "req-1").run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(answer)
        })
    };
    for _ in 0..3 {
        let told = attempt(error_result("vendor unavailable, try again")).unwrap();
        assert_eq!(told["isError"], true, "the model reads the error");
        assert_eq!(status(&store, &call(&store, "req-1")), None, "nothing recorded: key free");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "the body ran each time");
    let opened = attempt(json!({ "content": [], "structuredContent": { "case": 7 } })).unwrap();
    let replayed = attempt(error_result("never sent")).unwrap();
    assert_eq!(replayed, opened, "the success is recorded and replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // A value that merely has an `isError` field elsewhere is a result like any other.
    let other = call(&store, "req-2")
        .run(|| Ok::<_, Error>(json!({ "isError": true, "note": "a field, not a tool result" })))
        .unwrap();
    assert_eq!(other["note"], "a field, not a tool result");
    assert_eq!(status(&store, &call(&store, "req-2")), Some(Status::Done));
}

#[test]
fn an_error_result_after_the_effect_may_have_landed_leaves_the_key_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let told = call(&store, "req-3")
        .run(|| {
            idem_runtime::may_have_landed();
            Ok::<_, Error>(error_result("the vendor timed out"))
        })
        .unwrap();
    assert_eq!(told["isError"], true);
    assert_eq!(status(&store, &call(&store, "req-3")), Some(Status::InDoubt));
    let refused = call(&store, "req-3").run(|| Ok::<_, Error>(json!({ "content": [] })));
    assert!(matches!(refused, Err(Error::InDoubt { .. })), "{refused:?}");
}

#[test]
fn an_error_result_marked_final_is_recorded_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut declined = error_result("card declined");
    declined["_meta"] = json!({ "io.idem/final": true });
    let runs = AtomicUsize::new(0);
    for _ in 0..2 {
        let told = call(&store, "req-4")
            .run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(declined.clone())
            })
            .unwrap();
        assert_eq!(told, declined);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "recorded once, replayed after");
    assert_eq!(status(&store, &call(&store, "req-4")), Some(Status::Done));
}

#[test]
fn a_transactional_error_result_rolls_its_rows_back_unrecorded() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let conn = idem_runtime::rusqlite::Connection::open(store.path()).unwrap();
    conn.execute_batch("CREATE TABLE cases (id INTEGER PRIMARY KEY, title TEXT)").unwrap();
    let told = block_on(store.transactional(call(&store, "req-5")).run(|tx| {
        tx.execute("INSERT INTO cases (title) VALUES ('printer')", [])?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(error_result("no agent free"))
    }))
    .unwrap();
    assert_eq!(told["isError"], true);
    let rows: i64 = conn.query_row("SELECT count(*) FROM cases", [], |row| row.get(0)).unwrap();
    assert_eq!(rows, 0, "the body's row rolled back with the unrecorded result");
    assert_eq!(status(&store, &call(&store, "req-5")), None, "the key is free");
}
