//! Seeing each attempt a retry middleware makes, so that a refusal at the last attempt does not
//! hide an earlier one that may have landed.

use std::sync::{Arc, Mutex};

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::classify::{classified, Classifier, Landing, Outcome};

/// A reqwest-middleware middleware that records what each attempt of a keyed request came to.
/// Add it last (innermost), below a retry middleware:
///
/// ```
/// # let retry_policy = reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(3);
/// # let client = reqwest::Client::builder().redirect(idem_reqwest::redirect_policy()).build().unwrap();
/// let http = reqwest_middleware::ClientBuilder::new(client) // built with `redirect_policy()`
///     .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(retry_policy))
///     .with(idem_reqwest::Attempts)
///     .build();
/// ```
///
/// Without it, a keyed request sent through a middleware cannot know whether an attempt before
/// the last one may have landed, so a last attempt that could not have landed (a refused
/// connection, a 429) leaves the key in doubt rather than release it. With it, only a request all
/// of whose attempts could not have landed releases the key. Requests that are not keyed pass
/// through untouched.
#[derive(Clone, Copy, Debug, Default)]
pub struct Attempts;

/// The record a keyed request leaves in its extensions for [`Attempts`] to fill.
#[derive(Clone)]
pub(crate) struct AttemptLog {
    landings: Arc<Mutex<Vec<Landing>>>,
    classify: Option<Classifier>,
}

impl AttemptLog {
    pub(crate) fn new(classify: Option<Classifier>) -> AttemptLog {
        AttemptLog { landings: Arc::default(), classify }
    }

    /// The landings recorded so far, in order.
    pub(crate) fn landings(&self) -> Vec<Landing> {
        self.landings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Records an attempt's `outcome`; `redirected` when the vendor redirected that attempt.
    fn record(&self, outcome: &Outcome<'_>, redirected: bool) {
        let mut landing = classified(self.classify.as_ref(), outcome);
        if redirected {
            let is_redirect = outcome.status().is_some_and(|status| status.is_redirection());
            landing = crate::classify::after_redirect(landing, is_redirect);
        }
        self.landings.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(landing);
    }
}

#[async_trait::async_trait]
impl Middleware for Attempts {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let sent = request.url().clone();
        let result = next.run(request, extensions).await;
        if let Some(log) = extensions.get::<AttemptLog>() {
            match &result {
                Ok(response) => log.record(
                    &Outcome::status_code(response.status()),
                    crate::redirect::was_redirected(response, &sent),
                ),
                Err(reqwest_middleware::Error::Reqwest(error)) => {
                    log.record(&Outcome::failed(error), false)
                }
                Err(error) => log.record(&Outcome::failed(error), false),
            }
        }
        result
    }
}
