//! A payments vendor on loopback (axum) that deduplicates by idempotency key as the IETF draft
//! says (the same key and payload: the first answer; another payload: 422; the first still
//! running: 409), with scripted faults; and the tool the tests call through idem.

#![allow(dead_code)] // Each test file uses its own part.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use idem::{Call, InDoubtPolicy, Key, Status, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

/// What the tool sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChargeRequest {
    pub amount: u64,
    pub order: String,
    /// Where a vendor such as Square reads the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// A charge the vendor made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
    pub amount: u64,
    pub order: String,
}

/// What the vendor does to one request, in the order requests arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Refuses the request as invalid (400), before acting.
    Refuse,
    /// Answers 503 before acting (a vendor in maintenance that says so).
    Unavailable,
    /// Answers 429 before even looking at the key (a rate limit at the door).
    RateLimit,
    /// Holds the request, read in full, before committing, until [`Vendor::release`].
    HoldBeforeCommit,
    /// Commits, then answers 500.
    FailAfterCommit,
    /// Commits, then never answers: the response is lost.
    LoseAfterCommit,
}

/// A request the vendor received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The key, from wherever this vendor reads it.
    pub key: Option<String>,
    /// The `Idempotency-Key` header, whatever this vendor reads.
    pub idempotency_key_header: Option<String>,
}

enum Entry {
    Running(ChargeRequest),
    Done(ChargeRequest, Charge),
}

#[derive(Default)]
struct Ledger {
    charges: Vec<Charge>,
    keys: HashMap<String, Entry>,
    seen: Vec<Seen>,
    faults: VecDeque<Fault>,
}

/// Where the vendor reads the key.
#[derive(Clone, Copy)]
pub enum KeyAt {
    Header(&'static str),
    Body,
}

pub struct Vendor {
    ledger: Mutex<Ledger>,
    key_at: KeyAt,
    release: Notify,
    commits: watch::Sender<usize>,
    holding: watch::Sender<usize>,
    pub url: String,
}

impl Vendor {
    /// Starts a vendor reading the key at `key_at`, that applies `faults` to its first requests.
    pub async fn start(key_at: KeyAt, faults: &[Fault]) -> Arc<Vendor> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("loopback");
        let vendor = Arc::new(Vendor {
            ledger: Mutex::new(Ledger {
                faults: faults.iter().copied().collect(),
                ..Ledger::default()
            }),
            key_at,
            release: Notify::new(),
            commits: watch::channel(0).0,
            holding: watch::channel(0).0,
            url: format!("http://{}", listener.local_addr().expect("bound")),
        });
        let app = Router::new()
            .route("/v1/charges", post(create_charge))
            .route("/v1/charges/by-key/{key}", get(find_by_key))
            .with_state(vendor.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        vendor
    }

    /// A vendor reading `Idempotency-Key`.
    pub async fn stripe_like(faults: &[Fault]) -> Arc<Vendor> {
        Vendor::start(KeyAt::Header("idempotency-key"), faults).await
    }

    pub fn charges_url(&self) -> String {
        format!("{}/v1/charges", self.url)
    }

    pub fn charges(&self) -> Vec<Charge> {
        self.ledger.lock().unwrap().charges.clone()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.ledger.lock().unwrap().seen.clone()
    }

    /// Waits until the vendor has committed `n` charges.
    pub async fn committed(&self, n: usize) {
        let mut commits = self.commits.subscribe();
        let wait = commits.wait_for(|&count| count >= n);
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("the vendor commits within 30 s")
            .expect("the vendor is running");
    }

    /// Waits until a request is held before its commit.
    pub async fn holding(&self) {
        let mut holding = self.holding.subscribe();
        let wait = holding.wait_for(|&count| count >= 1);
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("a request is held within 30 s")
            .expect("the vendor is running");
    }

    /// Lets a held request commit.
    pub fn release(&self) {
        self.release.notify_waiters();
    }

    fn key_of(&self, headers: &HeaderMap, request: &ChargeRequest) -> Option<String> {
        match self.key_at {
            KeyAt::Header(name) => header(headers, name),
            KeyAt::Body => request.idempotency_key.clone(),
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
}

/// `POST /v1/charges`. The work runs in its own task, so that a client that gives up does not
/// stop a charge the vendor has started (as on a real server).
async fn create_charge(
    State(vendor): State<Arc<Vendor>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let work = tokio::spawn(charge(vendor, headers, body));
    match work.await {
        Ok(Some(response)) => response,
        // A lost response: the client hears nothing until it gives up.
        Ok(None) => std::future::pending().await,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn charge(
    vendor: Arc<Vendor>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Option<Response> {
    let Ok(request) = serde_json::from_slice::<ChargeRequest>(&body) else {
        return Some(json(StatusCode::BAD_REQUEST, &serde_json::json!({"error": "not a charge"})));
    };
    let key = vendor.key_of(&headers, &request);
    let payload = ChargeRequest { idempotency_key: None, ..request };
    let fault = {
        let mut ledger = vendor.ledger.lock().unwrap();
        let idempotency_key_header = header(&headers, "idempotency-key");
        ledger.seen.push(Seen { key: key.clone(), idempotency_key_header });
        if ledger.faults.front() == Some(&Fault::RateLimit) {
            ledger.faults.pop_front();
            let body = serde_json::json!({"error": "slow down"});
            return Some(json(StatusCode::TOO_MANY_REQUESTS, &body));
        }
        if let Some(entry) = key.as_ref().and_then(|key| ledger.keys.get(key)) {
            return Some(match entry {
                Entry::Running(first) | Entry::Done(first, _) if *first != payload => json(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &serde_json::json!({"error": "idempotency key reused with another payload"}),
                ),
                Entry::Running(_) => json(
                    StatusCode::CONFLICT,
                    &serde_json::json!({"error": "a request with this key is in progress"}),
                ),
                Entry::Done(_, charge) => json(StatusCode::OK, charge),
            });
        }
        let fault = ledger.faults.pop_front();
        match fault {
            Some(Fault::Refuse) => {
                return Some(json(
                    StatusCode::BAD_REQUEST,
                    &serde_json::json!({"error": "invalid"}),
                ))
            }
            Some(Fault::Unavailable) => {
                let body = serde_json::json!({"error": "maintenance: nothing was processed"});
                return Some(json(StatusCode::SERVICE_UNAVAILABLE, &body));
            }
            _ => {}
        }
        if let Some(key) = &key {
            ledger.keys.insert(key.clone(), Entry::Running(payload.clone()));
        }
        fault
    };
    if fault == Some(Fault::HoldBeforeCommit) {
        let released = vendor.release.notified();
        vendor.holding.send_modify(|count| *count += 1);
        released.await;
    }
    let charge = {
        let mut ledger = vendor.ledger.lock().unwrap();
        let charge = Charge {
            id: format!("ch_{}", ledger.charges.len() + 1),
            amount: payload.amount,
            order: payload.order.clone(),
        };
        ledger.charges.push(charge.clone());
        if let Some(key) = key {
            ledger.keys.insert(key, Entry::Done(payload, charge.clone()));
        }
        charge
    };
    vendor.commits.send_modify(|count| *count += 1);
    match fault {
        Some(Fault::FailAfterCommit) => {
            Some(json(StatusCode::INTERNAL_SERVER_ERROR, &serde_json::json!({"error": "oops"})))
        }
        Some(Fault::LoseAfterCommit) => None,
        _ => Some(json(StatusCode::OK, &charge)),
    }
}

/// `GET /v1/charges/by-key/{key}`: the charge made under `key`, or 404.
async fn find_by_key(State(vendor): State<Arc<Vendor>>, Path(key): Path<String>) -> Response {
    let mut ledger = vendor.ledger.lock().unwrap();
    if ledger.faults.front() == Some(&Fault::FailAfterCommit) {
        ledger.faults.pop_front();
        return json(StatusCode::INTERNAL_SERVER_ERROR, &serde_json::json!({"error": "oops"}));
    }
    match ledger.keys.get(&key) {
        Some(Entry::Done(_, charge)) => json(StatusCode::OK, charge),
        Some(Entry::Running(_)) => {
            json(StatusCode::CONFLICT, &serde_json::json!({"error": "running"}))
        }
        None => json(StatusCode::NOT_FOUND, &serde_json::json!({"error": "no such charge"})),
    }
}

fn json(status: StatusCode, body: &impl Serialize) -> Response {
    let body = serde_json::to_vec(body).expect("a charge or an error serializes");
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

// ---------------------------------------------------------------------------------------------
// The tool, through idem
// ---------------------------------------------------------------------------------------------

/// The tool's error: what the request said, or what idem said.
#[derive(Debug)]
pub enum ToolError {
    Http(idem_reqwest::Error),
    Idem(idem::Error),
}

impl From<idem_reqwest::Error> for ToolError {
    fn from(error: idem_reqwest::Error) -> Self {
        ToolError::Http(error)
    }
}

impl From<idem::Error> for ToolError {
    fn from(error: idem::Error) -> Self {
        ToolError::Idem(error)
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolError::Http(error) => write!(f, "{error}"),
            ToolError::Idem(error) => write!(f, "{error}"),
        }
    }
}

/// A store of its own for one test.
pub fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = idem::SledStore::builder(dir.path().join("idem.sled"))
        .durability(idem::Durability::Flush)
        .open()
        .expect("the store opens");
    (dir, Arc::new(store))
}

/// The call of `charge_card` for `order` of `amount`, as `#[idempotent(scope = "order")]` makes it.
pub fn call(store: &Arc<dyn Store>, order: &str, amount: u64, policy: InDoubtPolicy) -> Call {
    Call::new("charge_card", order, &serde_json::json!({ "amount": amount, "order": order }))
        .expect("the arguments have a key")
        .store(store.clone())
        .in_doubt(policy)
}

/// The status of `key`'s record, `None` when there is none (never reserved, or released).
pub async fn status(store: &Arc<dyn Store>, key: &Key) -> Option<Status> {
    store.get(key.as_str()).await.expect("the store reads").map(|record| record.status)
}

/// The request a tool would build for `order`.
pub fn charge_request(order: &str, amount: u64) -> ChargeRequest {
    ChargeRequest { amount, order: order.to_owned(), idempotency_key: None }
}

/// A client whose requests give up after `timeout`.
pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder().timeout(timeout).build().expect("a client without TLS builds")
}
