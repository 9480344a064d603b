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
    /// Writes applied (or being applied) whose durable point is not yet asked for.
    writing: u64,
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
            let began = std::time::Instant::now();
            let outcome = sync();
            crate::meter::sync(began.elapsed());
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
    fn ask(&self, state: &mut MutexGuard<'_, State>) -> Ticket {
        state.requested += 1;
        let generation = state.requested;
        self.shared.wanted.notify_one();
        Ticket { shared: Arc::clone(&self.shared), generation }
    }

    /// Announces a write that is about to be applied; [`Syncer::end_write`] must follow.
    pub(crate) fn begin_write(&self) {
        self.shared.lock().writing += 1;
    }

    /// Ends a write announced with [`Syncer::begin_write`]: when it changed the store, the
    /// ticket completes once it is durable.
    pub(crate) fn end_write(&self, changed: bool) -> Option<Ticket> {
        let mut state = self.shared.lock();
        state.writing -= 1;
        changed.then(|| self.ask(&mut state))
    }

    /// For a reader: `None` when everything already written is durable, else a ticket that
    /// completes once it is. Call it after the read, so that what was read is covered.
    pub(crate) fn barrier(&self) -> Option<Ticket> {
        let mut state = self.shared.lock();
        if state.writing > 0 {
            // A write may have landed without asking for its sync yet: ask for one.
            Some(self.ask(&mut state))
        } else if state.requested > state.finished {
            Some(Ticket { shared: Arc::clone(&self.shared), generation: state.requested })
        } else {
            None
        }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::task::{Context, Waker};

    use super::*;
    use crate::exec::block_on;

    /// A syncer whose every sync waits for a go from the test, and counts itself.
    fn gated() -> (Syncer, mpsc::Sender<Result<(), String>>, Arc<AtomicUsize>) {
        let (go, gate) = mpsc::channel::<Result<(), String>>();
        let gate = Mutex::new(gate);
        let syncs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&syncs);
        let syncer = Syncer::start(
            "test-sync",
            Box::new(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                gate.lock().unwrap().recv().unwrap()
            }),
        )
        .unwrap();
        (syncer, go, syncs)
    }

    fn pending(ticket: &mut Ticket) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(ticket).poll(&mut cx).is_pending()
    }

    #[test]
    fn a_reader_waits_for_a_write_whose_sync_is_not_asked_yet() {
        let (syncer, go, _) = gated();
        assert!(syncer.barrier().is_none(), "nothing written: nothing to wait for");
        syncer.begin_write();
        let mut ticket = syncer.barrier().expect("a write in progress must be waited for");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(pending(&mut ticket), "not durable before the sync ran");
        let writer = syncer.end_write(true).unwrap();
        go.send(Ok(())).unwrap();
        go.send(Ok(())).unwrap();
        block_on(ticket).unwrap();
        block_on(writer).unwrap();
        assert!(syncer.barrier().is_none(), "all durable afterwards");
    }

    #[test]
    fn a_reader_waits_for_a_sync_in_progress() {
        let (syncer, go, _) = gated();
        syncer.begin_write();
        let writer = syncer.end_write(true).unwrap();
        let mut reader = syncer.barrier().expect("the write's sync has not finished");
        assert!(pending(&mut reader));
        go.send(Ok(())).unwrap();
        block_on(reader).unwrap();
        block_on(writer).unwrap();
    }

    #[test]
    fn one_sync_answers_every_write_made_before_it_started() {
        let (syncer, go, syncs) = gated();
        syncer.begin_write();
        let first = syncer.end_write(true).unwrap();
        // Let the first sync start (it blocks on the gate), then pile up ten more writes.
        while syncs.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let later: Vec<Ticket> = (0..10)
            .map(|_| {
                syncer.begin_write();
                syncer.end_write(true).unwrap()
            })
            .collect();
        go.send(Ok(())).unwrap();
        block_on(first).unwrap();
        go.send(Ok(())).unwrap();
        for ticket in later {
            block_on(ticket).unwrap();
        }
        assert_eq!(syncs.load(Ordering::SeqCst), 2, "ten waiting writes share one sync");
    }

    #[test]
    fn a_failed_sync_fails_the_writes_it_covered() {
        let (syncer, go, _) = gated();
        syncer.begin_write();
        let failed = syncer.end_write(true).unwrap();
        go.send(Err("disk full".into())).unwrap();
        let error = block_on(failed).unwrap_err().to_string();
        assert!(error.contains("disk full"), "{error}");
        syncer.begin_write();
        let next = syncer.end_write(true).unwrap();
        go.send(Ok(())).unwrap();
        block_on(next).unwrap();
        assert_eq!(syncer.shared.lock().writing, 0, "every begun write ended");
    }
}
