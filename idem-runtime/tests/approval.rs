//! A tool that needs a person's approval, on a real sled store: the first call records its key
//! as awaiting approval and runs nothing, a person decides (`admin::decide`, what `idem approve`
//! and `idem deny` call), and the next call runs the body once, or is refused with the note.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem_runtime::admin::{self, Decision};
use idem_runtime::history::Event;
use idem_runtime::{Call, Error, Key, SledStore, Status, Store};

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::builder(dir.path().join("store"))
        .durability(idem_runtime::Durability::None)
        .open()
        .unwrap();
    (dir, Arc::new(store))
}

/// A refund of `amount` on order 17, which needs approval.
fn refund(store: &Arc<dyn Store>, amount: u64) -> Call {
    Call::new("refund", "order-17", &serde_json::json!({ "amount": amount }))
        .unwrap()
        .store(Arc::clone(store))
        .approve(true)
}

/// Runs the refund, counting the body's runs in `runs`.
fn run(call: Call, runs: &AtomicUsize) -> Result<String, Error> {
    call.run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("re_1".to_owned())
    })
}

fn key(error: &Error) -> Key {
    match error {
        Error::AwaitingApproval { key, .. } => key.parse().unwrap(),
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
}

fn status(store: &Arc<dyn Store>, key: &Key) -> Status {
    admin::show(store.as_ref(), key).unwrap().status
}

#[test]
fn the_first_call_asks_and_every_retry_before_a_decision_runs_nothing() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let first = run(refund(&store, 5000), &runs).unwrap_err();
    let key = key(&first);
    assert_eq!(key, *refund(&store, 5000).key(), "the error names the call's own key");
    assert!(first.to_string().contains(&format!("idem approve {key}")), "{first}");
    assert!(first.to_string().contains("other arguments is another request"), "{first}");
    for _ in 0..3 {
        let again = run(refund(&store, 5000), &runs).unwrap_err();
        assert!(matches!(again, Error::AwaitingApproval { .. }), "{again:?}");
        assert!(!again.is_retryable(), "a person must act first");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran before a decision");
    let record = admin::show(store.as_ref(), &key).unwrap();
    assert_eq!((record.status, record.attempts), (Status::AwaitingApproval, 0));
    let history = admin::history(store.as_ref(), &key).unwrap();
    assert_eq!(history.len(), 1, "one request, however many calls: {history:?}");
    assert_eq!(history[0].event, Event::ApprovalRequested);
    let waiting =
        admin::list(store.as_ref(), &admin::Filter::new().status(Status::AwaitingApproval))
            .unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!((waiting[0].tool.as_str(), waiting[0].scope.as_str()), ("refund", "order-17"));
}

#[test]
fn an_approved_key_runs_the_body_once_and_then_replays() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let key = key(&run(refund(&store, 5000), &runs).unwrap_err());
    let approved = admin::decide(
        store.as_ref(),
        &key,
        Decision::Approve,
        "ann@ops",
        Some("checked the order"),
    )
    .unwrap();
    assert_eq!(approved.status, Status::Approved);
    for _ in 0..3 {
        assert_eq!(run(refund(&store, 5000), &runs).unwrap(), "re_1");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once after the approval");
    let history = admin::history(store.as_ref(), &key).unwrap();
    let events: Vec<Event> = history.iter().map(|entry| entry.event).collect();
    assert_eq!(
        events,
        [Event::ApprovalRequested, Event::Approved, Event::TookOver, Event::Done],
        "{history:?}"
    );
    assert_eq!(history[1].by, "ann@ops", "who approved");
    assert_eq!(history[1].note.as_deref(), Some("checked the order"));
    assert!(history[1].at >= history[0].at, "when");
}

#[test]
fn an_approval_is_bound_to_the_arguments_it_was_given_for() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let key = key(&run(refund(&store, 5000), &runs).unwrap_err());
    admin::decide(store.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap();
    // The model changes the amount: another key, and another request.
    let changed = run(refund(&store, 9000), &runs).unwrap_err();
    let changed_key = self::key(&changed);
    assert_ne!(changed_key, key);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the approval of 5000 does not run 9000");
    assert_eq!(status(&store, &changed_key), Status::AwaitingApproval);
    assert_eq!(run(refund(&store, 5000), &runs).unwrap(), "re_1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the approved amount runs");
    assert_eq!(status(&store, &changed_key), Status::AwaitingApproval, "9000 still waits");
}

#[test]
fn a_denied_key_refuses_every_call_with_the_note() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let key = key(&run(refund(&store, 5000), &runs).unwrap_err());
    admin::decide(store.as_ref(), &key, Decision::Deny, "bob@ops", Some("over the limit")).unwrap();
    for _ in 0..3 {
        match run(refund(&store, 5000), &runs) {
            Err(Error::Denied { key: denied, by, note, .. }) => {
                assert_eq!(denied, key.as_str());
                assert_eq!((by.as_str(), note.as_deref()), ("bob@ops", Some("over the limit")));
            }
            other => panic!("expected Denied, got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let late = admin::decide(store.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap_err();
    assert!(matches!(late, Error::NotAwaitingApproval { status: Status::Denied, .. }), "{late:?}");
}

#[test]
fn of_an_approval_and_a_denial_racing_exactly_one_wins_and_the_call_follows_it() {
    for round in 100..120 {
        let (_dir, store) = store();
        let runs = AtomicUsize::new(0);
        let key = key(&run(refund(&store, 5000 + round), &runs).unwrap_err());
        let barrier = Barrier::new(2);
        let decisions = [Decision::Approve, Decision::Deny];
        let outcomes: Vec<Result<_, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = decisions
                .iter()
                .map(|&decision| {
                    let (store, key, barrier) = (&store, &key, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        admin::decide(store.as_ref(), key, decision, "ops@host", Some("race"))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<Status> = outcomes.iter().flatten().map(|record| record.status).collect();
        assert_eq!(won.len(), 1, "round {round}: exactly one decision lands: {outcomes:?}");
        let lost = outcomes.iter().find_map(|o| o.as_ref().err()).unwrap();
        assert!(matches!(lost, Error::NotAwaitingApproval { .. }), "{lost:?}");
        let history = admin::history(store.as_ref(), &key).unwrap();
        assert_eq!(history.len(), 2, "round {round}: one request, one decision: {history:?}");
        let got = run(refund(&store, 5000 + round), &runs);
        match won[0] {
            Status::Approved => assert!(got.is_ok() && runs.load(Ordering::SeqCst) == 1),
            _ => assert!(
                matches!(got, Err(Error::Denied { .. })) && runs.load(Ordering::SeqCst) == 0
            ),
        }
    }
}

#[test]
fn a_call_waiting_for_the_decision_runs_once_it_is_approved() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    // An amount of its own: `waiting` counts the calls of this process, of every test.
    let call = || refund(&store, 5001).approve_wait(Duration::from_secs(60));
    let key = call().key().clone();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| run(call(), &runs));
        // The call has recorded its request and waits on it: observed, not slept on.
        let deadline = Instant::now() + Duration::from_secs(30);
        while idem_runtime::waiting(key.as_str()) == 0 {
            assert!(Instant::now() < deadline, "the call never started waiting");
            std::thread::yield_now();
        }
        assert_eq!(status(&store, &key), Status::AwaitingApproval);
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing runs while it waits");
        let started = Instant::now();
        admin::decide(store.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), "re_1");
        assert!(started.elapsed() < Duration::from_secs(30), "woken by the decision");
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(status(&store, &key), Status::Done);
}

#[test]
fn a_call_waiting_for_a_decision_that_does_not_come_gives_up_at_its_bound() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let started = Instant::now();
    let got = run(refund(&store, 5003).approve_wait(Duration::from_millis(200)), &runs);
    assert!(matches!(got, Err(Error::AwaitingApproval { .. })), "{got:?}");
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited its bound");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[test]
fn a_denial_wakes_a_waiting_call_with_the_note() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let call = || refund(&store, 5002).approve_wait(Duration::from_secs(60));
    let key = call().key().clone();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| run(call(), &runs));
        let deadline = Instant::now() + Duration::from_secs(30);
        while idem_runtime::waiting(key.as_str()) == 0 {
            assert!(Instant::now() < deadline, "the call never started waiting");
            std::thread::yield_now();
        }
        admin::decide(store.as_ref(), &key, Decision::Deny, "bob@ops", Some("no")).unwrap();
        let got = waiter.join().unwrap();
        assert!(matches!(&got, Err(Error::Denied { note: Some(n), .. }) if n == "no"), "{got:?}");
    });
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[test]
fn an_approval_older_than_the_calls_approval_ttl_is_asked_for_again() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let ttl = Duration::from_millis(100);
    let key = key(&run(refund(&store, 5000).approval_ttl(ttl), &runs).unwrap_err());
    let approved = admin::decide(store.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap();
    // The store's clock passes the approval's end (observed on that clock).
    while store.clock() < approved.updated_at + ttl.as_millis() as u64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let again = run(refund(&store, 5000).approval_ttl(ttl), &runs).unwrap_err();
    assert!(matches!(again, Error::AwaitingApproval { .. }), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "an expired approval runs nothing");
    let history = admin::history(store.as_ref(), &key).unwrap();
    let last = history.last().unwrap();
    assert_eq!(last.event, Event::ApprovalRequested);
    assert!(last.note.as_deref().is_some_and(|n| n.contains("approval expired")), "{history:?}");
    // Approved anew, and used in time, it runs.
    admin::decide(store.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap();
    assert_eq!(
        run(refund(&store, 5000).approval_ttl(Duration::from_secs(60)), &runs).unwrap(),
        "re_1"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_call_that_needs_no_approval_runs_at_once() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let small = refund(&store, 20).approve(false);
    assert_eq!(run(small, &runs).unwrap(), "re_1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_denied_key_purged_by_age_asks_again() {
    let (_dir, store) = store();
    let runs = AtomicUsize::new(0);
    let key = key(&run(refund(&store, 5000), &runs).unwrap_err());
    admin::decide(store.as_ref(), &key, Decision::Deny, "bob@ops", Some("no")).unwrap();
    let older = admin::Purge::OlderThan(Duration::ZERO);
    // An awaiting key is never purged; a denied one is, by age.
    while store.clock() == admin::show(store.as_ref(), &key).unwrap().updated_at {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(admin::purge(store.as_ref(), older, "ann@ops").unwrap().records, 1);
    let again = run(refund(&store, 5000), &runs).unwrap_err();
    assert!(matches!(again, Error::AwaitingApproval { .. }), "{again:?}");
    assert_eq!(admin::purge(store.as_ref(), older, "ann@ops").unwrap().records, 0);
    assert_eq!(status(&store, &key), Status::AwaitingApproval);
}

/// The process that holds the store answers `idem approve` on its admin socket: the decision is
/// fenced and wakes the waiting call like any write of that process.
#[cfg(unix)]
#[test]
fn a_decision_through_the_admin_socket_wakes_the_waiting_call() {
    use idem_runtime::admin::Admin;
    use idem_runtime::remote::Remote;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&path).unwrap());
    let runs = AtomicUsize::new(0);
    let call = || refund(&store, 5004).approve_wait(Duration::from_secs(60));
    let key = call().key().clone();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| run(call(), &runs));
        let deadline = Instant::now() + Duration::from_secs(30);
        while idem_runtime::waiting(key.as_str()) == 0 {
            assert!(Instant::now() < deadline, "the call never started waiting");
            std::thread::yield_now();
        }
        let mut remote = Remote::connect(&path).unwrap().expect("the holder serves the socket");
        let listed = remote.list(&admin::Filter::new().status(Status::AwaitingApproval)).unwrap();
        assert_eq!(listed.len(), 1);
        let approved = remote.decide(&key, Decision::Approve, "ann@ops", Some("ok")).unwrap();
        assert_eq!(approved.status, Status::Approved);
        assert_eq!(waiter.join().unwrap().unwrap(), "re_1");
        // A second decision finds the key decided, and says so through the socket as locally.
        let late = remote.decide(&key, Decision::Deny, "bob@ops", Some("no")).unwrap_err();
        assert!(matches!(late, Error::NotAwaitingApproval { .. }), "{late:?}");
        let history = remote.history(&key).unwrap();
        let approval = history.iter().find(|entry| entry.event == Event::Approved).unwrap();
        assert_eq!((approval.by.as_str(), approval.note.as_deref()), ("ann@ops", Some("ok")));
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
