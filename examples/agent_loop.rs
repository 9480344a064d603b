//! The double charge, and how it goes away.
//!
//! ```text
//! cargo run --example agent_loop
//! ```
//!
//! Everything runs in this process, over loopback only: a small payments service that honours an
//! `Idempotency-Key` header the way Stripe does (the same key with the same parameters gets the
//! stored response; with other parameters, an error), and an agent whose "model" is a script (no
//! LLM). The agent asks the `charge_card` tool to charge order `o-17`. The network hiccups twice:
//! the service commits the charge, then its response is lost. The orchestration gives each tool
//! call a deadline and retries once when it passes; the model, reading the timeout, calls the tool
//! again (with a new tool-call id, as models do).
//!
//! The same scenario runs with each protection, and a table says how often the customer was
//! charged:
//!
//! 1. **none**: every attempt is a new charge: three.
//! 2. **`#[idempotent]`, key kept local**: the first attempt's future is dropped at the deadline
//!    after its body started, so idem marks the key in doubt; every later attempt gets
//!    `Error::InDoubt` and runs nothing. One charge, but the agent cannot confirm it: an operator
//!    settles the key (`idem resolve`, see the `crash_recovery` example).
//!
//!    2b. The same, but the tool's HTTP client has a timeout of its own and the tool returns
//!    `Err` on it. An `Err` tells idem that nothing landed, so the key is released and every
//!    retry runs the body again: three charges, as with no protection. idem's own record cannot
//!    know what a vendor did while the response was lost.
//!
//!    2c. As 2b, but the tool sends its request through `idem-reqwest` (`.idempotent()`), which
//!    classifies the timeout as "may have landed" and calls `idem::may_have_landed()` for it: the
//!    key is left in doubt, not released, and nothing runs twice. One charge, in doubt.
//! 3. **`#[idempotent]` with the key sent to the vendor** (`idem-reqwest` puts
//!    `idem::current_key()` in the `Idempotency-Key` header) and `in_doubt = "rerun"`: a rerun
//!    carries the same key, and the vendor answers with the charge it already made. One charge,
//!    and the agent gets it. The key comes from the intent (tool, arguments, order), so the
//!    model's new tool-call id does not change it.
//!
//! The program exits with status 1 if any outcome differs from the above; `tests/examples.rs`
//! runs it. Its stores live in a temporary directory that is removed at the end.

use std::collections::HashMap;
use std::fmt;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem_reqwest::IdempotentRequest;
use serde::{Deserialize, Serialize};

/// How long the orchestration lets one tool call run.
const DEADLINE: Duration = Duration::from_secs(1);
/// How long the service holds a response it is told to lose: well past every deadline.
const HOLD: Duration = Duration::from_secs(5);
/// How many responses the network loses, starting with the first charge request.
const LOST_RESPONSES: u32 = 2;
/// How many times the orchestration tries one tool call.
const ATTEMPTS_PER_CALL: u32 = 2;
/// How many tool calls the model makes before it gives up.
const MODEL_CALLS: u32 = 3;

// ---------------------------------------------------------------------------------------------
// The payments service (the vendor)
// ---------------------------------------------------------------------------------------------

/// What the tool asks the service to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ChargeRequest {
    amount: u64,
    customer: String,
    order: String,
}

/// A charge the service made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
    customer: String,
    order: String,
}

#[derive(Default)]
struct Ledger {
    charges: Vec<Charge>,
    /// Idempotency keys seen, with the request each came with and the charge it made.
    keys: HashMap<String, (ChargeRequest, Charge)>,
    /// Responses still to lose.
    lose: u32,
}

#[derive(Default)]
struct Vendor {
    ledger: Mutex<Ledger>,
}

impl Vendor {
    fn charges(&self) -> Vec<Charge> {
        self.ledger.lock().unwrap().charges.clone()
    }
}

/// `POST /v1/charges`. With an `Idempotency-Key`, a key seen before returns the charge it made
/// (when the parameters match) instead of charging again.
async fn create_charge(
    State(vendor): State<Arc<Vendor>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Ok(request) = serde_json::from_slice::<ChargeRequest>(&body) else {
        return json(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"error": {"type": "invalid_request"}}),
        );
    };
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (response, lost) = {
        let mut ledger = vendor.ledger.lock().unwrap();
        let response = match key.as_deref().and_then(|k| ledger.keys.get(k)) {
            Some((first, charge)) if *first == request => {
                println!("    vendor: key seen before: answers with {} again", charge.id);
                json(StatusCode::OK, charge)
            }
            Some(_) => {
                let error = serde_json::json!({"error": {
                    "type": "idempotency_error",
                    "message": "this key was first used with other parameters",
                }});
                return json(StatusCode::BAD_REQUEST, &error);
            }
            None => {
                let charge = Charge {
                    id: format!("ch_{}", ledger.charges.len() + 1),
                    amount: request.amount,
                    customer: request.customer.clone(),
                    order: request.order.clone(),
                };
                println!(
                    "    vendor: charged {} {} for {}",
                    charge.customer, charge.amount, charge.id
                );
                ledger.charges.push(charge.clone());
                if let Some(key) = key {
                    ledger.keys.insert(key, (request, charge.clone()));
                }
                json(StatusCode::OK, &charge)
            }
        };
        let lost = ledger.lose > 0;
        ledger.lose = ledger.lose.saturating_sub(1);
        (response, lost)
    };
    if lost {
        // The network hiccup: the charge is committed, and the response never arrives in time.
        println!("    network: the response is lost");
        tokio::time::sleep(HOLD).await;
    }
    response
}

/// A JSON response. (axum's `json` feature would do this, but it turns on serde_json's
/// `raw_value` for the whole workspace, which changes the compiler messages the trybuild cases
/// expect.)
fn json(status: StatusCode, body: &impl Serialize) -> Response {
    let body = serde_json::to_vec(body).expect("a charge or an error serializes");
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Starts the service on an ephemeral loopback port, losing the first `lose` responses.
async fn start_vendor(lose: u32) -> std::io::Result<(Arc<Vendor>, String)> {
    let vendor = Arc::new(Vendor::default());
    vendor.ledger.lock().unwrap().lose = lose;
    let app = Router::new().route("/v1/charges", post(create_charge)).with_state(vendor.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((vendor, base))
}

// ---------------------------------------------------------------------------------------------
// The tool
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
enum PayError {
    /// The request was sent and no answer came in time: the charge may or may not have landed.
    Timeout,
    /// The service refused the request, or the connection failed.
    Vendor(String),
    /// A keyed request failed; idem already knows whether it may have landed.
    Http(idem_reqwest::Error),
    /// idem could not run the call (in doubt, store failure…).
    Idem(idem::Error),
}

impl From<idem::Error> for PayError {
    fn from(error: idem::Error) -> Self {
        PayError::Idem(error)
    }
}

impl From<idem_reqwest::Error> for PayError {
    fn from(error: idem_reqwest::Error) -> Self {
        PayError::Http(error)
    }
}

impl PayError {
    /// Whether the tool gave up waiting: the orchestration retries those.
    fn timed_out(&self) -> bool {
        match self {
            PayError::Timeout => true,
            PayError::Http(error) => error.is_timeout(),
            PayError::Vendor(_) | PayError::Idem(_) => false,
        }
    }
}

impl fmt::Display for PayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayError::Timeout => f.write_str("charge_card timed out"),
            PayError::Vendor(message) => write!(f, "the payments service failed: {message}"),
            PayError::Http(error) => write!(f, "{error}"),
            PayError::Idem(error) => write!(f, "{error}"),
        }
    }
}

/// The tool's HTTP client for the payments service.
struct Payments {
    http: reqwest::Client,
    base: String,
}

impl Payments {
    /// `timeout`: the client's own, when it has one (row 2b). Its keyed requests (rows 2c and 3)
    /// do not follow a redirect to another origin, which would take the key along.
    fn new(base: String, timeout: Option<Duration>) -> Payments {
        let mut builder = reqwest::Client::builder().redirect(idem_reqwest::redirect_policy());
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        Payments { http: builder.build().expect("an HTTP client without TLS builds"), base }
    }

    /// Rows 1 to 2b: the request as written by hand, with no key.
    async fn charge(&self, request: &ChargeRequest) -> Result<Charge, PayError> {
        let post = self.http.post(format!("{}/v1/charges", self.base)).json(request);
        let failed = |e: reqwest::Error| {
            if e.is_timeout() {
                PayError::Timeout
            } else {
                PayError::Vendor(e.to_string())
            }
        };
        let response = post.send().await.map_err(failed)?;
        if !response.status().is_success() {
            let status = response.status();
            return Err(PayError::Vendor(format!(
                "{status}: {}",
                response.text().await.unwrap_or_default()
            )));
        }
        response.json().await.map_err(failed)
    }

    /// Rows 2c and 3: the request keyed by `idem-reqwest`, from the body of an idempotent call.
    /// The call's key goes out as `Idempotency-Key`; a timeout or a lost answer leaves the key
    /// in doubt, a refusal releases it.
    async fn charge_keyed(&self, request: &ChargeRequest) -> Result<Charge, PayError> {
        let post = self.http.post(format!("{}/v1/charges", self.base)).json(request);
        Ok(post.idempotent().send_json().await?)
    }
}

/// Row 1: no protection.
async fn charge_card_unprotected(
    payments: &Payments,
    amount: u64,
    customer: &str,
    order: &str,
) -> Result<Charge, PayError> {
    let request = ChargeRequest { amount, customer: customer.into(), order: order.into() };
    payments.charge(&request).await
}

/// Rows 2 and 2b: keyed by idem, the key kept in the local store. The client is not part of the
/// intent, so it is skipped; the order is the unit of work.
#[idem::idempotent(scope = "order", tool = "charge_card")]
async fn charge_card_local_key(
    #[idem(skip)] payments: &Payments,
    amount: u64,
    customer: &str,
    order: &str,
) -> Result<Charge, PayError> {
    let request = ChargeRequest { amount, customer: customer.into(), order: order.into() };
    payments.charge(&request).await
}

/// Row 2c: as 2b, but through `idem-reqwest`, which reports the timeout as what it is: the
/// charge may have landed, so the key is kept in doubt, not released.
#[idem::idempotent(scope = "order", tool = "charge_card")]
async fn charge_card_says_in_doubt(
    #[idem(skip)] payments: &Payments,
    amount: u64,
    customer: &str,
    order: &str,
) -> Result<Charge, PayError> {
    let request = ChargeRequest { amount, customer: customer.into(), order: order.into() };
    payments.charge_keyed(&request).await
}

/// Row 3: the same key, also sent to the vendor, which deduplicates it; so a call found in doubt
/// may safely run again.
#[idem::idempotent(scope = "order", tool = "charge_card", in_doubt = "rerun")]
async fn charge_card(
    #[idem(skip)] payments: &Payments,
    amount: u64,
    customer: &str,
    order: &str,
) -> Result<Charge, PayError> {
    let request = ChargeRequest { amount, customer: customer.into(), order: order.into() };
    payments.charge_keyed(&request).await
}

// ---------------------------------------------------------------------------------------------
// The agent: a scripted model and an orchestration loop
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Protection {
    None,
    LocalKey,
    LocalKeyToolTimeout,
    LocalKeyToolTimeoutInDoubt,
    VendorKey,
}

impl Protection {
    fn label(self) -> &'static str {
        match self {
            Protection::None => "1  none",
            Protection::LocalKey => "2  #[idempotent], key kept local",
            Protection::LocalKeyToolTimeout => "2b as 2, but the tool's own timeout returns Err",
            Protection::LocalKeyToolTimeoutInDoubt => "2c as 2b, sent through idem-reqwest",
            Protection::VendorKey => "3  #[idempotent], idem-reqwest sends the key",
        }
    }
}

/// What the model sees and says.
enum Message {
    User(String),
    ToolCall { id: String, amount: u64, customer: String, order: String },
    ToolResult { ok: bool, text: String },
    Answer(String),
}

/// A stand-in for the LLM: charges the order, calls again when the tool failed, gives up after
/// a few calls.
fn model(transcript: &[Message]) -> Message {
    let calls = transcript.iter().filter(|m| matches!(m, Message::ToolCall { .. })).count() as u32;
    match transcript.last() {
        Some(Message::ToolResult { ok: true, text }) => Message::Answer(format!("charged: {text}")),
        Some(Message::ToolResult { ok: false, text }) if calls >= MODEL_CALLS => {
            Message::Answer(format!("could not confirm the charge: {text}"))
        }
        // The first turn, or a failed call: (re)try the charge, with a new tool-call id.
        _ => Message::ToolCall {
            id: format!("call_{}", calls + 1),
            amount: 4200,
            customer: "cus_42".into(),
            order: "o-17".into(),
        },
    }
}

/// Runs one tool call the way the protection says, with no retry.
async fn call_tool(
    protection: Protection,
    payments: &Payments,
    amount: u64,
    customer: &str,
    order: &str,
) -> Result<Charge, PayError> {
    match protection {
        Protection::None => charge_card_unprotected(payments, amount, customer, order).await,
        Protection::LocalKey | Protection::LocalKeyToolTimeout => {
            charge_card_local_key(payments, amount, customer, order).await
        }
        Protection::LocalKeyToolTimeoutInDoubt => {
            charge_card_says_in_doubt(payments, amount, customer, order).await
        }
        Protection::VendorKey => charge_card(payments, amount, customer, order).await,
    }
}

struct Outcome {
    attempts: u32,
    charges: Vec<Charge>,
    answer: String,
}

/// The agent loop: ask the model, run the tool calls it makes (retrying once on a timeout), feed
/// the results back, until it answers.
async fn run_agent(protection: Protection) -> Result<Outcome, Box<dyn std::error::Error>> {
    let (vendor, base) = start_vendor(LOST_RESPONSES).await?;
    // Row 2b's client gives up a little before the orchestration would.
    let own_timeout = matches!(
        protection,
        Protection::LocalKeyToolTimeout | Protection::LocalKeyToolTimeoutInDoubt
    )
    .then_some(DEADLINE * 4 / 5);
    let payments = Payments::new(base, own_timeout);
    let request = Message::User("Charge order o-17: $42.00 to cus_42.".into());
    if let Message::User(text) = &request {
        println!("  user: {text}");
    }
    let mut transcript = vec![request];
    let mut attempts = 0;
    let answer = loop {
        match model(&transcript) {
            Message::Answer(text) => break text,
            Message::ToolCall { id, amount, customer, order } => {
                println!("  model: charge_card(amount={amount}, customer={customer}, order={order}) [{id}]");
                let mut result = Err(PayError::Timeout);
                for _ in 0..ATTEMPTS_PER_CALL {
                    attempts += 1;
                    let call = call_tool(protection, &payments, amount, &customer, &order);
                    // Past the deadline the call's future is dropped, as agent frameworks and
                    // MCP clients do when they cancel a slow tool.
                    result = tokio::time::timeout(DEADLINE, call)
                        .await
                        .unwrap_or(Err(PayError::Timeout));
                    match &result {
                        Ok(charge) => println!("  attempt {attempts}: {}", charge.id),
                        Err(error) => println!("  attempt {attempts}: {}", short(error)),
                    }
                    if !result.as_ref().is_err_and(PayError::timed_out) {
                        break;
                    }
                }
                transcript.push(Message::ToolCall { id, amount, customer, order });
                transcript.push(match result {
                    Ok(charge) => Message::ToolResult { ok: true, text: charge.id },
                    Err(PayError::Idem(idem::Error::InDoubt { .. })) => {
                        Message::ToolResult { ok: false, text: "it is in doubt".into() }
                    }
                    Err(error) => Message::ToolResult { ok: false, text: error.to_string() },
                });
            }
            Message::User(_) | Message::ToolResult { .. } => {
                unreachable!("the model only calls or answers")
            }
        }
    };
    println!("  model: {answer}");
    Ok(Outcome { attempts, charges: vendor.charges(), answer })
}

/// An error in a few words, for the transcript and the table.
fn short(error: &PayError) -> String {
    match error {
        PayError::Idem(idem::Error::InDoubt { key, .. }) => format!("key {key} is in doubt"),
        PayError::Http(error) if error.is_timeout() => {
            "timed out; idem-reqwest left the key in doubt".to_owned()
        }
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The three ways, and the table
// ---------------------------------------------------------------------------------------------

/// What each row must show: how many charges, and what the agent's answer says.
fn expected(protection: Protection) -> (usize, &'static str) {
    match protection {
        Protection::None | Protection::LocalKeyToolTimeout => (3, "charged: ch_3"),
        Protection::LocalKey | Protection::LocalKeyToolTimeoutInDoubt => {
            (1, "could not confirm the charge: it is in doubt")
        }
        Protection::VendorKey => (1, "charged: ch_1"),
    }
}

async fn demo(dir: &std::path::Path) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for (i, protection) in [
        Protection::None,
        Protection::LocalKey,
        Protection::LocalKeyToolTimeout,
        Protection::LocalKeyToolTimeoutInDoubt,
        Protection::VendorKey,
    ]
    .into_iter()
    .enumerate()
    {
        println!("\n{}", protection.label());
        // A fresh store for each row, so that no row replays another's record. `Flush` keeps the
        // demonstration fast; a real deployment keeps the default, `Fsync`.
        let store = idem::SledStore::builder(dir.join(format!("row-{i}.sled")))
            .durability(idem::Durability::Flush)
            .open()?;
        idem::set_default_store(Arc::new(store));
        let outcome = run_agent(protection).await?;
        let (charges, answer) = expected(protection);
        if outcome.charges.len() != charges || !outcome.answer.starts_with(answer) {
            failures.push(format!(
                "{}: expected {charges} charge(s) and an answer starting {answer:?}, got {} and {:?}",
                protection.label(),
                outcome.charges.len(),
                outcome.answer
            ));
        }
        rows.push((protection, outcome));
    }

    println!("\n{:<52} {:>8} {:>8}  the agent's answer", "protection", "attempts", "charges");
    for (protection, outcome) in &rows {
        println!(
            "{:<52} {:>8} {:>8}  {}",
            protection.label(),
            outcome.attempts,
            outcome.charges.len(),
            outcome.answer
        );
    }
    println!(
        "\nWhy 2b charges three times: the tool turned its timeout into Err, and an Err tells idem \
         that nothing landed,\nso the key is released and each retry runs the body again. Only the \
         vendor knows whether a lost response\ncharged the card: sending it idem's key (row 3) is \
         what closes that gap, and row 2c keeps the key in doubt: idem-reqwest calls\n\
         idem::may_have_landed() on the timeout. Row 2 charged once because the deadline dropped the call \
         mid-body,\nwhich idem records as in doubt; an operator settles it with `idem resolve`."
    );
    Ok(failures)
}

fn main() -> ExitCode {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("agent_loop: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let outcome = runtime.block_on(demo(dir.path()));
    // Stop the service (and the responses it still holds) before the store directory goes.
    runtime.shutdown_background();
    match outcome {
        Ok(failures) if failures.is_empty() => {
            println!("\nok: every row is as expected");
            ExitCode::SUCCESS
        }
        Ok(failures) => {
            for failure in failures {
                eprintln!("agent_loop: unexpected: {failure}");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("agent_loop: {e}");
            ExitCode::FAILURE
        }
    }
}
