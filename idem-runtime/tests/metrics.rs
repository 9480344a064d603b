//! What the engine reports through the `metrics` facade, read back with `metrics-util`'s
//! debugging recorder. One test, since the recorder is the process's global one and syncs are
//! counted per process.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_runtime::{
    may_have_landed, Call, Durability, Error, InDoubtPolicy, Reconciled, SledStore, Store,
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

fn charge(store: &Arc<dyn Store>, order: &str) -> Call {
    Call::new("charge_card", order, &json!({"amount": 4200})).unwrap().store(Arc::clone(store))
}

#[test]
fn counts_fresh_calls_replays_in_doubt_keys_releases_takeovers_and_syncs() {
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
    let got: Result<String, Error> = charge(&store, "order-5").run(|| {
        may_have_landed();
        Err(Error::NotFound { key: "the vendor's answer timed out".to_owned() })
    });
    assert!(got.is_err());
    Seen::take(&snapshotter);
    let body = || -> Result<String, Error> { panic!("the body must not run") };
    let got: Result<String, Error> =
        charge(&store, "order-5").run_reconciled(|_| Ok::<_, String>(Reconciled::CannotTell), body);
    assert!(matches!(got, Err(Error::InDoubt { .. })), "{got:?}");
    let got: Result<String, Error> = charge(&store, "order-5")
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

    // No series carries a key or a scope: the only labels are the tool, the outcome and a
    // reconciler's answer.
    let key = charge(&store, "order-1").key().to_string();
    for (composite, _, _, _) in snapshotter.snapshot().into_vec() {
        for label in composite.key().labels() {
            assert!(["tool", "outcome", "answer"].contains(&label.key()), "{composite:?}");
            assert!(!label.value().contains(&key) && !label.value().contains("order-"));
        }
    }
}
