//! The engine's heartbeat renews every lease a store's running calls hold in one renewal per
//! interval (one statement on PostgreSQL), never one per key, and stops renewing a lease once
//! its call has written its record.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use idem_postgres::PgStore;
use idem_runtime::history::{Change, Entry};
use idem_runtime::store::lease::{Held, Lease};
use idem_runtime::store::{Detached, Guard, Inserted, Page};
use idem_runtime::{block_on, Call, Error, Record, Status, Store, StoreFuture};

const CALLS: usize = 8;
const EVERY: Duration = Duration::from_millis(200);

/// A PostgreSQL store that notes how many leases each renewal names.
struct Counting {
    inner: PgStore,
    renewals: Mutex<Vec<usize>>,
}

impl Store for Counting {
    fn instance(&self) -> &str {
        self.inner.instance()
    }
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        self.inner.get(key)
    }
    fn insert_if_absent<'a>(&'a self, r: &'a Record, c: Change<'a>) -> StoreFuture<'a, Inserted> {
        self.inner.insert_if_absent(r, c)
    }
    fn compare_and_swap<'a>(
        &'a self,
        expected: &'a Record,
        guard: Guard,
        new: Option<&'a Record>,
        change: Change<'a>,
    ) -> StoreFuture<'a, Option<u64>> {
        self.inner.compare_and_swap(expected, guard, new, change)
    }
    fn compare_and_swap_detached(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<Record>,
        change: Change<'_>,
    ) -> Detached {
        self.inner.compare_and_swap_detached(expected, guard, new, change)
    }
    fn append_history<'a>(&'a self, key: &'a str, change: Change<'a>) -> StoreFuture<'a, bool> {
        self.inner.append_history(key, change)
    }
    fn history<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<Entry>> {
        self.inner.history(key)
    }
    fn scan_page<'a>(&'a self, after: Option<&'a str>, limit: usize) -> StoreFuture<'a, Page> {
        self.inner.scan_page(after, limit)
    }
    fn watch<'a>(
        &'a self,
        key: &'a str,
        seen: &'a Record,
        deadline: Instant,
    ) -> StoreFuture<'a, Option<Record>> {
        self.inner.watch(key, seen, deadline)
    }
    fn lease(&self) -> Option<Lease> {
        self.inner.lease()
    }
    fn renew<'a>(&'a self, held: &'a [Held], until: u64) -> StoreFuture<'a, Vec<bool>> {
        self.renewals.lock().unwrap().push(held.len());
        self.inner.renew(held, until)
    }
    fn clock(&self) -> u64 {
        self.inner.clock()
    }
}

/// Call `n`, the same charge for another order.
fn charge(n: usize) -> Call {
    Call::new("charge_card", format!("order-{n}"), &serde_json::json!({ "amount": 4200 })).unwrap()
}

fn call(store: &Arc<dyn Store>, n: usize) -> Call {
    charge(n).store(Arc::clone(store))
}

fn call_key(n: usize) -> String {
    charge(n).key().to_string()
}

fn lease_until(store: &dyn Store, n: usize) -> Option<u64> {
    block_on(store.get(&call_key(n))).unwrap().and_then(|r| r.lease_until)
}

#[test]
fn every_lease_held_is_renewed_in_one_renewal_per_interval() {
    let Some(url) = common::database_url() else { return };
    let schema = common::unique_schema("beat");
    let _guard = common::DropSchema { url: url.clone(), schema: schema.clone() };
    let inner = PgStore::builder(&url)
        .schema(&schema)
        .lease(Duration::from_secs(3))
        .heartbeat(EVERY)
        .connect()
        .unwrap();
    let counting = Arc::new(Counting { inner, renewals: Mutex::new(Vec::new()) });
    let store: Arc<dyn Store> = counting.clone();

    // CALLS sync calls on plain threads, each in its body until the test lets them go.
    let entered = Arc::new(Barrier::new(CALLS + 1));
    let go = Arc::new(Barrier::new(CALLS + 1));
    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..CALLS)
        .map(|n| {
            let (store, entered, go, runs) =
                (Arc::clone(&store), Arc::clone(&entered), Arc::clone(&go), Arc::clone(&runs));
            std::thread::spawn(move || {
                call(&store, n).run(|| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    entered.wait();
                    go.wait();
                    Ok::<_, Error>(format!("ch_{n}"))
                })
            })
        })
        .collect();
    entered.wait();
    let first: Vec<u64> = (0..CALLS).map(|n| lease_until(store.as_ref(), n).unwrap()).collect();
    let before = counting.renewals.lock().unwrap().len();

    // Three beats while every call is in its body.
    let beat = common::eventually(Duration::from_secs(10), || {
        counting.renewals.lock().unwrap().len() >= before + 3
    });
    assert!(beat, "the heartbeat renews: {:?}", counting.renewals.lock().unwrap());
    let renewals: Vec<usize> = counting.renewals.lock().unwrap()[before + 1..].to_vec();
    assert!(
        renewals.iter().all(|&held| held == CALLS),
        "each renewal names every lease held, at once: {renewals:?}"
    );
    for (n, first) in first.iter().enumerate() {
        let now = lease_until(store.as_ref(), n).unwrap();
        assert!(now > *first, "call {n}'s lease was pushed on ({first} → {now})");
    }

    go.wait();
    for (n, call) in calls.into_iter().enumerate() {
        assert_eq!(call.join().unwrap().unwrap(), format!("ch_{n}"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), CALLS);
    for n in 0..CALLS {
        let record = block_on(store.get(&call_key(n))).unwrap().unwrap();
        assert_eq!((record.status, record.lease_until), (Status::Done, None));
    }

    // Written, the records' leases are forgotten: with one more call in its body, the renewals
    // name its lease alone. (The first renewal after it entered may be a beat that read the
    // leases held before the calls above wrote their records.)
    let (entered, go) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let last = {
        let (store, entered, go) = (Arc::clone(&store), Arc::clone(&entered), Arc::clone(&go));
        std::thread::spawn(move || {
            call(&store, CALLS).run(|| {
                entered.wait();
                go.wait();
                Ok::<_, Error>("ch_last".to_owned())
            })
        })
    };
    entered.wait();
    let before = counting.renewals.lock().unwrap().len();
    let beat = common::eventually(Duration::from_secs(10), || {
        counting.renewals.lock().unwrap().len() >= before + 3
    });
    assert!(beat, "the heartbeat renews: {:?}", counting.renewals.lock().unwrap());
    let renewals: Vec<usize> = counting.renewals.lock().unwrap()[before + 1..].to_vec();
    assert!(renewals.iter().all(|&held| held == 1), "only the running call's: {renewals:?}");
    go.wait();
    assert_eq!(last.join().unwrap().unwrap(), "ch_last");
}
