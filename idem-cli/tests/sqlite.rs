//! The `idem` command on a SQLite store that an agent holds open: this test process is the
//! agent (with a call still running, one in doubt and one done), and the command, another
//! process, works on the same file directly, no socket needed. `--store sqlite:PATH` and
//! `IDEM_STORE=sqlite:PATH` name the same store.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use common::{idem_in, idem_in_with};
use idem_runtime::{Call, Error, SqliteStore, Status, Store};
use serde_json::Value;

fn call(store: &Arc<dyn Store>, scope: &str) -> Call {
    Call::new("refund", scope, &serde_json::json!({ "order": scope }))
        .unwrap()
        .store(Arc::clone(store))
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn status_of(records: &[Value], key: &str) -> Option<String> {
    records.iter().find(|r| r["key"] == key).map(|r| r["status"].as_str().unwrap().to_owned())
}

#[test]
fn the_command_works_on_a_sqlite_store_that_an_agent_holds_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agents.sqlite");
    let name = format!("sqlite:{}", path.display());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());

    let done = call(&store, "order-1");
    done.clone().run(|| Ok::<_, Error>("refunded".to_owned())).unwrap();
    let doubt = call(&store, "order-2");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        doubt.clone().run(|| -> Result<String, Error> { panic!("the vendor hung up") })
    }));
    assert!(panicked.is_err());
    // A call still running, in this process, while the command looks.
    let running = call(&store, "order-3");
    let (started, finish) = (mpsc::channel(), mpsc::channel::<()>());
    let runner = {
        let running = running.clone();
        std::thread::spawn(move || {
            running.run(|| {
                started.0.send(()).unwrap();
                finish.1.recv().unwrap();
                Ok::<_, Error>("refunded late".to_owned())
            })
        })
    };
    started.1.recv().unwrap();

    // An in-flight record of another process carries, as its lease, what its owner's lock
    // said when it was read: the moment differs from one read to the next.
    let ls = |run: &common::Run| -> Vec<Value> {
        let mut records = json_lines(run.ok());
        records.iter_mut().for_each(|r| drop(r.as_object_mut().unwrap().remove("lease_until")));
        records
    };
    let listed = ls(&idem_in(dir.path(), &["--store", &name, "ls", "--json"]));
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(status_of(&listed, done.key().as_str()).as_deref(), Some("done"));
    assert_eq!(status_of(&listed, doubt.key().as_str()).as_deref(), Some("in-doubt"));
    assert_eq!(status_of(&listed, running.key().as_str()).as_deref(), Some("in-flight"));
    // $IDEM_STORE reads the name the same way.
    let by_env = idem_in_with(dir.path(), &["ls", "--json"], &[("IDEM_STORE", &name)]);
    assert_eq!(ls(&by_env), listed);

    // A running call's owner lives: the command will not settle it under its feet.
    let refused =
        idem_in(dir.path(), &["--store", &name, "resolve", running.key().as_str(), "--release"]);
    let line = refused.fails(1);
    assert!(line.contains("in-flight and cannot be resolved"), "{line}");

    // The operator settles the key in doubt; the agent then runs it again, once.
    let resolved =
        idem_in(dir.path(), &["--store", &name, "resolve", doubt.key().as_str(), "--release"]);
    resolved.ok();
    let runs = AtomicUsize::new(0);
    let again = doubt.clone().run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("refunded".to_owned())
    });
    assert_eq!(again.unwrap(), "refunded");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let shown = idem_in(dir.path(), &["--store", &name, "show", doubt.key().as_str(), "--json"]);
    let shown: Value = serde_json::from_str(shown.ok().trim()).unwrap();
    let events: Vec<&str> =
        shown["history"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["reserved", "in-doubt", "resolved", "reserved", "done"], "{shown}");

    finish.0.send(()).unwrap();
    assert_eq!(runner.join().unwrap().unwrap(), "refunded late");
    let record = idem_runtime::block_on(store.get(running.key().as_str())).unwrap();
    assert_eq!(record.map(|r| r.status), Some(Status::Done), "the agent's write landed");
}

#[test]
fn a_sqlite_name_that_is_wrong_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo.sqlite");
    let line = idem_in(dir.path(), &["--store", &format!("sqlite:{}", missing.display()), "ls"])
        .fails(1)
        .to_owned();
    assert!(line.contains("does not exist"), "{line}");
    assert!(!missing.exists(), "the command created nothing");

    // A SQLite file named as a plain path (a sled directory's name).
    let path = dir.path().join("agents.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    let line = idem_in(dir.path(), &["--store", path.to_str().unwrap(), "ls"]).fails(1).to_owned();
    assert!(line.contains(&format!("sqlite:{}", path.display())), "names the fix: {line}");
    assert!(!Path::new(&path).is_dir());
}

#[test]
fn the_command_leaves_a_store_that_an_agent_opened_twice_shared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agents.sqlite");
    let name = format!("sqlite:{}", path.display());
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    // A second open in the agent's process: a tool with a store of its own, say.
    let _again = SqliteStore::open(&path).unwrap();
    idem_in(dir.path(), &["--store", &name, "ls"]).ok();
    let (wal, shm) = (dir.path().join("agents.sqlite-wal"), dir.path().join("agents.sqlite-shm"));
    assert!(
        wal.exists() && shm.exists(),
        "the command took itself for the store's last user and removed the live -wal and -shm"
    );
    let runs = AtomicUsize::new(0);
    let refund = call(&store, "order-1");
    let got = refund.clone().run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("refunded".to_owned())
    });
    assert_eq!(got.unwrap(), "refunded");
    // The command, a new process, reads what the agent wrote: one log and one lock for both.
    let listed = json_lines(idem_in(dir.path(), &["--store", &name, "ls", "--json"]).ok());
    assert_eq!(status_of(&listed, refund.key().as_str()).as_deref(), Some("done"), "{listed:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `--store sqlite:~/…` and `IDEM_STORE=~/…`, written where no shell expands them, name stores
/// in the home directory for the command as for an agent (`$HOME` set for the command alone).
/// Before, the command looked for them under a directory named `~`, and found none.
#[test]
fn a_store_name_with_a_tilde_is_in_the_home_directory() {
    let (home, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(home.path().join("idem.sqlite")).unwrap());
    call(&store, "order-1").run(|| Ok::<_, Error>("refunded".to_owned())).unwrap();
    drop(store);
    let home_env = [("HOME", home.path().to_str().unwrap())];
    let listed = idem_in_with(
        elsewhere.path(),
        &["--store", "sqlite:~/idem.sqlite", "ls", "--json"],
        &home_env,
    );
    assert_eq!(json_lines(listed.ok()).len(), 1, "the store in the home: {listed:?}");
    let envs = [home_env[0], ("IDEM_STORE", "sqlite:~/idem.sqlite")];
    assert_eq!(json_lines(idem_in_with(elsewhere.path(), &["ls", "--json"], &envs).ok()).len(), 1);
    let other = idem_in_with(elsewhere.path(), &["--store", "~ann/idem.sled", "ls"], &home_env);
    assert!(other.fails(1).contains("write the full path"), "{other:?}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0, "nothing made here");
}
