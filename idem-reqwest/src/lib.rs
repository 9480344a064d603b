//! # idem-agent-reqwest: HTTP calls from idem's idempotent tools
//!
//! Most tools an agent calls are HTTP APIs, and the vendors that matter deduplicate a request by
//! an idempotency key. This crate makes a reqwest request carry the key of the idempotent call it
//! is sent from, and tells that call what a failure means for its effect, so that the tool's
//! body needs neither a hand-written header nor a hand-written
//! [`may_have_landed`](idem_runtime::may_have_landed):
//!
//! ```no_run
//! use idem_reqwest::IdempotentRequest;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Charge {
//!     id: String,
//! }
//!
//! #[derive(Debug)]
//! enum PayError {
//!     Http(idem_reqwest::Error),
//!     Idem(idem::Error),
//! }
//! impl From<idem_reqwest::Error> for PayError {
//!     fn from(error: idem_reqwest::Error) -> Self {
//!         PayError::Http(error)
//!     }
//! }
//! impl From<idem::Error> for PayError {
//!     fn from(error: idem::Error) -> Self {
//!         PayError::Idem(error)
//!     }
//! }
//!
//! /// The client the tool sends with: a keyed request does not follow a redirect to another origin.
//! fn payments_client() -> reqwest::Client {
//!     reqwest::Client::builder().redirect(idem_reqwest::redirect_policy()).build().expect("the client builds")
//! }
//!
//! #[idem::idempotent(scope = "order", in_doubt = "rerun")]
//! async fn charge_card(#[idem(skip)] http: &reqwest::Client, amount: u64, order: &str) -> Result<Charge, PayError> {
//!     let body = serde_json::json!({ "amount": amount, "order": order });
//!     // The key goes out as `Idempotency-Key`; a timeout, a reset or a 5xx leaves it in doubt,
//!     // a refused connection or a 400 releases it.
//!     Ok(http.post("https://api.example.com/v1/charges").json(&body).idempotent().send_json().await?)
//! }
//! ```
//!
//! - [`IdempotentRequest::idempotent`] makes a request builder (reqwest's, or
//!   reqwest-middleware's with the `middleware` feature) a [`Keyed`] request:
//!   [`Keyed::key_header`] names another header (`PayPal-Request-Id`), [`Keyed::key_in_body`]
//!   sends none (the body holds [`current_key`](idem_runtime::current_key)), and
//!   [`Keyed::classify`] overrides the classification for one request.
//! - [`Landing`] is the classification; [`Outcome::default_landing`] is the default table.
//! - [`Error`] says what became of the key; convert it into the tool's error with `From`.
//! - [`lookup`] is a reconciler's lookup by key: found, not found, or cannot tell.
//! - [`redirect_policy`] is the redirect policy of the client that sends keyed requests: a
//!   redirect to another origin is not followed, so the key and the request's credentials stay
//!   with the vendor.
//!
//! A request the vendor redirected reached it: whatever came after (a 404 at the redirect's
//! target, or, through a client with [`redirect_policy`], a refused connection there) leaves the
//! key in doubt, never releases it, and a 3xx is never the answer. An answer from another origin
//! than the request's (a client built without [`redirect_policy`] followed a redirect there) is
//! never taken as the vendor's: the key is left in doubt and the error says what to do.
//!
//! A keyed request sent outside an idempotent call (no call, a `#[read]` tool, a `#[write]` one)
//! is not sent: it fails with [`Error::OutsideCall`]. The README's "Calling HTTP APIs" has the
//! classification table, the vendors' header names, and what a client can and cannot tell.
//!
//! ## Features
//!
//! - `middleware`: `.idempotent()` on `reqwest_middleware::RequestBuilder`. The header is set
//!   once, before the middleware runs, so that a retry middleware's every attempt carries the
//!   same key. This crate's `Attempts` middleware, added innermost, sees each attempt, so that a
//!   refusal at the last one releases the key only when no attempt before it may have landed.
//! - `rmcp`: `From<Error>` for rmcp's `ErrorData`, so that an rmcp tool ends a request with `?`.
//!   A router under `#[idem::tools]` answers it as a tool result with `isError: true` that tells
//!   the model what happened and whether to call again: a refusal it has to fix, a vendor it could
//!   not reach (call again later), or an effect that may have landed (do not call again).

// docs.rs (`--cfg docsrs`, nightly) marks each item that a feature gates with that feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "middleware")]
mod attempts;
mod classify;
mod error;
mod lookup;
#[cfg(feature = "rmcp")]
mod mcp;
mod redirect;
mod request;

#[cfg(feature = "middleware")]
pub use attempts::Attempts;
pub use classify::{Landing, Outcome};
pub use error::{Error, Failure};
pub use lookup::lookup;
pub use redirect::redirect_policy;
pub use request::{IdempotentRequest, Keyed, IDEMPOTENCY_KEY};
