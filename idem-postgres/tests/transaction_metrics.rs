//! Transactional calls are counted in `idem_calls_total` like every other call: a fresh commit,
//! a replay, and a body's `Err` (nothing committed, the key released). A binary of its own: the
//! debugging recorder is the process's global one.

mod common;

use std::collections::BTreeMap;

use idem_postgres::PgStore;
use idem_runtime::Call;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio_postgres::types::Type;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::test(flavor = "multi_thread")]
async fn transactional_calls_are_counted_by_outcome() {
    let Some((url, schema, guard)) = common::scratch_schema("txm") else { return };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");
    let store = PgStore::builder(&url).schema(&schema).connect_async().await.unwrap();
    let table = format!("\"{schema}\".refunds");
    let create = format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, cents bigint)");
    let at = url.clone();
    std::thread::spawn(move || common::run_sql(&at, &create)).join().unwrap().unwrap();
    let insert = format!("INSERT INTO {table} (cents) VALUES ($1) RETURNING id");
    let refund = |order: u32| Call::new("refund", format!("order-{order}"), &order).unwrap();

    let write = async |tx: &mut tokio_postgres::Transaction<'_>| -> Result<i64, BoxError> {
        Ok(tx.query_typed(&insert, &[(&1250i64, Type::INT8)]).await?[0].get(0))
    };
    let fresh = store.transactional(refund(1)).run(write).await.unwrap();
    let replayed = store.transactional(refund(1)).run(write).await.unwrap();
    assert_eq!(replayed, fresh, "the second call replays the first");
    let refused: Result<i64, BoxError> = store
        .transactional(refund(2))
        .run(async |tx| {
            tx.query_typed(&insert, &[(&99i64, Type::INT8)]).await?;
            Err("the card was declined".into())
        })
        .await;
    assert!(refused.is_err());

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
            ("tool=refund,outcome=fresh".to_owned(), 1),
            ("tool=refund,outcome=replay".to_owned(), 1),
            ("tool=refund,outcome=released".to_owned(), 1),
        ])
    );
    drop(store);
    let _ = std::thread::spawn(move || drop(guard)).join();
}
