//! A keyed request: built as reqwest builds it, sent with the call's key, its outcome classified
//! and reported to the call.

use std::fmt;
use std::sync::Arc;

use idem_runtime::Key;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, Request, Response};
use serde::de::DeserializeOwned;

use crate::classify::{
    after_redirect, classified, over_attempts, AttemptsKnown, Classifier, Landing, Outcome,
};
use crate::error::{BoxError, Error, Failure, Redirect};
use crate::redirect;

/// The header a keyed request carries its key in unless told otherwise: the IETF draft's name,
/// which Stripe and Adyen read.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// How much of a refusal's body is read, for the error's message.
const BODY_READ: usize = 8 * 1024;

/// Makes a reqwest request builder a keyed request: `.idempotent()`. Implemented for
/// `reqwest::RequestBuilder` and, with the `middleware` feature, for `reqwest_middleware`'s.
pub trait IdempotentRequest: sealed::Sealed + Sized {
    /// The request, to be sent from the body of an idempotent call with that call's key in the
    /// `Idempotency-Key` header (see [`Keyed`]). The key is read here, so build the request in
    /// the body.
    fn idempotent(self) -> Keyed {
        let (client, request) = self.split();
        Keyed {
            key: idem_runtime::try_current_key(),
            client,
            request,
            header: Some(IDEMPOTENCY_KEY.to_owned()),
            classify: None,
        }
    }
}

impl IdempotentRequest for reqwest::RequestBuilder {}

#[cfg(feature = "middleware")]
impl IdempotentRequest for reqwest_middleware::RequestBuilder {}

pub(crate) mod sealed {
    use super::Sender;

    /// A request builder this crate knows how to take apart.
    pub trait Sealed {
        /// The client that sends the request, and the request (or why it could not be built).
        fn split(self) -> (Sender, Result<reqwest::Request, reqwest::Error>);
    }

    impl Sealed for reqwest::RequestBuilder {
        fn split(self) -> (Sender, Result<reqwest::Request, reqwest::Error>) {
            let (client, request) = self.build_split();
            (Sender::Plain(client), request)
        }
    }

    #[cfg(feature = "middleware")]
    impl Sealed for reqwest_middleware::RequestBuilder {
        fn split(mut self) -> (Sender, Result<reqwest::Request, reqwest::Error>) {
            let extensions = std::mem::take(self.extensions());
            let (client, request) = self.build_split();
            (Sender::Middleware(client, extensions), request)
        }
    }
}

/// The client a request goes out through.
pub enum Sender {
    /// reqwest's own client.
    Plain(reqwest::Client),
    /// reqwest-middleware's client, with the extensions set on the request.
    #[cfg(feature = "middleware")]
    Middleware(reqwest_middleware::ClientWithMiddleware, http::Extensions),
}

impl Sender {
    /// Sends `request` through the whole client: a middleware's retries all carry the header set
    /// once before. Also says what is known of the attempts made (see the `Attempts` middleware).
    pub(crate) async fn execute(
        self,
        request: Request,
        classify: Option<&Classifier>,
    ) -> (Result<Response, BoxError>, AttemptsKnown) {
        match self {
            Sender::Plain(client) => {
                // The one attempt's outcome is classified by the caller.
                let _ = classify;
                (client.execute(request).await.map_err(BoxError::from), AttemptsKnown::One)
            }
            #[cfg(feature = "middleware")]
            Sender::Middleware(client, mut extensions) => {
                let log = crate::attempts::AttemptLog::new(classify.cloned());
                extensions.insert(log.clone());
                let result = match client.execute_with_extensions(request, &mut extensions).await {
                    Ok(response) => Ok(response),
                    // Unwrapped, so that the classification sees reqwest's error itself.
                    Err(reqwest_middleware::Error::Reqwest(error)) => Err(error.into()),
                    Err(error) => Err(error.into()),
                };
                let landings = log.landings();
                let attempts = if landings.is_empty() {
                    AttemptsKnown::Unseen
                } else {
                    AttemptsKnown::Recorded(landings)
                };
                (result, attempts)
            }
        }
    }
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sender::Plain(_) => f.write_str("Sender::Plain"),
            #[cfg(feature = "middleware")]
            Sender::Middleware(..) => f.write_str("Sender::Middleware"),
        }
    }
}

/// A request that carries the key of the idempotent call it is sent from, and whose failures
/// tell that call whether the effect may have landed. Made by
/// [`.idempotent()`](IdempotentRequest::idempotent); sent by [`send`](Keyed::send) or
/// [`send_json`](Keyed::send_json).
///
/// Return its [`Error`] from the body (through the tool's own error type) and idem does the
/// right thing with the key: see [`Landing`] and the README's "Calling HTTP APIs".
#[must_use = "a keyed request does nothing until it is sent"]
pub struct Keyed {
    key: Option<Key>,
    client: Sender,
    request: Result<Request, reqwest::Error>,
    header: Option<String>,
    classify: Option<Classifier>,
}

impl fmt::Debug for Keyed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("key", &self.key)
            .field("client", &self.client)
            .field("request", &self.request)
            .field("header", &self.header)
            .field("classify", &self.classify.as_ref().map(|_| "…"))
            .finish()
    }
}

impl Keyed {
    /// Carries the key in the header `name` instead of `Idempotency-Key`: PayPal's
    /// `PayPal-Request-Id`, for instance. A name that is not a valid header name is an
    /// [`Error::NotLanded`] when the request is sent.
    pub fn key_header(mut self, name: &str) -> Keyed {
        self.header = Some(name.to_owned());
        self
    }

    /// Carries no key header: the body already holds [`current_key`](idem_runtime::current_key)
    /// where the vendor reads it (Square's `idempotency_key` field). The outcome is classified all
    /// the same.
    pub fn key_in_body(mut self) -> Keyed {
        self.header = None;
        self
    }

    /// Overrides the classification for this request: `classify` sees each outcome and answers a
    /// [`Landing`], or `None` to keep the default ([`Outcome::default_landing`]). A request the
    /// vendor redirected stays in doubt all the same when the override answers
    /// [`Landing::NotLanded`] (the redirect shows the vendor received it), and a 3xx is never
    /// [`Landing::Answered`].
    ///
    /// ```
    /// use idem_reqwest::{IdempotentRequest, Landing};
    /// use reqwest::StatusCode;
    ///
    /// # fn build(http: &reqwest::Client) -> idem_reqwest::Keyed {
    /// // A vendor whose 409 means "that order already exists", not "still in progress".
    /// http.post("http://127.0.0.1:8080/v1/orders")
    ///     .idempotent()
    ///     .classify(|outcome| (outcome.status() == Some(StatusCode::CONFLICT)).then_some(Landing::NotLanded))
    /// # }
    /// ```
    pub fn classify(
        mut self,
        classify: impl Fn(&Outcome<'_>) -> Option<Landing> + Send + Sync + 'static,
    ) -> Keyed {
        self.classify = Some(Arc::new(classify));
        self
    }

    /// Sends the request and returns the vendor's answer when it is [`Landing::Answered`] (every
    /// 2xx by default). Reading the body of that answer is then the caller's part: if it fails,
    /// the effect landed and its answer is lost, so call
    /// [`may_have_landed`](idem_runtime::may_have_landed) before returning the error, or use
    /// [`send_json`](Keyed::send_json), which does.
    ///
    /// # Errors
    ///
    /// [`Error::OutsideCall`] outside an idempotent call, and otherwise the classification of the
    /// failure ([`Error::NotLanded`], [`Error::MayHaveLanded`], [`Error::OtherIntent`]), already
    /// reported to the call.
    pub async fn send(self) -> Result<Response, Error> {
        self.exchange().await.map(|(response, _)| response)
    }

    /// Sends the request and reads the vendor's answer as JSON. An answer whose body cannot be
    /// read or parsed is [`Error::MayHaveLanded`]: the vendor acted, and a rerun with the same key
    /// gets its answer again.
    ///
    /// # Errors
    ///
    /// As [`send`](Keyed::send), and [`Error::MayHaveLanded`] for an unreadable answer.
    pub async fn send_json<T: DeserializeOwned>(self) -> Result<T, Error> {
        let (response, mut failure) = self.exchange().await?;
        failure.status = Some(response.status());
        match response.json::<T>().await {
            Ok(value) => Ok(value),
            Err(error) => {
                failure.source = Some(error.into());
                report(Landing::MayHaveLanded);
                Err(Error::MayHaveLanded(failure))
            }
        }
    }

    /// Sends the request with its key, and classifies what comes back. On success, also returns
    /// the failure to report should reading the answer fail.
    async fn exchange(self) -> Result<(Response, Failure), Error> {
        let Keyed { key, client, request, header, classify } = self;
        let Some(key) = key else {
            let (method, url) = match &request {
                Ok(request) => (Some(request.method().clone()), request.url().to_string()),
                Err(error) => (None, error.url().map(ToString::to_string).unwrap_or_default()),
            };
            return Err(Error::OutsideCall { method, url });
        };
        let mut request = match request {
            Ok(request) => request,
            Err(error) => {
                let url = error.url().map(ToString::to_string).unwrap_or_default();
                let failure = failure(Some(key), None, url, Some(error.into()));
                return Err(Error::NotLanded(failure));
            }
        };
        let method = Some(request.method().clone());
        let mut failure = failure(Some(key.clone()), method, request.url().to_string(), None);
        if let Some(name) = header {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|error| format!("{name:?} is not a header name: {error}"))
                .and_then(|name| {
                    // A derived key is 32 hex digits, always a valid value; checked all the same.
                    let value = HeaderValue::from_str(key.as_str())
                        .map_err(|error| format!("key {key} is not a header value: {error}"))?;
                    Ok((name, value))
                });
            match header {
                Ok((name, value)) => {
                    request.headers_mut().insert(name, value);
                }
                Err(reason) => {
                    failure.source = Some(reason.into());
                    return Err(Error::NotLanded(failure));
                }
            }
        }
        let sent = request.url().clone();
        let hops = Arc::new(redirect::Hops::default());
        let sending = client.execute(request, classify.as_ref());
        let (result, attempts) = redirect::watched(&hops, sending).await;
        match result {
            Ok(response) => {
                let status = response.status();
                failure.redirect = redirect::redirect_of(&response, &sent);
                let landing = if redirect::from_elsewhere(&response, &sent) {
                    // A client without `redirect_policy` followed the vendor's redirect to another
                    // origin: whatever that origin answered, the vendor had the request.
                    Landing::MayHaveLanded
                } else {
                    let last = classified(classify.as_ref(), &Outcome::status_code(status));
                    let landing = over_attempts(last, &attempts);
                    if hops.last().is_some() || redirect::was_redirected(&response, &sent) {
                        after_redirect(landing, status.is_redirection())
                    } else {
                        landing
                    }
                };
                if landing == Landing::Answered {
                    return Ok((response, failure));
                }
                failure.status = Some(status);
                failure.body = read_some(response).await;
                Err(settle(landing, failure))
            }
            Err(error) => {
                // The last attempt's own error, as recorded before a middleware wrapped it.
                let last = match &attempts {
                    AttemptsKnown::Recorded(landings) => landings.last().copied(),
                    AttemptsKnown::One | AttemptsKnown::Unseen => None,
                };
                let last = last.unwrap_or_else(|| {
                    classified(classify.as_ref(), &Outcome::failed(error.as_ref()))
                });
                let mut landing = over_attempts(last, &attempts);
                // reqwest reports a later hop's failure (its target refused the connection) as
                // the request's own, with the URL it was sent to: only the policy saw the hop.
                if let Some(to) = hops.last() {
                    landing = after_redirect(landing, false);
                    failure.redirect = Some(Redirect::Followed(to.to_string()));
                }
                failure.source = Some(error);
                Err(settle(landing, failure))
            }
        }
    }
}

fn failure(
    key: Option<Key>,
    method: Option<Method>,
    url: String,
    source: Option<BoxError>,
) -> Failure {
    Failure { key, method, url, status: None, body: String::new(), source, redirect: None }
}

/// Tells the call what `landing` means for it, and names the error.
fn settle(landing: Landing, failure: Failure) -> Error {
    report(landing);
    match landing {
        Landing::NotLanded => Error::NotLanded(failure),
        Landing::OtherIntent => Error::OtherIntent(failure),
        // A classifier's `Answered` is handled before; anything else is the safe side.
        Landing::MayHaveLanded | Landing::Answered => Error::MayHaveLanded(failure),
    }
}

/// Leaves the key in doubt for the landings that may have acted at the vendor.
pub(crate) fn report(landing: Landing) {
    if matches!(landing, Landing::MayHaveLanded | Landing::OtherIntent)
        && !idem_runtime::may_have_landed()
    {
        // The request was built in the body but its future awaited elsewhere (a spawned task):
        // the call cannot hear it. The error still says what happened.
        tracing::warn!(
            "idem_reqwest: a keyed request that may have landed finished outside its call's body; \
             await it in the body, so that the key is left in doubt"
        );
    }
}

/// The start of a refusal's body, for the error's message; whatever cannot be read is left out.
pub(crate) async fn read_some(mut response: Response) -> String {
    let mut body = Vec::new();
    while body.len() < BODY_READ {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(BODY_READ);
    String::from_utf8_lossy(&body).into_owned()
}
