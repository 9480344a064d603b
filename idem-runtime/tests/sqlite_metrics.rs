//! The engine's metrics on a SQLite store: the same counters as on any store (the store adds
//! none of its own), read back with `metrics-util`'s debugging recorder, the process's global one.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use idem_runtime::{Call, Error, SqliteStore, Store};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::json;

#[test]
fn calls_on_a_sqlite_store_are_counted_by_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("m.sqlite")).unwrap());
    let charge = || {
        Call::new("charge_card", "order-1", &json!({"amount": 4200}))
            .unwrap()
            .store(Arc::clone(&store))
    };
    let ((started, on_start), (finish, on_finish)) = (mpsc::channel(), mpsc::channel::<()>());
    std::thread::scope(|scope| {
        let owner = scope.spawn(move || {
            charge().run(|| {
                started.send(()).unwrap();
                on_finish.recv().unwrap();
                Ok::<_, Error>("ch_1".to_owned())
            })
        });
        on_start.recv().unwrap();
        let waiter = scope.spawn(|| charge().run(|| -> Result<String, Error> { unreachable!() }));
        let key = charge().key().to_string();
        let until = Instant::now() + Duration::from_secs(20);
        while idem_runtime::waiting(&key) == 0 {
            assert!(Instant::now() < until, "the second caller never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        finish.send(()).unwrap();
        assert_eq!(owner.join().unwrap().unwrap(), "ch_1");
        assert_eq!(waiter.join().unwrap().unwrap(), "ch_1");
    });
    let replayed: String = charge().run(|| -> Result<String, Error> { unreachable!() }).unwrap();
    assert_eq!(replayed, "ch_1");

    // Transactional calls count alike: a commit, a replay, and a body's `Err` (released).
    let sqlite = SqliteStore::open(dir.path().join("m.sqlite")).unwrap();
    let refund = |order: u32| Call::new("refund", format!("order-{order}"), &order).unwrap();
    type BoxError = Box<dyn std::error::Error + Send + Sync>;
    let run = |order: u32, ok: bool| -> Result<u32, BoxError> {
        idem_runtime::block_on(sqlite.transactional(refund(order)).run(move |tx| {
            tx.execute_batch("CREATE TABLE IF NOT EXISTS refunds (order_id INTEGER)")?;
            tx.execute("INSERT INTO refunds VALUES (?1)", [order])?;
            if ok {
                Ok(order)
            } else {
                Err(BoxError::from("the card was declined"))
            }
        }))
    };
    assert_eq!(run(1, true).unwrap(), 1);
    assert_eq!(run(1, true).unwrap(), 1, "replayed");
    assert!(run(2, false).is_err());
    let mut calls = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<String> =
            key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        if let (true, DebugValue::Counter(n)) = (key.name() == "idem_calls_total", value) {
            calls.insert(labels.join(","), n);
        }
    }
    assert_eq!(
        calls,
        BTreeMap::from([
            ("tool=charge_card,outcome=fresh".to_owned(), 1),
            ("tool=charge_card,outcome=waited".to_owned(), 1),
            ("tool=charge_card,outcome=replay".to_owned(), 1),
            ("tool=refund,outcome=fresh".to_owned(), 1),
            ("tool=refund,outcome=replay".to_owned(), 1),
            ("tool=refund,outcome=released".to_owned(), 1),
        ])
    );
}
