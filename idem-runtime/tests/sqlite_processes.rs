//! Several processes on one SQLite store, for real: each child is this test binary run again in
//! child mode, opening the same file. Racing processes run each key's body once; an owner killed
//! with SIGKILL at any point leaves its key in doubt for every other process at once (its lock is
//! gone with it, so no lease is waited out), never run again under `fail`; and a waiter in
//! another process is woken by the owner's result, or by its death.

mod children;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::admin::{self, Filter};
use idem_runtime::{Call, Error, InDoubtPolicy, SqliteStore, Status, Store};

use self::children::{start, Running};

const KEYS: usize = 25;

fn store(dir: &Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(dir.join("idem.sqlite")).expect("the shared store opens"))
}

/// The effect: one line in the ledger (`O_APPEND`, one write), made durable.
fn charge(dir: &Path, what: &str) -> String {
    let id = format!("{what}:{}:{}", std::process::id(), idem_runtime::fencing_token());
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("ledger")).unwrap();
    file.write_all(format!("{id}\n").as_bytes()).unwrap();
    file.sync_all().unwrap();
    id
}

fn ledger(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ledger"))
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Child mode `race`: waits for `go` on stdin, then calls every key of the round, starting at
/// its own offset so that the processes meet on every key, and prints each result.
fn race_child(dir: &Path) {
    let store = store(dir);
    let round = std::env::var("IDEM_ROUND").unwrap();
    let offset: usize = std::env::var("IDEM_OFFSET").unwrap().parse().unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    for i in 0..KEYS {
        let key = (i + offset) % KEYS;
        let scope = format!("round-{round}-order-{key}");
        let got: String = Call::new("charge_card", &scope, &serde_json::json!({ "amount": key }))
            .unwrap()
            .store(Arc::clone(&store))
            .run(|| Ok::<_, Error>(charge(dir, &scope)))
            .unwrap_or_else(|e| panic!("key {scope}: {e}"));
        println!("RESULT {scope} {got}");
    }
}

/// Child mode `call`: one call of `order-7`, with the body `IDEM_BODY` names; prints
/// `WAITING` once it waits for another process's owner, and its outcome.
fn call_child(dir: &Path) {
    let store = store(dir);
    let policy = match std::env::var("IDEM_POLICY").as_deref() {
        Ok("rerun") => InDoubtPolicy::Rerun,
        _ => InDoubtPolicy::Fail,
    };
    let call = Call::new("charge_card", "order-7", &serde_json::json!({ "amount": 4200 }))
        .unwrap()
        .store(store)
        .in_doubt(policy)
        .wait(Duration::from_secs(120));
    let key = call.key().to_string();
    std::thread::spawn(move || {
        while idem_runtime::waiting(&key) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        println!("WAITING");
        std::io::stdout().flush().unwrap();
    });
    let outcome = call.run(|| {
        let id = charge(dir, "order-7");
        match std::env::var("IDEM_BODY").as_deref() {
            Ok("park") => {
                println!("IN_BODY");
                std::io::stdout().flush().unwrap();
                loop {
                    std::thread::park();
                }
            }
            Ok("stdin") => {
                println!("IN_BODY");
                std::io::stdout().flush().unwrap();
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).unwrap();
            }
            _ => {}
        }
        Ok::<_, Error>(id)
    });
    match outcome {
        Ok(id) => println!("OUTCOME ok {id}"),
        Err(Error::InDoubt { .. }) => println!("OUTCOME in_doubt"),
        Err(e) => println!("OUTCOME error {e}"),
    }
}

/// Child mode `peek`: opens the store, reads every record, and closes it, as a short-lived
/// process does (`idem ls`, an MCP server of one session).
fn peek_child(dir: &Path) {
    let store = store(dir);
    let page = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(store.scan_page(None, usize::MAX))
        .unwrap();
    println!("RECORDS {}", page.into_records().count());
}

#[test]
fn sqlite_child() {
    let Some((mode, dir)) = children::role() else { return };
    match mode.as_str() {
        "race" => race_child(&dir),
        "peek" => peek_child(&dir),
        _ => call_child(&dir),
    }
}

fn child(dir: &Path, mode: &str) -> Command {
    children::child("sqlite_child", mode, dir)
}

fn outcome_of(lines: &[String]) -> String {
    lines
        .iter()
        .find_map(|l| l.split_once("OUTCOME ").map(|(_, o)| o.to_owned()))
        .unwrap_or_else(|| panic!("the child printed no outcome: {lines:?}"))
}

/// Runs a `call` child to its end and returns its outcome.
fn call_once(dir: &Path, policy: &str) -> String {
    let mut once = start(child(dir, "call").env("IDEM_POLICY", policy).stdin(Stdio::null()));
    outcome_of(&once.finish().0)
}

#[test]
fn eight_processes_racing_on_many_keys_run_each_body_once() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let mut children: Vec<Running> = (0..8)
            .map(|n| {
                start(
                    child(dir.path(), "race")
                        .env("IDEM_ROUND", round.to_string())
                        .env("IDEM_OFFSET", (n * 3).to_string()),
                )
            })
            .collect();
        for running in &mut children {
            running.until_line("READY");
        }
        // All at once: every process has opened the store before any calls.
        for running in &mut children {
            writeln!(running.process.stdin.as_mut().unwrap(), "go").unwrap();
        }
        let mut results = std::collections::BTreeMap::<String, Vec<String>>::new();
        for mut running in children {
            let (rest, status) = running.finish();
            assert!(status.success(), "a racing process failed");
            for line in rest.iter().filter_map(|l| l.strip_prefix("RESULT ")) {
                let (scope, got) = line.split_once(' ').unwrap();
                results.entry(scope.to_owned()).or_default().push(got.to_owned());
            }
        }
        let charged: Vec<String> = ledger(dir.path())
            .into_iter()
            .filter(|line| line.starts_with(&format!("round-{round}-")))
            .collect();
        assert_eq!(charged.len(), KEYS, "one body per key in round {round}: {charged:?}");
        assert_eq!(results.len(), KEYS);
        for (scope, got) in &results {
            assert_eq!(got.len(), 8, "every process called {scope}");
            let ran: Vec<&String> =
                charged.iter().filter(|l| l.starts_with(&format!("{scope}:"))).collect();
            assert_eq!(ran.len(), 1, "{scope} ran once: {charged:?}");
            assert!(
                got.iter().all(|g| g == ran[0]),
                "every process got the one result of {scope}: {got:?}"
            );
        }
    }
}

/// Kills the owner at `point` (a fail point, or `in_body`) while the store is shared, then
/// checks that every later process finds the key in doubt and never runs it under `fail`.
fn in_doubt_after_kill_at(point: &str, lines_at_crash: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut owner = child(dir.path(), "call");
    match point {
        "in_body" => owner.env("IDEM_BODY", "park"),
        _ => owner.env("IDEM_FAILPOINT", point),
    };
    let mut owner = start(&mut owner);
    let reached = if point == "in_body" {
        "IN_BODY".to_owned()
    } else {
        format!("IDEM_FAILPOINT_REACHED {point}")
    };
    owner.until_line(&reached);
    let owner_pid = owner.process.id();
    owner.process.kill().unwrap(); // SIGKILL
    owner.process.wait().unwrap();
    assert_eq!(ledger(dir.path()).len(), lines_at_crash, "the ledger at the crash");
    // The operator finds it where the model was told to look: `idem ls --status in-doubt`
    // and `idem stats` count the record in flight under a dead owner as in doubt.
    let looking = store(dir.path());
    let in_doubt = admin::list(looking.as_ref(), &Filter::new().status(Status::InDoubt)).unwrap();
    assert_eq!(in_doubt.len(), 1, "listed in doubt after a kill at {point}: {in_doubt:?}");
    let counted = admin::stats(looking.as_ref()).unwrap().by_status;
    assert_eq!(counted.get("in-doubt"), Some(&1), "{counted:?}");
    assert_eq!(counted.get("in-flight"), None, "{counted:?}");
    drop(looking);
    for _ in 0..2 {
        assert_eq!(
            call_once(dir.path(), "fail"),
            "in_doubt",
            "a kill at {point} leaves the key in doubt"
        );
    }
    let owner_lock = || {
        lock_files(dir.path()).into_iter().find(|path| {
            path.file_name().unwrap().to_string_lossy().contains(&format!("_{owner_pid}_"))
        })
    };
    assert!(
        owner_lock().is_some(),
        "the dead owner's free lock file, the evidence its record needs, is kept by every open"
    );
    assert_eq!(ledger(dir.path()).len(), lines_at_crash, "`fail` never runs the body again");
    let rerun = call_once(dir.path(), "rerun");
    assert!(rerun.starts_with("ok order-7:"), "`rerun` runs the body: {rerun}");
    assert_eq!(ledger(dir.path()).len(), lines_at_crash + 1);
    assert_eq!(call_once(dir.path(), "fail"), rerun, "the rerun's result replays");
    assert!(
        owner_lock().is_none(),
        "once no record needs it, an open removes the dead owner's lock file"
    );
}

#[test]
fn an_owner_killed_after_its_reservation_leaves_the_key_in_doubt() {
    in_doubt_after_kill_at("after_reserve", 0);
}

#[test]
fn an_owner_killed_in_its_body_leaves_the_key_in_doubt() {
    in_doubt_after_kill_at("in_body", 1);
}

#[test]
fn an_owner_killed_before_its_result_is_durable_leaves_the_key_in_doubt() {
    in_doubt_after_kill_at("after_body", 1);
}

#[test]
fn an_owner_killed_after_its_result_is_durable_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let mut owner = start(child(dir.path(), "call").env("IDEM_FAILPOINT", "after_complete"));
    owner.until_line("IDEM_FAILPOINT_REACHED after_complete");
    owner.process.kill().unwrap();
    owner.process.wait().unwrap();
    let charged = ledger(dir.path());
    assert_eq!(charged.len(), 1);
    assert_eq!(call_once(dir.path(), "fail"), format!("ok {}", charged[0]));
    assert_eq!(ledger(dir.path()), charged, "the body never ran again");
}

#[test]
fn a_waiter_in_another_process_learns_of_the_owner_s_death_without_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut owner = start(child(dir.path(), "call").env("IDEM_BODY", "park"));
    owner.until_line("IN_BODY");
    let mut waiter = start(&mut child(dir.path(), "call"));
    waiter.until_line("WAITING");
    let killed = Instant::now();
    owner.process.kill().unwrap();
    owner.process.wait().unwrap();
    let lines = waiter.until_line("OUTCOME");
    let woke = killed.elapsed();
    assert_eq!(outcome_of(&lines), "in_doubt", "the waiter finds the key in doubt");
    // Not a speed check: the waiter waits up to 120 s and the store has no lease; only the
    // owner's end can have woken it this early.
    assert!(woke < Duration::from_secs(30), "the waiter woke at the owner's death ({woke:?})");
    assert!(waiter.finish().1.success());
    assert_eq!(ledger(dir.path()).len(), 1, "the body ran once");
}

#[test]
fn a_waiter_in_another_process_gets_the_owner_s_result() {
    let dir = tempfile::tempdir().unwrap();
    let mut owner = start(child(dir.path(), "call").env("IDEM_BODY", "stdin"));
    owner.until_line("IN_BODY");
    let mut waiter = start(&mut child(dir.path(), "call"));
    waiter.until_line("WAITING");
    writeln!(owner.process.stdin.as_mut().unwrap(), "finish").unwrap();
    let owned = outcome_of(&owner.until_line("OUTCOME"));
    let waited = outcome_of(&waiter.until_line("OUTCOME"));
    assert!(owned.starts_with("ok order-7:"), "{owned}");
    assert_eq!(waited, owned, "the waiter gets the owner's result");
    assert!(owner.finish().1.success() && waiter.finish().1.success());
    assert_eq!(ledger(dir.path()).len(), 1, "the body ran once");
}

#[test]
fn an_owner_that_finishes_between_a_read_and_its_probe_is_not_taken_for_gone() {
    // The reader reads the record in flight, then pauses before it asks whether its owner
    // lives; meanwhile the owner records its result, closes the store and exits. Its lock is
    // free by then, yet the key is not in doubt: the reader gets the owner's result.
    let dir = tempfile::tempdir().unwrap();
    let mut owner = start(child(dir.path(), "call").env("IDEM_BODY", "stdin"));
    owner.until_line("IN_BODY");
    let mut reader = start(child(dir.path(), "call").env("IDEM_PAUSE", "sqlite_read_before_probe"));
    reader.until_line("IDEM_PAUSED sqlite_read_before_probe");
    writeln!(owner.process.stdin.as_mut().unwrap(), "finish").unwrap();
    let owned = outcome_of(&owner.until_line("OUTCOME"));
    assert!(owned.starts_with("ok order-7:"), "{owned}");
    assert!(owner.finish().1.success(), "the owner exited, its lock free");
    writeln!(reader.process.stdin.as_mut().unwrap(), "go").unwrap();
    let read = outcome_of(&reader.until_line("OUTCOME"));
    assert_eq!(read, owned, "the reader gets the owner's result, not in doubt");
    assert!(reader.finish().1.success());
    assert_eq!(ledger(dir.path()).len(), 1, "the body ran once");
}

/// The lock files beside the store, as an operator or a tmp cleaner would find them.
fn lock_files(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("idem.sqlite-idem"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "lock"))
        .collect()
}

#[test]
fn a_second_open_in_one_process_keeps_the_store_shared_with_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let first = store(dir.path());
    // A tool with a store of its own, or a store per MCP session: a second open of one file.
    let _second = store(dir.path());
    let mut peek = start(child(dir.path(), "peek").stdin(Stdio::null()));
    assert!(peek.finish().1.success(), "the short-lived process read the store");
    assert!(
        dir.path().join("idem.sqlite-wal").exists() && dir.path().join("idem.sqlite-shm").exists(),
        "a process that closed the store took itself for its last user, while this one holds it \
         open, and removed the live -wal and -shm"
    );
    let ran: String = Call::new("charge_card", "order-7", &serde_json::json!({ "amount": 4200 }))
        .unwrap()
        .store(first)
        .run(|| Ok::<_, Error>(charge(dir.path(), "order-7")))
        .unwrap();
    assert_eq!(
        call_once(dir.path(), "fail"),
        format!("ok {ran}"),
        "another process replays this process's result"
    );
    assert_eq!(ledger(dir.path()), [ran], "the body ran once");
}

#[test]
fn an_owner_whose_lock_file_was_removed_is_waited_for_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut owner = start(child(dir.path(), "call").env("IDEM_BODY", "stdin"));
    owner.until_line("IN_BODY");
    let removed = lock_files(dir.path());
    assert!(!removed.is_empty(), "the owner holds a lock file");
    for path in &removed {
        std::fs::remove_file(path).unwrap(); // a tmp cleaner, or an operator tidying up
    }
    // Under `rerun`, an owner taken for dead would have its body run again at once.
    let mut waiter = start(child(dir.path(), "call").env("IDEM_POLICY", "rerun"));
    waiter.until_line("WAITING");
    writeln!(owner.process.stdin.as_mut().unwrap(), "finish").unwrap();
    let owned = outcome_of(&owner.until_line("OUTCOME"));
    let waited = outcome_of(&waiter.until_line("OUTCOME"));
    assert!(owned.starts_with("ok order-7:"), "{owned}");
    assert_eq!(waited, owned, "the waiter gets the owner's result");
    assert!(owner.finish().1.success() && waiter.finish().1.success());
    assert_eq!(ledger(dir.path()).len(), 1, "the body ran once");
}

#[test]
fn an_owner_whose_lock_file_was_removed_is_in_doubt_once_its_process_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut owner = start(child(dir.path(), "call").env("IDEM_BODY", "park"));
    owner.until_line("IN_BODY");
    for path in lock_files(dir.path()) {
        std::fs::remove_file(path).unwrap();
    }
    let mut waiter = start(&mut child(dir.path(), "call"));
    waiter.until_line("WAITING");
    owner.process.kill().unwrap(); // SIGKILL
    owner.process.wait().unwrap();
    // The waiter has no lock to block on: it learns of the end from the process table.
    assert_eq!(outcome_of(&waiter.until_line("OUTCOME")), "in_doubt");
    assert!(waiter.finish().1.success());
    assert_eq!(call_once(dir.path(), "fail"), "in_doubt", "a later process finds it in doubt");
    assert_eq!(ledger(dir.path()).len(), 1, "the body ran once");
}
