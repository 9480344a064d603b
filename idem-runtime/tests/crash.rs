//! Crash behaviour with real processes: a child (this test binary re-run in child mode) runs a
//! charge against a sled store, is stopped at an exact point by a fail point, and is killed with
//! SIGKILL. A new process on the same store must then replay, or report the key in doubt, and
//! under `fail` never write the ledger twice.

mod children;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use idem_runtime::{Call, Error, InDoubtPolicy, SledStore, Store};

use self::children::start;

const CHILD: &str = "IDEM_CRASH_CHILD";

/// The effect: one line per charge in a ledger file, made durable before the body returns. The
/// charge names the call's fencing token, as a system of record would keep it.
fn charge(ledger: &Path) -> Result<String, Error> {
    let charge_id = format!("ch_{}_{}", std::process::id(), idem_runtime::fencing_token());
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(ledger).unwrap();
    writeln!(file, "{charge_id}").unwrap();
    file.sync_all().unwrap();
    if std::env::var("IDEM_FAILPOINT").as_deref() == Ok("in_body") {
        println!("IDEM_FAILPOINT_REACHED in_body");
        std::io::stdout().flush().unwrap();
        loop {
            std::thread::park();
        }
    }
    Ok(charge_id)
}

/// Child mode: one call, its outcome on stdout.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let dir = PathBuf::from(dir);
    let policy = match std::env::var("IDEM_POLICY").as_deref() {
        Ok("rerun") => InDoubtPolicy::Rerun,
        _ => InDoubtPolicy::Fail,
    };
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.join("store")).unwrap());
    let ledger = dir.join("ledger");
    let outcome = Call::new("charge_card", "order-7", &serde_json::json!({ "amount": 4200 }))
        .unwrap()
        .store(store)
        .in_doubt(policy)
        .run(|| charge(&ledger));
    match outcome {
        Ok(id) => println!("OUTCOME ok {id}"),
        Err(Error::InDoubt { .. }) => println!("OUTCOME in_doubt"),
        Err(e) => println!("OUTCOME error {e}"),
    }
}

fn child(dir: &Path, failpoint: Option<&str>, policy: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, dir)
        .env("IDEM_POLICY", policy)
        .env_remove("IDEM_FAILPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(point) = failpoint {
        command.env("IDEM_FAILPOINT", point);
    }
    command
}

/// Runs a child to `point`, then SIGKILLs it.
fn kill_at(dir: &Path, point: &str) {
    let mut process = start(&mut child(dir, Some(point), "fail"));
    process.until_line(&format!("IDEM_FAILPOINT_REACHED {point}"));
    process.kill(); // SIGKILL on Unix
}

/// Runs a child to completion and returns its outcome line.
fn outcome(dir: &Path, policy: &str) -> String {
    let (stdout, _) = start(&mut child(dir, None, policy)).finish();
    stdout
        .iter()
        .find_map(|l| l.split_once("OUTCOME ").map(|(_, o)| o.to_owned()))
        .unwrap_or_else(|| panic!("the child printed no outcome: {stdout:?}"))
}

fn ledger(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ledger"))
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The fencing token a ledger line was charged under.
fn token(line: &str) -> u64 {
    line.rsplit('_').next().and_then(|t| t.parse().ok()).expect("a charge names its token")
}

/// (a)–(c): after the crash the key is in doubt; `fail` runs nothing, however often it is
/// called; `rerun` runs the body again once, as an owner with a greater fencing token than the
/// killed one's, although the store was reopened.
fn in_doubt_after_crash_at(point: &str, lines_at_crash: usize) {
    let dir = tempfile::tempdir().unwrap();
    kill_at(dir.path(), point);
    assert_eq!(ledger(dir.path()).len(), lines_at_crash, "the ledger at the crash");
    for _ in 0..2 {
        assert_eq!(
            outcome(dir.path(), "fail"),
            "in_doubt",
            "a crash at {point} leaves the key in doubt"
        );
    }
    assert_eq!(ledger(dir.path()).len(), lines_at_crash, "`fail` never writes the ledger again");
    let rerun = outcome(dir.path(), "rerun");
    assert!(rerun.starts_with("ok ch_"), "`rerun` runs the body: {rerun}");
    let charged = ledger(dir.path());
    assert_eq!(charged.len(), lines_at_crash + 1);
    if let [killed, rerun] = &charged[..] {
        assert!(token(killed) < token(rerun), "the rerun's token is greater: {charged:?}");
    }
    let after = outcome(dir.path(), "fail");
    assert_eq!(after, rerun, "the rerun's result is replayed afterwards");
    assert_eq!(ledger(dir.path()).len(), lines_at_crash + 1);
}

#[test]
fn crash_after_reservation_before_body_is_in_doubt() {
    in_doubt_after_crash_at("after_reserve", 0);
}

#[test]
fn crash_inside_body_after_effect_is_in_doubt() {
    in_doubt_after_crash_at("in_body", 1);
}

#[test]
fn crash_after_body_before_result_is_durable_is_in_doubt() {
    in_doubt_after_crash_at("after_body", 1);
}

#[test]
fn replays_result_after_crash_after_completion() {
    let dir = tempfile::tempdir().unwrap();
    kill_at(dir.path(), "after_complete");
    let charged = ledger(dir.path());
    assert_eq!(charged.len(), 1);
    for _ in 0..2 {
        assert_eq!(
            outcome(dir.path(), "fail"),
            format!("ok {}", charged[0]),
            "the first result is replayed"
        );
    }
    assert_eq!(ledger(dir.path()), charged, "the body never ran again");
}
