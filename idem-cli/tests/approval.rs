//! `idem approve` and `idem deny` as an operator runs them: on a sled store opened by the
//! command, on one a process holds (through its admin socket), and on PostgreSQL.

use std::sync::Arc;

use idem_runtime::{Call, Error, Key, Store};
use serde_json::{json, Value};

mod common;

use self::common::{idem, idem_in, open, place};

fn refund(store: &Arc<dyn Store>, amount: u64) -> Call {
    Call::new("refund", "order-17", &json!({ "amount": amount }))
        .unwrap()
        .store(Arc::clone(store))
        .approve(true)
}

/// Runs the refund; its result and how many times its body ran.
fn run(store: &Arc<dyn Store>, amount: u64) -> (Result<String, Error>, usize) {
    let mut runs = 0;
    let got = refund(store, amount).run(|| {
        runs += 1;
        Ok::<_, Error>(format!("re_{amount}"))
    });
    (got, runs)
}

fn asked(store: &Arc<dyn Store>, amount: u64) -> Key {
    match run(store, amount) {
        (Err(Error::AwaitingApproval { key, .. }), 0) => key.parse().unwrap(),
        other => panic!("expected a request for approval, got {other:?}"),
    }
}

#[test]
fn ls_lists_what_awaits_approval_and_approve_lets_the_next_call_run_once() {
    let (_dir, path) = place();
    let store = open(&path);
    let key = asked(&store, 5000);
    drop(store);

    let listed = idem(&path, &["ls", "--status", "awaiting-approval"]).ok().to_owned();
    assert!(listed.contains(key.as_str()) && listed.contains("refund"), "{listed}");
    assert!(listed.contains("order-17"), "the scope is listed: {listed}");
    let shown = idem(&path, &["show", key.as_str()]).ok().to_owned();
    assert!(shown.contains(&format!("idem approve {key}")), "{shown}");

    let out = idem(&path, &["approve", key.as_str(), "--note", "checked"]).ok().to_owned();
    assert!(out.contains(&format!("approved {key}")), "{out}");
    let shown: Value =
        serde_json::from_str(idem(&path, &["show", key.as_str(), "--json"]).ok()).unwrap();
    assert_eq!(shown["status"], "approved");
    let approval = &shown["history"][1];
    assert_eq!(
        (approval["event"].as_str(), approval["note"].as_str()),
        (Some("approved"), Some("checked"))
    );
    assert!(approval["by"].as_str().is_some_and(|by| by.contains('@')), "user@host: {approval}");

    let store = open(&path);
    let (got, runs) = run(&store, 5000);
    assert_eq!((got.unwrap(), runs), ("re_5000".to_owned(), 1));
    let (got, runs) = run(&store, 5000);
    assert_eq!((got.unwrap(), runs), ("re_5000".to_owned(), 0), "replayed");
}

#[test]
fn deny_needs_a_note_and_every_call_then_gets_it() {
    let (_dir, path) = place();
    let store = open(&path);
    let key = asked(&store, 7000);
    drop(store);
    let usage = idem(&path, &["deny", key.as_str()]).fails(2).to_owned();
    assert!(usage.contains("--note"), "{usage}");
    idem(&path, &["deny", key.as_str(), "--note", "over the limit"]).ok();
    let again = idem(&path, &["approve", key.as_str()]).fails(1).to_owned();
    assert!(again.contains("is denied, not awaiting approval"), "{again}");
    let store = open(&path);
    match run(&store, 7000) {
        (Err(Error::Denied { note, .. }), 0) => assert_eq!(note.as_deref(), Some("over the limit")),
        other => panic!("expected Denied, got {other:?}"),
    }
}

#[test]
fn approve_reaches_a_store_held_by_a_running_process_through_its_socket() {
    let (_dir, path) = place();
    let store = open(&path);
    let key = asked(&store, 9000);
    // The store stays open here: the command must go through the admin socket.
    let out = idem(&path, &["approve", key.as_str()]).ok().to_owned();
    assert!(out.contains("approved"), "{out}");
    let (got, runs) = run(&store, 9000);
    assert_eq!((got.unwrap(), runs), ("re_9000".to_owned(), 1));
}

/// Runs when `DATABASE_URL` names a PostgreSQL database, as the idem-postgres tests do; in a
/// table of its own, so that parallel runs do not meet.
#[cfg(feature = "postgres")]
#[test]
fn approve_and_deny_work_directly_on_postgresql() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("skipped: DATABASE_URL is not set (CI sets it)");
        return;
    };
    // At most 28 characters: the pid and the clock's low digits keep runs apart.
    let table =
        format!("appr_{}_{}", std::process::id(), idem_runtime::store::now_ms() % 1_000_000_000);
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}idem_table=idem_cli_tests.{table}");
    let store: Arc<dyn Store> =
        Arc::new(idem_postgres::PgStore::connect(&url).expect("PostgreSQL is reachable"));
    let approved = asked(&store, 100);
    let denied = asked(&store, 200);
    let dir = tempfile::tempdir().unwrap();
    let listed = idem_in(dir.path(), &["--store", &url, "ls", "--status", "awaiting-approval"])
        .ok()
        .to_owned();
    assert!(listed.contains(approved.as_str()) && listed.contains(denied.as_str()), "{listed}");
    idem_in(dir.path(), &["--store", &url, "approve", approved.as_str()]).ok();
    idem_in(dir.path(), &["--store", &url, "deny", denied.as_str(), "--note", "no"]).ok();
    let (got, runs) = run(&store, 100);
    assert_eq!((got.unwrap(), runs), ("re_100".to_owned(), 1));
    assert!(matches!(run(&store, 200), (Err(Error::Denied { .. }), 0)));
}
