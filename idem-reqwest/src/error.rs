//! The errors of a keyed request and of a lookup: each says what became of the key.

use std::error::Error as StdError;
use std::fmt;

use idem_runtime::Key;
use reqwest::{Method, StatusCode};

use crate::classify::Landing;

/// Any error that can be the cause of a failure (reqwest's, a middleware's).
pub(crate) type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// How much of a refusal's body an error keeps, for its message.
const BODY_SHOWN: usize = 300;

/// Why a keyed request or a lookup did not give an answer to use. Convert it into the tool's
/// error type with `From`: the classification has already told idem what to do with the key.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A keyed request was sent outside the body of an idempotent call (from a `#[read]` tool,
    /// a `#[write]` one, or no tool): there is no key to carry, so it was not sent.
    OutsideCall {
        /// The request's method (none when the request could not be built).
        method: Option<Method>,
        /// The request's URL.
        url: String,
    },
    /// The request cannot have taken effect ([`Landing::NotLanded`]): returned from the body, it
    /// releases the key, and the next call runs the body again.
    NotLanded(Failure),
    /// The request may have taken effect ([`Landing::MayHaveLanded`]): the call was told so, and
    /// the key stays in doubt when the body returns this.
    MayHaveLanded(Failure),
    /// The vendor holds a different request under this key ([`Landing::OtherIntent`]): the key
    /// stays in doubt, since something landed under it.
    OtherIntent(Failure),
    /// A [`lookup`](crate::lookup) got no answer that settles anything: a reconciler that returns
    /// it leaves the key in doubt, with this message.
    CannotTell(Failure),
}

impl Error {
    /// What the classification decided, or `None` for [`Error::OutsideCall`] (nothing was sent)
    /// and [`Error::CannotTell`].
    pub fn landing(&self) -> Option<Landing> {
        match self {
            Error::NotLanded(_) => Some(Landing::NotLanded),
            Error::MayHaveLanded(_) => Some(Landing::MayHaveLanded),
            Error::OtherIntent(_) => Some(Landing::OtherIntent),
            Error::OutsideCall { .. } | Error::CannotTell(_) => None,
        }
    }

    /// The details of a request that was sent, or could not be built.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::NotLanded(failure)
            | Error::MayHaveLanded(failure)
            | Error::OtherIntent(failure)
            | Error::CannotTell(failure) => Some(failure),
            Error::OutsideCall { .. } => None,
        }
    }

    /// The status the vendor answered, if it answered.
    pub fn status(&self) -> Option<StatusCode> {
        self.failure().and_then(|failure| failure.status)
    }

    /// Whether the request gave up waiting: one of reqwest's timeouts (`timeout`,
    /// `read_timeout`, `connect_timeout`) struck, or the vendor answered 408.
    pub fn is_timeout(&self) -> bool {
        let Some(failure) = self.failure() else { return false };
        let timed_out = failure.cause().and_then(|cause| cause.downcast_ref::<reqwest::Error>());
        failure.status == Some(StatusCode::REQUEST_TIMEOUT)
            || timed_out.is_some_and(reqwest::Error::is_timeout)
    }
}

/// A request that went wrong: which, under which key, and what came back.
#[derive(Debug)]
pub struct Failure {
    pub(crate) key: Option<Key>,
    pub(crate) method: Option<Method>,
    pub(crate) url: String,
    pub(crate) status: Option<StatusCode>,
    pub(crate) body: String,
    pub(crate) source: Option<BoxError>,
    pub(crate) redirect: Option<Redirect>,
}

/// Where the vendor redirected a request, and what the client did with it.
#[derive(Debug)]
pub(crate) enum Redirect {
    /// The client followed it, within the request's origin: what came back came from this URL.
    Followed(String),
    /// It came back unfollowed: the URL it pointed to, and whether that is another origin.
    Returned { to: String, other_origin: bool },
    /// The client followed it to another origin, whose answer came back from this URL.
    Elsewhere(String),
}

impl Failure {
    /// The idempotency key the request carried (none for a lookup).
    pub fn key(&self) -> Option<&Key> {
        self.key.as_ref()
    }

    /// The request's method (none when the request could not be built).
    pub fn method(&self) -> Option<&Method> {
        self.method.as_ref()
    }

    /// The request's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The status the vendor answered, if it answered.
    pub fn status(&self) -> Option<StatusCode> {
        self.status
    }

    /// The beginning of the body the vendor answered with (empty when it did not answer).
    pub fn body(&self) -> &str {
        &self.body
    }

    /// Where the vendor redirected the request, if it did: the URL that answered (or failed) after
    /// the redirects the client followed, or the one a redirect that came back unfollowed points
    /// to. A request the vendor redirected is never [`Error::NotLanded`]: the redirect was its
    /// answer to the request. An answer from another origin than the request's is never taken
    /// as the vendor's (see [`redirect_policy`](crate::redirect_policy)).
    pub fn redirected_to(&self) -> Option<&str> {
        match self.redirect.as_ref()? {
            Redirect::Followed(to) | Redirect::Returned { to, .. } | Redirect::Elsewhere(to) => {
                Some(to)
            }
        }
    }

    /// The error that stopped the request (reqwest's, or a middleware's), if one did: downcast
    /// it to `reqwest::Error` to ask it more.
    pub fn cause(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// What happened, in a few words: the status and the start of its body, or the error.
    fn what(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(status) = self.status {
            write!(f, "answered {status}")?;
            let body = self.body.trim();
            if !body.is_empty() {
                let shown: String = body.chars().take(BODY_SHOWN).collect();
                let more = if shown.len() < body.len() { "…" } else { "" };
                write!(f, " ({shown}{more})")?;
            }
        }
        if let Some(source) = &self.source {
            if self.status.is_some() {
                f.write_str(", then ")?;
            }
            write!(f, "{source}")?;
            let mut next = source.source();
            while let Some(cause) = next {
                write!(f, ": {cause}")?;
                next = cause.source();
            }
        }
        match &self.redirect {
            None => Ok(()),
            Some(Redirect::Followed(to)) => write!(
                f,
                ", at {to}, where the vendor had redirected it (so it had received the request)"
            ),
            Some(Redirect::Returned { to, other_origin: false }) => write!(
                f,
                ", a redirect to {to} that the client did not follow (so the vendor had received \
                 the request)"
            ),
            Some(Redirect::Returned { to, other_origin: true }) => write!(
                f,
                ", a redirect to {to}, another origin, that the client did not follow: the key and \
                 the request's credentials would have gone along (the vendor had received the \
                 request; if it has moved, send the request to {to})"
            ),
            Some(Redirect::Elsewhere(to)) => write!(
                f,
                ", from {to}, another origin than the request's, where the client followed a \
                 redirect with the request's headers and key: that answer is not the vendor's, \
                 so it is not taken as the result; build the client with \
                 `.redirect(idem_reqwest::redirect_policy())`, which stops a keyed request at such \
                 a redirect, and if the vendor has moved, send the request to {to}"
            ),
        }
    }

    fn request(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.method {
            Some(method) => write!(f, "{method} {}", self.url)?,
            None => write!(f, "the request to {}", self.url)?,
        }
        if let Some(key) = &self.key {
            write!(f, " (idempotency key {key})")?;
        }
        Ok(())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutsideCall { method, url } => write!(
                f,
                "{}{url} was not sent: a keyed request (`.idempotent()`) must be sent from \
                 the body of an idempotent call (#[idem::idempotent] or idem::Call), which gives \
                 it its key; a #[read] or #[write] tool has no key, so send its requests without \
                 `.idempotent()`",
                method.as_ref().map(|method| format!("{method} ")).unwrap_or_default()
            ),
            Error::NotLanded(failure) => {
                failure.request(f)?;
                f.write_str(" cannot have taken effect: ")?;
                failure.what(f)?;
                f.write_str("; the key is released, and the next call runs the body again")
            }
            Error::MayHaveLanded(failure) => {
                failure.request(f)?;
                f.write_str(" may have taken effect: ")?;
                failure.what(f)?;
                f.write_str(
                    "; the key is left in doubt: a rerun with the same key (in_doubt = \"rerun\") \
                     is deduplicated by the vendor, or settle it with a reconciler or `idem \
                     resolve`",
                )
            }
            Error::OtherIntent(failure) => {
                f.write_str("the vendor holds a different request under this key: ")?;
                failure.request(f)?;
                f.write_str(" ")?;
                failure.what(f)?;
                f.write_str(
                    "; the request differs from the one first sent under the key, so a part of \
                     it is not in the key (an argument marked #[idem(skip)], or state the body \
                     reads): put that part in the key, and settle this key (it stays in doubt) \
                     with `idem resolve`",
                )
            }
            Error::CannotTell(failure) => {
                f.write_str("the lookup ")?;
                failure.request(f)?;
                f.write_str(" cannot tell whether the effect landed: ")?;
                failure.what(f)
            }
        }
    }
}

/// The message already spells out the whole chain of causes (reqwest's own message names only
/// the URL, and an agent's model reads only the message), so `source` gives none;
/// [`Failure::cause`] gives it.
impl StdError for Error {}
