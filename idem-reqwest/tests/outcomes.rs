//! Each outcome of a keyed request against a real vendor on loopback, and what it does to the
//! call's key: released (the next call runs the body again), in doubt (nothing runs twice; a
//! rerun with the same key gets the vendor's first answer), or another intent.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{call, charge_request, client, status, store, Charge, Fault, ToolError, Vendor};
use idem::{InDoubtPolicy, Status};
use idem_reqwest::{IdempotentRequest, Landing};
use reqwest::StatusCode;

/// How long a request may take before the client gives up, where the test needs it to give up:
/// the vendor never answers those, so the length only bounds the test's duration.
const GIVE_UP: Duration = Duration::from_millis(400);

/// `charge_card`'s body: the charge, sent to `url` with the call's key. `amount` is what is
/// sent; the key holds the amount the call was made with.
async fn charge_at(
    http: &reqwest::Client,
    url: &str,
    order: &str,
    amount: u64,
) -> Result<Charge, ToolError> {
    let request = charge_request(order, amount);
    Ok(http.post(url).json(&request).idempotent().send_json().await?)
}

#[tokio::test]
async fn a_lost_response_leaves_the_key_in_doubt_and_the_rerun_gets_the_first_charge() {
    let vendor = Vendor::stripe_like(&[Fault::LoseAfterCommit]).await;
    let (_dir, store) = store();
    let http = client(GIVE_UP);
    let url = vendor.charges_url();

    let first = call(&store, "o-1", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let lost = first.run_async(|| charge_at(&http, &url, "o-1", 4200)).await;
    let Err(ToolError::Http(error)) = lost else { panic!("the response was lost: {lost:?}") };
    assert_eq!(error.landing(), Some(Landing::MayHaveLanded), "{error}");
    assert!(error.failure().unwrap().cause().is_some_and(|cause| cause
        .downcast_ref::<reqwest::Error>()
        .is_some_and(reqwest::Error::is_timeout)));
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt), "not released: {error}");

    vendor.committed(1).await;
    let again = call(&store, "o-1", 4200, InDoubtPolicy::Fail)
        .run_async(|| charge_at(&http, &url, "o-1", 4200))
        .await;
    assert!(matches!(again, Err(ToolError::Idem(idem::Error::InDoubt { .. }))), "{again:?}");

    let rerun = call(&store, "o-1", 4200, InDoubtPolicy::Rerun)
        .run_async(|| charge_at(&http, &url, "o-1", 4200))
        .await
        .expect("the vendor answers the rerun with its first charge");
    assert_eq!(rerun, vendor.charges()[0], "the vendor's first answer");
    assert_eq!(vendor.charges().len(), 1, "charged once");
    assert_eq!(status(&store, &key).await, Some(Status::Done));
    let keys: Vec<_> = vendor.seen().into_iter().map(|seen| seen.key).collect();
    assert_eq!(keys, [Some(key.to_string()), Some(key.to_string())], "the same key both times");
}

#[tokio::test]
async fn a_500_after_the_commit_leaves_the_key_in_doubt() {
    let vendor = Vendor::stripe_like(&[Fault::FailAfterCommit]).await;
    let (_dir, store) = store();
    let http = client(Duration::from_secs(30));
    let url = vendor.charges_url();

    let first = call(&store, "o-2", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let failed = first.run_async(|| charge_at(&http, &url, "o-2", 4200)).await;
    let Err(ToolError::Http(error)) = failed else { panic!("500: {failed:?}") };
    assert!(matches!(error, idem_reqwest::Error::MayHaveLanded(_)), "{error}");
    assert_eq!(error.status(), Some(StatusCode::INTERNAL_SERVER_ERROR));
    assert!(error.to_string().contains("oops"), "the vendor's body is in the message: {error}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt));

    let again = call(&store, "o-2", 4200, InDoubtPolicy::Fail)
        .run_async(|| charge_at(&http, &url, "o-2", 4200))
        .await;
    assert!(matches!(again, Err(ToolError::Idem(idem::Error::InDoubt { .. }))), "{again:?}");
    assert_eq!(vendor.charges().len(), 1);
    assert_eq!(vendor.seen().len(), 1, "the second call sent nothing");
}

#[tokio::test]
async fn a_timeout_after_the_request_was_written_leaves_the_key_in_doubt_and_409_keeps_it() {
    // The vendor reads the whole request and holds it before committing: the client's timeout
    // strikes after the request was written.
    let vendor = Vendor::stripe_like(&[Fault::HoldBeforeCommit]).await;
    let (_dir, store) = store();
    let http = client(GIVE_UP);
    let url = vendor.charges_url();

    let first = call(&store, "o-3", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let timed_out = first.run_async(|| charge_at(&http, &url, "o-3", 4200)).await;
    let Err(ToolError::Http(error)) = timed_out else { panic!("timed out: {timed_out:?}") };
    assert_eq!(error.landing(), Some(Landing::MayHaveLanded), "{error}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt));
    vendor.holding().await;

    // A rerun while the vendor still runs the first: 409, and the key stays in doubt.
    let in_flight = call(&store, "o-3", 4200, InDoubtPolicy::Rerun)
        .run_async(|| charge_at(&http, &url, "o-3", 4200))
        .await;
    let Err(ToolError::Http(error)) = in_flight else { panic!("409: {in_flight:?}") };
    assert_eq!(error.status(), Some(StatusCode::CONFLICT));
    assert_eq!(error.landing(), Some(Landing::MayHaveLanded), "{error}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt));

    vendor.release();
    vendor.committed(1).await;
    let rerun = call(&store, "o-3", 4200, InDoubtPolicy::Rerun)
        .run_async(|| charge_at(&http, &url, "o-3", 4200))
        .await
        .expect("the first request's charge");
    assert_eq!(rerun.id, "ch_1");
    assert_eq!(vendor.charges().len(), 1);
}

#[tokio::test]
async fn a_changed_payload_under_the_same_key_is_another_intent() {
    let vendor = Vendor::stripe_like(&[Fault::LoseAfterCommit]).await;
    let (_dir, store) = store();
    let http = client(GIVE_UP);
    let url = vendor.charges_url();

    let first = call(&store, "o-4", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let lost = first.run_async(|| charge_at(&http, &url, "o-4", 4200)).await;
    assert!(matches!(lost, Err(ToolError::Http(idem_reqwest::Error::MayHaveLanded(_)))));
    vendor.committed(1).await;

    // The same key, but the body sends another amount (a part of the request left out of the
    // key): the vendor refuses it with 422.
    let changed = call(&store, "o-4", 4200, InDoubtPolicy::Rerun)
        .run_async(|| charge_at(&http, &url, "o-4", 9900))
        .await;
    let Err(ToolError::Http(error)) = changed else { panic!("422: {changed:?}") };
    assert!(matches!(error, idem_reqwest::Error::OtherIntent(_)), "{error}");
    assert_eq!(error.status(), Some(StatusCode::UNPROCESSABLE_ENTITY));
    let message = error.to_string();
    assert!(message.contains("different request under this key"), "{message}");
    assert!(message.contains(key.as_str()), "{message}");
    assert_eq!(status(&store, &key).await, Some(Status::InDoubt), "something landed under it");
    assert_eq!(vendor.charges().len(), 1);
}

#[tokio::test]
async fn a_refused_connection_releases_the_key() {
    // A port nobody listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}/v1/charges", closed.local_addr().unwrap());
    drop(closed);
    let vendor = Vendor::stripe_like(&[]).await;
    let (_dir, store) = store();
    let http = client(Duration::from_secs(30));
    let runs = AtomicU32::new(0);

    let first = call(&store, "o-5", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let refused = first
        .run_async(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            charge_at(&http, &nowhere, "o-5", 4200)
        })
        .await;
    let Err(ToolError::Http(error)) = refused else { panic!("refused: {refused:?}") };
    assert!(matches!(error, idem_reqwest::Error::NotLanded(_)), "{error}");
    assert!(error.to_string().contains("released"), "{error}");
    assert_eq!(status(&store, &key).await, None, "released");

    let url = vendor.charges_url();
    let charged = call(&store, "o-5", 4200, InDoubtPolicy::Fail)
        .run_async(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            charge_at(&http, &url, "o-5", 4200)
        })
        .await
        .expect("the vendor charges");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the released key ran the body again");
    assert_eq!(charged.id, "ch_1");
    assert_eq!(vendor.seen()[0].key.as_deref(), Some(key.as_str()));
}

#[tokio::test]
async fn a_request_refused_as_invalid_releases_the_key() {
    let vendor = Vendor::stripe_like(&[Fault::Refuse]).await;
    let (_dir, store) = store();
    let http = client(Duration::from_secs(30));
    let url = vendor.charges_url();

    let first = call(&store, "o-6", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let refused = first.run_async(|| charge_at(&http, &url, "o-6", 4200)).await;
    let Err(ToolError::Http(error)) = refused else { panic!("400: {refused:?}") };
    assert_eq!(error.status(), Some(StatusCode::BAD_REQUEST));
    assert_eq!(error.landing(), Some(Landing::NotLanded));
    assert_eq!(status(&store, &key).await, None, "released");

    let charged = call(&store, "o-6", 4200, InDoubtPolicy::Fail)
        .run_async(|| charge_at(&http, &url, "o-6", 4200))
        .await
        .expect("the next call runs the body and charges");
    assert_eq!(charged.id, "ch_1");
    assert_eq!(vendor.charges().len(), 1);
}

#[tokio::test]
async fn a_per_request_override_changes_the_classification() {
    // A vendor documented to answer 503 only before it acts: the tool says so, and the key is
    // released instead of left in doubt.
    let vendor = Vendor::stripe_like(&[Fault::Unavailable]).await;
    let (_dir, store) = store();
    let http = client(Duration::from_secs(30));
    let url = vendor.charges_url();
    let charge = || async {
        let sent = http
            .post(&url)
            .json(&charge_request("o-7", 4200))
            .idempotent()
            .classify(|outcome| {
                (outcome.status() == Some(StatusCode::SERVICE_UNAVAILABLE))
                    .then_some(Landing::NotLanded)
            })
            .send_json::<Charge>()
            .await;
        Ok::<_, ToolError>(sent?)
    };

    let first = call(&store, "o-7", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let failed = first.run_async(charge).await;
    let Err(ToolError::Http(error)) = failed else { panic!("503: {failed:?}") };
    assert_eq!(error.landing(), Some(Landing::NotLanded), "{error}");
    assert_eq!(status(&store, &key).await, None, "released, as the override says");

    let charged = call(&store, "o-7", 4200, InDoubtPolicy::Fail)
        .run_async(charge)
        .await
        .expect("the next call charges");
    assert_eq!(charged.id, "ch_1");
    assert_eq!(vendor.charges().len(), 1);
}
