//! What the body of a running call can reach: its key, its fencing token, and a way to say
//! that its effect may have landed.
//!
//! One stack per thread holds the calls whose bodies are running on it, innermost last. A sync
//! body is on it while it runs; an async body while it is polled (it joins the stack of
//! whichever thread polls it, for the length of that poll). Calls nest on a thread in the order
//! they run, whatever mixes them (a sync call in an async body, an async call driven by
//! `block_on` in a sync body), so the top of the stack is always the innermost call. Work moved
//! to another thread (`spawn_blocking`, `tokio::spawn`) sees no call: read the key first and
//! move it in.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::key::Key;

/// The running call as its body sees it.
#[derive(Clone)]
pub(crate) struct Current {
    key: Key,
    token: u64,
    may_have_landed: Arc<AtomicBool>,
}

impl Current {
    /// The call of `key`, whose owner the store gave fencing token `token`.
    pub(crate) fn new(key: &Key, token: u64) -> Current {
        Current { key: key.clone(), token, may_have_landed: Arc::default() }
    }

    /// Whether the body said its effect may have landed.
    pub(crate) fn may_have_landed(&self) -> bool {
        self.may_have_landed.load(Ordering::SeqCst)
    }

    /// Runs an async body with this call as the innermost one while each poll lasts.
    pub(crate) async fn enter_async<F: Future>(&self, body: F) -> F::Output {
        let mut body = pin!(body);
        poll_fn(|cx| {
            let _scope = Running::enter(self);
            body.as_mut().poll(cx)
        })
        .await
    }
}

thread_local! {
    static RUNNING: RefCell<Vec<Current>> = const { RefCell::new(Vec::new()) };
}

/// The innermost idempotent call whose body is running on this thread.
fn current() -> Option<Current> {
    RUNNING.with(|calls| calls.borrow().last().cloned())
}

/// The key of the idempotent call whose body is running, if any.
pub fn try_current_key() -> Option<Key> {
    current().map(|call| call.key)
}

/// The fencing token of the idempotent call whose body is running, if any (see
/// [`fencing_token`]).
pub fn try_fencing_token() -> Option<u64> {
    current().map(|call| call.token)
}

/// The fencing token of the idempotent call whose body is running: a number the store gave
/// this call when it became the key's owner, greater than that of every earlier owner of the
/// key (after a takeover, a release, a purge, and across restarts). Send it with the effect to a
/// system of record that keeps the highest token it has seen per key and refuses a write that
/// carries a lower one: an owner that was paused past its lease, while the key moved on to
/// another owner, then has its late write refused there (see the README, "Fencing tokens").
///
/// # Panics
///
/// Outside the body of an idempotent call; use [`try_fencing_token`] to ask without
/// panicking. As with [`current_key`], work moved to another thread does not inherit it.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// # let store: std::sync::Arc<dyn idem_runtime::Store> =
/// #     std::sync::Arc::new(idem_runtime::MemoryStore::new());
/// use idem_runtime::{Call, Error};
///
/// let call = || Call::new("charge_card", "order-17", &4200).map(|c| c.store(store.clone()));
/// let first: Result<u64, Error> = call()?.run(|| {
///     let token = idem_runtime::fencing_token();
///     Err(Error::Key { tool: "charge_card".into(), reason: format!("declined ({token})") })
/// });
/// assert!(first.is_err(), "released: nothing landed");
/// let second: u64 = call()?.run(|| Ok::<_, Error>(idem_runtime::fencing_token()))?;
/// assert!(second > 1, "a later owner of the key holds a greater token");
/// # Ok(()) }
/// ```
pub fn fencing_token() -> u64 {
    try_fencing_token().expect(
        "idem::fencing_token() called outside an idempotent call: call it inside the body of an \
         #[idempotent] function or Call::run, or use idem::try_fencing_token()",
    )
}

/// Says, from inside the body, that the effect may have landed although the body is about to
/// return `Err`: the key is then left in doubt instead of released, so that no retry runs the
/// effect a second time.
///
/// Call it where the outcome is unknown: a request was sent and its answer timed out or the
/// connection dropped. Without it an `Err` means "nothing landed" and the next call runs the
/// body again. Returns `false` (and does nothing) outside the body of an idempotent call.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// # let store: std::sync::Arc<dyn idem_runtime::Store> =
/// #     std::sync::Arc::new(idem_runtime::MemoryStore::new());
/// use idem_runtime::{Call, Error};
///
/// let outcome: Result<String, Error> = Call::new("charge_card", "order-17", &4200)?
///     .store(store.clone())
///     .run(|| {
///         // … the request went out, and its answer timed out:
///         idem_runtime::may_have_landed();
///         Err(Error::Key { tool: "charge_card".into(), reason: "timed out".into() })
///     });
/// assert!(outcome.is_err());
/// let again: Result<String, Error> = Call::new("charge_card", "order-17", &4200)?
///     .store(store)
///     .run(|| Ok("ch_2".to_string()));
/// assert!(matches!(again, Err(Error::InDoubt { .. })), "not run a second time");
/// # Ok(()) }
/// ```
pub fn may_have_landed() -> bool {
    match current() {
        Some(call) => {
            call.may_have_landed.store(true, Ordering::SeqCst);
            true
        }
        None => {
            tracing::warn!("idem::may_have_landed() called outside an idempotent call: ignored");
            false
        }
    }
}

/// The key of the idempotent call whose body is running: send it to the vendor as its
/// idempotency key, so that a rerun after a crash is deduplicated there too.
///
/// # Panics
///
/// Outside the body of an idempotent call (there is no key there); use [`try_current_key`] to
/// ask without panicking. In a call made from another call's body, it is the inner call's key. A
/// task spawned from the body, or work moved to `spawn_blocking`, runs elsewhere and does not
/// inherit the key: read it first and move it in.
pub fn current_key() -> Key {
    try_current_key().expect(
        "idem::current_key() called outside an idempotent call: call it inside the body of an \
         #[idempotent] function or Call::run, or use idem::try_current_key()",
    )
}

/// Keeps a call on this thread's stack while its body runs (or is polled), and pops it however
/// that ends (a panic included).
struct Running;

impl Running {
    fn enter(call: &Current) -> Running {
        RUNNING.with(|calls| calls.borrow_mut().push(call.clone()));
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|calls| calls.borrow_mut().pop());
    }
}
