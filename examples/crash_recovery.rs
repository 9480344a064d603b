//! A process killed mid-effect, the key it leaves in doubt, and an operator settling it.
//!
//! ```text
//! cargo run --example crash_recovery
//! ```
//!
//! The program plays every part by starting copies of itself (the `IDEM_EXAMPLE_ROLE` variable
//! says which part a copy plays), all sharing one sled store and one "vendor" ledger in a
//! temporary directory:
//!
//! 1. **agent** (a child): calls `charge_card`. Its body writes the charge to the ledger, says
//!    so, and is then killed with SIGKILL before it can return: the effect landed, idem never
//!    heard back.
//! 2. **agent, restarted** (a new child): calls `charge_card` again with the same intent. Opening
//!    the store finds the key still in flight from a dead process and marks it in doubt, so the
//!    call returns `Error::InDoubt` and runs nothing.
//! 3. **operator** (this process): lists the records in doubt, checks the ledger, finds the charge
//!    and settles the key with its result.
//! 4. **agent, again** (a new child): the call replays the settled result without running the
//!    body.
//!
//! The ledger must end with exactly one charge; the program exits with status 1 if anything
//! differs. `tests/examples.rs` runs it.
//!
//! **How the operator step runs.** It calls [`idem::admin::resolve`], the function behind
//! `idem resolve`, and prints the exact `idem` command an operator would type. It does not run
//! the `idem` binary: a fresh clone may not have built it, a nested `cargo run` would wait on the
//! build lock held by the `cargo test` that runs this example, and nothing else may hold the
//! store meanwhile anyway (sled is one process at a time). The command itself is tested end to
//! end in `idem-cli/tests/cli.rs`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use idem::admin::{Filter, Resolution};
use idem::{Key, SledStore, Status};
use serde::{Deserialize, Serialize};

const ROLE: &str = "IDEM_EXAMPLE_ROLE";
const DIR: &str = "IDEM_EXAMPLE_DIR";
/// sled releases its directory lock a moment after the last handle closes: wait that long.
const LOCK_WAIT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
}

#[derive(Debug)]
enum PayError {
    Idem(idem::Error),
    Ledger(std::io::Error),
}

impl From<idem::Error> for PayError {
    fn from(error: idem::Error) -> Self {
        PayError::Idem(error)
    }
}

impl std::fmt::Display for PayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PayError::Idem(error) => write!(f, "{error}"),
            PayError::Ledger(error) => write!(f, "cannot write the ledger: {error}"),
        }
    }
}

fn store_path(dir: &Path) -> PathBuf {
    dir.join("idem.sled")
}

fn ledger_path(dir: &Path) -> PathBuf {
    dir.join("ledger.txt")
}

/// The charges in the vendor's ledger, one line each: `id order amount`.
fn ledger(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(ledger_path(dir))
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

fn shared_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR).expect("the parent sets the directory"))
}

/// The tool. The "vendor" is an append-only ledger file, written and synced before the body
/// reports that the effect landed.
#[idem::idempotent(scope = "order")]
fn charge_card(amount: u64, customer: &str, order: &str) -> Result<Charge, PayError> {
    let dir = shared_dir();
    let id = format!("ch_{}", ledger(&dir).len() + 1);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger_path(&dir))
        .map_err(PayError::Ledger)?;
    writeln!(file, "{id} {order} {amount} {customer}").map_err(PayError::Ledger)?;
    file.sync_all().map_err(PayError::Ledger)?;
    println!("effect landed: {id}");
    std::io::stdout().flush().map_err(PayError::Ledger)?;
    if std::env::var(ROLE).as_deref() == Ok("crash") {
        // The parent kills this process here, after the charge and before idem records it.
        std::thread::sleep(Duration::from_secs(60));
    }
    Ok(Charge { id, amount })
}

/// The intent every part of the story calls with.
fn call() -> Result<Charge, PayError> {
    charge_card(4200, "cus_42", "o-17")
}

/// A child: opens the shared store and plays its role. Exit status 0 when the role went as the
/// story says.
fn child(role: &str) -> Result<(), String> {
    let store = SledStore::builder(store_path(&shared_dir()))
        .lock_wait(LOCK_WAIT)
        .open()
        .map_err(|e| e.to_string())?;
    idem::set_default_store(Arc::new(store));
    match (role, call()) {
        ("crash", _) => Err("should have been killed mid-effect".to_owned()),
        ("retry", Err(PayError::Idem(error @ idem::Error::InDoubt { .. }))) => {
            println!("in doubt: {}", error.key().unwrap_or("?"));
            println!("error: {error}");
            Ok(())
        }
        ("replay", Ok(charge)) => {
            println!("replayed: {} ({} cents)", charge.id, charge.amount);
            Ok(())
        }
        (role, Ok(charge)) => Err(format!("role {role}: unexpected success: {charge:?}")),
        (role, Err(error)) => Err(format!("role {role}: unexpected error: {error}")),
    }
}

/// Starts a copy of this program in `role`; returns it and a channel of its output lines.
fn spawn(role: &str, dir: &Path) -> Result<(std::process::Child, mpsc::Receiver<String>), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut child = Command::new(exe)
        .env(ROLE, role)
        .env(DIR, dir)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the {role} process: {e}"))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let (lines, receiver) = mpsc::channel();
    let role = role.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("    [{role}] {line}");
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    Ok((child, receiver))
}

/// Runs a child to its end; returns its output lines.
fn run_to_end(role: &str, dir: &Path) -> Result<Vec<String>, String> {
    let (mut child, lines) = spawn(role, dir)?;
    let status = child.wait().map_err(|e| format!("the {role} process: {e}"))?;
    let lines: Vec<String> = lines.iter().collect();
    if !status.success() {
        return Err(format!("the {role} process failed ({status})"));
    }
    Ok(lines)
}

fn story(dir: &Path) -> Result<(), String> {
    crash_after_effect(dir)?;
    let key = restart_in_doubt(dir)?;
    let result = settle(dir, &key)?;
    replay_settled(dir, &result)
}

/// Step 1: the agent charges order o-17, and is killed once the charge has landed.
fn crash_after_effect(dir: &Path) -> Result<(), String> {
    println!("1. the agent charges order o-17, and is killed once the charge has landed");
    let (mut agent, lines) = spawn("crash", dir)?;
    let landed = lines
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| "the agent never reported the effect".to_owned())?;
    if !landed.starts_with("effect landed: ") {
        return Err(format!("the agent said {landed:?} before the effect"));
    }
    agent.kill().map_err(|e| format!("cannot kill the agent: {e}"))?;
    let status = agent.wait().map_err(|e| format!("the agent: {e}"))?;
    println!("   killed ({status})");
    Ok(())
}

/// Step 2: the agent restarts and calls again with the same intent, and finds its key in doubt.
fn restart_in_doubt(dir: &Path) -> Result<Key, String> {
    println!("2. the agent restarts and calls again with the same intent");
    let lines = run_to_end("retry", dir)?;
    let key_text = lines
        .iter()
        .find_map(|line| line.strip_prefix("in doubt: "))
        .ok_or("the restarted agent did not find the key in doubt")?;
    let key = Key::parse(key_text).map_err(|e| format!("a bad key {key_text}: {e}"))?;
    let expected = Key::derive(
        "charge_card",
        "o-17",
        &serde_json::json!({"amount": 4200, "customer": "cus_42"}),
    )
    .map_err(|e| e.to_string())?;
    if key != expected {
        return Err(format!("the key in doubt is {key}, the intent's is {expected}"));
    }
    Ok(key)
}

/// Step 3: the operator looks, checks the vendor, and settles the key; returns the result
/// recorded.
fn settle(dir: &Path, key: &Key) -> Result<serde_json::Value, String> {
    println!("3. the operator looks, checks the vendor, and settles the key");
    let path = store_path(dir);
    let store = SledStore::builder(&path)
        .create(false)
        .lock_wait(LOCK_WAIT)
        .open()
        .map_err(|e| e.to_string())?;
    let shown = path.display();
    println!("   $ idem --store {shown} ls --status in-doubt");
    let filter = Filter::new().status(Status::InDoubt);
    let in_doubt = idem::admin::scan(&store, &filter).map_err(|e| e.to_string())?.records;
    for record in &in_doubt {
        println!("     {}  {}  scope {}", record.key, record.tool, record.scope);
    }
    if in_doubt.len() != 1 || in_doubt[0].key != key.as_str() {
        return Err(format!("expected one record in doubt, under {key}"));
    }
    // The ledger is the vendor's truth: the charge is there, so the effect landed.
    let charges = ledger(dir);
    let [line] = charges.as_slice() else {
        return Err(format!("expected one charge in the ledger, found {charges:?}"));
    };
    let id = line.split(' ').next().unwrap_or_default();
    let result = serde_json::json!({"id": id, "amount": 4200});
    println!("   the vendor has {id} for o-17: it landed");
    println!("   $ idem --store {shown} resolve {key} --done '{result}'");
    let settled = idem::admin::resolve(
        &store,
        key,
        Resolution::Done(result.clone()),
        "operator@example",
        None,
        false,
    )
    .map_err(|e| e.to_string())?;
    if settled.map(|record| record.status) != Some(Status::Done) {
        return Err("the record is not done after resolving it".to_owned());
    }
    Ok(result)
}

/// Step 4: the agent calls again, and gets the settled result without running the body.
fn replay_settled(dir: &Path, result: &serde_json::Value) -> Result<(), String> {
    println!("4. the agent calls again, and gets the settled result");
    let lines = run_to_end("replay", dir)?;
    let want = format!("replayed: {} ({} cents)", result["id"].as_str().unwrap_or("?"), 4200);
    if !lines.contains(&want) {
        return Err(format!("the agent did not replay the settled charge: {lines:?}"));
    }
    if lines.iter().any(|line| line.starts_with("effect landed")) {
        return Err("the body ran again".to_owned());
    }
    let charges = ledger(dir);
    if charges.len() != 1 {
        return Err(format!("the customer was charged {} times: {charges:?}", charges.len()));
    }
    Ok(())
}

fn main() -> ExitCode {
    if let Ok(role) = std::env::var(ROLE) {
        return match child(&role) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("crash_recovery ({role}): {message}");
                ExitCode::FAILURE
            }
        };
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("crash_recovery: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    match story(dir.path()) {
        Ok(()) => {
            println!(
                "ok: charged once; the crash left the key in doubt, and the settled result replays"
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("crash_recovery: {message}");
            ExitCode::FAILURE
        }
    }
}
