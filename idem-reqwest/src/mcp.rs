//! idem-reqwest's errors as rmcp's `ErrorData` (the `rmcp` feature), so that an rmcp tool's body
//! can end a request with `?` and the model still reads what happened.
//!
//! An rmcp router under `#[idem::tools]` (or passed through `idem::mcp::annotate`) answers an
//! `ErrorData` whose `data` has an `idem.error` kind as a tool result with `isError: true`, with
//! a text that tells the model what to do next. The kinds this crate adds are
//! `not-landed`, `may-have-landed`, `other-intent`, `outside-call` and `cannot-tell`; `data`
//! also carries the vendor's status and the request's URL, where there are some.

use reqwest::StatusCode;
use rmcp::model::ErrorCode;
use rmcp::ErrorData;

use crate::error::Error;

impl From<Error> for ErrorData {
    /// A vendor's refusal (a 4xx the default table reads as not landed) is the caller's to fix
    /// (`invalid_params`); everything else is the server's (`internal_error`). The message is
    /// the error's own, which names the request and its key; `data.idem` carries the kind, the
    /// key, whether calling again unchanged can help, and the status and URL.
    fn from(error: Error) -> Self {
        let refused = refused(&error);
        let code = if refused { ErrorCode::INVALID_PARAMS } else { ErrorCode::INTERNAL_ERROR };
        let failure = error.failure();
        let mut idem = serde_json::json!({
            "error": kind(&error),
            "key": failure.and_then(|failure| failure.key()).map(|key| key.as_str()),
            "retryable": retryable(&error),
        });
        if let Some(status) = error.status() {
            idem["status"] = status.as_u16().into();
        }
        let url = match &error {
            Error::OutsideCall { url, .. } => Some(url.as_str()),
            other => other.failure().map(|failure| failure.url()),
        };
        idem["url"] = url.into();
        ErrorData::new(code, error.to_string(), Some(serde_json::json!({ "idem": idem })))
    }
}

/// The kind the model's text is chosen by: one per variant, spelled as idem's own kinds are.
fn kind(error: &Error) -> &'static str {
    match error {
        Error::OutsideCall { .. } => "outside-call",
        Error::NotLanded(_) => "not-landed",
        Error::MayHaveLanded(_) => "may-have-landed",
        Error::OtherIntent(_) => "other-intent",
        Error::CannotTell(_) => "cannot-tell",
    }
}

/// Whether the vendor answered and refused the request for what it is: the same request gets
/// the same answer, so calling again unchanged cannot help.
fn refused(error: &Error) -> bool {
    matches!(error, Error::NotLanded(_))
        && error.status().is_some_and(|status| {
            status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS
        })
}

/// Whether calling again with the same arguments can help: only for a request that cannot have
/// taken effect and that the vendor did not refuse (it was never sent, could not connect, or was
/// told to slow down). An effect that may have landed is never retried on the model's word.
fn retryable(error: &Error) -> bool {
    matches!(error, Error::NotLanded(_)) && !refused(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Failure;

    fn failure(status: Option<u16>) -> Failure {
        Failure {
            key: None,
            method: Some(reqwest::Method::POST),
            url: "https://vendor.example/v1/cases".into(),
            status: status.map(|code| StatusCode::from_u16(code).expect("a status")),
            body: "amount must be positive".into(),
            source: None,
            redirect: None,
        }
    }

    #[test]
    fn each_error_names_its_kind_and_whether_calling_again_can_help() {
        for (error, kind, retryable, code) in [
            (Error::NotLanded(failure(Some(400))), "not-landed", false, ErrorCode::INVALID_PARAMS),
            (Error::NotLanded(failure(Some(429))), "not-landed", true, ErrorCode::INTERNAL_ERROR),
            (Error::NotLanded(failure(None)), "not-landed", true, ErrorCode::INTERNAL_ERROR),
            (
                Error::MayHaveLanded(failure(None)),
                "may-have-landed",
                false,
                ErrorCode::INTERNAL_ERROR,
            ),
            (
                Error::OtherIntent(failure(Some(422))),
                "other-intent",
                false,
                ErrorCode::INTERNAL_ERROR,
            ),
        ] {
            let status = error.status().map(|status| status.as_u16());
            let message = error.to_string();
            let data = ErrorData::from(error);
            assert_eq!(data.code, code, "{kind}");
            assert_eq!(data.message, message, "the message is the error's own");
            let idem = &data.data.expect("data")["idem"];
            assert_eq!(idem["error"], kind);
            assert_eq!(idem["retryable"], retryable, "{kind} {status:?}");
            assert_eq!(idem["status"].as_u64(), status.map(u64::from));
            assert_eq!(idem["url"], "https://vendor.example/v1/cases");
        }
    }

    #[test]
    fn a_request_sent_outside_a_call_says_so() {
        let error = Error::OutsideCall { method: None, url: "https://vendor.example/x".into() };
        let data = ErrorData::from(error);
        let idem = &data.data.expect("data")["idem"];
        assert_eq!(idem["error"], "outside-call");
        assert_eq!(idem["retryable"], false);
        assert_eq!(idem["key"], serde_json::Value::Null);
        assert_eq!(idem["url"], "https://vendor.example/x");
    }
}
