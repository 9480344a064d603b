//! The reconciler's half: asking a vendor that can look an operation up by its idempotency key
//! whether the effect of a key in doubt landed.

use std::sync::Arc;

use idem_runtime::Reconciled;
use reqwest::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::{Error, Failure};
use crate::redirect::{self, Hops};
use crate::request::{read_some, IdempotentRequest};

/// Sends `request` (a request builder of reqwest or reqwest-middleware), a lookup of an operation by the key it was sent with (such as
/// `GET /v1/charges?idempotency_key=…`), and answers what a reconciler answers:
///
/// | the vendor answers | the answer |
/// | --- | --- |
/// | 2xx | [`Reconciled::Landed`] with the body read as JSON |
/// | 404 Not Found, 410 Gone | [`Reconciled::NotLanded`] |
/// | anything else, or nothing; any answer from another origin than the request's (a redirect) | [`Error::CannotTell`], which leaves the key in doubt |
///
/// Use it only where "not found" means "never landed": a vendor whose lookups lag behind its
/// writes should map `NotLanded` to `CannotTell` for a while.
///
/// ```no_run
/// # #[derive(serde::Deserialize)] struct Charge;
/// # enum PayError { Http(idem_reqwest::Error) }
/// # impl From<idem_reqwest::Error> for PayError { fn from(e: idem_reqwest::Error) -> Self { PayError::Http(e) } }
/// # static HTTP: std::sync::LazyLock<reqwest::Client> = std::sync::LazyLock::new(|| {
/// #     reqwest::Client::builder().redirect(idem_reqwest::redirect_policy()).build().unwrap()
/// # });
/// async fn find_charge(key: &idem::Key) -> Result<idem::Reconciled<Charge>, PayError> {
///     let url = format!("http://127.0.0.1:8080/v1/charges/by-key/{key}");
///     Ok(idem_reqwest::lookup(HTTP.get(url)).await?)
/// }
/// ```
///
/// # Errors
///
/// [`Error::CannotTell`] when the answer settles nothing: the vendor failed or refused the
/// lookup, could not be reached, or its body is not a `T`.
pub async fn lookup<T: DeserializeOwned>(
    request: impl IdempotentRequest,
) -> Result<Reconciled<T>, Error> {
    let (client, request) = request.split();
    let mut failure = Failure {
        key: None,
        method: None,
        url: String::new(),
        status: None,
        body: String::new(),
        source: None,
        redirect: None,
    };
    let request = match request {
        Ok(request) => request,
        Err(error) => {
            failure.url = error.url().map(ToString::to_string).unwrap_or_default();
            failure.source = Some(error.into());
            return Err(Error::CannotTell(failure));
        }
    };
    failure.method = Some(request.method().clone());
    failure.url = request.url().to_string();
    let sent = request.url().clone();
    // Watched, so that `redirect_policy` keeps the lookup's credentials within the vendor's
    // origin as it does a keyed request's.
    let hops = Arc::new(Hops::default());
    let response = match redirect::watched(&hops, client.execute(request, None)).await.0 {
        Ok(response) => response,
        Err(error) => {
            failure.source = Some(error);
            return Err(Error::CannotTell(failure));
        }
    };
    let status = response.status();
    failure.status = Some(status);
    failure.redirect = redirect::redirect_of(&response, &sent);
    if redirect::from_elsewhere(&response, &sent) {
        // Another origin's "not found" would release a key whose effect landed.
        failure.body = read_some(response).await;
        return Err(Error::CannotTell(failure));
    }
    if status.is_success() {
        return match response.json::<T>().await {
            Ok(found) => Ok(Reconciled::Landed(found)),
            Err(error) => {
                failure.source = Some(error.into());
                Err(Error::CannotTell(failure))
            }
        };
    }
    if matches!(status, StatusCode::NOT_FOUND | StatusCode::GONE) {
        return Ok(Reconciled::NotLanded);
    }
    failure.body = read_some(response).await;
    Err(Error::CannotTell(failure))
}
