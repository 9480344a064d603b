//! How a call's record is settled when things go wrong around it: a final write the database
//! refuses, a call cancelled before its body starts, a sibling call that wants the record.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::block_on;
use idem_runtime::conformance::{new_call, transition};
use idem_runtime::store::Inserted;
use idem_runtime::{Call, Error, Store};

fn store(url: &str, schema: &str, lease: Duration) -> Arc<dyn Store> {
    Arc::new(
        PgStore::builder(url)
            .schema(schema)
            .lease(lease)
            .pool_size(4)
            .connect()
            .expect("the store connects"),
    )
}

/// How many in-flight records hold a lease that has not lapsed by the database's clock.
fn live_leases(url: &str, schema: &str) -> i64 {
    common::query_i64(
        url,
        &format!(
            "SELECT count(*) FROM \"{schema}\".records WHERE status = 'in-flight' \
             AND lease_until > (extract(epoch from clock_timestamp()) * 1000)::bigint"
        ),
    )
}

#[test]
fn a_failed_final_write_lets_the_lease_lapse() {
    let Some((url, schema, _guard)) = common::scratch_schema("final") else { return };
    let store = store(&url, &schema, Duration::from_secs(1));
    // From now on the table refuses every status change and every delete: the owner's last
    // word (done, released, in doubt) cannot land.
    common::run_sql(
        &url,
        &format!(
            "CREATE FUNCTION \"{schema}\".refuse() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'status changes are refused here'; END $$; \
             CREATE TRIGGER refuse BEFORE UPDATE OF status OR DELETE ON \"{schema}\".records \
             FOR EACH ROW EXECUTE FUNCTION \"{schema}\".refuse();"
        ),
    )
    .unwrap();
    let runs = AtomicU32::new(0);
    let call = |key: &str| {
        Call::new("final_write", key, &1)
            .unwrap()
            .store(Arc::clone(&store))
            .wait(Duration::from_secs(30))
    };

    let done: Result<u32, Error> = call("done").run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(1)
    });
    let message = done.expect_err("the result could not be stored").to_string();

    let released: Result<u32, Error> = call("released").run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Err(Error::Key { tool: "final_write".into(), reason: "refused by the vendor".into() })
    });
    assert!(matches!(released, Err(Error::Key { .. })), "the body's error comes back");

    assert!(
        common::eventually(Duration::from_secs(20), || live_leases(&url, &schema) == 0),
        "no lease is renewed once its owner's last write failed"
    );
    for key in ["done", "released"] {
        let again: Result<u32, Error> = call(key).run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(2)
        });
        assert!(
            matches!(again, Err(Error::InDoubt { .. })),
            "key {key}: the next caller is told the key is in doubt at once, not after its \
             whole wait: {again:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "no body ran twice");
    assert!(message.contains("status changes are refused here"), "{message}");
    assert!(message.contains("P0001"), "the SQLSTATE is in the text: {message}");
    assert!(message.contains("trigger"), "the advice fits the cause: {message}");
}

#[test]
fn a_release_that_fails_once_is_retried_and_frees_the_key() {
    let Some((url, schema, _guard)) = common::scratch_schema("release") else { return };
    let store = store(&url, &schema, Duration::from_secs(15));
    // The first delete fails; the ones after it go through (a sequence's increments survive
    // the failing statement's rollback).
    common::run_sql(
        &url,
        &format!(
            "CREATE SEQUENCE \"{schema}\".deletes; \
             CREATE FUNCTION \"{schema}\".refuse_first() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF nextval('\"{schema}\".deletes') = 1 THEN \
             RAISE EXCEPTION 'not this time'; END IF; RETURN OLD; END $$; \
             CREATE TRIGGER refuse_first BEFORE DELETE ON \"{schema}\".records \
             FOR EACH ROW EXECUTE FUNCTION \"{schema}\".refuse_first();"
        ),
    )
    .unwrap();
    let runs = AtomicU32::new(0);
    let call = || {
        Call::new("release_once", "k", &1)
            .unwrap()
            .store(Arc::clone(&store))
            .wait(Duration::from_secs(10))
    };
    let first: Result<u32, Error> = call().run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Err(Error::Key { tool: "release_once".into(), reason: "vendor said no".into() })
    });
    assert!(matches!(first, Err(Error::Key { .. })), "{first:?}");
    let second: Result<u32, Error> = call().run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(7)
    });
    assert_eq!(second.expect("the key was released, so the next call runs"), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[test]
fn reservations_cancelled_before_the_body_leave_no_false_doubt() {
    let Some((url, schema, _guard)) = common::scratch_schema("cancel") else { return };
    let store = store(&url, &schema, Duration::from_secs(1));
    const CALLS: usize = 300;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..CALLS).map(|_| AtomicU32::new(0)).collect());
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let call = |n: usize, wait: Duration| {
        let runs = Arc::clone(&runs);
        Call::new("cancelled", "c", &n).unwrap().store(Arc::clone(&store)).wait(wait).run_async(
            move || async move {
                runs[n].fetch_add(1, Ordering::SeqCst);
                Ok::<usize, Error>(n)
            },
        )
    };
    runtime.block_on(async {
        // A few at a time, so that the timeouts (spread over 0-2 ms) fall while reservations
        // are in the air rather than while they queue.
        for batch in (0..CALLS).collect::<Vec<_>>().chunks(4) {
            let tasks: Vec<_> = batch
                .iter()
                .map(|&n| {
                    let limit = Duration::from_micros((n as u64 * 7919) % 2000);
                    tokio::spawn(tokio::time::timeout(limit, call(n, Duration::from_secs(10))))
                })
                .collect();
            for task in tasks {
                let _ = task.await.unwrap();
            }
        }
    });
    let cancelled_early = runs.iter().filter(|r| r.load(Ordering::SeqCst) == 0).count();
    eprintln!("{cancelled_early} of {CALLS} calls were cancelled before their body ran");
    runtime.block_on(async {
        for n in 0..CALLS {
            let ran_before = runs[n].load(Ordering::SeqCst);
            let again = call(n, Duration::from_secs(10)).await;
            if ran_before == 0 {
                assert_eq!(
                    again.as_ref().ok(),
                    Some(&n),
                    "key {n}: its body never ran, so the next call runs it: {again:?}"
                );
                assert_eq!(runs[n].load(Ordering::SeqCst), 1, "key {n}");
            } else {
                // The body ran: a replay, or in doubt when the call was cancelled before its
                // result was stored. Never a second run.
                assert!(
                    matches!(again, Ok(got) if got == n)
                        || matches!(again, Err(Error::InDoubt { .. })),
                    "key {n}: {again:?}"
                );
                assert_eq!(runs[n].load(Ordering::SeqCst), 1, "key {n} ran twice");
            }
        }
    });
}

#[test]
fn a_sibling_call_cannot_take_over_a_live_lease() {
    let Some((url, schema, _guard)) = common::scratch_schema("sibling") else { return };
    let store = PgStore::builder(&url).schema(&schema).pool_size(2).connect().unwrap();
    let owner = new_call(store.instance().id());
    let (_, inserted) = common::reserve(&store, "k", "sibling", "s", &owner);
    assert!(matches!(inserted, Inserted::New { .. }), "the first call reserves");
    let held = block_on(store.get("k")).unwrap().expect("the record is there");

    // A sibling of the same store instance, believing the lease lapsed, tries to take over.
    let sibling_owner = new_call(store.instance().id());
    let sibling =
        transition::take_over(&held, &sibling_owner, None, store.clock(), store.instance().lease());
    assert!(
        common::swap(&store, &held, sibling).is_none(),
        "a live lease is not taken over, by a sibling either"
    );
    let now = block_on(store.get("k")).unwrap().unwrap();
    assert_eq!((&now.owner, now.attempts), (&owner, held.attempts));

    // Once the lease has lapsed by the database's clock, the sibling may.
    common::run_sql(
        &url,
        &format!("UPDATE \"{schema}\".records SET lease_until = 0 WHERE key = 'k'"),
    )
    .unwrap();
    let lapsed = block_on(store.get("k")).unwrap().unwrap();
    let sibling = transition::take_over(
        &lapsed,
        &sibling_owner,
        None,
        store.clock(),
        store.instance().lease(),
    );
    assert!(common::swap(&store, &lapsed, sibling).is_some(), "a lapsed lease is");
    // And the owner's own settling write is still accepted while its lease lives.
    let (other_record, inserted) = common::reserve(&store, "k2", "sibling", "s", &owner);
    assert!(matches!(inserted, Inserted::New { .. }));
    let done = transition::complete(&other_record, "1".into(), None, store.clock());
    assert!(common::swap(&store, &other_record, done).is_some(), "the owner settles its own");
}
