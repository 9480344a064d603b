//! Redirects of a keyed request. A redirect is the vendor's answer to the request, so the vendor
//! received it: whatever comes after (another hop's refusal, or no answer) cannot make it "not
//! landed".

use reqwest::header::LOCATION;
use reqwest::{Response, Url};

use crate::error::Redirect;

/// Whether `response`, to a request sent to `sent`, says that the vendor redirected it: it is
/// itself a redirect, or it came from another URL than the one the request was sent to.
pub(crate) fn was_redirected(response: &Response, sent: &Url) -> bool {
    response.status().is_redirection() || response.url() != sent
}

/// The redirect `response` tells of, for the error's message: the one it is, when it came back
/// unfollowed, or else the URL it came from after the client followed some.
pub(crate) fn redirect_of(response: &Response, sent: &Url) -> Option<Redirect> {
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
