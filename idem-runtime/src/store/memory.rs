//! The reference store, in memory: the storage contract of [`Store`] written as plainly as it
//! can be, for examples and unit tests. Each method's body is the definition of its contract.

use std::collections::BTreeMap;
use std::future::{poll_fn, ready};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Instant;

use super::notify::Notifier;
use super::{Inserted, Instance, Page, Store, StoreFuture};
use crate::error::StoreError;
use crate::lifecycle::history::{Change, Entry};
use crate::lifecycle::{Guard, Record, Status};
use crate::loom::Arc;

/// The reference store: records and histories in a map in memory, under one lock.
///
/// It is what the storage contract means, with nothing else in the way: every change of a key
/// (its record, and its history entry in the same step) is made under one lock, which makes it
/// atomic and linearizable; every fenced write checks the guard the engine gave it
/// ([`Guard::passes`](crate::store::Guard::passes)); the
/// crate's one [`Notifier`](crate::store::Notifier) wakes waiters. It passes the conformance
/// suite (`idem_runtime::conformance_suite!`), which is all a new backend must pass: read it
/// beside the suite when writing one.
///
/// **Not durable, not for production.** Nothing survives the process, so
/// [`Durability`](crate::Durability) does not apply: a write is done once it is in memory, and
/// a store dropped or a process that dies takes every record with it (a key left in flight is
/// never seen in doubt, since no one is left to see it). It keeps no lease: as on sled, an
/// in-flight record is held while its owner is a call of this store. One process, one store:
/// use it for examples, doc tests and unit tests of code that runs calls, never in place of a
/// real store in a test of what a store keeps.
///
/// ```
/// # fn main() -> Result<(), idem_runtime::Error> {
/// use std::sync::Arc;
/// use idem_runtime::{Call, Error, MemoryStore, Store};
///
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let charge = || Call::new("charge_card", "order-17", &serde_json::json!({"amount": 4200}));
/// let mut runs = 0;
/// for _ in 0..3 {
///     let id: String = charge()?.store(Arc::clone(&store)).run(|| {
///         runs += 1;
///         Ok::<_, Error>(format!("ch_{runs}"))
///     })?;
///     assert_eq!(id, "ch_1", "every attempt gets the first result");
/// }
/// assert_eq!(runs, 1, "the body ran once");
/// # Ok(()) }
/// ```
pub struct MemoryStore {
    instance: Instance,
    keys: Mutex<Keys>,
    /// The crate's concurrency types (loom's under its models), as every `Notifier` is held.
    notifier: Arc<Notifier>,
}

/// Everything the store holds, under its one lock.
#[derive(Default)]
struct Keys {
    records: BTreeMap<String, Record>,
    /// Every key's history, oldest first: a key with none has no entry here.
    histories: BTreeMap<String, Vec<Entry>>,
    /// The last fencing token handed out. One counter for every key: each owner holds a greater
    /// token than every owner before it, of any key.
    token: u64,
}

impl Keys {
    /// Appends `change`'s entry to the history of `key`, which it left in `status`.
    fn append(&mut self, key: &str, change: &Change<'_>, status: Option<Status>, at: u64) {
        let entry = Entry::of(change, status, at);
        self.histories.entry(key.to_owned()).or_default().push(entry);
    }

    /// Makes a change the fence admitted: `new` replaces what `key` held (nothing, when
    /// `None`), and the change's entry is appended in the same step, or the history goes with
    /// the record when the change ends it (a purge). Returns the fencing token of `new`'s owner.
    fn land(&mut self, key: &str, new: Option<&Record>, change: &Change<'_>, at: u64) -> u64 {
        match new {
            Some(new) => self.records.insert(key.to_owned(), new.clone()),
            None => self.records.remove(key),
        };
        if change.event().ends_history() {
            self.histories.remove(key);
        } else {
            self.append(key, change, new.map(|record| record.status), at);
        }
        self.token += 1;
        self.token
    }

    /// Whether `key` has a record.
    fn has_record(&self, key: &str) -> bool {
        self.records.contains_key(key)
    }
}

/// `value` as a write's answer, on the second poll of the future that awaits it: the write has
/// landed, and its answer comes back later, as from every store that syncs, queues its writes or
/// sends them over a network. So a caller can go away between its write and the answer here as
/// well, which the engine must survive (the suite's
/// `takeover_dropped_before_its_body_is_undone` checks that it does).
async fn answered<T>(value: T) -> Result<T, StoreError> {
    let mut asked = false;
    poll_fn(|cx| {
        if asked {
            return Poll::Ready(());
        }
        asked = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
    Ok(value)
}

/// The keys that sort after `after` (all of them when `None`).
fn past(after: Option<&str>) -> (Bound<&str>, Bound<&str>) {
    (after.map_or(Bound::Unbounded, Bound::Excluded), Bound::Unbounded)
}

impl MemoryStore {
    /// An empty store, as a new instance (`memory:…`).
    pub fn new() -> MemoryStore {
        MemoryStore {
            instance: Instance::new("memory"),
            keys: Mutex::default(),
            notifier: Arc::new(Notifier::default()),
        }
    }

    fn keys(&self) -> MutexGuard<'_, Keys> {
        // A panic cannot leave a change half made (each is checked before anything is changed,
        // and the changes themselves do not panic), so a poisoned lock still holds a consistent
        // store: it is taken as it is, as the crate's other locks are.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read(&self, key: &str) -> Option<Record> {
        self.keys().records.get(key).cloned()
    }

    /// Replaces `expected` by `new` if the stored record passes `guard` now; the fencing
    /// token, or `None` when refused. Waiters are told once the change has landed.
    fn swap(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: &Change<'_>,
    ) -> Option<u64> {
        let key = expected.key.as_str();
        let token = {
            let mut keys = self.keys();
            let stored = keys.records.get(key)?;
            let now = self.clock();
            if !guard.passes(expected.fence(), stored.fence(), stored.lease_until, now) {
                return None;
            }
            keys.land(key, new, change, now)
        };
        self.notifier.notify(key);
        Some(token)
    }
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::new()
    }
}

impl Store for MemoryStore {
    fn instance(&self) -> &Instance {
        &self.instance
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        Box::pin(ready(Ok(self.read(key))))
    }

    fn insert_if_absent<'a>(
        &'a self,
        record: &'a Record,
        change: Change<'a>,
    ) -> StoreFuture<'a, Inserted> {
        Box::pin(async move {
            let key = record.key.as_str();
            let inserted = {
                let mut keys = self.keys();
                match keys.records.get(key) {
                    Some(existing) => Inserted::Existing(existing.clone()),
                    None => {
                        let token = keys.land(key, Some(record), &change, self.clock());
                        Inserted::New { token }
                    }
                }
            };
            if let Inserted::New { .. } = inserted {
                self.notifier.notify(key);
            }
            answered(inserted).await
        })
    }

    fn compare_and_swap(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> StoreFuture<'static, Option<u64>> {
        // Swapped now, in place; nothing can fail, and only the answer comes later.
        Box::pin(answered(self.swap(expected, guard, new, &change)))
    }

    fn append_history<'a>(&'a self, key: &'a str, change: Change<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let appended = {
                let mut keys = self.keys();
                if change.event().ends_history() {
                    // Nothing of the purge is kept: the history goes whole, as with a purged
                    // record, and only from a key with no record.
                    !keys.has_record(key) && keys.histories.remove(key).is_some()
                } else {
                    let status = keys.records.get(key).map(|record| record.status);
                    keys.append(key, &change, status, self.clock());
                    true
                }
            };
            answered(appended).await
        })
    }

    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>> {
        let entries = self.keys().histories.get(key).cloned().unwrap_or_default();
        Box::pin(ready(Ok(entries)))
    }

    fn scan_page<'a>(&'a self, after: Option<&'a str>, limit: usize) -> StoreFuture<'a, Page> {
        let keys = self.keys();
        let records = keys.records.range::<str, _>(past(after)).take(limit);
        let histories = keys.histories.range::<str, _>(past(after)).take(limit);
        let page = Page::merge(
            records.map(|(key, record)| (key.clone(), Ok(record.clone()))).collect(),
            histories
                .map(|(key, entries)| {
                    let last = if keys.has_record(key) { None } else { entries.last() };
                    (key.clone(), last.map(|entry| entry.at))
                })
                .collect(),
            limit,
        );
        Box::pin(ready(Ok(page)))
    }

    fn watch<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>> {
        Box::pin(async move {
            // Watch before reading, so that a change between the read and the wait is seen.
            let watch = Notifier::watch(&self.notifier, key);
            let current = self.read(key);
            if !current.as_ref().is_some_and(|record| record.is_as(seen)) {
                return Ok(current);
            }
            let _ = crate::exec::until(watch, deadline).await;
            Ok(self.read(key))
        })
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("instance", &self.instance.id()).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::block_on;
    use crate::lifecycle::transition;
    use crate::lifecycle::Owner;
    use crate::store::Stored;

    /// A store where each key `k{n}` of `released` was reserved and released (its history
    /// stays, its record went) and each of `done` reserved and completed.
    fn store_with(released: &[u32], done: &[u32]) -> MemoryStore {
        let store = MemoryStore::new();
        let owner = Owner::new_call(store.instance().id());
        let reserve = |n: &u32| {
            let key = format!("k{n}");
            let step = transition::reserve(&key, "charge", "order-17", None, &owner, 1, None);
            let held = step.new.clone().expect("a reservation leaves a record");
            let inserted = block_on(store.insert_if_absent(&held, step.change)).unwrap();
            assert!(matches!(inserted, Inserted::New { .. }), "{inserted:?}");
            held
        };
        for n in released {
            let held = reserve(n);
            let step = transition::release(&held);
            let guard = Guard::of(held.fence(), step.change.by(), store.instance().id());
            let released = block_on(store.compare_and_swap(&held, guard, None, step.change));
            assert!(released.unwrap().is_some());
        }
        for n in done {
            let held = reserve(n);
            let step = transition::complete(&held, "\"ch_1\"".into(), None, 2);
            let guard = Guard::of(held.fence(), step.change.by(), store.instance().id());
            let swapped =
                block_on(store.compare_and_swap(&held, guard, step.new.as_ref(), step.change));
            assert!(swapped.unwrap().is_some());
        }
        store
    }

    #[test]
    fn pages_seek_past_the_given_key_in_key_order() {
        let store = store_with(&[0, 1], &[2, 3, 4]);
        let page = block_on(store.scan_page(None, 10)).unwrap();
        assert!(page.next.is_none(), "one page holds them all");
        let all: Vec<(&str, bool)> = page
            .entries
            .iter()
            .map(|(key, stored)| (key.as_str(), matches!(stored, Stored::Record(Ok(_)))))
            .collect();
        assert_eq!(all.len(), 5, "every key called: {all:?}");
        assert_eq!(all.iter().filter(|(_, record)| *record).count(), 3, "the done keys' records");
        assert!(all.windows(2).all(|pair| pair[0].0 < pair[1].0), "in key order: {all:?}");
        let rest = block_on(store.scan_page(Some(all[0].0), 10)).unwrap();
        let rest: Vec<&str> = rest.entries.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(rest, all[1..].iter().map(|(key, _)| *key).collect::<Vec<_>>());
        let one = block_on(store.scan_page(Some(all[0].0), 1)).unwrap();
        assert_eq!(one.entries.len(), 1, "the limit");
        assert_eq!(one.next.as_deref(), Some(all[1].0), "the next page reads on after it");
    }
}
