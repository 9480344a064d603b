//! The store's own tokio runtime, and the handles its callers hold on its tasks.
//!
//! Store futures run on any executor (the sync engine parks a plain thread), so the I/O cannot
//! rely on an ambient runtime: it runs here, and callers await a join handle.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use idem_runtime::{StoreError, StoreFuture};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The store's own tokio runtime. Shut down in the background when the store goes, so that
/// dropping a store inside a user's async runtime never panics.
pub(crate) struct OwnRuntime(Option<Runtime>);

impl OwnRuntime {
    pub(crate) fn new() -> Result<OwnRuntime, StoreError> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("idem-postgres")
            .enable_all()
            .build()
            .map(|rt| OwnRuntime(Some(rt)))
            .map_err(|e| StoreError::with_source("cannot start the PostgreSQL store's runtime", e))
    }

    pub(crate) fn handle(&self) -> &Handle {
        self.0.as_ref().expect("the runtime lives as long as the store").handle()
    }

    pub(crate) fn spawn<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> Joined<T> {
        Joined { task: self.handle().spawn(task), abort_on_drop: true }
    }

    /// Runs a store operation on the runtime and hands back a future any executor can await.
    pub(crate) fn spawn_store<T: Send + 'static>(
        &self,
        task: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> StoreFuture<'static, T> {
        let joined = self.spawn(task);
        Box::pin(async move { joined.await? })
    }

    /// Like [`OwnRuntime::spawn_store`] for a write: the write runs to its end even when the
    /// caller stops waiting. A statement already sent may commit anyway, so cancelling would
    /// only hide its outcome from the store (and from the writes that must follow it).
    pub(crate) fn spawn_write<T: Send + 'static>(
        &self,
        task: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> StoreFuture<'static, T> {
        let joined = Joined { task: self.handle().spawn(task), abort_on_drop: false };
        Box::pin(async move { joined.await? })
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// A task on the store's runtime; dropping it cancels the task (a waiter that gave up) unless it
/// is a write.
pub(crate) struct Joined<T> {
    task: JoinHandle<T>,
    abort_on_drop: bool,
}

impl<T> Future for Joined<T> {
    type Output = Result<T, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.task).poll(cx).map(|joined| {
            joined.map_err(|e| {
                StoreError::with_source(
                    "PostgreSQL store: the operation was cancelled or panicked",
                    e,
                )
            })
        })
    }
}

impl<T> Drop for Joined<T> {
    fn drop(&mut self) {
        if self.abort_on_drop {
            self.task.abort();
        }
    }
}

/// The writes in progress, by the owner they write as, so that a write goes out only after
/// those of the owner it replaces that began before it: otherwise the compensating delete of a
/// cancelled reservation (sent from `Drop`) can reach the server before the insert it undoes, and
/// leave that insert behind. Dropping the store waits a moment for them (see [`Writes::wait_idle`]).
#[derive(Default)]
pub(crate) struct Writes {
    by_owner: Mutex<HashMap<String, watch::Sender<Started>>>,
    /// Told when the last write in progress ends.
    idle: Condvar,
}

/// One owner's writes: how many began (each one's number), and the numbers of those in progress.
#[derive(Default)]
pub(crate) struct Started {
    next: u64,
    running: Vec<u64>,
}

/// One write in progress; dropping it says the write has ended.
pub(crate) struct WriteGuard {
    writes: Arc<Writes>,
    owner: String,
    number: u64,
}

impl Writes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<Started>>> {
        self.by_owner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A write as `owner` begins.
    pub(crate) fn start(self: &Arc<Self>, owner: &str) -> WriteGuard {
        let mut number = 0;
        self.lock()
            .entry(owner.to_owned())
            .or_insert_with(|| watch::channel(Started::default()).0)
            .send_modify(|started| {
                number = started.next;
                started.next += 1;
                started.running.push(number);
            });
        WriteGuard { writes: Arc::clone(self), owner: owner.to_owned(), number }
    }

    /// Resolves once every write as `owner` that began before this call has ended (not those
    /// that begin after it, such as the caller's own).
    pub(crate) fn settled(&self, owner: &str) -> impl Future<Output = ()> + Send + 'static {
        let watching =
            self.lock().get(owner).map(|started| (started.borrow().next, started.subscribe()));
        async move {
            if let Some((before, mut watching)) = watching {
                // An error means every write ended and the entry went: settled too.
                let _ =
                    watching.wait_for(|started| started.running.iter().all(|&n| n >= before)).await;
            }
        }
    }

    /// Waits, at most `at_most`, until no write is in progress (for a store being dropped on a
    /// thread that may block, so that a write sent from a `Drop` path a moment before lands);
    /// whether none is.
    pub(crate) fn wait_idle(&self, at_most: Duration) -> bool {
        let waited =
            self.idle.wait_timeout_while(self.lock(), at_most, |by_owner| !by_owner.is_empty());
        let (by_owner, _) = waited.unwrap_or_else(|e| e.into_inner());
        by_owner.is_empty()
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let mut by_owner = self.writes.lock();
        let Some(started) = by_owner.get(&self.owner) else { return };
        started.send_modify(|started| started.running.retain(|&n| n != self.number));
        if started.borrow().running.is_empty() {
            by_owner.remove(&self.owner);
            if by_owner.is_empty() {
                self.writes.idle.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::Writes;

    #[test]
    fn a_settling_write_waits_for_the_owners_writes_in_progress() {
        let writes = Arc::new(Writes::default());
        let first = writes.start("o#1");
        let second = writes.start("o#1");
        let other = writes.start("o#2");
        let mut settled = Box::pin(writes.settled("o#1"));
        assert!(!poll_once(&mut settled), "two writes in progress");
        drop(first);
        assert!(!poll_once(&mut settled), "one write in progress");
        drop(second);
        assert!(poll_once(&mut settled), "none in progress; another owner's write does not count");
        drop(other);
        assert!(
            poll_once(&mut Box::pin(writes.settled("o#3"))),
            "an owner with no writes is settled"
        );
        let late = writes.start("o#1");
        let mut before_late = Box::pin(writes.settled("o#1"));
        assert!(!poll_once(&mut before_late), "a write that began before the wait is waited for");
        let own = writes.start("o#1");
        drop(late);
        assert!(poll_once(&mut before_late), "a write that began after the wait is not");
        drop(own);
    }

    #[test]
    fn the_store_waits_for_every_write_in_progress_and_no_longer() {
        let writes = Arc::new(Writes::default());
        assert!(writes.wait_idle(Duration::ZERO), "no write yet");
        let (first, second) = (writes.start("o#1"), writes.start("o#2"));
        let began = Instant::now();
        assert!(!writes.wait_idle(Duration::from_millis(20)), "two writes in progress");
        assert!(began.elapsed() >= Duration::from_millis(20));
        let ending = std::thread::spawn(move || {
            drop(first);
            drop(second);
        });
        assert!(writes.wait_idle(Duration::from_secs(60)), "both ended");
        ending.join().unwrap();
    }

    fn poll_once<F: std::future::Future<Output = ()>>(future: &mut std::pin::Pin<Box<F>>) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        future.as_mut().poll(&mut cx).is_ready()
    }
}
