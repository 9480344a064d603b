//! Approval on a real server: a request, a decision made through another store instance (as
//! `idem approve` on another machine would), the waiting call woken by its `NOTIFY`, racing
//! decisions, and a table from before approvals whose status check is widened on connect.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem_postgres::PgStore;
use idem_runtime::admin::{self, Decision};
use idem_runtime::history::Event;
use idem_runtime::{Call, Error, Key, Status, Store};

fn connect(url: &str, schema: &str) -> Arc<dyn Store> {
    Arc::new(PgStore::builder(url).schema(schema).pool_size(4).connect().unwrap())
}

fn refund(store: &Arc<dyn Store>, amount: u64) -> Call {
    Call::new("refund", "order-17", &serde_json::json!({ "amount": amount }))
        .unwrap()
        .store(Arc::clone(store))
        .approve(true)
}

fn run(call: Call, runs: &AtomicUsize) -> Result<String, Error> {
    call.run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("re_1".to_owned())
    })
}

fn asked(store: &Arc<dyn Store>, amount: u64, runs: &AtomicUsize) -> Key {
    match run(refund(store, amount), runs) {
        Err(Error::AwaitingApproval { key, .. }) => key.parse().unwrap(),
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
}

#[test]
fn an_approval_from_another_instance_wakes_the_waiting_call_which_runs_once() {
    let Some((url, schema, _guard)) = common::scratch_schema("appr") else { return };
    let (agent, operator) = (connect(&url, &schema), connect(&url, &schema));
    let runs = AtomicUsize::new(0);
    let call = || refund(&agent, 5000).approve_wait(Duration::from_secs(60));
    let key = call().key().clone();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| run(call(), &runs));
        let deadline = Instant::now() + Duration::from_secs(30);
        while idem_runtime::waiting(key.as_str()) == 0 {
            assert!(Instant::now() < deadline, "the call never started waiting");
            std::thread::yield_now();
        }
        let record = admin::show(operator.as_ref(), &key).unwrap();
        assert_eq!(record.status, Status::AwaitingApproval);
        assert_eq!(record.lease_until, None, "a request holds no lease");
        let started = Instant::now();
        admin::decide(operator.as_ref(), &key, Decision::Approve, "ann@ops", Some("ok")).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), "re_1");
        assert!(started.elapsed() < Duration::from_secs(15), "woken by the NOTIFY, not a lease");
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let history = admin::history(operator.as_ref(), &key).unwrap();
    let events: Vec<Event> = history.iter().map(|entry| entry.event).collect();
    assert_eq!(events, [Event::ApprovalRequested, Event::Approved, Event::TookOver, Event::Done]);
    assert_eq!((history[1].by.as_str(), history[1].note.as_deref()), ("ann@ops", Some("ok")));
}

#[test]
fn of_two_instances_deciding_at_once_exactly_one_wins() {
    let Some((url, schema, _guard)) = common::scratch_schema("aprace") else { return };
    let stores = [connect(&url, &schema), connect(&url, &schema)];
    let runs = AtomicUsize::new(0);
    for round in 0..10 {
        let key = asked(&stores[0], 100 + round, &runs);
        let barrier = Barrier::new(2);
        let outcomes: Vec<Result<_, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = [Decision::Approve, Decision::Deny]
                .into_iter()
                .zip(&stores)
                .map(|(decision, store)| {
                    let (key, barrier) = (&key, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        admin::decide(store.as_ref(), key, decision, "ops@host", None)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<Status> = outcomes.iter().flatten().map(|record| record.status).collect();
        assert_eq!(won.len(), 1, "round {round}: {outcomes:?}");
        let before = runs.load(Ordering::SeqCst);
        let got = run(refund(&stores[1], 100 + round), &runs);
        match won[0] {
            Status::Approved => assert!(got.is_ok() && runs.load(Ordering::SeqCst) == before + 1),
            _ => assert!(matches!(got, Err(Error::Denied { .. }))),
        }
        let history = admin::history(stores[1].as_ref(), &key).unwrap();
        assert_eq!(history.len(), if won[0] == Status::Approved { 4 } else { 2 }, "{history:?}");
    }
}

#[test]
fn a_table_from_before_approvals_takes_the_new_statuses_once_a_store_connects() {
    let Some((url, schema, _guard)) = common::scratch_schema("apmig") else { return };
    drop(connect(&url, &schema));
    // As a release before approvals left the check.
    common::run_sql(
        &url,
        &format!(
            "ALTER TABLE \"{schema}\".records DROP CONSTRAINT records_status_check; \
             ALTER TABLE \"{schema}\".records ADD CONSTRAINT records_status_check \
             CHECK (status IN ('in-flight', 'done', 'in-doubt'))"
        ),
    )
    .unwrap();
    let store = connect(&url, &schema);
    let runs = AtomicUsize::new(0);
    let key = asked(&store, 42, &runs);
    admin::decide(store.as_ref(), &key, Decision::Deny, "bob@ops", Some("no")).unwrap();
    assert!(matches!(run(refund(&store, 42), &runs), Err(Error::Denied { .. })));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A transactional call of a key that awaits a person's decision, or was denied, does not run
/// its body (it neither asks nor waits); once approved, it runs the body once.
#[test]
fn a_transactional_call_runs_only_what_a_person_approved() {
    let Some((url, schema, _guard)) = common::scratch_schema("aptx") else { return };
    let pg = Arc::new(PgStore::builder(&url).schema(&schema).pool_size(4).connect().unwrap());
    let store: Arc<dyn Store> = pg.clone();
    let runs = AtomicUsize::new(0);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let transactional = |amount: u64| -> Result<String, Error> {
        let call =
            Call::new("refund", "order-17", &serde_json::json!({ "amount": amount })).unwrap();
        runtime.block_on(pg.transactional(call).run(async |_tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("re_tx".to_owned())
        }))
    };

    let waiting = asked(&store, 1, &runs);
    match transactional(1) {
        Err(Error::AwaitingApproval { key, .. }) => assert_eq!(key, waiting.as_str()),
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
    let denied = asked(&store, 2, &runs);
    admin::decide(store.as_ref(), &denied, Decision::Deny, "ann@ops", Some("no")).unwrap();
    match transactional(2) {
        Err(Error::Denied { by, note, .. }) => {
            assert_eq!((by.as_str(), note.as_deref()), ("ann@ops", Some("no")))
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no body ran before a decision");
    admin::decide(store.as_ref(), &waiting, Decision::Approve, "ann@ops", None).unwrap();
    assert_eq!(transactional(1).unwrap(), "re_tx");
    assert_eq!(transactional(1).unwrap(), "re_tx", "and replays");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the approved body ran once");
}
