//! A takeover (an in-doubt key rerun, or an expired result run again) is guarded exactly like a
//! first reservation: cancelled before the body starts, it is undone; cancelled after, the key
//! is left in doubt. Never left in flight by a caller that has gone.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use idem_runtime::admin::{self, Filter};
use idem_runtime::store::now_ms;
use idem_runtime::{Call, Error, InDoubtPolicy, Key, SledStore, Status, Store};

fn sled() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path()).unwrap());
    (store, dir)
}

fn call(store: &Arc<dyn Store>, scope: &str) -> Call {
    Call::new("charge_card", scope, &4200).unwrap().store(Arc::clone(store))
}

fn record(store: &Arc<dyn Store>, key: &Key) -> Option<idem_runtime::Record> {
    idem_runtime::admin::show(store.as_ref(), key).ok()
}

/// Leaves `scope`'s key in doubt: the body said its effect may have landed, then failed.
fn put_in_doubt(store: &Arc<dyn Store>, scope: &str) -> Key {
    let outcome: Result<u32, Error> = call(store, scope).run(|| {
        idem_runtime::may_have_landed();
        Err(Error::Key { tool: "charge_card".into(), reason: "timed out".into() })
    });
    assert!(outcome.is_err());
    let key = call(store, scope).key().clone();
    assert_eq!(record(store, &key).map(|r| r.status), Some(Status::InDoubt));
    key
}

/// Finishes `scope`'s key with a 1 ms ttl, and returns once that result has expired.
fn put_expired(store: &Arc<dyn Store>, scope: &str) -> Key {
    let first: u32 =
        call(store, scope).ttl(Duration::from_millis(1)).run(|| Ok::<_, Error>(1)).unwrap();
    assert_eq!(first, 1);
    let key = call(store, scope).key().clone();
    let expires = record(store, &key).and_then(|r| r.expires_at).expect("a ttl was set");
    while now_ms() <= expires {
        std::thread::yield_now();
    }
    key
}

/// Polls a takeover until the store shows the key taken over (in flight, under a new owner) while
/// its body has not started, then drops it there. Returns false when the body started first.
fn drop_takeover_before_body(store: &Arc<dyn Store>, scope: &str, key: &Key) -> bool {
    let before = record(store, key).unwrap().owner;
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&ran);
    let future = call(store, scope).in_doubt(InDoubtPolicy::Rerun).run_async(move || async move {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<u32, Error>>().await
    });
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        assert!(matches!(future.as_mut().poll(&mut cx), Poll::Pending));
        if ran.load(Ordering::SeqCst) > 0 {
            return false;
        }
        let now = record(store, key).unwrap();
        if now.status == Status::InFlight && now.owner != before {
            return true;
        }
    }
}

/// Sets a key up with `setup` and drops a takeover of it between its write and its body, on a
/// fresh scope each try: a poll that finds the write already durable (the sync ran while this
/// thread was descheduled) goes straight on into the body, and such a try proves nothing.
fn caught(
    store: &Arc<dyn Store>,
    name: &str,
    setup: fn(&Arc<dyn Store>, &str) -> Key,
) -> (String, Key) {
    for attempt in 0..50 {
        let scope = format!("{name}-{attempt}");
        let key = setup(store, &scope);
        if drop_takeover_before_body(store, &scope, &key) {
            return (scope, key);
        }
    }
    panic!("no takeover could be dropped between its write and its body in 50 tries");
}

fn assert_not_in_flight(store: &Arc<dyn Store>, key: &Key, what: &str) {
    let status = record(store, key).map(|r| r.status);
    assert_ne!(status, Some(Status::InFlight), "{what}: the key is left in flight");
}

#[test]
fn a_rerun_dropped_before_its_body_leaves_the_key_in_doubt_as_it_was() {
    let (store, _dir) = sled();
    let (scope, key) = caught(&store, "rerun-dropped", put_in_doubt);
    let scope = scope.as_str();
    assert_eq!(
        record(&store, &key).map(|r| r.status),
        Some(Status::InDoubt),
        "the takeover is undone: the key is in doubt, as before"
    );
    let again: Result<u32, Error> = call(&store, scope).wait(Duration::from_secs(30)).run(|| Ok(2));
    assert!(matches!(again, Err(Error::InDoubt { .. })), "{again:?}");
    let rerun: u32 =
        call(&store, scope).in_doubt(InDoubtPolicy::Rerun).run(|| Ok::<_, Error>(3)).unwrap();
    assert_eq!(rerun, 3, "a later rerun runs the body");
}

#[test]
fn an_expired_result_taken_over_and_dropped_before_its_body_runs_on_the_next_call() {
    let (store, _dir) = sled();
    let (scope, key) = caught(&store, "expired-dropped", put_expired);
    let scope = scope.as_str();
    assert_not_in_flight(&store, &key, "after the dropped takeover");
    let runs = AtomicUsize::new(0);
    let next: u32 = call(&store, scope)
        .wait(Duration::from_secs(30))
        .run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(4)
        })
        .unwrap();
    assert_eq!((next, runs.load(Ordering::SeqCst)), (4, 1), "the next call runs the body");
}

#[test]
fn a_rerun_dropped_after_its_body_started_leaves_the_key_in_doubt() {
    let (store, _dir) = sled();
    let scope = "rerun-started";
    let key = put_in_doubt(&store, scope);
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&ran);
    let future = call(&store, scope).in_doubt(InDoubtPolicy::Rerun).run_async(move || async move {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<u32, Error>>().await
    });
    {
        let mut future = pin!(future);
        let mut cx = Context::from_waker(Waker::noop());
        while ran.load(Ordering::SeqCst) == 0 {
            assert!(matches!(future.as_mut().poll(&mut cx), Poll::Pending));
        }
    }
    let after = record(&store, &key).unwrap();
    assert_eq!((after.status, after.attempts), (Status::InDoubt, 2), "in doubt, its body ran");
}

#[test]
fn two_hundred_takeovers_under_random_timeouts_leave_no_key_in_flight() {
    let (store, _dir) = sled();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let first_seed = now_ms() | 1;
    let mut seed = first_seed;
    let mut random = move |below: u64| {
        // xorshift: enough to spread the timeouts, and the seed is printed on failure.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let scopes: Vec<String> = (0..200).map(|i| format!("many-{i}")).collect();
    for (i, scope) in scopes.iter().enumerate() {
        if i % 2 == 0 {
            put_in_doubt(&store, scope);
        } else {
            put_expired(&store, scope);
        }
    }
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for scope in &scopes {
            let (timeout, work) = (random(2_000), random(2_000));
            let takeover =
                call(&store, scope).in_doubt(InDoubtPolicy::Rerun).run_async(move || async move {
                    tokio::time::sleep(Duration::from_micros(work)).await;
                    Ok::<_, Error>(5u32)
                });
            tasks
                .push(tokio::spawn(tokio::time::timeout(Duration::from_micros(timeout), takeover)));
        }
        for task in tasks {
            let _ = task.await.unwrap();
        }
    });
    let in_flight = admin::list(store.as_ref(), &Filter::new().status(Status::InFlight)).unwrap();
    assert!(
        in_flight.is_empty(),
        "{} of 200 takeovers left their key in flight (seed {first_seed}): {:?}",
        in_flight.len(),
        in_flight.iter().map(|r| &r.key).collect::<Vec<_>>()
    );
}
