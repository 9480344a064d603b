//! What the engine reports through the `metrics` facade, read back with `metrics-util`'s
//! debugging recorder. One test, since the recorder is the process's global one and syncs are
//! counted per process.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::admin::{self, Decision};
use idem_runtime::block_on;
use idem_runtime::store::Stored;
use idem_runtime::{
    may_have_landed, Call, Durability, Error, InDoubtPolicy, Reconciled, Retention, SledStore,
    Store,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;

/// What was recorded since the last look: counters by name and labels, and the number of
/// samples per histogram.
#[derive(Debug, Default)]
struct Seen {
    counters: BTreeMap<String, u64>,
    samples: BTreeMap<String, usize>,
}

impl Seen {
    fn take(snapshotter: &Snapshotter) -> Seen {
        let mut seen = Seen::default();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<String> =
                key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            match value {
                DebugValue::Counter(0) => {}
                DebugValue::Counter(n) => *seen.counters.entry(name).or_default() += n,
                DebugValue::Histogram(values) if values.is_empty() => {}
                DebugValue::Histogram(values) => {
                    *seen.samples.entry(name).or_default() += values.len()
                }
                DebugValue::Gauge(_) => panic!("idem sets no gauges: {name}"),
            }
        }
        seen
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    fn calls(&self) -> BTreeMap<&str, u64> {
        self.counters
            .iter()
            .filter(|(name, _)| name.starts_with("idem_calls_total"))
            .map(|(name, n)| (name.as_str(), *n))
            .collect()
    }
}

/// Returns once a caller waits for `call`'s key (the store has registered it for the change,
/// so it cannot miss it), as the conformance suite does: never a sleep in its place.
fn until_waiting(call: &Call) {
    let until = Instant::now() + Duration::from_secs(20);
    while idem_runtime::waiting(call.key().as_str()) == 0 {
        assert!(Instant::now() < until, "no caller ever waited for {}", call.key());
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn charge(store: &Arc<dyn Store>, order: &str) -> Call {
    Call::new("charge_card", order, &json!({"amount": 4200})).unwrap().store(Arc::clone(store))
}

#[test]
fn counts_fresh_calls_replays_waits_errors_in_doubt_keys_releases_takeovers_and_syncs() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SledStore::builder(dir.path().join("idem.sled"))
            .durability(Durability::Fsync)
            .open()
            .unwrap(),
    );
    Seen::take(&snapshotter);
    let mut runs = 0;

    // A fresh call: the body runs; two durable points (the reservation, the result).
    let got: Result<String, Error> = charge(&store, "order-1").run(|| {
        runs += 1;
        Ok("ch_1".to_owned())
    });
    assert_eq!(got.unwrap(), "ch_1");
    let seen = Seen::take(&snapshotter);
    assert_eq!(
        seen.calls(),
        BTreeMap::from([("idem_calls_total{tool=charge_card,outcome=fresh}", 1)]),
        "{seen:?}"
    );
    assert_eq!(seen.samples["idem_call_duration_seconds{tool=charge_card,outcome=fresh}"], 1);
    assert_eq!(seen.counter("idem_syncs_total{}"), 2, "{seen:?}");
    assert_eq!(seen.samples["idem_sync_duration_seconds{}"], 2);

    // A replay: nothing runs, nothing is written.
    let got: Result<String, Error> = charge(&store, "order-1").run(|| {
        runs += 1;
        Ok("ch_again".to_owned())
    });
    assert_eq!((got.unwrap(), runs), ("ch_1".to_owned(), 1));
    let seen = Seen::take(&snapshotter);
    assert_eq!(
        seen.calls(),
        BTreeMap::from([("idem_calls_total{tool=charge_card,outcome=replay}", 1)]),
        "{seen:?}"
    );
    assert_eq!(seen.samples["idem_call_duration_seconds{tool=charge_card,outcome=replay}"], 1);
    assert_eq!(seen.counter("idem_syncs_total{}"), 0);

    // A second caller waits for an owner and is handed its result: counted as waited, with the
    // time it waited; the owner is the only fresh call.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
    let owner = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || -> Result<String, Error> {
            charge(&store, "order-5").run(|| {
                entered_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                Ok("ch_5".to_owned())
            })
        })
    };
    entered_rx.recv().unwrap();
    let waiter = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || -> Result<String, Error> {
            charge(&store, "order-5")
                .wait(Duration::from_secs(20))
                .run(|| unreachable!("the owner is alive: a waiter never runs the body"))
        })
    };
    until_waiting(&charge(&store, "order-5"));
    finish_tx.send(()).unwrap();
    assert_eq!(owner.join().unwrap().unwrap(), "ch_5");
    assert_eq!(waiter.join().unwrap().unwrap(), "ch_5");
    let seen = Seen::take(&snapshotter);
    assert_eq!(
        seen.calls(),
        BTreeMap::from([
            ("idem_calls_total{tool=charge_card,outcome=fresh}", 1),
            ("idem_calls_total{tool=charge_card,outcome=waited}", 1),
        ]),
        "{seen:?}"
    );
    assert_eq!(seen.samples["idem_wait_duration_seconds{tool=charge_card}"], 1, "{seen:?}");
    // The latency histogram is of fresh calls and replays; a wait has its own.
    assert_eq!(seen.samples["idem_call_duration_seconds{tool=charge_card,outcome=fresh}"], 1);
    assert!(!seen.samples.keys().any(|name| name.contains("outcome=waited")), "{seen:?}");

    // A wait that runs out is an error of idem's (the key is still in flight), and its time
    // is counted too.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
    let owner = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || -> Result<String, Error> {
            charge(&store, "order-6").run(|| {
                entered_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                Ok("ch_6".to_owned())
            })
        })
    };
    entered_rx.recv().unwrap();
    let got: Result<String, Error> = charge(&store, "order-6")
        .wait(Duration::from_millis(20))
        .run(|| unreachable!("the owner is alive: a waiter never runs the body"));
    assert!(matches!(got, Err(Error::InFlight { .. })), "{got:?}");
    finish_tx.send(()).unwrap();
    assert_eq!(owner.join().unwrap().unwrap(), "ch_6");
    let seen = Seen::take(&snapshotter);
    assert_eq!(
        seen.calls(),
        BTreeMap::from([
            ("idem_calls_total{tool=charge_card,outcome=error}", 1),
            ("idem_calls_total{tool=charge_card,outcome=fresh}", 1),
        ]),
        "{seen:?}"
    );
    assert_eq!(seen.samples["idem_wait_duration_seconds{tool=charge_card}"], 1, "{seen:?}");

    // In doubt twice: the call that left it so, and the next one, which refuses to run.
    let got: Result<String, Error> = charge(&store, "order-2").run(|| {
        may_have_landed();
        Err(Error::NotFound { key: "the vendor's answer timed out".to_owned() })
    });
    assert!(got.is_err());
    let got: Result<String, Error> = charge(&store, "order-2").run(|| {
        runs += 1;
        Ok("ch_2".to_owned())
    });
    assert!(matches!(got, Err(Error::InDoubt { .. })), "{got:?}");
    assert_eq!(runs, 1);
    let seen = Seen::take(&snapshotter);
    assert_eq!(
        seen.calls(),
        BTreeMap::from([("idem_calls_total{tool=charge_card,outcome=in-doubt}", 2)]),
        "{seen:?}"
    );

    // A rerun takes the in-doubt record over; an error releases a key.
    let got: Result<String, Error> =
        charge(&store, "order-2").in_doubt(InDoubtPolicy::Rerun).run(|| {
            runs += 1;
            Ok("ch_2".to_owned())
        });
    assert_eq!((got.unwrap(), runs), ("ch_2".to_owned(), 2));
    let got: Result<String, Error> = charge(&store, "order-3")
        .run(|| Err(Error::NotFound { key: "the card was declined".to_owned() }));
    assert!(got.is_err());
    let seen = Seen::take(&snapshotter);
    assert_eq!(seen.counter("idem_takeovers_total{tool=charge_card}"), 1, "{seen:?}");
    assert_eq!(
        seen.calls(),
        BTreeMap::from([
            ("idem_calls_total{tool=charge_card,outcome=fresh}", 1),
            ("idem_calls_total{tool=charge_card,outcome=released}", 1),
        ]),
        "{seen:?}"
    );

    // An expired result is taken over too: the body runs again, as a fresh call. (Not a sleep
    // in place of a synchronisation: the record's age is read from the clock, so once 5 ms
    // have passed a 1 ms ttl has run out.)
    let expiring = |runs: &mut u32| -> Result<String, Error> {
        charge(&store, "order-7").ttl(Duration::from_millis(1)).run(|| {
            *runs += 1;
            Ok("report".to_owned())
        })
    };
    expiring(&mut runs).unwrap();
    Seen::take(&snapshotter);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!((expiring(&mut runs).unwrap(), runs), ("report".to_owned(), 4));
    let seen = Seen::take(&snapshotter);
    assert_eq!(seen.counter("idem_takeovers_total{tool=charge_card}"), 1, "{seen:?}");
    assert_eq!(
        seen.calls(),
        BTreeMap::from([("idem_calls_total{tool=charge_card,outcome=fresh}", 1)]),
        "{seen:?}"
    );

    // A body that panics leaves its key in doubt, and is counted so.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _: Result<String, Error> = charge(&store, "order-4").run(|| panic!("the card reader"));
    }));
    assert!(panicked.is_err());
    let seen = Seen::take(&snapshotter);
    assert_eq!(
        seen.calls(),
        BTreeMap::from([("idem_calls_total{tool=charge_card,outcome=in-doubt}", 1)]),
        "{seen:?}"
    );

    // A reconciler that cannot tell: its answer is counted, and the call once, in doubt. One
    // that finds the effect landed: the call is counted as reconciled.
    let got: Result<String, Error> = charge(&store, "order-8").run(|| {
        may_have_landed();
        Err(Error::NotFound { key: "the vendor's answer timed out".to_owned() })
    });
    assert!(got.is_err());
    Seen::take(&snapshotter);
    let body = || -> Result<String, Error> { panic!("the body must not run") };
    let got: Result<String, Error> =
        charge(&store, "order-8").run_reconciled(|_| Ok::<_, String>(Reconciled::CannotTell), body);
    assert!(matches!(got, Err(Error::InDoubt { .. })), "{got:?}");
    let got: Result<String, Error> = charge(&store, "order-8")
        .run_reconciled(|_| Ok::<_, String>(Reconciled::Landed("ch_5".to_owned())), body);
    assert_eq!(got.unwrap(), "ch_5");
    let seen = Seen::take(&snapshotter);
    assert_eq!(
        seen.calls(),
        BTreeMap::from([
            ("idem_calls_total{tool=charge_card,outcome=in-doubt}", 1),
            ("idem_calls_total{tool=charge_card,outcome=reconciled}", 1),
        ]),
        "{seen:?}"
    );
    for answer in ["cannot-tell", "landed"] {
        let name = format!("idem_reconciliations_total{{tool=charge_card,answer={answer}}}");
        assert_eq!(seen.counter(&name), 1, "{seen:?}");
    }

    // A retention pass: counted once, with what it removed (every finished record and released
    // key's history once the store's clock has moved past them; nothing in doubt).
    let stats = idem_runtime::admin::stats(store.as_ref()).unwrap();
    let done = stats.by_status.get("done").copied().unwrap_or(0);
    let page = block_on(store.scan_page(None, usize::MAX)).unwrap();
    let released = page.entries.iter().filter(|(_, s)| matches!(s, Stored::History { .. }));
    let released = released.count() as u64;
    assert!(done > 0 && released > 0, "{stats:?}");
    let last = store.clock();
    while store.clock() <= last + 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    Seen::take(&snapshotter);
    let removed = Retention::new(Duration::ZERO).run(store.as_ref()).unwrap();
    assert_eq!((removed.records, removed.histories), (done, released));
    let seen = Seen::take(&snapshotter);
    assert_eq!(seen.counter("idem_retention_passes_total{}"), 1, "{seen:?}");
    assert_eq!(seen.counter("idem_retention_removed_total{what=records}"), done, "{seen:?}");
    assert_eq!(seen.counter("idem_retention_removed_total{what=histories}"), released);
    assert_eq!(seen.samples["idem_retention_pass_records{}"], 1, "{seen:?}");

    // Approvals: requested, approved, denied, and an approval found past the call's
    // approval_ttl (expired, and requested again); the calls that ran nothing are counted by it.
    let refund = |order: &str, ttl: Duration| {
        Call::new("refund", order, &json!({"amount": 9000}))
            .unwrap()
            .store(Arc::clone(&store))
            .approval_ttl(ttl)
    };
    let ask = |call: Call| -> idem_runtime::Key {
        match call.run(|| Ok::<_, Error>("re_1".to_owned())) {
            Err(Error::AwaitingApproval { key, .. }) => key.parse().unwrap(),
            other => panic!("expected AwaitingApproval, got {other:?}"),
        }
    };
    let hour = Duration::from_secs(3600);
    let (approved, denied) = (ask(refund("order-20", hour)), ask(refund("order-21", hour)));
    let by = "ann@ops";
    admin::decide(store.as_ref(), &approved, Decision::Approve, by, None).unwrap();
    admin::decide(store.as_ref(), &denied, Decision::Deny, by, Some("no")).unwrap();
    assert!(matches!(
        refund("order-21", hour).run(|| Ok::<_, Error>(0)),
        Err(Error::Denied { .. })
    ));
    // An approval of no time at all has expired by the time a call uses it.
    ask(refund("order-20", Duration::ZERO));
    let seen = Seen::take(&snapshotter);
    for (event, n) in [("requested", 3), ("approved", 1), ("denied", 1), ("expired", 1)] {
        let name = format!("idem_approvals_total{{tool=refund,event={event}}}");
        assert_eq!(seen.counter(&name), n, "{event}: {seen:?}");
    }
    assert_eq!(
        seen.calls(),
        BTreeMap::from([
            ("idem_calls_total{tool=refund,outcome=awaiting-approval}", 3),
            ("idem_calls_total{tool=refund,outcome=denied}", 1),
        ]),
        "{seen:?}"
    );

    // No series carries a key or a scope: the only labels are the tool, the outcome, a
    // reconciler's answer, what a retention pass removed and an approval's event.
    let key = charge(&store, "order-1").key().to_string();
    for (composite, _, _, _) in snapshotter.snapshot().into_vec() {
        for label in composite.key().labels() {
            assert!(
                ["tool", "outcome", "answer", "what", "event"].contains(&label.key()),
                "{composite:?}"
            );
            assert!(!label.value().contains(&key) && !label.value().contains("order-"));
        }
    }
}
