//! The few executor pieces the engine needs without tying it to a runtime: a thread-parking
//! `block_on` for sync tools, and a deadline timer served by one shared thread.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Instant;

use crate::loom::{thread, AtomicU64, Condvar, Mutex, MutexGuard};

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread, parking between polls.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// Deadlines waiting to fire, and whether the timer thread should stop (only a model stops it:
/// the process-wide timer runs for the life of the process).
#[derive(Default)]
struct Queue {
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    stopped: bool,
    /// Until when the timer thread waits, for a model to time that wait out.
    #[cfg(feature = "loom")]
    waiting_until: Option<Instant>,
}

/// A deadline timer: futures register a waker and a deadline, and one thread wakes each at its
/// deadline.
pub(crate) struct Timers {
    queue: Mutex<Queue>,
    wakers: Mutex<HashMap<u64, Waker>>,
    changed: Condvar,
    next_id: AtomicU64,
    clock: Clock,
}

/// Time as the timer sees it: the system's; under the `loom` feature, a clock the model moves
/// (loom has no time, and its `wait_timeout` returns only when notified).
#[derive(Default)]
struct Clock {
    #[cfg(feature = "loom")]
    ticks: AtomicU64,
}

impl Clock {
    #[cfg(not(feature = "loom"))]
    fn now(&self) -> Instant {
        Instant::now()
    }

    #[cfg(feature = "loom")]
    fn now(&self) -> Instant {
        model_epoch() + std::time::Duration::from_millis(self.ticks.load(Ordering::SeqCst))
    }
}

#[cfg(feature = "loom")]
fn model_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<&'static Timers> = OnceLock::new();
    TIMERS.get_or_init(|| {
        let timers: &'static Timers = Box::leak(Box::default());
        thread::Builder::new()
            .name("idem-timer".into())
            .spawn(move || timers.run())
            .expect("idem: cannot start its timer thread");
        timers
    })
}

impl Default for Timers {
    fn default() -> Timers {
        Timers {
            queue: Mutex::new(Queue::default()),
            wakers: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            next_id: AtomicU64::new(0),
            clock: Clock::default(),
        }
    }
}

impl Timers {
    /// The timer thread: wakes each deadline that has passed, then sleeps until the next one or
    /// until a new deadline is registered.
    fn run(&self) {
        let mut queue = lock(&self.queue);
        loop {
            let now = self.clock.now();
            while let Some(Reverse((at, id))) = queue.due.peek().copied() {
                if at > now {
                    break;
                }
                queue.due.pop();
                if let Some(waker) = lock(&self.wakers).remove(&id) {
                    waker.wake();
                }
            }
            if queue.stopped {
                return;
            }
            queue = match queue.due.peek() {
                Some(Reverse((at, _))) => {
                    let timeout = at.saturating_duration_since(self.clock.now());
                    if timeout.is_zero() {
                        // Passed while the others were woken: look again rather than wait.
                        continue;
                    }
                    #[cfg(feature = "loom")]
                    {
                        queue.waiting_until = Some(*at);
                    }
                    self.changed.wait_timeout(queue, timeout).unwrap_or_else(|e| e.into_inner()).0
                }
                None => {
                    #[cfg(feature = "loom")]
                    {
                        queue.waiting_until = None;
                    }
                    self.changed.wait(queue).unwrap_or_else(|e| e.into_inner())
                }
            };
        }
    }

    /// A future that completes at `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Sleep<'_> {
        Sleep { timers: self, deadline, id: None }
    }
}

/// A future that completes at `deadline`, on any executor.
pub(crate) struct Sleep<'a> {
    timers: &'a Timers,
    deadline: Instant,
    id: Option<u64>,
}

pub(crate) fn sleep_until(deadline: Instant) -> Sleep<'static> {
    timers().sleep_until(deadline)
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let timers = self.timers;
        if timers.clock.now() >= self.deadline {
            return Poll::Ready(());
        }
        let first = self.id.is_none();
        let id = *self.id.get_or_insert_with(|| timers.next_id.fetch_add(1, Ordering::Relaxed));
        lock(&timers.wakers).insert(id, cx.waker().clone());
        if first {
            lock(&timers.queue).due.push(Reverse((self.deadline, id)));
            timers.changed.notify_one();
        }
        // The timer may have fired between the check above and the insert: look again, so that
        // a wake-up is never lost.
        if timers.clock.now() >= self.deadline {
            lock(&timers.wakers).remove(&id);
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            lock(&self.timers.wakers).remove(&id);
        }
    }
}

/// Completes with `Some` when `future` does, or `None` at `deadline`.
pub(crate) async fn until<F: Future>(future: F, deadline: Instant) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut sleep = pin!(sleep_until(deadline));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        sleep.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// Runs `futures` together, each polled in turn until every one is done: their outputs, in
/// their order. What a batch of a store's writes needs so that a store whose writes share
/// durable points (sled's group commit) makes them all before it waits once.
pub(crate) async fn join_all<F: Future + Unpin>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<F>> = futures.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match Pin::new(future).poll(cx) {
                    Poll::Ready(out) => {
                        *output = Some(out);
                        *slot = None;
                    }
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Models of the timer under loom (`cargo test -p idem-agent-runtime --features loom --lib loom_`):
/// time moves on a clock the model owns, as `wait_timeout` ending would show it, and a sleep
/// polled from any point of that race must be woken (a lost wake-up leaves its thread blocked
/// for ever, which loom reports as a deadlock).
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use std::time::Duration;

    use loom::future::block_on;

    use super::*;
    use crate::loom::Arc;

    /// Moves the clock to `ticks` ms and, when the timer thread's wait runs out by then, ends
    /// that wait, as a real `wait_timeout` returns by itself at its deadline (loom's never
    /// times out).
    fn advance(timers: &Timers, ticks: u64) {
        let queue = lock(&timers.queue);
        timers.clock.ticks.store(ticks, Ordering::SeqCst);
        let timed_out = queue.waiting_until.is_some_and(|at| at <= timers.clock.now());
        drop(queue);
        if timed_out {
            timers.changed.notify_one();
        }
    }

    fn stop(timers: &Timers) {
        lock(&timers.queue).stopped = true;
        timers.changed.notify_one();
    }

    #[test]
    fn loom_a_sleep_is_woken_at_its_deadline() {
        crate::loom::model(|| {
            let timers = Arc::new(Timers::default());
            let runner = {
                let timers = Arc::clone(&timers);
                thread::spawn(move || timers.run())
            };
            let clock = {
                let timers = Arc::clone(&timers);
                thread::spawn(move || advance(&timers, 10))
            };
            let deadline = model_epoch() + Duration::from_millis(10);
            block_on(timers.sleep_until(deadline));
            assert!(timers.clock.now() >= deadline, "woken before its deadline");
            clock.join().unwrap();
            stop(&timers);
            runner.join().unwrap();
        });
    }

    #[test]
    fn loom_an_earlier_deadline_is_not_held_up_by_a_later_one() {
        crate::loom::model(|| {
            let timers = Arc::new(Timers::default());
            let runner = {
                let timers = Arc::clone(&timers);
                thread::spawn(move || timers.run())
            };
            // A sleep until 100 ms is registered first: the timer thread may be waiting for it.
            let mut later =
                Box::pin(timers.sleep_until(model_epoch() + Duration::from_millis(100)));
            let waker = Waker::noop().clone();
            assert!(later.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
            let clock = {
                let timers = Arc::clone(&timers);
                thread::spawn(move || advance(&timers, 10))
            };
            let deadline = model_epoch() + Duration::from_millis(10);
            block_on(timers.sleep_until(deadline));
            clock.join().unwrap();
            drop(later);
            stop(&timers);
            runner.join().unwrap();
        });
    }

    #[test]
    fn loom_a_dropped_sleep_does_not_keep_its_waker() {
        crate::loom::model(|| {
            let timers = Arc::new(Timers::default());
            let runner = {
                let timers = Arc::clone(&timers);
                thread::spawn(move || timers.run())
            };
            let deadline = model_epoch() + Duration::from_millis(10);
            let mut sleep = Box::pin(timers.sleep_until(deadline));
            let polled = sleep.as_mut().poll(&mut Context::from_waker(&Waker::noop().clone()));
            assert!(polled.is_pending());
            drop(sleep);
            advance(&timers, 10);
            stop(&timers);
            runner.join().unwrap();
            assert!(lock(&timers.wakers).is_empty(), "a dropped sleep left its waker behind");
        });
    }
}
