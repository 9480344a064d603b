//! The few executor pieces the engine needs without tying it to a runtime: a thread-parking
//! `block_on` for sync tools, and a deadline timer served by one shared thread.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Instant;

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
    let waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}

struct Timers {
    queue: Mutex<BinaryHeap<Reverse<(Instant, u64)>>>,
    wakers: Mutex<std::collections::HashMap<u64, Waker>>,
    changed: Condvar,
    next_id: std::sync::atomic::AtomicU64,
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<&'static Timers> = OnceLock::new();
    TIMERS.get_or_init(|| {
        let timers: &'static Timers = Box::leak(Box::new(Timers {
            queue: Mutex::new(BinaryHeap::new()),
            wakers: Mutex::new(Default::default()),
            changed: Condvar::new(),
            next_id: Default::default(),
        }));
        thread::Builder::new()
            .name("idem-timer".into())
            .spawn(move || timer_loop(timers))
            .expect("idem: cannot start its timer thread");
        timers
    })
}

fn timer_loop(timers: &'static Timers) {
    let mut queue = timers.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = Instant::now();
        while let Some(Reverse((at, id))) = queue.peek().copied() {
            if at > now {
                break;
            }
            queue.pop();
            let waker = timers.wakers.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        queue = match queue.peek() {
            Some(Reverse((at, _))) => {
                let timeout = at.saturating_duration_since(Instant::now());
                timers.changed.wait_timeout(queue, timeout).unwrap_or_else(|e| e.into_inner()).0
            }
            None => timers.changed.wait(queue).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// A future that completes at `deadline`, on any executor.
pub(crate) struct Sleep {
    deadline: Instant,
    id: Option<u64>,
}

pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    Sleep { deadline, id: None }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        let timers = timers();
        let first = self.id.is_none();
        let id = *self.id.get_or_insert_with(|| {
            timers.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        });
        timers.wakers.lock().unwrap_or_else(|e| e.into_inner()).insert(id, cx.waker().clone());
        if first {
            timers
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Reverse((self.deadline, id)));
            timers.changed.notify_one();
        }
        // The timer may have fired between the check above and the insert: look again, so that
        // a wake-up is never lost.
        if Instant::now() >= self.deadline {
            timers.wakers.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            timers().wakers.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
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
