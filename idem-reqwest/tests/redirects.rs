//! A vendor that redirects a keyed request. Its redirect proves it received the request, so no
//! later hop may release the key; a hop to another origin must not take the key or the
//! credentials along, and that origin's answer is never recorded as the vendor's.

mod common;

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use common::{call, charge_request, status, store, Charge, ToolError};
use idem::{InDoubtPolicy, Status};
use idem_reqwest::{IdempotentRequest, Landing};
use reqwest_middleware::ClientBuilder;
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;

/// A credential the tool sends in a header of its own: reqwest strips only `Authorization` and
/// cookies when it follows a redirect to another host.
const API_KEY: &str = "sk_test_do_not_leak";

/// What a site answers to one method and path.
#[derive(Clone, Debug)]
enum Reply {
    /// A redirect with this status to this `Location`.
    Redirect(u16, String),
    /// This status, with a small JSON error.
    Status(u16),
    /// 200 with a charge.
    Charge,
}

/// A request a site received.
#[derive(Clone, Debug)]
struct Received {
    method: Method,
    path: String,
    idempotency_key: Option<String>,
    api_key: Option<String>,
}

/// An HTTP site on loopback that answers from a script and records what it received.
struct Site {
    url: String,
    /// Per "METHOD path": the replies in order, the last one repeated.
    script: Mutex<HashMap<String, VecDeque<Reply>>>,
    received: Mutex<Vec<Received>>,
}

impl Site {
    async fn start() -> Arc<Site> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("loopback");
        let site = Arc::new(Site {
            url: format!("http://{}", listener.local_addr().expect("bound")),
            script: Mutex::default(),
            received: Mutex::default(),
        });
        let app = Router::new().fallback(answer).with_state(site.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        site
    }

    /// Scripts what `method path` answers.
    fn on(&self, method: &str, path: &str, replies: &[Reply]) {
        let replies = replies.iter().cloned().collect();
        self.script.lock().unwrap().insert(format!("{method} {path}"), replies);
    }

    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

async fn answer(
    State(site): State<Arc<Site>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    site.received.lock().unwrap().push(Received {
        method: method.clone(),
        path: uri.path().to_owned(),
        idempotency_key: header("idempotency-key"),
        api_key: header("x-api-key"),
    });
    let reply = {
        let mut script = site.script.lock().unwrap();
        match script.get_mut(&format!("{method} {}", uri.path())) {
            Some(replies) if replies.len() > 1 => replies.pop_front(),
            Some(replies) => replies.front().cloned(),
            None => None,
        }
    };
    let status = |code: u16| StatusCode::from_u16(code).expect("a scripted status");
    match reply {
        Some(Reply::Redirect(code, location)) => {
            (status(code), [(axum::http::header::LOCATION, location)]).into_response()
        }
        Some(Reply::Status(code)) => json(status(code), &serde_json::json!({"error": "scripted"})),
        Some(Reply::Charge) => {
            let charge = Charge { id: "ch_1".into(), amount: 4200, order: "o".into() };
            json(StatusCode::OK, &charge)
        }
        None => (StatusCode::NOT_FOUND, "nothing scripted here").into_response(),
    }
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(body).expect("a charge or an error serializes");
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The client the README tells a tool to send its keyed requests with.
fn keyed_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(idem_reqwest::redirect_policy())
        .build()
        .expect("a client without TLS builds")
}

/// A client as reqwest makes it, following every redirect (up to 10).
fn plain_client() -> reqwest::Client {
    common::client(Duration::from_secs(30))
}

/// The clients a tool may send its keyed requests with.
fn clients() -> Vec<reqwest::Client> {
    vec![plain_client(), keyed_client()]
}

/// `charge_card`'s body: the charge, with the call's key and the API key, sent to `url`.
async fn charge(
    http: &reqwest::Client,
    url: &str,
    order: &str,
    runs: &AtomicU32,
) -> Result<Charge, ToolError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let request = http.post(url).header("X-Api-Key", API_KEY).json(&charge_request(order, 4200));
    Ok(request.idempotent().send_json().await?)
}

/// Calls `charge_card` for `order` twice, as an agent that retries would: the first call's
/// error, after checking that it left the key in doubt and that the second call did not run
/// the body again.
async fn charge_twice(http: &reqwest::Client, url: &str, order: &str) -> idem_reqwest::Error {
    let (_dir, store) = store();
    let runs = AtomicU32::new(0);
    let first = call(&store, order, 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let failed = first.run_async(|| charge(http, url, order, &runs)).await;
    let Err(ToolError::Http(error)) = failed else { panic!("{url}: {failed:?}") };
    assert_eq!(error.landing(), Some(Landing::MayHaveLanded), "{error}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt), "not released: {error}");

    let again = call(&store, order, 4200, InDoubtPolicy::Fail)
        .run_async(|| charge(http, url, order, &runs))
        .await;
    assert!(matches!(again, Err(ToolError::Idem(idem::Error::InDoubt { .. }))), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    error
}

/// A URL on a port nobody listens on: bound, then closed.
fn nowhere(path: &str) -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}{path}", closed.local_addr().unwrap());
    drop(closed);
    url
}

#[tokio::test]
async fn a_303_to_a_404_leaves_the_key_in_doubt() {
    for (n, http) in clients().iter().enumerate() {
        let vendor = Site::start().await;
        vendor.on("POST", "/v1/charges", &[Reply::Redirect(303, "/v1/charges/ch_1".into())]);
        vendor.on("GET", "/v1/charges/ch_1", &[Reply::Status(404)]);

        let error = charge_twice(http, &vendor.at("/v1/charges"), &format!("o-1{n}")).await;
        assert_eq!(error.status(), Some(reqwest::StatusCode::NOT_FOUND), "{error}");
        let redirected_to = error.failure().and_then(|failure| failure.redirected_to());
        assert_eq!(redirected_to, Some(vendor.at("/v1/charges/ch_1").as_str()), "{error}");
        let received = vendor.received();
        assert_eq!(received.len(), 2, "the POST, once, and the GET of its redirect");
        assert_eq!(received[0].method, Method::POST);
        assert!(received[0].idempotency_key.is_some(), "the POST carried the key");
    }
}

#[tokio::test]
async fn a_302_to_a_401_leaves_the_key_in_doubt() {
    for (n, http) in clients().iter().enumerate() {
        let vendor = Site::start().await;
        vendor.on("POST", "/v1/charges", &[Reply::Redirect(302, "/login".into())]);
        vendor.on("GET", "/login", &[Reply::Status(401)]);

        let error = charge_twice(http, &vendor.at("/v1/charges"), &format!("o-2{n}")).await;
        assert_eq!(error.status(), Some(reqwest::StatusCode::UNAUTHORIZED), "{error}");
        let paths: Vec<_> = vendor.received().into_iter().map(|r| (r.method, r.path)).collect();
        let expected = [(Method::POST, "/v1/charges".into()), (Method::GET, "/login".into())];
        assert_eq!(paths, expected, "the POST once, and the GET of its redirect");
    }
}

#[tokio::test]
async fn a_303_to_a_port_nobody_listens_on_is_in_doubt() {
    let vendor = Site::start().await;
    let moved = nowhere("/v1/charges");
    vendor.on("POST", "/v1/charges", &[Reply::Redirect(303, moved.clone())]);

    // The policy stops at the other origin, so nothing tries the port. (A plain client would,
    // and reqwest would report the refusal with the vendor's URL, as if the vendor refused: the
    // README's "Redirects" says so.)
    let error = charge_twice(&keyed_client(), &vendor.at("/v1/charges"), "o-3").await;
    assert_eq!(error.status(), Some(reqwest::StatusCode::SEE_OTHER), "{error}");
    let message = error.to_string();
    assert!(message.contains(&moved), "names where the vendor sent it: {message}");
    assert_eq!(vendor.received().len(), 1, "the vendor got the POST");
}

#[test]
fn a_redirect_whose_target_then_refuses_the_connection_is_in_doubt() {
    // A vendor that reads the request, stops listening, and only then answers it with a 303 to
    // a path of its own and `Connection: close`: the redirect's GET needs a new connection, and
    // it is refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/charges", listener.local_addr().unwrap());
    let vendor = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("the client connects");
        let received = read_request(&mut stream);
        drop(listener);
        let answer = "HTTP/1.1 303 See Other\r\nLocation: /v1/charges/ch_1\r\n\
                      Connection: close\r\nContent-Length: 0\r\n\r\n";
        stream.write_all(answer.as_bytes()).expect("the client reads");
        received
    });

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let error = runtime.block_on(charge_twice(&keyed_client(), &url, "o-4"));
    let cause = error.failure().and_then(|f| f.cause()?.downcast_ref::<reqwest::Error>());
    assert!(cause.is_some_and(reqwest::Error::is_connect), "the later hop's refusal: {error}");
    let received = vendor.join().unwrap();
    assert!(received.starts_with("POST /v1/charges "), "{received}");
    assert!(received.to_ascii_lowercase().contains("idempotency-key: "), "{received}");
}

/// One HTTP/1.1 request, its head and a body of `Content-Length` bytes.
fn read_request(stream: &mut std::net::TcpStream) -> String {
    let mut received = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        let read = stream.read(&mut buffer).expect("the request arrives");
        assert!(read > 0, "the client closed before the request ended");
        received.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&received).into_owned();
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let length = text[..end]
            .lines()
            .find_map(|line| {
                line.to_ascii_lowercase().strip_prefix("content-length:")?.trim().parse().ok()
            })
            .unwrap_or(0usize);
        if received.len() >= end + 4 + length {
            return text;
        }
    }
}

#[tokio::test]
async fn a_307_to_another_origin_gets_neither_the_key_nor_the_api_key() {
    let vendor = Site::start().await;
    let elsewhere = Site::start().await;
    vendor.on("POST", "/v1/charges", &[Reply::Redirect(307, elsewhere.at("/v1/charges"))]);
    elsewhere.on("POST", "/v1/charges", &[Reply::Charge]);

    let error = charge_twice(&keyed_client(), &vendor.at("/v1/charges"), "o-5").await;
    assert!(elsewhere.received().is_empty(), "the other origin got {:?}", elsewhere.received());
    assert_eq!(vendor.received().len(), 1);
    assert_eq!(vendor.received()[0].api_key.as_deref(), Some(API_KEY));
    assert_eq!(error.status(), Some(reqwest::StatusCode::TEMPORARY_REDIRECT));
    let message = error.to_string();
    assert!(message.contains(&elsewhere.at("/v1/charges")), "names the target: {message}");
}

#[tokio::test]
async fn with_a_plain_client_another_origins_answer_is_never_recorded() {
    let vendor = Site::start().await;
    let elsewhere = Site::start().await;
    vendor.on("POST", "/v1/charges", &[Reply::Redirect(307, elsewhere.at("/v1/charges"))]);
    elsewhere.on("POST", "/v1/charges", &[Reply::Charge]);

    // The client follows the redirect (with the key), and the other origin answers 200: the
    // answer is not the vendor's, so the call is not done.
    let error = charge_twice(&plain_client(), &vendor.at("/v1/charges"), "o-6").await;
    let message = error.to_string();
    assert!(message.contains(&elsewhere.at("/v1/charges")), "names the other origin: {message}");
    assert!(message.contains("idem_reqwest::redirect_policy()"), "says what to do: {message}");
    assert_eq!(elsewhere.received().len(), 1, "the plain client followed it");
}

#[tokio::test]
async fn a_same_origin_303_to_the_created_charge_is_the_vendors_answer() {
    for (n, http) in clients().iter().enumerate() {
        let vendor = Site::start().await;
        vendor.on("POST", "/v1/charges", &[Reply::Redirect(303, "/v1/charges/ch_1".into())]);
        vendor.on("GET", "/v1/charges/ch_1", &[Reply::Charge]);
        let (_dir, store) = store();
        let runs = AtomicU32::new(0);
        let order = format!("o-7{n}");

        let first = call(&store, &order, 4200, InDoubtPolicy::Fail);
        let key = first.key().clone();
        let url = vendor.at("/v1/charges");
        let charged = first.run_async(|| charge(http, &url, &order, &runs)).await;
        assert_eq!(charged.expect("the charge").id, "ch_1");
        assert_eq!(status(&store, &key).await, Some(Status::Done));
    }
}

#[tokio::test]
async fn a_retry_after_a_redirected_attempt_does_not_release_the_key() {
    // The first attempt is redirected to a queue that answers 429 (a transient failure, which
    // the middleware retries); the retry is refused with 400. Each alone reads "not landed",
    // but the first reached the vendor.
    let vendor = Site::start().await;
    vendor.on(
        "POST",
        "/v1/charges",
        &[Reply::Redirect(303, "/v1/queue".into()), Reply::Status(400)],
    );
    vendor.on("GET", "/v1/queue", &[Reply::Status(429)]);
    let retry = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(10))
        .build_with_max_retries(1);
    let http = ClientBuilder::new(plain_client())
        .with(RetryTransientMiddleware::new_with_policy(retry))
        .with(idem_reqwest::Attempts)
        .build();
    let (_dir, store) = store();
    let url = vendor.at("/v1/charges");

    let first = call(&store, "o-8", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let failed = first
        .run_async(|| async {
            let request = http.post(&url).json(&charge_request("o-8", 4200)).idempotent();
            Ok::<Charge, ToolError>(request.send_json().await?)
        })
        .await;
    let Err(ToolError::Http(error)) = failed else { panic!("400: {failed:?}") };
    assert_eq!(error.status(), Some(reqwest::StatusCode::BAD_REQUEST), "{error}");
    assert_eq!(error.landing(), Some(Landing::MayHaveLanded), "{error}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt), "not released");
    let posts = vendor.received().iter().filter(|r| r.method == Method::POST).count();
    assert_eq!(posts, 2, "the first attempt and its retry");
}

#[tokio::test]
async fn a_lookup_answered_by_another_origin_cannot_tell() {
    // A lookup settles a key: a "not found" from another origin would release a key whose
    // charge landed.
    let vendor = Site::start().await;
    let elsewhere = Site::start().await;
    let key = idem::Key::derive_canonical("charge_card", "o-9", "{}");
    let path = format!("/v1/charges/by-key/{key}");
    vendor.on("GET", &path, &[Reply::Redirect(302, elsewhere.at(&path))]);

    for http in [plain_client(), keyed_client()] {
        let found = idem_reqwest::lookup::<Charge>(http.get(vendor.at(&path))).await;
        let Err(error) = found else { panic!("settled by another origin: {found:?}") };
        assert!(matches!(error, idem_reqwest::Error::CannotTell(_)), "{error}");
        assert!(error.to_string().contains(&elsewhere.at(&path)), "{error}");
    }
}
