//! Processes killed mid-effect, and the keys they leave in doubt settled by a reconciler that asks
//! the vendor: no operator.
//!
//! ```text
//! cargo run --example crash_reconcile
//! ```
//!
//! This process runs a small payments service on loopback that keeps every charge under the
//! `Idempotency-Key` it came with and looks a charge up by that key
//! (`GET /v1/charges/by-key/{key}`), and plays the agent by starting copies of itself (the
//! `IDEM_EXAMPLE_ROLE` variable says which part a copy plays), all sharing one sled store in a
//! temporary directory. The tool, `charge_card`, sends the vendor its key through `idem-reqwest`
//! (`.idempotent()` puts `idem::current_key()` in the `Idempotency-Key` header) and names
//! `find_charge`, written with `idem_reqwest::lookup`, as its reconciler.
//!
//! 1. **agent** (a child) charges order o-17 and is killed with SIGKILL once the vendor has
//!    answered, before idem records the result: the charge landed, idem never heard back.
//! 2. **agent** (a child) starts to charge order o-18 and is killed before its request is sent.
//! 3. **agent, restarted**: its first call charges o-17 again. Opening the store found the key
//!    left in flight by a dead process, so it is in doubt; the call asks `find_charge`, the
//!    vendor has the charge under the key, and the call records and returns it: no new charge.
//! 4. **agent, restarted**, sweeps at start-up: every key of `charge_card` in doubt is asked
//!    about. o-18's never reached the vendor, so it is released; the call for o-18 then charges.
//!
//! The vendor must end with exactly one charge per order; the program exits with status 1 if
//! anything differs. `tests/examples.rs` runs it.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{mpsc, Arc, LazyLock, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idem::{Key, Reconciled, SledStore};
use idem_reqwest::IdempotentRequest;
use serde::{Deserialize, Serialize};

const ROLE: &str = "IDEM_EXAMPLE_ROLE";
const DIR: &str = "IDEM_EXAMPLE_DIR";
const VENDOR: &str = "IDEM_EXAMPLE_VENDOR";
/// sled releases its directory lock a moment after the last handle closes: wait that long.
const LOCK_WAIT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// The payments service (the vendor), in the parent process: it outlives every agent.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ChargeRequest {
    amount: u64,
    customer: String,
    order: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
    order: String,
}

#[derive(Default)]
struct Ledger {
    charges: Vec<Charge>,
    by_key: HashMap<String, Charge>,
}

type Vendor = Arc<Mutex<Ledger>>;

/// `POST /v1/charges`: a key seen before answers with the charge it made.
async fn create_charge(
    State(vendor): State<Vendor>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Ok(request) = serde_json::from_slice::<ChargeRequest>(&body) else {
        return json(StatusCode::BAD_REQUEST, &serde_json::json!({"error": "invalid_request"}));
    };
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return json(StatusCode::BAD_REQUEST, &serde_json::json!({"error": "no idempotency key"}));
    };
    let mut ledger = vendor.lock().unwrap();
    if let Some(charge) = ledger.by_key.get(key) {
        return json(StatusCode::OK, charge);
    }
    let charge = Charge {
        id: format!("ch_{}", ledger.charges.len() + 1),
        amount: request.amount,
        order: request.order,
    };
    println!("    vendor: charged {} for {} under key {key}", charge.id, charge.order);
    ledger.charges.push(charge.clone());
    ledger.by_key.insert(key.to_owned(), charge.clone());
    json(StatusCode::OK, &charge)
}

/// `GET /v1/charges/by-key/{key}`: the charge made under `key`, or 404.
async fn find_by_key(State(vendor): State<Vendor>, Path(key): Path<String>) -> Response {
    match vendor.lock().unwrap().by_key.get(&key) {
        Some(charge) => json(StatusCode::OK, charge),
        None => json(StatusCode::NOT_FOUND, &serde_json::json!({"error": "no such charge"})),
    }
}

/// A JSON response (axum's `json` feature would turn on serde_json's `raw_value` for the whole
/// workspace, which changes the compiler messages the trybuild cases expect).
fn json(status: StatusCode, body: &impl Serialize) -> Response {
    let body = serde_json::to_vec(body).expect("a charge or an error serializes");
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn start_vendor() -> std::io::Result<(Vendor, String)> {
    let vendor = Vendor::default();
    let app = Router::new()
        .route("/v1/charges", post(create_charge))
        .route("/v1/charges/by-key/{key}", get(find_by_key))
        .with_state(vendor.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((vendor, base))
}

// ---------------------------------------------------------------------------------------------
// The agent's tool and its reconciler, in the children.
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
enum PayError {
    /// The vendor's answer, or its absence, classified by idem-reqwest.
    Http(idem_reqwest::Error),
    Idem(idem::Error),
}

impl From<idem_reqwest::Error> for PayError {
    fn from(error: idem_reqwest::Error) -> Self {
        PayError::Http(error)
    }
}

impl From<idem::Error> for PayError {
    fn from(error: idem::Error) -> Self {
        PayError::Idem(error)
    }
}

impl fmt::Display for PayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayError::Http(error) => write!(f, "{error}"),
            PayError::Idem(error) => write!(f, "{error}"),
        }
    }
}

/// The client of the charges and of the lookups: a keyed request or a lookup does not follow a
/// redirect to another origin, which would take the key along.
static HTTP: LazyLock<reqwest::Client> = LazyLock::new(|| {
    let client = reqwest::Client::builder().redirect(idem_reqwest::redirect_policy());
    client.build().expect("an HTTP client without TLS builds")
});

fn vendor_url() -> String {
    std::env::var(VENDOR).expect("the parent names the vendor")
}

fn say(line: impl fmt::Display) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// The tool: charges under the call's key, so that the vendor can be asked about it later.
#[idem::idempotent(scope = "order", reconcile = "find_charge")]
async fn charge_card(amount: u64, customer: &str, order: &str) -> Result<Charge, PayError> {
    if std::env::var(ROLE).as_deref() == Ok("crash-early") {
        say("about to charge");
        // The parent kills this process here, before the request is sent.
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    let request = ChargeRequest { amount, customer: customer.into(), order: order.into() };
    let charge: Charge = HTTP
        .post(format!("{}/v1/charges", vendor_url()))
        .json(&request)
        .idempotent()
        .send_json()
        .await?;
    say(format_args!("effect landed: {}", charge.id));
    if std::env::var(ROLE).as_deref() == Ok("crash") {
        // The parent kills this process here, after the charge and before idem records it.
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    Ok(charge)
}

/// The reconciler: asks the vendor for the charge made under the key. An error (the vendor
/// cannot be reached, or answers neither the charge nor 404) leaves the key in doubt, saying why.
async fn find_charge(key: &Key) -> Result<Reconciled<Charge>, PayError> {
    let url = format!("{}/v1/charges/by-key/{key}", vendor_url());
    let found: Reconciled<Charge> = idem_reqwest::lookup(HTTP.get(url)).await?;
    match &found {
        Reconciled::Landed(charge) => {
            say(format_args!("reconciler: the vendor has {} under key {key}", charge.id));
        }
        Reconciled::NotLanded => {
            say(format_args!("reconciler: the vendor has no charge under key {key}"));
        }
        _ => {}
    }
    Ok(found)
}

/// A child: opens the shared store and plays its role.
async fn child(role: &str) -> Result<(), String> {
    let dir = PathBuf::from(std::env::var_os(DIR).expect("the parent sets the directory"));
    let store = SledStore::builder(dir.join("idem.sled"))
        .lock_wait(LOCK_WAIT)
        .open()
        .map_err(|e| e.to_string())?;
    idem::set_default_store(Arc::new(store));
    match role {
        "crash" => {
            let _ = charge_card(4200, "cus_42", "o-17").await;
            Err("should have been killed mid-effect".to_owned())
        }
        "crash-early" => {
            let _ = charge_card(1500, "cus_42", "o-18").await;
            Err("should have been killed before the charge".to_owned())
        }
        "restart" => {
            let charge = charge_card(4200, "cus_42", "o-17").await.map_err(|e| e.to_string())?;
            say(format_args!("o-17: {} ({} cents)", charge.id, charge.amount));
            Ok(())
        }
        "sweep" => {
            let report = idem::Sweep::new()
                .tool_async("charge_card", |key| async move { find_charge(&key).await })
                .run_async()
                .await
                .map_err(|e| e.to_string())?;
            for swept in &report.keys {
                say(format_args!(
                    "swept {} (scope {}): {:?}",
                    swept.key, swept.scope, swept.outcome
                ));
            }
            say(format_args!(
                "sweep: {} settled, {} still in doubt",
                report.settled().count(),
                report.still_in_doubt().count()
            ));
            let charge = charge_card(1500, "cus_42", "o-18").await.map_err(|e| e.to_string())?;
            say(format_args!("o-18: {} ({} cents)", charge.id, charge.amount));
            Ok(())
        }
        other => Err(format!("unknown role {other}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The story, in the parent.
// ---------------------------------------------------------------------------------------------

fn spawn(
    role: &str,
    dir: &FsPath,
    vendor: &str,
) -> Result<(std::process::Child, mpsc::Receiver<String>), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut child = Command::new(exe)
        .env(ROLE, role)
        .env(DIR, dir)
        .env(VENDOR, vendor)
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

/// Starts a child and kills it with SIGKILL once it says `cue`.
fn kill_at(role: &str, cue: &str, dir: &FsPath, vendor: &str) -> Result<(), String> {
    let (mut agent, lines) = spawn(role, dir, vendor)?;
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| format!("the {role} agent never said {cue:?}"))?;
        if line.starts_with(cue) {
            break;
        }
    }
    agent.kill().map_err(|e| format!("cannot kill the agent: {e}"))?;
    let status = agent.wait().map_err(|e| format!("the agent: {e}"))?;
    println!("   killed ({status})");
    Ok(())
}

/// Runs a child to its end; returns its output lines.
fn run_to_end(role: &str, dir: &FsPath, vendor: &str) -> Result<Vec<String>, String> {
    let (mut child, lines) = spawn(role, dir, vendor)?;
    let status = child.wait().map_err(|e| format!("the {role} process: {e}"))?;
    let lines: Vec<String> = lines.iter().collect();
    if !status.success() {
        return Err(format!("the {role} process failed ({status})"));
    }
    Ok(lines)
}

fn story(dir: &FsPath, vendor: &Vendor, base: &str) -> Result<(), String> {
    println!("1. the agent charges order o-17, and is killed once the vendor has answered");
    kill_at("crash", "effect landed: ", dir, base)?;
    println!("2. the agent starts to charge order o-18, and is killed before the request is sent");
    kill_at("crash-early", "about to charge", dir, base)?;

    println!("3. the agent restarts; its first call charges o-17 again");
    let lines = run_to_end("restart", dir, base)?;
    if lines.iter().any(|line| line.starts_with("effect landed")) {
        return Err("the body ran again for o-17".to_owned());
    }
    if !lines.iter().any(|line| line.starts_with("reconciler: the vendor has ch_1")) {
        return Err(format!("the call did not reconcile o-17: {lines:?}"));
    }
    if !lines.contains(&"o-17: ch_1 (4200 cents)".to_owned()) {
        return Err(format!("the call did not return the vendor's charge: {lines:?}"));
    }

    println!("4. the agent restarts and sweeps its keys in doubt at start-up, then charges o-18");
    let lines = run_to_end("sweep", dir, base)?;
    if !lines.contains(&"sweep: 1 settled, 0 still in doubt".to_owned()) {
        return Err(format!("the sweep did not settle o-18's key: {lines:?}"));
    }
    if !lines.contains(&"o-18: ch_2 (1500 cents)".to_owned()) {
        return Err(format!("o-18 was not charged after the sweep released it: {lines:?}"));
    }

    let charges = vendor.lock().unwrap().charges.clone();
    let orders: Vec<&str> = charges.iter().map(|c| c.order.as_str()).collect();
    if orders != ["o-17", "o-18"] {
        return Err(format!("expected one charge per order, the vendor has {charges:?}"));
    }
    Ok(())
}

fn main() -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime starts");
    if let Ok(role) = std::env::var(ROLE) {
        return match runtime.block_on(child(&role)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("crash_reconcile ({role}): {message}");
                ExitCode::FAILURE
            }
        };
    }
    let (vendor, base) = match runtime.block_on(start_vendor()) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("crash_reconcile: cannot start the payments service: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("crash_reconcile: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    match story(dir.path(), &vendor, &base) {
        Ok(()) => {
            println!("ok: one charge per order; the reconciler settled both keys, no operator");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("crash_reconcile: {message}");
            ExitCode::FAILURE
        }
    }
}
