//! In-process change notification, the one notifier of every store: a waiter watches a key
//! before it reads the record, and a writer (or, for a store shared by several processes, the
//! task that hears of another process's write) notifies once the change has landed.
//!
//! On sled, 0.34's `watch_prefix` cannot be used race-free: a writer takes its snapshot of the
//! subscribers before it applies the write, so a subscriber that registers and then reads in
//! between sees the old value and never hears of the new one (a waiter then sleeps out its whole
//! `wait`). sled is single-process, so every write goes through this store: it bumps the key's
//! epoch after the write lands, and a waiter that read the epoch before the record cannot miss it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::loom::{Arc, Mutex, MutexGuard};

#[derive(Default)]
struct Slot {
    epoch: u64,
    interested: usize,
    wakers: Vec<Waker>,
}

/// The waiters of one process, per key: see the docs of the `store` module for its use by a
/// store.
#[derive(Default)]
pub struct Notifier {
    slots: Mutex<HashMap<String, Slot>>,
}

impl Notifier {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers interest in `key`: call before reading the record, then await the [`Watch`]
    /// only if the record read is still as seen.
    pub fn watch(notifier: &Arc<Notifier>, key: &str) -> Watch {
        let mut slots = notifier.lock();
        let slot = slots.entry(key.to_owned()).or_default();
        slot.interested += 1;
        Watch { notifier: Arc::clone(notifier), key: key.to_owned(), epoch: slot.epoch }
    }

    /// How many watches of `key` exist.
    #[cfg(all(test, feature = "loom"))]
    pub(crate) fn watchers(&self, key: &str) -> usize {
        self.lock().get(key).map_or(0, |slot| slot.interested)
    }

    /// Tells every watcher to look again (a store that may have missed notifications, such as
    /// one whose listening connection dropped).
    pub fn notify_all(&self) {
        let wakers: Vec<Waker> = self
            .lock()
            .values_mut()
            .flat_map(|slot| {
                slot.epoch += 1;
                std::mem::take(&mut slot.wakers)
            })
            .collect();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Tells the watchers of `key` that it changed: call after the write has landed.
    pub fn notify(&self, key: &str) {
        let wakers = match self.lock().get_mut(key) {
            Some(slot) => {
                slot.epoch += 1;
                std::mem::take(&mut slot.wakers)
            }
            None => return,
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// Completes once the key has changed since [`Notifier::watch`].
#[must_use = "a watch does nothing unless awaited"]
pub struct Watch {
    notifier: Arc<Notifier>,
    key: String,
    epoch: u64,
}

impl Future for Watch {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut slots = self.notifier.lock();
        let slot = slots.get_mut(&self.key).expect("a watched key keeps its slot");
        if slot.epoch != self.epoch {
            return Poll::Ready(());
        }
        if !slot.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            slot.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut slots = self.notifier.lock();
        if let Some(slot) = slots.get_mut(&self.key) {
            slot.interested -= 1;
            if slot.interested == 0 {
                slots.remove(&self.key);
            }
        }
    }
}

/// Models of the notifier under loom
/// (`cargo test -p idem-agent-runtime --features loom --lib loom_`): a waiter watches, then
/// reads the record, and waits only if it has not changed; the writer changes the record, then
/// notifies. Whatever the interleaving, no waiter misses the change
/// (a lost wake-up leaves a thread blocked for ever, which loom reports as a deadlock).
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use loom::future::block_on;
    use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use loom::thread;

    use super::*;

    /// What `SledStore::watch` does around the notifier.
    fn wait_for_change(notifier: &Arc<Notifier>, record: &AtomicUsize, seen: usize) -> usize {
        let watch = Notifier::watch(notifier, "k");
        let now = record.load(SeqCst);
        if now != seen {
            return now;
        }
        block_on(watch);
        record.load(SeqCst)
    }

    #[test]
    fn loom_a_waiter_never_misses_a_change() {
        crate::loom::model(|| {
            let notifier = Arc::new(Notifier::default());
            let record = Arc::new(AtomicUsize::new(0));
            let writer = {
                let (notifier, record) = (Arc::clone(&notifier), Arc::clone(&record));
                thread::spawn(move || {
                    record.store(1, SeqCst);
                    notifier.notify("k");
                })
            };
            assert_eq!(wait_for_change(&notifier, &record, 0), 1);
            writer.join().unwrap();
            assert_eq!(notifier.watchers("k"), 0, "the watch let go of the key");
        });
    }

    #[test]
    fn loom_two_waiters_never_miss_a_change() {
        crate::loom::model(|| {
            let notifier = Arc::new(Notifier::default());
            let record = Arc::new(AtomicUsize::new(0));
            let writer = {
                let (notifier, record) = (Arc::clone(&notifier), Arc::clone(&record));
                thread::spawn(move || {
                    record.store(1, SeqCst);
                    notifier.notify("k");
                })
            };
            let waiter = {
                let (notifier, record) = (Arc::clone(&notifier), Arc::clone(&record));
                thread::spawn(move || wait_for_change(&notifier, &record, 0))
            };
            assert_eq!(wait_for_change(&notifier, &record, 0), 1);
            assert_eq!(waiter.join().unwrap(), 1);
            writer.join().unwrap();
            assert_eq!(notifier.watchers("k"), 0, "every watch let go of the key");
        });
    }

    #[test]
    fn loom_a_waiter_that_gives_up_does_not_strand_another() {
        crate::loom::model(|| {
            let notifier = Arc::new(Notifier::default());
            let record = Arc::new(AtomicUsize::new(0));
            let quitter = {
                let notifier = Arc::clone(&notifier);
                // Watches, then gives up before the change (its deadline passed).
                thread::spawn(move || drop(Notifier::watch(&notifier, "k")))
            };
            let writer = {
                let (notifier, record) = (Arc::clone(&notifier), Arc::clone(&record));
                thread::spawn(move || {
                    record.store(1, SeqCst);
                    notifier.notify("k");
                })
            };
            assert_eq!(wait_for_change(&notifier, &record, 0), 1);
            quitter.join().unwrap();
            writer.join().unwrap();
        });
    }
}
