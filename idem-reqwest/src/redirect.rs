//! Redirects of a keyed request. A redirect is the vendor's answer to the request, so the vendor
//! received it: whatever comes after (another hop's refusal, or no answer) cannot make it "not
//! landed". A redirect to another origin would take the key and the request's credentials there,
//! and its answer is not the vendor's: [`redirect_policy`] stops a keyed request at one, and
//! the keyed request refuses an answer from another origin that a client without it followed.

use std::cell::RefCell;
use std::future::Future;
use std::sync::{Arc, Mutex};

use reqwest::header::LOCATION;
use reqwest::redirect::Policy;
use reqwest::{Response, Url};

use crate::error::Redirect;

/// The redirect policy of a client that sends keyed requests: build the client with
/// `.redirect(idem_reqwest::redirect_policy())`.
///
/// ```
/// let http = reqwest::Client::builder()
///     .redirect(idem_reqwest::redirect_policy())
///     .build()
///     .expect("the client builds");
/// ```
///
/// A keyed request (and a [`lookup`](crate::lookup)) sent through it follows a redirect within
/// the origin (scheme, host and port) it was sent to, up to 10 as reqwest's default does, and
/// stops at one to another origin: the 3xx comes back as what the request came to, the key is
/// left in doubt, and the error names where the redirect pointed. Followed, that redirect would
/// carry the `Idempotency-Key` and every header of the request but `Authorization` and cookies
/// (an `X-Api-Key`, for one) to the other origin, and a 307 or 308 would send it the body too.
/// The policy also tells the keyed request of each redirect it follows, so that a failure after
/// one (the redirect's target refuses the connection) leaves the key in doubt instead of
/// releasing it. Every other request of the client is left to reqwest's default.
///
/// It sees a keyed request while that request's future is being polled, which is always so
/// unless a middleware sends the request from a task of its own: such a request is followed as
/// any other, and an answer from another origin is still never taken as the vendor's.
pub fn redirect_policy() -> Policy {
    Policy::custom(|attempt| {
        let Some(hops) = Hops::watching() else {
            return Policy::default().redirect(attempt);
        };
        // The first of `previous` is the URL the request was sent to.
        let sent = attempt.previous().first();
        if sent.is_some_and(|sent| sent.origin() == attempt.url().origin()) {
            hops.record(attempt.url());
            Policy::default().redirect(attempt)
        } else {
            attempt.stop()
        }
    })
}

/// The last redirect [`redirect_policy`] followed for one keyed request, if it followed any.
#[derive(Debug, Default)]
pub(crate) struct Hops(Mutex<Option<Url>>);

thread_local! {
    /// The hops of the keyed request being polled on this thread, if one is.
    static WATCHING: RefCell<Option<Arc<Hops>>> = const { RefCell::new(None) };
}

impl Hops {
    fn watching() -> Option<Arc<Hops>> {
        // A thread being torn down watches nothing.
        WATCHING.try_with(|watching| watching.borrow().clone()).ok().flatten()
    }

    fn record(&self, to: &Url) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(to.clone());
    }

    /// The last redirect followed, if any was.
    pub(crate) fn last(&self) -> Option<Url> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// Awaits `sending` with `hops` where [`redirect_policy`] finds them. reqwest asks the policy
/// from inside the poll of the request's future, so the policy sees the request that asks.
pub(crate) async fn watched<F: Future>(hops: &Arc<Hops>, sending: F) -> F::Output {
    let mut sending = std::pin::pin!(sending);
    std::future::poll_fn(|cx| {
        let _watching = Watching::enter(hops);
        sending.as_mut().poll(cx)
    })
    .await
}

/// Shows some hops to the policy for the span of one poll, and then whatever it saw before
/// (a keyed request polled from inside another's poll).
struct Watching(Option<Arc<Hops>>);

impl Watching {
    fn enter(hops: &Arc<Hops>) -> Watching {
        let before = WATCHING.try_with(|watching| watching.replace(Some(hops.clone())));
        Watching(before.ok().flatten())
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let before = self.0.take();
        let _ = WATCHING.try_with(|watching| *watching.borrow_mut() = before);
    }
}

/// Whether `response`, to a request sent to `sent`, says that the vendor redirected it: it is
/// itself a redirect, or it came from another URL than the one the request was sent to.
pub(crate) fn was_redirected(response: &Response, sent: &Url) -> bool {
    response.status().is_redirection() || response.url() != sent
}

/// Whether `response` came from another origin than the request's: a client without
/// [`redirect_policy`] followed a redirect there.
pub(crate) fn from_elsewhere(response: &Response, sent: &Url) -> bool {
    response.url().origin() != sent.origin()
}

/// The redirect `response` tells of, for the error's message: the one it is, when it came back
/// unfollowed, or else the URL it came from after the client followed some.
pub(crate) fn redirect_of(response: &Response, sent: &Url) -> Option<Redirect> {
    if from_elsewhere(response, sent) {
        return Some(Redirect::Elsewhere(response.url().to_string()));
    }
    if response.status().is_redirection() {
        if let Some(to) = location(response) {
            let other_origin = to.origin() != sent.origin();
            return Some(Redirect::Returned { to: to.to_string(), other_origin });
        }
    }
    (response.url() != sent).then(|| Redirect::Followed(response.url().to_string()))
}

/// Where a redirect points, resolved against the URL it came from; `None` when it names nothing
/// that parses.
fn location(response: &Response) -> Option<Url> {
    let location = response.headers().get(LOCATION)?.to_str().ok()?;
    response.url().join(location).ok()
}
