//! How many calls wait for each key's owner right now: counted by the engine around a store's
//! `watch`, so that a test of the wait path can know a waiter is on it before it changes the
//! record (no store needs a hook for it).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

static WAITING: LazyLock<Mutex<HashMap<String, usize>>> = LazyLock::new(Mutex::default);

fn lock() -> MutexGuard<'static, HashMap<String, usize>> {
    WAITING.lock().unwrap_or_else(|e| e.into_inner())
}

/// One call waiting for the owner of a key, counted while it lives (a store's own run path,
/// idem-postgres's transactional calls, counts its waits with it too).
pub struct Waiting(String);

impl Waiting {
    /// Counts a call that has read the key's record and is about to wait for it to change.
    pub fn start(key: &str) -> Waiting {
        *lock().entry(key.to_owned()).or_default() += 1;
        Waiting(key.to_owned())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut waiting = lock();
        if let Some(n) = waiting.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&self.0);
            }
        }
    }
}

/// How many calls of this process wait now for the owner of `key` (they have read its record
/// and wait for it to change, so a change made from now on reaches them). For tests.
pub fn waiting(key: &str) -> usize {
    lock().get(key).copied().unwrap_or(0)
}
