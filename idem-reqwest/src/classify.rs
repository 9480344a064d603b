//! What an HTTP outcome says about the effect: whether the vendor can have acted on the request.
//! The default table lives here, once; a request may override it ([`Keyed::classify`]).
//!
//! [`Keyed::classify`]: crate::Keyed::classify

use std::error::Error as StdError;
use std::sync::Arc;

use reqwest::StatusCode;

/// Whether a request's effect can have taken place at the vendor, as far as the client can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Landing {
    /// The vendor answered: `send` returns the response (by default every 2xx).
    Answered,
    /// The request cannot have taken effect (it never left, or the vendor refused it as
    /// invalid): the error releases the key when the body returns it, and the next call runs
    /// the body again.
    NotLanded,
    /// The request may have taken effect: [`may_have_landed`](idem_runtime::may_have_landed)
    /// is called, so the key is left in doubt when the body returns the error, and nothing runs
    /// twice.
    MayHaveLanded,
    /// The vendor holds another request under this key (a different payload): the key is left in
    /// doubt, since something did land under it, and the error says so.
    OtherIntent,
}

/// What came back from a request: a status, or an error before any status.
#[derive(Clone, Copy, Debug)]
pub struct Outcome<'a> {
    status: Option<StatusCode>,
    error: Option<&'a (dyn StdError + 'static)>,
}

impl<'a> Outcome<'a> {
    /// The vendor answered with `status`.
    pub fn status_code(status: StatusCode) -> Outcome<'static> {
        Outcome { status: Some(status), error: None }
    }

    /// No answer: sending failed with `error` (a `reqwest::Error`, or a middleware's error).
    pub fn failed(error: &'a (dyn StdError + 'static)) -> Outcome<'a> {
        Outcome { status: None, error: Some(error) }
    }

    /// The status the vendor answered, if it answered.
    pub fn status(&self) -> Option<StatusCode> {
        self.status
    }

    /// Why no answer came, if none came.
    pub fn error(&self) -> Option<&'a (dyn StdError + 'static)> {
        self.error
    }

    /// The reqwest error under [`error`](Self::error), found through its sources (a middleware
    /// wraps it).
    pub fn reqwest_error(&self) -> Option<&'a reqwest::Error> {
        let mut next = self.error;
        while let Some(error) = next {
            if let Some(found) = error.downcast_ref::<reqwest::Error>() {
                return Some(found);
            }
            next = error.source();
        }
        None
    }

    /// The default classification: the README's table ("Calling HTTP APIs").
    ///
    /// ```
    /// use idem_reqwest::{Landing, Outcome};
    /// use reqwest::StatusCode;
    ///
    /// let landing = |code: u16| Outcome::status_code(StatusCode::from_u16(code).unwrap()).default_landing();
    /// assert_eq!(landing(201), Landing::Answered);
    /// assert_eq!(landing(400), Landing::NotLanded);
    /// assert_eq!(landing(409), Landing::MayHaveLanded);
    /// assert_eq!(landing(422), Landing::OtherIntent);
    /// assert_eq!(landing(503), Landing::MayHaveLanded);
    /// ```
    pub fn default_landing(&self) -> Landing {
        match self.status {
            Some(status) => status_landing(status),
            None => match self.reqwest_error() {
                Some(error) => error_landing(error),
                // A middleware's own error: nothing says whether the request left.
                None => Landing::MayHaveLanded,
            },
        }
    }
}

/// What is known of the attempts behind one outcome.
#[derive(Debug)]
#[cfg_attr(not(feature = "middleware"), allow(dead_code))] // Only a middleware makes the others.
pub(crate) enum AttemptsKnown {
    /// The outcome is that of the only attempt (reqwest's own client).
    One,
    /// A middleware ran them, and the `Attempts` middleware recorded each one's landing, in order.
    Recorded(Vec<Landing>),
    /// A middleware ran them, unseen: one may have been retried after it had landed.
    Unseen,
}

/// The landing of a request that came to `last` after `attempts`: if any attempt may have landed,
/// the request may have, whatever the last one came to (a retry refused at the door, 429, after
/// a first attempt timed out does not undo the first).
pub(crate) fn over_attempts(last: Landing, attempts: &AttemptsKnown) -> Landing {
    let earlier_may_have = match attempts {
        AttemptsKnown::One => false,
        AttemptsKnown::Recorded(landings) => {
            landings.iter().any(|landing| *landing != Landing::NotLanded)
        }
        AttemptsKnown::Unseen => true,
    };
    if last == Landing::NotLanded && earlier_may_have {
        Landing::MayHaveLanded
    } else {
        last
    }
}

/// The landing of a request the vendor redirected, from the landing of what came after (a later
/// hop's answer or error, or the redirect itself when it was not followed). The redirect was the
/// vendor's answer to the request, so the vendor received it: nothing after can prove it did not
/// act. A redirect that comes back unfollowed (`is_redirect_answer`) is not its answer either,
/// whatever a classifier says.
pub(crate) fn after_redirect(landing: Landing, is_redirect_answer: bool) -> Landing {
    match landing {
        Landing::NotLanded => Landing::MayHaveLanded,
        Landing::Answered if is_redirect_answer => Landing::MayHaveLanded,
        other => other,
    }
}

/// A per-request override of the classification: `None` keeps the default.
pub(crate) type Classifier = Arc<dyn Fn(&Outcome<'_>) -> Option<Landing> + Send + Sync>;

/// `outcome`'s landing: the override's, else the default.
pub(crate) fn classified(classify: Option<&Classifier>, outcome: &Outcome<'_>) -> Landing {
    classify.and_then(|classify| classify(outcome)).unwrap_or_else(|| outcome.default_landing())
}

/// The default for an answer.
fn status_landing(status: StatusCode) -> Landing {
    match status.as_u16() {
        200..=299 => Landing::Answered,
        // Request Timeout: the vendor gave up reading, perhaps after acting on part of it.
        408 => Landing::MayHaveLanded,
        // Conflict: a deduplicating vendor is still running the first request under this key.
        409 => Landing::MayHaveLanded,
        // Unprocessable: the IETF draft's answer to a key reused with another payload.
        422 => Landing::OtherIntent,
        // Every other 4xx refuses the request before acting on it (400, 401, 403, 404, 429…).
        400..=499 => Landing::NotLanded,
        // 5xx: the vendor failed somewhere, perhaps after it committed. A 3xx that reaches here
        // is a redirect not followed, so the vendor had the request; a 1xx says nothing.
        _ => Landing::MayHaveLanded,
    }
}

/// The default for a request that got no answer. Only what reqwest can prove happened before the
/// first byte of the request was written counts as not landed.
fn error_landing(error: &reqwest::Error) -> Landing {
    if error.is_builder() || error.is_connect() {
        // The request was never built, or no connection came up: DNS, a refused or timed-out
        // connect (`connect_timeout`), a TLS handshake or a proxy's CONNECT that failed.
        Landing::NotLanded
    } else {
        // A timeout of the whole request (`timeout`, `read_timeout`), a reset or a closed
        // connection, a failed redirect: reqwest reports them alike whether they struck while
        // the request was being written or after the vendor had read it. In doubt is the side
        // that never runs an effect twice.
        Landing::MayHaveLanded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn landing(code: u16) -> Landing {
        Outcome::status_code(StatusCode::from_u16(code).unwrap()).default_landing()
    }

    #[test]
    fn the_status_table_is_the_readmes() {
        for code in [200, 201, 202, 204] {
            assert_eq!(landing(code), Landing::Answered, "{code}");
        }
        for code in [400, 401, 403, 404, 405, 410, 415, 429] {
            assert_eq!(landing(code), Landing::NotLanded, "{code}");
        }
        for code in [408, 409, 500, 502, 503, 504, 302, 307] {
            assert_eq!(landing(code), Landing::MayHaveLanded, "{code}");
        }
        assert_eq!(landing(422), Landing::OtherIntent);
    }

    #[test]
    fn an_attempt_that_may_have_landed_is_not_undone_by_a_later_refusal() {
        use Landing::*;
        let recorded = |landings: &[Landing]| AttemptsKnown::Recorded(landings.to_vec());
        assert_eq!(over_attempts(NotLanded, &AttemptsKnown::One), NotLanded);
        assert_eq!(over_attempts(NotLanded, &recorded(&[NotLanded, NotLanded])), NotLanded);
        assert_eq!(over_attempts(NotLanded, &recorded(&[MayHaveLanded, NotLanded])), MayHaveLanded);
        assert_eq!(over_attempts(NotLanded, &AttemptsKnown::Unseen), MayHaveLanded);
        assert_eq!(over_attempts(Answered, &recorded(&[MayHaveLanded, Answered])), Answered);
        assert_eq!(over_attempts(OtherIntent, &AttemptsKnown::Unseen), OtherIntent);
    }

    #[test]
    fn a_redirect_is_never_not_landed_nor_an_answer_when_unfollowed() {
        use Landing::*;
        assert_eq!(after_redirect(NotLanded, false), MayHaveLanded);
        assert_eq!(after_redirect(NotLanded, true), MayHaveLanded);
        assert_eq!(after_redirect(Answered, false), Answered, "a followed hop's 2xx");
        assert_eq!(after_redirect(Answered, true), MayHaveLanded, "a classifier's 3xx");
        assert_eq!(after_redirect(OtherIntent, false), OtherIntent);
    }

    #[test]
    fn an_error_that_is_not_reqwests_is_in_doubt() {
        let error = std::io::Error::other("a middleware gave up");
        assert_eq!(Outcome::failed(&error).default_landing(), Landing::MayHaveLanded);
    }
}
