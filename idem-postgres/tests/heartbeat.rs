//! The engine's leases on PostgreSQL: the transition that leaves a record in flight stamps its
//! lease on the store instance's terms, and the table stores it as given; the heartbeat renews
//! every lease a store's running calls hold in one renewal per interval (one statement), never
//! one per key, renews a lease whose write was slow before it lapses, and stops renewing a
//! lease once its call has written its record. And a call on PostgreSQL, whose reads are round
//! trips, reserves its key without reading it first.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use idem_postgres::PgStore;
use idem_runtime::history::{Change, Entry};
use idem_runtime::store::lease::{Held, Lease};
use idem_runtime::store::Owner;
use idem_runtime::store::{Guard, Inserted, Instance, Page};
use idem_runtime::{block_on, Call, Error, InDoubtPolicy, Record, Status, Store, StoreFuture};

const CALLS: usize = 8;
const EVERY: Duration = Duration::from_millis(200);

/// A PostgreSQL store that notes how many leases each renewal names, the records the engine
/// inserts and how many reads it makes; it may state lease terms of its own (its instance's, on which the engine stamps and
/// renews leases, whatever the table's builder said), and hold each insert back, as a slow write.
struct Counting {
    inner: PgStore,
    instance: Instance,
    insert_delay: Duration,
    inserted: Mutex<Vec<Record>>,
    renewals: Mutex<Vec<usize>>,
    gets: AtomicUsize,
}

impl Counting {
    fn new(inner: PgStore) -> Counting {
        Counting {
            instance: inner.instance().clone(),
            inner,
            insert_delay: Duration::ZERO,
            inserted: Mutex::new(Vec::new()),
            renewals: Mutex::new(Vec::new()),
            gets: AtomicUsize::new(0),
        }
    }

    /// The store, with leases on `terms` instead of the table's.
    fn with_terms(self, terms: Lease) -> Counting {
        Counting { instance: Instance::new("pg").with_lease(terms).with_remote_reads(), ..self }
    }

    /// The lease the engine stamped on the last record it inserted.
    fn stamped(&self) -> u64 {
        let inserted = self.inserted.lock().unwrap();
        inserted.last().and_then(|r| r.lease_until).expect("the engine stamped a lease")
    }
}

impl Store for Counting {
    fn instance(&self) -> &Instance {
        &self.instance
    }
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Record>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(key)
    }
    fn insert_if_absent<'a>(&'a self, r: &'a Record, c: Change<'a>) -> StoreFuture<'a, Inserted> {
        self.inserted.lock().unwrap().push(r.clone());
        let delay = self.insert_delay;
        Box::pin(async move {
            // The calls of these tests are sync: the engine drives this future on their thread.
            std::thread::sleep(delay);
            self.inner.insert_if_absent(r, c).await
        })
    }
    fn compare_and_swap(
        &self,
        expected: &Record,
        guard: Guard,
        new: Option<&Record>,
        change: Change<'_>,
    ) -> StoreFuture<'static, Option<u64>> {
        self.inner.compare_and_swap(expected, guard, new, change)
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

/// The store of a table whose builder says leases of 3 s, with a beat every [`EVERY`].
fn table(url: &str, schema: &str) -> PgStore {
    PgStore::builder(url)
        .schema(schema)
        .lease(Duration::from_secs(3))
        .heartbeat(EVERY)
        .connect()
        .unwrap()
}

fn lease_until(store: &dyn Store, n: usize) -> Option<u64> {
    block_on(store.get(&call_key(n))).unwrap().and_then(|r| r.lease_until)
}

#[test]
fn every_lease_held_is_renewed_in_one_renewal_per_interval() {
    let Some((url, schema, _guard)) = common::scratch_schema("beat") else { return };
    let inner = table(&url, &schema);
    let counting = Arc::new(Counting::new(inner));
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

/// A store whose instance states leases of 7 s over a table whose builder said 3 s: the lease a
/// record in flight carries is the engine's stamp on the instance's terms, for a reservation
/// and for a takeover of a lapsed lease alike; the table computes none of its own.
#[test]
fn the_engine_stamps_each_lease_on_the_instance_s_terms() {
    let Some((url, schema, _guard)) = common::scratch_schema("stamp") else { return };
    let inner = table(&url, &schema);
    let terms = Lease::new(Duration::from_secs(7), Some(EVERY)).unwrap();
    let length = 7_000;
    let counting = Arc::new(Counting::new(inner).with_terms(terms));
    let store: Arc<dyn Store> = counting.clone();

    // A reservation: its lease runs 7 s from the engine's reading of the store's clock.
    let before = store.clock();
    let seen: Result<Record, Error> = call(&store, 0)
        .run(|| Ok(block_on(store.get(&call_key(0))).unwrap().expect("the call's record")));
    let (seen, stamped) = (seen.unwrap(), counting.stamped());
    let after = store.clock();
    assert!(
        (before + length..=after + length).contains(&stamped),
        "the engine stamps clock + 7 s: {stamped} not in {before}+7000..={after}+7000"
    );
    // Stored as given (or pushed on by a renewal, from a later reading of the clock).
    let stored = seen.lease_until.expect("a record in flight carries a lease");
    assert!(
        (stamped..=after + length).contains(&stored),
        "the table stores the engine's lease: {stored}, stamped {stamped}"
    );

    // A takeover of a record whose owner's lease lapsed stamps a new lease.
    let key = call_key(1);
    let dead = Owner::from(format!("{}#1", Instance::new("pg").id()));
    // On the instance's terms, as the engine stamps a reservation.
    let (_, inserted) = common::reserve(store.as_ref(), &key, "charge_card", "order-1", &dead);
    assert!(matches!(inserted, Inserted::New { .. }));
    common::run_sql(
        &url,
        &format!("UPDATE \"{schema}\".records SET lease_until = 1 WHERE key = '{key}'"),
    )
    .unwrap();
    let before = store.clock();
    let seen: Result<Record, Error> = call(&store, 1)
        .in_doubt(InDoubtPolicy::Rerun)
        .run(|| Ok(block_on(store.get(&key)).unwrap().expect("the record taken over")));
    let seen = seen.unwrap();
    let after = store.clock();
    assert_eq!((seen.status, seen.attempts), (Status::InFlight, 2), "taken over: {seen:?}");
    let stored = seen.lease_until.expect("a record taken over carries a lease");
    assert!(
        (before + length..=after + length).contains(&stored),
        "the takeover's lease is the engine's new stamp: {stored} not in {before}+7000..={after}+7000"
    );
}

/// A reservation whose write took longer than a beat (held back 1.6 s, its lease of 2 s
/// stamped before it was sent) is renewed before its lease lapses: the heartbeat's first
/// renewal of a lease comes a beat after its stamp, not a beat after the write returned, which
/// would find it lapsed and refuse it.
#[test]
fn a_lease_whose_write_was_slow_is_renewed_before_it_lapses() {
    let Some((url, schema, _guard)) = common::scratch_schema("slow") else { return };
    let inner = PgStore::builder(&url).schema(&schema).connect().unwrap();
    let terms = Lease::new(Duration::from_secs(2), Some(Duration::from_millis(500))).unwrap();
    let counting = Arc::new(Counting {
        insert_delay: Duration::from_millis(1_600),
        ..Counting::new(inner).with_terms(terms)
    });
    let store: Arc<dyn Store> = counting.clone();
    let (entered, go) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
    let running = {
        let (store, entered, go) = (Arc::clone(&store), Arc::clone(&entered), Arc::clone(&go));
        std::thread::spawn(move || {
            call(&store, 0).run(|| {
                entered.wait();
                go.wait();
                Ok::<_, Error>("ch_0".to_owned())
            })
        })
    };
    entered.wait();
    let stamped = counting.stamped();
    // A lapsed lease is never renewed: one pushed past its stamp was renewed in time.
    let renewed = common::eventually(Duration::from_secs(5), || {
        lease_until(store.as_ref(), 0).is_some_and(|until| until > stamped)
    });
    let now = block_on(store.get(&call_key(0))).unwrap().unwrap();
    assert!(
        renewed,
        "the slow write's lease is renewed before it lapses: stamped {stamped}, now {now:?}"
    );
    go.wait();
    assert_eq!(running.join().unwrap().unwrap(), "ch_0");
}

/// PostgreSQL's reads are round trips (`Instance::remote_reads`): a fresh call and its replay
/// each reserve the key at once and learn from the reservation what it holds, with no read
/// first. The same table stated as a store whose reads are at hand replays from a read instead.
#[test]
fn a_call_reserves_without_reading_first_on_a_store_whose_reads_are_round_trips() {
    let Some((url, schema, _guard)) = common::scratch_schema("reads") else { return };
    let counting = Arc::new(Counting::new(table(&url, &schema)));
    assert!(counting.instance().remote_reads(), "PostgreSQL states that its reads are round trips");
    let store: Arc<dyn Store> = counting.clone();
    let runs = AtomicUsize::new(0);
    let charge = |store: &Arc<dyn Store>| {
        call(store, 0).run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("ch_0".to_owned())
        })
    };
    assert_eq!(charge(&store).unwrap(), "ch_0");
    assert_eq!(charge(&store).unwrap(), "ch_0");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the second call replays");
    assert_eq!(counting.gets.load(Ordering::SeqCst), 0, "no call read the key before reserving");
    assert_eq!(counting.inserted.lock().unwrap().len(), 2, "each call reserved once");

    let inner = table(&url, &schema);
    let terms = inner.instance().lease().expect("PostgreSQL's records carry leases");
    let at_hand = Arc::new(Counting {
        instance: Instance::new("pg").with_lease(terms),
        ..Counting::new(inner)
    });
    let store: Arc<dyn Store> = at_hand.clone();
    assert_eq!(charge(&store).unwrap(), "ch_0");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the third call replays too");
    assert_eq!(
        at_hand.gets.load(Ordering::SeqCst),
        1,
        "a store whose reads are at hand is read first"
    );
    assert!(
        at_hand.inserted.lock().unwrap().is_empty(),
        "and a replay from the read reserves nothing"
    );
}
