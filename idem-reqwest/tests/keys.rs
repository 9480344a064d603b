//! Where the key goes (the default header, a header by name, the body), what happens to a keyed
//! request with no call to take a key from, a retry middleware's chain under one key, and the
//! reconciler's lookup by key.

mod common;

use std::time::Duration;

use common::{
    call, charge_request, client, status, store, Charge, Fault, KeyAt, ToolError, Vendor,
};
use idem::{InDoubtPolicy, Reconciled, Status};
use idem_reqwest::IdempotentRequest;
use reqwest_middleware::ClientBuilder;
use reqwest_retry::policies::ExponentialBackoff;
use reqwest_retry::RetryTransientMiddleware;

#[tokio::test]
async fn a_retry_middleware_sends_every_attempt_under_the_one_key() {
    // The vendor commits the first attempt and answers 500; the middleware retries, and the
    // vendor, seeing the same key, answers with the charge it made.
    let vendor = Vendor::stripe_like(&[Fault::FailAfterCommit]).await;
    let retry = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(10))
        .build_with_max_retries(3);
    let http = ClientBuilder::new(client(Duration::from_secs(30)))
        .with(RetryTransientMiddleware::new_with_policy(retry))
        .with(idem_reqwest::Attempts)
        .build();
    let (_dir, store) = store();
    let url = vendor.charges_url();

    let first = call(&store, "o-10", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let charged = first
        .run_async(|| async {
            let request = http.post(&url).json(&charge_request("o-10", 4200)).idempotent();
            Ok::<Charge, ToolError>(request.send_json().await?)
        })
        .await
        .expect("the retry gets the first charge");
    assert_eq!(charged.id, "ch_1");
    assert_eq!(vendor.charges().len(), 1, "charged once");
    let keys: Vec<_> = vendor.seen().into_iter().map(|seen| seen.key).collect();
    assert_eq!(keys, [Some(key.to_string()), Some(key.to_string())], "two attempts, one key");
    assert_eq!(status(&store, &key).await, Some(Status::Done));
}

/// A client that retries transient failures once, under the one key, and records each attempt.
fn retrying(timeout: Duration) -> reqwest_middleware::ClientWithMiddleware {
    let retry = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(1), Duration::from_millis(10))
        .build_with_max_retries(1);
    ClientBuilder::new(client(timeout))
        .with(RetryTransientMiddleware::new_with_policy(retry))
        .with(idem_reqwest::Attempts)
        .build()
}

#[tokio::test]
async fn a_retry_refused_at_the_door_does_not_undo_an_attempt_that_may_have_landed() {
    // The first attempt's response is lost after the commit (a timeout); the retry gets a 429,
    // which alone would release the key.
    let vendor = Vendor::stripe_like(&[Fault::LoseAfterCommit, Fault::RateLimit]).await;
    let http = retrying(Duration::from_millis(400));
    let (_dir, store) = store();
    let url = vendor.charges_url();

    let first = call(&store, "o-19", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let failed = first
        .run_async(|| async {
            let request = http.post(&url).json(&charge_request("o-19", 4200)).idempotent();
            Ok::<Charge, ToolError>(request.send_json().await?)
        })
        .await;
    let Err(ToolError::Http(error)) = failed else { panic!("429: {failed:?}") };
    assert_eq!(error.status(), Some(reqwest::StatusCode::TOO_MANY_REQUESTS), "{error}");
    assert!(matches!(error, idem_reqwest::Error::MayHaveLanded(_)), "{error}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt), "not released");
    assert_eq!(vendor.seen().len(), 2, "one retry");
    vendor.committed(1).await;
    assert_eq!(vendor.charges().len(), 1);
}

#[tokio::test]
async fn a_retry_chain_that_never_connected_releases_the_key() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}/v1/charges", closed.local_addr().unwrap());
    drop(closed);
    let http = retrying(Duration::from_secs(30));
    let (_dir, store) = store();

    let first = call(&store, "o-20", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let refused = first
        .run_async(|| async {
            let request = http.post(&nowhere).json(&charge_request("o-20", 4200)).idempotent();
            Ok::<Charge, ToolError>(request.send_json().await?)
        })
        .await;
    let Err(ToolError::Http(error)) = refused else { panic!("refused: {refused:?}") };
    assert!(matches!(error, idem_reqwest::Error::NotLanded(_)), "{error}");
    assert!(error.to_string().contains("after 1 retries"), "the middleware's word: {error}");
    assert_eq!(status(&store, &key).await, None, "released: no attempt connected");
}

#[tokio::test]
async fn without_attempts_a_middlewares_refusal_leaves_the_key_in_doubt() {
    // No `Attempts` below the retry: whether an earlier attempt landed is unknown.
    let vendor = Vendor::stripe_like(&[Fault::Refuse]).await;
    let http = ClientBuilder::new(client(Duration::from_secs(30)))
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(1),
        ))
        .build();
    let (_dir, store) = store();
    let url = vendor.charges_url();

    let first = call(&store, "o-21", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let refused = first
        .run_async(|| async {
            let request = http.post(&url).json(&charge_request("o-21", 4200)).idempotent();
            Ok::<Charge, ToolError>(request.send_json().await?)
        })
        .await;
    let Err(ToolError::Http(error)) = refused else { panic!("400: {refused:?}") };
    assert_eq!(error.status(), Some(reqwest::StatusCode::BAD_REQUEST));
    assert!(matches!(error, idem_reqwest::Error::MayHaveLanded(_)), "{error}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt));
}

#[tokio::test]
async fn the_key_goes_in_the_header_the_vendor_names() {
    let vendor = Vendor::start(KeyAt::Header("paypal-request-id"), &[]).await;
    let (_dir, store) = store();
    let http = client(Duration::from_secs(30));
    let url = vendor.charges_url();

    let first = call(&store, "o-11", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    first
        .run_async(|| async {
            let request = http.post(&url).json(&charge_request("o-11", 4200));
            let sent = request.idempotent().key_header("PayPal-Request-Id").send_json().await;
            Ok::<Charge, ToolError>(sent?)
        })
        .await
        .expect("charged");
    let seen = vendor.seen();
    assert_eq!(seen[0].key.as_deref(), Some(key.as_str()));
    assert_eq!(seen[0].idempotency_key_header, None, "only the header named");
}

#[tokio::test]
async fn the_key_can_go_in_the_body_instead() {
    let vendor = Vendor::start(KeyAt::Body, &[]).await;
    let (_dir, store) = store();
    let http = client(Duration::from_secs(30));
    let url = vendor.charges_url();

    let first = call(&store, "o-12", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    first
        .run_async(|| async {
            let mut body = charge_request("o-12", 4200);
            body.idempotency_key = Some(idem::current_key().to_string());
            let sent = http.post(&url).json(&body).idempotent().key_in_body().send_json().await;
            Ok::<Charge, ToolError>(sent?)
        })
        .await
        .expect("charged");
    let seen = vendor.seen();
    assert_eq!(seen[0].key.as_deref(), Some(key.as_str()));
    assert_eq!(seen[0].idempotency_key_header, None, "no header");
}

#[tokio::test]
async fn a_keyed_request_outside_a_call_is_not_sent() {
    let vendor = Vendor::stripe_like(&[]).await;
    let http = client(Duration::from_secs(30));
    let sent = http
        .post(vendor.charges_url())
        .json(&charge_request("o-13", 4200))
        .idempotent()
        .send()
        .await;
    let Err(error) = sent else { panic!("sent without a key: {sent:?}") };
    assert!(matches!(error, idem_reqwest::Error::OutsideCall { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains(&vendor.charges_url()), "names the request: {message}");
    assert!(message.contains("#[idem::idempotent]"), "says what to do: {message}");
    assert!(vendor.seen().is_empty(), "nothing reached the vendor");
}

/// A read: no key, so a keyed request from it is refused.
#[idem::read]
async fn get_charge(http: &reqwest::Client, url: &str) -> Result<Charge, ToolError> {
    Ok(http.post(url).json(&charge_request("o-14", 4200)).idempotent().send_json().await?)
}

#[tokio::test]
async fn a_read_tool_cannot_send_a_keyed_request() {
    let vendor = Vendor::stripe_like(&[]).await;
    let http = client(Duration::from_secs(30));
    let read = get_charge(&http, &vendor.charges_url()).await;
    assert!(
        matches!(read, Err(ToolError::Http(idem_reqwest::Error::OutsideCall { .. }))),
        "{read:?}"
    );
    assert!(vendor.seen().is_empty(), "nothing reached the vendor");
}

/// A reconciler written with the lookup helper.
async fn find_charge(
    http: &reqwest::Client,
    base: &str,
    key: &idem::Key,
) -> Result<Reconciled<Charge>, ToolError> {
    Ok(idem_reqwest::lookup(http.get(format!("{base}/v1/charges/by-key/{key}"))).await?)
}

#[tokio::test]
async fn a_lookup_by_key_settles_what_the_vendor_knows() {
    let vendor = Vendor::stripe_like(&[Fault::LoseAfterCommit]).await;
    let (_dir, store) = store();
    let http = client(Duration::from_millis(400));
    let url = vendor.charges_url();

    let first = call(&store, "o-15", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let lost = first
        .run_async(|| async {
            let request = http.post(&url).json(&charge_request("o-15", 4200)).idempotent();
            Ok::<Charge, ToolError>(request.send_json().await?)
        })
        .await;
    assert!(lost.is_err());
    vendor.committed(1).await;

    let found = find_charge(&http, &vendor.url, &key).await.expect("the vendor answers");
    assert_eq!(found, Reconciled::Landed(vendor.charges()[0].clone()));
    let other = idem::Key::derive_canonical("charge_card", "o-16", "{}");
    let missing = find_charge(&http, &vendor.url, &other).await.expect("the vendor answers");
    assert_eq!(missing, Reconciled::NotLanded);
}

#[tokio::test]
async fn a_lookup_that_fails_cannot_tell() {
    let vendor = Vendor::stripe_like(&[Fault::FailAfterCommit]).await;
    let http = client(Duration::from_secs(30));
    let key = idem::Key::derive_canonical("charge_card", "o-17", "{}");
    let failed = find_charge(&http, &vendor.url, &key).await;
    let Err(ToolError::Http(error)) = failed else { panic!("500: {failed:?}") };
    assert!(matches!(error, idem_reqwest::Error::CannotTell(_)), "{error}");
    assert!(error.to_string().contains("cannot tell"), "{error}");
}

/// The store of the attribute test below.
fn tool_store() -> std::sync::Arc<dyn idem::Store> {
    static STORE: std::sync::OnceLock<(tempfile::TempDir, std::sync::Arc<dyn idem::Store>)> =
        std::sync::OnceLock::new();
    STORE.get_or_init(store).1.clone()
}

/// The README's tool: no header and no `may_have_landed()` written by hand.
#[idem::idempotent(scope = "order", in_doubt = "rerun", store = tool_store)]
async fn charge_card(
    #[idem(skip)] http: &reqwest::Client,
    #[idem(skip)] url: &str,
    amount: u64,
    order: &str,
) -> Result<Charge, ToolError> {
    Ok(http.post(url).json(&charge_request(order, amount)).idempotent().send_json().await?)
}

#[tokio::test]
async fn an_idempotent_tool_needs_no_hand_written_header_or_may_have_landed() {
    let vendor = Vendor::stripe_like(&[Fault::LoseAfterCommit]).await;
    let http = client(Duration::from_millis(400));
    let url = vendor.charges_url();

    let lost = charge_card(&http, &url, 4200, "o-18").await;
    assert!(
        matches!(lost, Err(ToolError::Http(idem_reqwest::Error::MayHaveLanded(_)))),
        "{lost:?}"
    );
    vendor.committed(1).await;
    let charged = charge_card(&http, &url, 4200, "o-18").await.expect("the rerun gets the charge");
    assert_eq!(charged, vendor.charges()[0]);
    assert_eq!(vendor.charges().len(), 1, "charged once");
    let keys: Vec<_> = vendor.seen().into_iter().map(|seen| seen.key).collect();
    assert!(keys[0].is_some() && keys[0] == keys[1], "one key: {keys:?}");
}

#[test]
fn a_keyed_request_can_be_awaited_in_a_send_future() {
    fn send<T: Send>(_: &T) {}
    let http = reqwest::Client::new();
    let keyed = http.post("http://127.0.0.1:9/").idempotent();
    let sending = keyed.send_json::<Charge>();
    send(&sending);
    let lookup = idem_reqwest::lookup::<Charge>(http.get("http://127.0.0.1:9/"));
    send(&lookup);
}
