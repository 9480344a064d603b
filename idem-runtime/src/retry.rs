//! Retrying a safe tool with exponential backoff and jitter. The backoff itself comes from
//! `backon`; this module chooses its defaults, runs it for `idem::retry!`, and keeps the one
//! piece of bookkeeping `retry!` needs from the engine: whether an attempt failed on an idem
//! error that no attempt can fix.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{BlockingRetryable, ExponentialBuilder, Retryable};

use crate::error::Error;

thread_local! {
    /// The verdicts of the `retry!` attempts running on this thread, innermost last: a sync
    /// attempt is on it while it runs, an async one while it is polled, so that an engine error
    /// is noted on the attempt it belongs to however sync and async code nest.
    static ATTEMPTS: RefCell<Vec<Arc<AtomicBool>>> = const { RefCell::new(Vec::new()) };
}

/// Every error the engine hands its caller passes through here. It notes, for an enclosing
/// `idem::retry!`, whether calling again could help: an in-doubt key, arguments with no key or
/// a stored result that no longer fits stay as they are however often the call repeats, so
/// `retry!` returns them at once. The error's own type carries the error on, so the note travels
/// beside it, on the attempt's thread.
pub(crate) fn raise(error: Error) -> Error {
    if !error.is_retryable() {
        ATTEMPTS.with(|attempts| {
            if let Some(verdict) = attempts.borrow().last() {
                verdict.store(true, Ordering::SeqCst);
            }
        });
    }
    error
}

/// Keeps an attempt's verdict on this thread's stack while it runs, and pops it however that
/// ends (a panic included).
struct Attempting;

impl Attempting {
    fn enter(verdict: &Arc<AtomicBool>) -> Attempting {
        ATTEMPTS.with(|attempts| attempts.borrow_mut().push(Arc::clone(verdict)));
        Attempting
    }
}

impl Drop for Attempting {
    fn drop(&mut self) {
        ATTEMPTS.with(|attempts| attempts.borrow_mut().pop());
    }
}

/// Runs one sync attempt of `retry!`; returns its outcome and whether its error was final.
fn attempt_sync<R>(attempt: impl FnOnce() -> R) -> (R, bool) {
    let verdict = Arc::new(AtomicBool::new(false));
    let outcome = {
        let _attempting = Attempting::enter(&verdict);
        attempt()
    };
    (outcome, verdict.load(Ordering::SeqCst))
}

/// Runs one async attempt of `retry!`; returns its outcome and whether its error was final.
async fn attempt_async<F: Future>(attempt: F) -> (F::Output, bool) {
    let verdict = Arc::new(AtomicBool::new(false));
    let mut attempt = pin!(attempt);
    let outcome = poll_fn(|cx| {
        let _attempting = Attempting::enter(&verdict);
        attempt.as_mut().poll(cx)
    })
    .await;
    (outcome, verdict.load(Ordering::SeqCst))
}

/// How `idem::retry!` spaces its attempts: exponential backoff with full jitter.
///
/// The default waits about 100 ms, then 200 ms, 400 ms… up to 10 s between attempts, and gives
/// up after 5 retries (6 attempts), returning the last error.
///
/// ```
/// use std::time::Duration;
/// let patient = idem_runtime::Backoff::default()
///     .max_retries(10)
///     .min_delay(Duration::from_millis(50))
///     .max_delay(Duration::from_secs(30));
/// # let _ = patient;
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    min_delay: Duration,
    max_delay: Duration,
    factor: f32,
    max_retries: usize,
    jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
            factor: 2.0,
            max_retries: 5,
            jitter: true,
        }
    }
}

impl Backoff {
    /// The delay before the first retry.
    pub fn min_delay(mut self, delay: Duration) -> Self {
        self.min_delay = delay;
        self
    }

    /// The longest delay between two attempts.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How much each delay grows over the one before.
    pub fn factor(mut self, factor: f32) -> Self {
        self.factor = factor;
        self
    }

    /// How many times to call again after the first attempt fails.
    pub fn max_retries(mut self, retries: usize) -> Self {
        self.max_retries = retries;
        self
    }

    /// Waits exactly the computed delays. Jitter is on by default so that many callers who
    /// failed together do not retry together; turn it off only for deterministic tests.
    pub fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    fn builder(&self) -> ExponentialBuilder {
        let builder = ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_factor(self.factor)
            .with_max_times(self.max_retries);
        if self.jitter {
            builder.with_jitter()
        } else {
            builder
        }
    }
}

/// Calls `call` until it succeeds, `when` refuses its error, or `backoff` gives up; sleeps the
/// thread between attempts. Generated by `idem::retry!`; the macro has already checked that the
/// tool is safe to call again.
#[doc(hidden)]
pub fn retry_blocking<T, E>(
    backoff: &Backoff,
    mut when: impl FnMut(&E) -> bool,
    mut call: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let attempt = || match attempt_sync(&mut call) {
        (Err(e), true) => Err(Attempt::Final(e)),
        (Err(e), false) => Err(Attempt::Again(e)),
        (Ok(v), _) => Ok(v),
    };
    attempt
        .retry(backoff.builder())
        .when(|e: &Attempt<E>| matches!(e, Attempt::Again(e) if when(e)))
        .call()
        .map_err(Attempt::into_inner)
}

/// An attempt's error, and whether another attempt could change it.
enum Attempt<E> {
    /// idem's own error that stays until someone acts (in doubt, no key, a stale result).
    Final(E),
    /// Anything else: `when` decides.
    Again(E),
}

impl<E> Attempt<E> {
    fn into_inner(self) -> E {
        match self {
            Attempt::Final(e) | Attempt::Again(e) => e,
        }
    }
}

/// Like [`retry_blocking`] for an async tool; sleeps with tokio's timer between attempts.
#[doc(hidden)]
pub async fn retry_async<T, E, Fut>(
    backoff: &Backoff,
    mut when: impl FnMut(&E) -> bool,
    mut call: impl FnMut() -> Fut,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    let attempt = || {
        let attempt = attempt_async(call());
        async move {
            match attempt.await {
                (Err(e), true) => Err(Attempt::Final(e)),
                (Err(e), false) => Err(Attempt::Again(e)),
                (Ok(v), _) => Ok(v),
            }
        }
    };
    attempt
        .retry(backoff.builder())
        .when(|e: &Attempt<E>| matches!(e, Attempt::Again(e) if when(e)))
        .await
        .map_err(Attempt::into_inner)
}

/// Retry every error: the default of `idem::retry!`. A safe tool may be called again whatever
/// went wrong; pass `when = …` to stop early on errors that another attempt cannot fix. idem's
/// own errors that no attempt can fix (see [`Error::is_retryable`](crate::Error::is_retryable))
/// are returned at once whatever `when` says.
#[doc(hidden)]
pub fn retry_any<E>(_: &E) -> bool {
    true
}
