//! Group commit: one thread makes writes durable, and every caller that asked before a sync
//! started is answered by that one sync. Concurrent calls share their fsyncs; no caller is told
//! a write is durable before a sync that began after the write has finished.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use crate::error::StoreError;

/// What one durable point does (flush sled, then sync its data file).
pub(crate) type SyncFn = Box<dyn FnMut() -> Result<(), String> + Send>;

#[derive(Default)]
struct State {
    /// Highest generation asked for.
    requested: u64,
    /// Highest generation whose sync has finished (well or badly).
    finished: u64,
    /// Generation ranges whose sync failed, newest last, with the reason.
    failures: VecDeque<(u64, u64, String)>,
    wakers: Vec<Waker>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wanted: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) struct Syncer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    pub(crate) fn start(name: &str, mut sync: SyncFn) -> std::io::Result<Syncer> {
        let shared =
            Arc::new(Shared { state: Mutex::new(State::default()), wanted: Condvar::new() });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || loop {
            let target = {
                let mut state = worker.lock();
                while state.requested == state.finished && !state.shutdown {
                    state = worker.wanted.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                if state.requested == state.finished {
                    return;
                }
                state.requested
            };
            let outcome = sync();
            let wakers = {
                let mut state = worker.lock();
                if let Err(reason) = outcome {
                    let from = state.finished + 1;
                    state.failures.push_back((from, target, reason));
                    if state.failures.len() > 64 {
                        state.failures.pop_front();
                    }
                }
                state.finished = target;
                std::mem::take(&mut state.wakers)
            };
            wakers.into_iter().for_each(Waker::wake);
        })?;
        Ok(Syncer { shared, thread: Some(thread) })
    }

    /// A ticket that completes once everything written before this call is durable.
    pub(crate) fn request(&self) -> Ticket {
        let mut state = self.shared.lock();
        state.requested += 1;
        let generation = state.requested;
        drop(state);
        self.shared.wanted.notify_one();
        Ticket { shared: Arc::clone(&self.shared), generation }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wanted.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub(crate) struct Ticket {
    shared: Arc<Shared>,
    generation: u64,
}

impl Future for Ticket {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.shared.lock();
        if state.finished < self.generation {
            state.wakers.push(cx.waker().clone());
            return Poll::Pending;
        }
        let failed =
            state.failures.iter().find(|(from, to, _)| (*from..=*to).contains(&self.generation));
        match failed {
            Some((_, _, reason)) => Poll::Ready(Err(StoreError::new(format!(
                "the store could not make a write durable ({reason}); check the disk and retry"
            )))),
            None => Poll::Ready(Ok(())),
        }
    }
}
