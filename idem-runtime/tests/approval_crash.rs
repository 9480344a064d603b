//! Approval across crashes, with real processes: a child (this test binary re-run in child
//! mode) asks for approval, approves, or runs the approved call against a sled store, is stopped
//! at an exact point by a fail point, and is killed with SIGKILL. What the store holds after
//! each point is what landed, and no body runs without an approval or twice with one.

mod children;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::admin::{self, Decision};
use idem_runtime::history::Event;
use idem_runtime::{Call, Error, Key, SledStore, Status, Store};

use self::children::start;

const CHILD: &str = "IDEM_APPROVAL_CHILD";

fn call() -> Call {
    Call::new("refund", "order-17", &serde_json::json!({ "amount": 5000 })).unwrap().approve(true)
}

fn key() -> Key {
    call().key().clone()
}

fn open(path: &Path) -> Arc<dyn Store> {
    Arc::new(SledStore::builder(path).lock_wait(Duration::from_secs(5)).open().unwrap())
}

/// Child mode: `IDEM_ACTION=call` makes the call (printing `BODY` when its body runs),
/// `approve` approves the key.
#[test]
fn approval_child() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let store = open(&PathBuf::from(dir).join("store"));
    match std::env::var("IDEM_ACTION").as_deref() {
        Ok("approve") => {
            let got = admin::decide(store.as_ref(), &key(), Decision::Approve, "ann@ops", None);
            println!("OUTCOME {:?}", got.map(|record| record.status));
        }
        _ => {
            let got: Result<String, Error> = call().store(store).run(|| {
                println!("BODY");
                Ok("re_1".to_owned())
            });
            println!("OUTCOME {got:?}");
        }
    }
}

/// Runs a child doing `action`, SIGKILLed at `point` (or left to finish, with `None`); what it
/// printed.
fn child(dir: &Path, action: &str, point: Option<&str>) -> Vec<String> {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "approval_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, dir)
        .env("IDEM_ACTION", action)
        .env_remove("IDEM_FAILPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(point) = point {
        command.env("IDEM_FAILPOINT", point);
    }
    let mut process = start(&mut command);
    match point {
        Some(point) => {
            let seen = process.until_line(&format!("IDEM_FAILPOINT_REACHED {point}"));
            process.kill(); // SIGKILL on Unix
            seen
        }
        None => {
            let seen = process.until_line("OUTCOME ");
            process.finish();
            seen
        }
    }
}

fn bodies(lines: &[String]) -> usize {
    lines.iter().filter(|line| line.ends_with("BODY")).count()
}

fn events(store: &Arc<dyn Store>) -> Vec<Event> {
    admin::history(store.as_ref(), &key()).unwrap().into_iter().map(|entry| entry.event).collect()
}

fn status(store: &Arc<dyn Store>) -> Option<Status> {
    admin::show(store.as_ref(), &key()).ok().map(|record| record.status)
}

/// A store whose key awaits approval, made by a child that finished.
fn asked(dir: &Path) {
    let lines = child(dir, "call", None);
    assert!(lines.iter().any(|line| line.contains("AwaitingApproval")), "{lines:?}");
}

#[test]
fn a_request_cut_short_before_its_record_leaves_nothing_and_the_next_call_asks() {
    let dir = tempfile::tempdir().unwrap();
    child(dir.path(), "call", Some("after_entry_approval-requested"));
    let store = open(&dir.path().join("store"));
    assert_eq!(status(&store), None, "the request never landed");
    assert!(events(&store).is_empty(), "nor is it in the history");
    let got: Result<String, Error> = call().store(Arc::clone(&store)).run(|| Ok("re_1".into()));
    assert!(matches!(got, Err(Error::AwaitingApproval { .. })), "{got:?}");
    assert_eq!(events(&store), [Event::ApprovalRequested]);
}

#[test]
fn a_request_that_landed_survives_the_crash_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let lines = child(dir.path(), "call", Some("after_approval_request"));
    assert_eq!(bodies(&lines), 0);
    let store = open(&dir.path().join("store"));
    assert_eq!(status(&store), Some(Status::AwaitingApproval), "not marked in doubt at open");
    assert_eq!(events(&store), [Event::ApprovalRequested]);
    let got: Result<String, Error> = call().store(Arc::clone(&store)).run(|| Ok("re_1".into()));
    assert!(matches!(got, Err(Error::AwaitingApproval { .. })), "{got:?}");
}

#[test]
fn an_approval_cut_short_before_its_record_leaves_the_key_awaiting() {
    let dir = tempfile::tempdir().unwrap();
    asked(dir.path());
    child(dir.path(), "approve", Some("after_entry_approved"));
    let store = open(&dir.path().join("store"));
    assert_eq!(status(&store), Some(Status::AwaitingApproval));
    assert_eq!(events(&store), [Event::ApprovalRequested], "the approval never landed");
    drop(store);
    let lines = child(dir.path(), "call", None);
    assert_eq!(bodies(&lines), 0, "still no approval: {lines:?}");
}

#[test]
fn an_approval_that_landed_survives_the_crash_and_the_next_call_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    asked(dir.path());
    child(dir.path(), "approve", Some("after_decision"));
    let store = open(&dir.path().join("store"));
    assert_eq!(status(&store), Some(Status::Approved));
    drop(store);
    let first = child(dir.path(), "call", None);
    let second = child(dir.path(), "call", None);
    assert_eq!(bodies(&first) + bodies(&second), 1, "{first:?} {second:?}");
    assert!(second.iter().any(|line| line.contains("Ok(\"re_1\")")), "replayed: {second:?}");
}

#[test]
fn an_approved_call_killed_at_each_point_never_runs_the_body_twice() {
    for (point, ran, then) in [
        ("after_reserve", 0, Some(Status::InDoubt)),
        ("after_body", 1, Some(Status::InDoubt)),
        ("after_complete", 1, Some(Status::Done)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        asked(dir.path());
        child(dir.path(), "approve", None);
        let lines = child(dir.path(), "call", Some(point));
        assert_eq!(bodies(&lines), ran, "{point}: {lines:?}");
        let store = open(&dir.path().join("store"));
        assert_eq!(status(&store), then, "{point}");
        drop(store);
        // The approval was used by the call that died: the next one replays or reports the key
        // in doubt, and never runs the body again.
        let after = child(dir.path(), "call", None);
        assert_eq!(bodies(&after), 0, "{point}: {after:?}");
        let store = open(&dir.path().join("store"));
        let history = events(&store);
        assert_eq!(history[..3], [Event::ApprovalRequested, Event::Approved, Event::TookOver]);
    }
}
