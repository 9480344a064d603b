//! One way to name a store: `$IDEM_STORE` read by the first call of a process, and
//! `set_default_store_named`, take `sqlite:PATH`, `postgres://…` and a sled path alike.

#![cfg(unix)]

use std::path::Path;
use std::process::{Command, Stdio};

use idem_runtime::{Call, Error, SqliteStore, Status, Store};

const CHILD: &str = "IDEM_STORE_NAMES_CHILD";

/// Child mode: one call on the default store, as `$IDEM_STORE` names it.
#[test]
fn store_names_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let ran = Call::new("send_invoice", "inv-1", &serde_json::json!({ "amount": 10 }))
        .unwrap()
        .run(|| Ok::<_, Error>("sent".to_owned()));
    match ran {
        Ok(got) => println!("OUTCOME {got}"),
        Err(e) => println!("OUTCOME error {e}"),
    }
}

fn run_child(name: &str) -> String {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "store_names_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("IDEM_STORE", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let outcome = stdout.lines().find_map(|line| line.split_once("OUTCOME ").map(|(_, o)| o));
    outcome.unwrap_or_else(|| panic!("the child printed no outcome: {stdout}")).to_owned()
}

fn key() -> String {
    Call::new("send_invoice", "inv-1", &serde_json::json!({ "amount": 10 }))
        .unwrap()
        .key()
        .to_string()
}

#[test]
fn idem_store_names_a_sqlite_file_for_the_first_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/agents.sqlite");
    let name = format!("sqlite:{}", path.display());
    assert_eq!(run_child(&name), "sent");
    assert_eq!(run_child(&name), "sent", "the second process replays");
    assert!(path.is_file(), "the store is the file the name gives, parents created");
    let store = SqliteStore::open(&path).unwrap();
    let record = idem_runtime::for_stores::block_on(store.get(&key())).unwrap().unwrap();
    assert_eq!((record.status, record.result.as_deref()), (Status::Done, Some("\"sent\"")));
}

#[test]
fn idem_store_names_a_sled_directory_as_a_plain_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agents.sled");
    assert_eq!(run_child(path.to_str().unwrap()), "sent");
    assert!(path.join("conf").exists(), "a sled store");
}

#[test]
fn idem_store_naming_postgres_without_its_opener_says_what_to_do() {
    let outcome = run_child("postgres://agent:s3cret@127.0.0.1:1/agents");
    assert!(outcome.contains("idem's `postgres` feature"), "{outcome}");
    assert!(outcome.contains("open_default_store"), "{outcome}");
    assert!(!outcome.contains("s3cret"), "never the password: {outcome}");
}

#[test]
fn set_default_store_named_opens_the_named_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agents.sqlite");
    let store = idem_runtime::set_default_store_named(&format!("sqlite:{}", path.display()))
        .expect("the named store opens");
    let got = Call::new("send_invoice", "inv-1", &serde_json::json!({ "amount": 10 }))
        .unwrap()
        .run(|| Ok::<_, Error>("sent".to_owned()))
        .unwrap();
    assert_eq!(got, "sent");
    let record = idem_runtime::for_stores::block_on(store.get(&key())).unwrap();
    assert_eq!(record.map(|r| r.status), Some(Status::Done), "the call used the named store");
    let file = dir.path().join("notes");
    std::fs::write(&file, "x").unwrap();
    let Err(e) = idem_runtime::set_default_store_named(file.to_str().unwrap()) else {
        panic!("a plain file opened as a sled store")
    };
    assert!(e.to_string().contains("a sled store is a directory"), "{e}");
    assert!(Path::new(&file).is_file());
}
