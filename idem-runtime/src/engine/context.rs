//! What the body of a running call can reach: its key, and a way to say that its effect may
//! have landed. Async bodies find it in a task-local, sync bodies on a per-thread stack.

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::key::Key;

/// The running call as its body sees it.
#[derive(Clone)]
pub(crate) struct Current {
    key: Key,
    may_have_landed: Arc<AtomicBool>,
}

impl Current {
    pub(crate) fn new(key: &Key) -> Current {
        Current { key: key.clone(), may_have_landed: Arc::default() }
    }

    /// Whether the body said its effect may have landed.
    pub(crate) fn may_have_landed(&self) -> bool {
        self.may_have_landed.load(Ordering::SeqCst)
    }

    /// Runs a sync body with this call as the innermost one on this thread.
    pub(crate) fn enter_sync<R>(&self, body: impl FnOnce() -> R) -> R {
        let _scope = SyncCallScope::enter(self);
        body()
    }

    /// Runs an async body with this call as the innermost one of its task.
    pub(crate) async fn enter_async<F: Future>(&self, body: F) -> F::Output {
        ASYNC_CALL.scope(self.clone(), body).await
    }
}

tokio::task_local! {
    static ASYNC_CALL: Current;
}

thread_local! {
    static SYNC_CALLS: RefCell<Vec<Current>> = const { RefCell::new(Vec::new()) };
}

/// The innermost idempotent call whose body is running on this task or thread.
fn current() -> Option<Current> {
    ASYNC_CALL
        .try_with(Current::clone)
        .ok()
        .or_else(|| SYNC_CALLS.with(|calls| calls.borrow().last().cloned()))
}

/// The key of the idempotent call whose body is running, if any.
pub fn try_current_key() -> Option<Key> {
    current().map(|call| call.key)
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
/// # let dir = tempfile::tempdir().unwrap();
/// # let store: std::sync::Arc<dyn idem_runtime::Store> =
/// #     std::sync::Arc::new(idem_runtime::SledStore::open(dir.path())?);
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
/// ask without panicking. A task spawned from the body does not inherit the key: read it first
/// and move it in.
pub fn current_key() -> Key {
    try_current_key().expect(
        "idem::current_key() called outside an idempotent call: call it inside the body of an \
         #[idempotent] function or Call::run, or use idem::try_current_key()",
    )
}

/// Keeps a sync call on this thread's stack while its body runs, and pops it however the body
/// ends (a panic included).
struct SyncCallScope;

impl SyncCallScope {
    fn enter(call: &Current) -> SyncCallScope {
        SYNC_CALLS.with(|calls| calls.borrow_mut().push(call.clone()));
        SyncCallScope
    }
}

impl Drop for SyncCallScope {
    fn drop(&mut self) {
        SYNC_CALLS.with(|calls| calls.borrow_mut().pop());
    }
}
