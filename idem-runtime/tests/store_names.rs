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
    outcome(Command::new(std::env::current_exe().unwrap()).env("IDEM_STORE", name))
}

/// The outcome of the child `command` runs, as `run_child`.
fn outcome(command: &mut Command) -> String {
    let output = command
        .args(["--exact", "store_names_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
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
    let record = idem_runtime::block_on(store.get(&key())).unwrap().unwrap();
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
    let record = idem_runtime::block_on(store.get(&key())).unwrap();
    assert_eq!(record.map(|r| r.status), Some(Status::Done), "the call used the named store");
    let file = dir.path().join("notes");
    std::fs::write(&file, "x").unwrap();
    let Err(e) = idem_runtime::set_default_store_named(file.to_str().unwrap()) else {
        panic!("a plain file opened as a sled store")
    };
    assert!(e.to_string().contains("a sled store is a directory"), "{e}");
    assert!(Path::new(&file).is_file());
}

/// A child whose `$IDEM_STORE` is `name`, run in the directory `cwd` with `$HOME` set to
/// `home` (unset for `None`): this test process's own home is never touched.
fn in_home(name: &str, home: Option<&Path>, cwd: &Path) -> String {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env("IDEM_STORE", name).current_dir(cwd);
    match home {
        Some(home) => command.env("HOME", home),
        None => command.env_remove("HOME"),
    };
    outcome(&mut command)
}

/// `sqlite:~/idem.sqlite`, as an MCP host's configuration writes it (no shell reads it), is
/// the file in the home directory, and a sled name `~/…` the directory there. Before, each
/// made a directory named `~` in the working directory, which `rm -rf ~` would have sent the
/// user to remove with their home.
#[test]
fn a_store_name_beginning_with_a_tilde_is_in_the_home_directory() {
    let (home, cwd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    assert_eq!(in_home("sqlite:~/idem.sqlite", Some(home.path()), cwd.path()), "sent");
    assert_eq!(in_home("~/agent.sled", Some(home.path()), cwd.path()), "sent");
    assert!(home.path().join("idem.sqlite").is_file(), "the SQLite store is in the home");
    assert!(home.path().join("agent.sled/conf").is_file(), "the sled store is in the home");
    let made: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(made.is_empty(), "nothing was made in the working directory: {made:?}");
}

/// A tilde idem cannot read as the home is refused with the name and what to write instead,
/// and nothing is made: `~ann/…` (another user's home) and `~/…` with no `$HOME`.
#[test]
fn a_tilde_that_names_no_home_is_refused() {
    let (home, cwd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let other = in_home("sqlite:~ann/idem.sqlite", Some(home.path()), cwd.path());
    assert!(other.starts_with("error") && other.contains("sqlite:~ann/idem.sqlite"), "{other}");
    assert!(other.contains("write the full path"), "{other}");
    let homeless = in_home("~/idem.sled", None, cwd.path());
    assert!(
        homeless.contains("~/idem.sled") && homeless.contains("$HOME is not set"),
        "{homeless}"
    );
    assert!(homeless.contains("write the full path"), "{homeless}");
    let made: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(made.is_empty(), "nothing was made in the working directory: {made:?}");
}
