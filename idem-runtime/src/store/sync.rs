//! Group commit: one thread makes writes durable, and every caller that asked before a sync
//! started is answered by that one sync. Concurrent calls share their fsyncs; no caller is told
//! a write is durable before a sync that began after the write has finished.
//!
//! A sync about to start for fewer asks than the last one answered waits a little for the rest
//! (see [`Gather`]): callers answered together come back together, a few microseconds apart,
//! and a sync that starts on the first of them makes the others wait for a whole second sync.
//!
//! A failed sync poisons the syncer, as a failed fsync makes PostgreSQL stop: the kernel may
//! have dropped the dirty pages it could not write and reports the error once, so a later sync
//! that succeeds proves nothing about them. From then on every write is refused, every ticket
//! not answered by an earlier good sync fails, and every reader is refused, until the store is
//! reopened (which reads back what the disk really holds).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::loom::thread::{self, JoinHandle};
use crate::loom::{Arc, Condvar, Mutex, MutexGuard};

/// What one durable point does (flush sled, then sync its data file).
pub(crate) type SyncFn = Box<dyn FnMut() -> Result<(), String> + Send>;

#[derive(Default)]
struct State {
    /// Highest generation asked for.
    requested: u64,
    /// Highest generation whose sync has finished (well or badly).
    finished: u64,
    /// The first generation whose sync failed, and why: it and every later one fail.
    poisoned: Option<(u64, String)>,
    wakers: Vec<Waker>,
    shutdown: bool,
    /// Writes applied (or being applied) whose durable point is not yet asked for.
    writing: u64,
    /// How many asks the last sync answered: as many are expected for the next one.
    last_batch: u64,
    /// The sync thread wants waking once `requested` reaches this (`u64::MAX` while it syncs,
    /// so that an ask then costs no wake-up).
    wake_at: u64,
}

/// How long a sync waits for the asks it expects before it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gather {
    /// Never: a sync starts on the first ask.
    Off,
    /// Up to a quarter of the time the last sync took (at most [`MAX_ADAPTIVE_GATHER`]): long
    /// enough for callers answered together to come back (tens of microseconds), short beside
    /// the whole sync that the wait saves them, and what a lone ask pays at most when the
    /// callers it expects do not come (after which it expects fewer).
    Adaptive,
    /// Up to this long.
    UpTo(Duration),
}

impl Gather {
    /// The longest a sync waits, given how long the last one took.
    fn cap(self, last_sync: Duration) -> Duration {
        match self {
            Gather::Off => Duration::ZERO,
            Gather::Adaptive => (last_sync / 4).min(MAX_ADAPTIVE_GATHER),
            Gather::UpTo(cap) => cap,
        }
    }
}

/// The most [`Gather::Adaptive`] waits: a slow or networked disk's sync of many milliseconds is
/// not matched by a wait a caller would feel as latency of its own.
const MAX_ADAPTIVE_GATHER: Duration = Duration::from_millis(1);

struct SyncState {
    state: Mutex<State>,
    wanted: Condvar,
}

impl SyncState {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// With at least one ask pending, waits up to `cap` until as many are pending as the last
    /// sync answered (or the store closes).
    fn gather<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        cap: Duration,
    ) -> MutexGuard<'a, State> {
        if cap.is_zero() {
            return state;
        }
        state.wake_at = state.finished + state.last_batch;
        let deadline = Instant::now() + cap;
        while state.requested < state.wake_at && !state.shutdown {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let wait = self.wanted.wait_timeout(state, deadline - now);
            state = wait.unwrap_or_else(|e| e.into_inner()).0;
        }
        state
    }
}

pub(crate) struct Syncer {
    shared: Arc<SyncState>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    pub(crate) fn start(name: &str, gather: Gather, mut sync: SyncFn) -> std::io::Result<Syncer> {
        let shared =
            Arc::new(SyncState { state: Mutex::new(State::default()), wanted: Condvar::new() });
        let worker = Arc::clone(&shared);
        let mut last_sync = Duration::ZERO;
        let thread = thread::Builder::new().name(name.to_owned()).spawn(move || loop {
            let (target, answered) = {
                let mut state = worker.lock();
                state.wake_at = state.finished + 1;
                while state.requested < state.wake_at && !state.shutdown {
                    state = worker.wanted.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                if state.requested == state.finished {
                    return;
                }
                state = worker.gather(state, gather.cap(last_sync));
                state.wake_at = u64::MAX;
                (state.requested, state.finished)
            };
            let began = Instant::now();
            let outcome = sync();
            last_sync = began.elapsed();
            crate::meter::sync(last_sync);
            let wakers = {
                let mut state = worker.lock();
                if let Err(reason) = outcome {
                    if state.poisoned.is_none() {
                        state.poisoned = Some((state.finished + 1, reason));
                    }
                }
                state.finished = target;
                state.last_batch = target - answered;
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
        if state.requested >= state.wake_at {
            self.shared.wanted.notify_one();
        }
        Ticket { shared: Arc::clone(&self.shared), generation }
    }

    /// Announces a write that is about to be applied; [`Syncer::end_write`] must follow when it
    /// is allowed. Refused once a sync has failed.
    pub(crate) fn begin_write(&self) -> Result<(), StoreError> {
        let mut state = self.shared.lock();
        if let Some((_, reason)) = &state.poisoned {
            return Err(poisoned(reason));
        }
        state.writing += 1;
        Ok(())
    }

    /// Ends a write announced with [`Syncer::begin_write`]: when it changed the store, the
    /// ticket completes once it is durable.
    pub(crate) fn end_write(&self, changed: bool) -> Option<Ticket> {
        let mut state = self.shared.lock();
        state.writing -= 1;
        changed.then(|| self.ask(&mut state))
    }

    /// Refuses every later write and read, and fails every ticket not yet answered: for a write
    /// that failed, which leaves the store's memory and its disk apart just as a failed sync
    /// does (sled's log buffers hold other writes too).
    pub(crate) fn poison(&self, reason: String) {
        let mut state = self.shared.lock();
        if state.poisoned.is_none() {
            state.poisoned = Some((state.finished + 1, reason));
        }
        let wakers = std::mem::take(&mut state.wakers);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// For a reader: `None` when everything already written is durable, else a ticket that
    /// completes once it is. Call it after the read, so that what was read is covered.
    pub(crate) fn barrier(&self) -> Option<Ticket> {
        let mut state = self.shared.lock();
        if state.poisoned.is_some() {
            // What is read may be a write whose sync failed.
            Some(Ticket { shared: Arc::clone(&self.shared), generation: u64::MAX })
        } else if state.writing > 0 {
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
    shared: Arc<SyncState>,
    generation: u64,
}

impl Future for Ticket {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.shared.lock();
        match &state.poisoned {
            Some((from, reason)) if self.generation >= *from => Poll::Ready(Err(poisoned(reason))),
            _ if state.finished < self.generation => {
                state.wakers.push(cx.waker().clone());
                Poll::Pending
            }
            _ => Poll::Ready(Ok(())),
        }
    }
}

fn poisoned(reason: &str) -> StoreError {
    StoreError::new(format!(
        "the store could not make a write durable ({reason}), so it refuses every read and \
         write until it is reopened: what it holds in memory may not be on disk; check the disk \
         (space, errors), then restart the process"
    ))
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::task::{Context, Waker};

    use super::*;
    use crate::exec::block_on;

    /// A syncer whose every sync waits for a go from the test, and counts itself.
    fn gated() -> (Syncer, mpsc::Sender<Result<(), String>>, Arc<AtomicUsize>) {
        gated_with(Gather::Off)
    }

    fn gated_with(gather: Gather) -> (Syncer, mpsc::Sender<Result<(), String>>, Arc<AtomicUsize>) {
        let (go, gate) = mpsc::channel::<Result<(), String>>();
        let gate = Mutex::new(gate);
        let syncs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&syncs);
        let syncer = Syncer::start(
            "test-sync",
            gather,
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
        syncer.begin_write().unwrap();
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
        syncer.begin_write().unwrap();
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
        syncer.begin_write().unwrap();
        let first = syncer.end_write(true).unwrap();
        // Let the first sync start (it blocks on the gate), then pile up ten more writes.
        while syncs.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let later: Vec<Ticket> = (0..10)
            .map(|_| {
                syncer.begin_write().unwrap();
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

    fn write(syncer: &Syncer) -> Ticket {
        syncer.begin_write().unwrap();
        syncer.end_write(true).unwrap()
    }

    /// Makes the syncer's last sync answer three asks: one sync for a first write, blocked on
    /// the gate while three more ask, then one for those three.
    fn answer_three(syncer: &Syncer, go: &mpsc::Sender<Result<(), String>>, syncs: &AtomicUsize) {
        let first = write(syncer);
        while syncs.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let three: Vec<Ticket> = (0..3).map(|_| write(syncer)).collect();
        go.send(Ok(())).unwrap();
        go.send(Ok(())).unwrap();
        block_on(first).unwrap();
        three.into_iter().for_each(|ticket| block_on(ticket).unwrap());
        assert_eq!(syncs.load(Ordering::SeqCst), 2);
        assert_eq!(syncer.shared.lock().last_batch, 3);
    }

    #[test]
    fn a_sync_waits_for_as_many_writes_as_the_last_one_answered() {
        // A cap far longer than the test: only the asks end the wait.
        let (syncer, go, syncs) = gated_with(Gather::UpTo(std::time::Duration::from_secs(600)));
        answer_three(&syncer, &go, &syncs);
        let a = write(&syncer);
        // The sync thread sees the ask and waits for two more instead of syncing.
        loop {
            assert_eq!(
                syncs.load(Ordering::SeqCst),
                2,
                "the sync thread started a sync for one write of three expected"
            );
            let state = syncer.shared.lock();
            if state.wake_at == state.finished + 3 {
                break;
            }
            drop(state);
            std::thread::yield_now();
        }
        let (b, c) = (write(&syncer), write(&syncer));
        go.send(Ok(())).unwrap();
        for ticket in [a, b, c] {
            block_on(ticket).unwrap();
        }
        assert_eq!(syncs.load(Ordering::SeqCst), 3, "the three writes share one sync");
    }

    #[test]
    fn a_sync_waits_no_longer_than_its_cap() {
        let (syncer, go, syncs) = gated_with(Gather::UpTo(std::time::Duration::from_millis(20)));
        answer_three(&syncer, &go, &syncs);
        // One write of the three expected: the sync starts once the cap has passed.
        let alone = write(&syncer);
        go.send(Ok(())).unwrap();
        block_on(alone).unwrap();
        assert_eq!(syncs.load(Ordering::SeqCst), 3);
        assert_eq!(syncer.shared.lock().last_batch, 1, "the next sync expects one write");
    }

    #[test]
    fn a_failed_sync_refuses_every_later_write_and_read() {
        let (syncer, go, _) = gated();
        syncer.begin_write().unwrap();
        let durable = syncer.end_write(true).unwrap();
        go.send(Ok(())).unwrap();
        block_on(durable).unwrap();
        syncer.begin_write().unwrap();
        let failed = syncer.end_write(true).unwrap();
        go.send(Err("disk full".into())).unwrap();
        let error = block_on(failed).unwrap_err().to_string();
        assert!(error.contains("disk full") && error.contains("reopened"), "{error}");
        // More failures than the old code remembered (64), then a sync that succeeds: none of
        // it makes the store trust its writes again.
        for _ in 0..100 {
            let error = syncer.begin_write().unwrap_err().to_string();
            assert!(error.contains("refuses every read and write"), "{error}");
        }
        let reader = syncer.barrier().expect("a reader must not trust what it read");
        assert!(block_on(reader).is_err(), "a reader is refused after a failed sync");
        assert_eq!(syncer.shared.lock().writing, 0, "a refused write is not counted");
    }

    #[test]
    fn writes_waiting_for_a_failed_sync_all_fail() {
        let (syncer, go, syncs) = gated();
        syncer.begin_write().unwrap();
        let first = syncer.end_write(true).unwrap();
        while syncs.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // Asked while the first sync runs: answered by the next one, which will succeed.
        syncer.begin_write().unwrap();
        let second = syncer.end_write(true).unwrap();
        go.send(Err("EIO".into())).unwrap();
        go.send(Ok(())).unwrap();
        assert!(block_on(first).is_err());
        assert!(block_on(second).is_err(), "a sync after a failed one proves nothing");
    }
}

#[cfg(all(test, feature = "loom"))]
mod loom_models;
