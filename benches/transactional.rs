//! What a transactional call costs on PostgreSQL, beside what it replaces and what it cannot beat,
//! all with the same two writes (a refund row and its ledger row):
//!
//! - `raw_commit`: the writes in one transaction of their own (BEGIN, two inserts, COMMIT), on
//!   one connection whose task runs on the caller's runtime: the floor.
//! - `raw_commit_other_runtime`: the same on a connection whose task runs on another runtime of
//!   two threads, as the store's pooled connections do (the store runs its I/O on a runtime of
//!   its own): what the hops between runtimes add to each round trip.
//! - `transactional_fresh` / `transactional_replay`: `PgStore::transactional`, the writes and the
//!   call's record in one transaction.
//! - `plain_fresh` / `plain_replay`: an ordinary idem call on the same store whose body makes
//!   the same transaction on a connection of its own: three commits (reservation, body, done).
//! - `sqlite_fresh` / `sqlite_replay` (and `sqlite_fresh_fsync`): `SqliteStore::transactional`
//!   with the same two writes, on a store in a temporary directory with `Durability::None` (the
//!   engine's and the store's work, no sync) and with the default `Durability::Fsync`.
//!
//! `DATABASE_URL=… cargo bench -p idem-benches --bench transactional`; the PostgreSQL part is
//! skipped without it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use idem::{Call, Durability, Error, Store};
use idem_postgres::PgStore;
use idem_runtime::SqliteStore;
use tokio_postgres::types::Type;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "idem_bench_txn";

static SEQ: AtomicU64 = AtomicU64::new(0);

fn sql() -> (String, String) {
    (
        format!("INSERT INTO {SCHEMA}.refunds (order_id, cents) VALUES ($1, 1250) RETURNING id"),
        format!("INSERT INTO {SCHEMA}.ledger (refund_id, cents) VALUES ($1, -1250)"),
    )
}

/// The two writes, on any tokio-postgres transaction.
async fn writes(
    tx: &tokio_postgres::Transaction<'_>,
    order: i64,
) -> Result<i64, tokio_postgres::Error> {
    let (refund, ledger) = sql();
    let id: i64 = tx.query_typed_one(&refund, &[(&order, Type::INT8)]).await?.get(0);
    tx.execute_typed(&ledger, &[(&id, Type::INT8)]).await?;
    Ok(id)
}

fn call(scope: &str) -> Call {
    Call::new("refund", scope, &serde_json::json!({ "cents": 1250 })).unwrap()
}

type Client = tokio::sync::Mutex<tokio_postgres::Client>;

/// The raw rows' connections, after the store made its schema: one driven by the caller's
/// runtime, one by a runtime of its own (returned, to keep it running), as the store's are.
async fn connections(url: &str) -> (Client, Client, tokio::runtime::Runtime) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {SCHEMA}.refunds (id bigserial PRIMARY KEY, order_id bigint, cents bigint); \
             CREATE TABLE IF NOT EXISTS {SCHEMA}.ledger (refund_id bigint, cents bigint);"
        ))
        .await
        .unwrap();
    let other =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (across, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    other.spawn(connection);
    (tokio::sync::Mutex::new(client), tokio::sync::Mutex::new(across), other)
}

/// The two writes, on a SQLite transaction.
fn sqlite_writes(tx: &rusqlite::Transaction<'_>, order: i64) -> rusqlite::Result<i64> {
    tx.execute("INSERT INTO refunds (order_id, cents) VALUES (?1, 1250)", [order])?;
    let id = tx.last_insert_rowid();
    tx.execute("INSERT INTO ledger (refund_id, cents) VALUES (?1, -1250)", [id])?;
    Ok(id)
}

fn sqlite(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::Builder::new().prefix("idem-bench").tempdir().unwrap();
    let store = |name: &str, durability: Durability| {
        let path = dir.path().join(name);
        let store = SqliteStore::builder(&path).durability(durability).open().unwrap();
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id, cents); \
                 CREATE TABLE ledger (refund_id, cents);",
            )
            .unwrap();
        store
    };
    let (fast, synced) =
        (store("none.sqlite", Durability::None), store("fsync.sqlite", Durability::Fsync));
    async fn fresh(store: &SqliteStore) -> i64 {
        let scope = format!("s{}", SEQ.fetch_add(1, Ordering::Relaxed));
        let id: Result<i64, BoxError> =
            store.transactional(call(&scope)).run(|tx| Ok(sqlite_writes(tx, 17)?)).await;
        id.unwrap()
    }
    let mut group = c.benchmark_group("transactional");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("sqlite_fresh", |b| b.to_async(&runtime).iter(|| fresh(&fast)));
    runtime
        .block_on(
            fast.transactional(call("s-replay"))
                .run(|tx| Ok::<_, BoxError>(sqlite_writes(tx, 17)?)),
        )
        .unwrap();
    group.bench_function("sqlite_replay", |b| {
        b.to_async(&runtime).iter(|| async {
            let id: Result<i64, BoxError> = fast
                .transactional(call("s-replay"))
                .run(|_tx| unreachable!("a replay runs no body"))
                .await;
            id.unwrap()
        })
    });
    group.bench_function("sqlite_fresh_fsync", |b| b.to_async(&runtime).iter(|| fresh(&synced)));
    group.finish();
}

fn transactional(c: &mut Criterion) {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("DATABASE_URL is not set: skipping the PostgreSQL transactional benchmarks");
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = Arc::new(PgStore::builder(&url).schema(SCHEMA).pool_size(4).connect().unwrap());
    let (raw, across, _other) = runtime.block_on(connections(&url));
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let run = format!("{}-{}", std::process::id(), started.as_millis());

    let mut group = c.benchmark_group("transactional");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("raw_commit", |b| {
        b.to_async(&runtime).iter(|| async {
            let mut client = raw.lock().await;
            let tx = client.transaction().await.unwrap();
            writes(&tx, 17).await.unwrap();
            tx.commit().await.unwrap();
        })
    });
    // One round trip with no work: what a statement more per call costs at least.
    group.bench_function("raw_round_trip", |b| {
        b.to_async(&runtime).iter(|| async {
            let client = raw.lock().await;
            client.query_typed("SELECT 1", &[]).await.unwrap();
        })
    });
    group.bench_function("raw_commit_other_runtime", |b| {
        b.to_async(&runtime).iter(|| async {
            let mut client = across.lock().await;
            let tx = client.transaction().await.unwrap();
            writes(&tx, 17).await.unwrap();
            tx.commit().await.unwrap();
        })
    });
    group.bench_function("transactional_fresh", |b| {
        b.to_async(&runtime).iter(|| async {
            let scope = format!("{run}-t{}", SEQ.fetch_add(1, Ordering::Relaxed));
            let id: Result<i64, BoxError> =
                store.transactional(call(&scope)).run(async |tx| Ok(writes(tx, 17).await?)).await;
            id.unwrap()
        })
    });
    let replayed = format!("{run}-t-replay");
    runtime
        .block_on(
            store
                .transactional(call(&replayed))
                .run(async |tx| Ok::<_, BoxError>(writes(tx, 17).await?)),
        )
        .unwrap();
    group.bench_function("transactional_replay", |b| {
        b.to_async(&runtime).iter(|| async {
            let id: Result<i64, BoxError> = store
                .transactional(call(&replayed))
                .run(async |_tx| unreachable!("a replay runs no body"))
                .await;
            id.unwrap()
        })
    });
    let plain_store: Arc<dyn Store> = store.clone();
    let plain = |scope: String| {
        let (store, raw) = (plain_store.clone(), &raw);
        async move {
            let id: Result<i64, Error> = call(&scope)
                .store(store)
                .run_async(|| async {
                    let mut client = raw.lock().await;
                    let tx = client.transaction().await.unwrap();
                    let id = writes(&tx, 17).await.unwrap();
                    tx.commit().await.unwrap();
                    Ok(id)
                })
                .await;
            id.unwrap()
        }
    };
    group.bench_function("plain_fresh", |b| {
        b.to_async(&runtime)
            .iter(|| plain(format!("{run}-p{}", SEQ.fetch_add(1, Ordering::Relaxed))))
    });
    let replayed = format!("{run}-p-replay");
    runtime.block_on(plain(replayed.clone()));
    group.bench_function("plain_replay", |b| b.to_async(&runtime).iter(|| plain(replayed.clone())));
    group.finish();

    // Leave nothing behind.
    runtime.block_on(async {
        let client = raw.lock().await;
        let _ = client.batch_execute(&format!("DROP SCHEMA {SCHEMA} CASCADE")).await;
    });
}

criterion_group!(benches, sqlite, transactional);
criterion_main!(benches);
