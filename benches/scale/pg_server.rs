//! The PostgreSQL server's own figures, with nothing of idem's in the way: a raw durable point
//! and the commit ceiling of many connections, on scratch tables in the schema `idem_fleet`.

use std::sync::Arc;
use std::time::Instant;

use crate::{percentile, sorted, RAW_SAMPLES, THROUGHPUT_FOR};

/// A runtime for the benchmark's own PostgreSQL statements.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
}

/// A connection of its own, its driver spawned on the current runtime.
pub(crate) async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("PostgreSQL connects");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Creates the empty scratch table `idem_fleet.<name>`, a key and a value, for the server's own
/// figures.
pub(crate) async fn scratch_table(client: &tokio_postgres::Client, name: &str) {
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS idem_fleet; DROP TABLE IF EXISTS idem_fleet.{name}; \
             CREATE TABLE idem_fleet.{name} (key text PRIMARY KEY, value text)"
        ))
        .await
        .expect("the scratch table");
}

/// The server's own limit: one autocommitted single-row INSERT, what each of a call's two
/// durable points is at the least (`synchronous_commit = on`: the commit waits for its WAL flush).
pub(crate) fn raw_durable_point(url: &str) -> f64 {
    runtime().block_on(async {
        let client = client(url).await;
        scratch_table(&client, "raw").await;
        let insert =
            client.prepare("INSERT INTO idem_fleet.raw VALUES ($1, $2)").await.expect("prepare");
        let value = "x".repeat(330);
        let mut times = Vec::with_capacity(RAW_SAMPLES);
        for n in 0..RAW_SAMPLES + RAW_SAMPLES / 10 {
            let key = format!("{n:032x}");
            let began = Instant::now();
            client.execute(&insert, &[&key, &value]).await.expect("an insert");
            if n >= RAW_SAMPLES / 10 {
                times.push(began.elapsed().as_secs_f64());
            }
        }
        client.batch_execute("DROP TABLE idem_fleet.raw").await.expect("drop the scratch table");
        percentile(&sorted(times), 0.5)
    })
}

/// Commits per second that `connections` connections reach together, each committing
/// single-row INSERTs one after another for [`THROUGHPUT_FOR`]: the server's own ceiling on
/// this machine, with nothing of idem's in the way.
pub(crate) fn commit_ceiling(url: &str, connections: usize) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let setup = client(url).await;
        scratch_table(&setup, "ceiling").await;
        let mut clients = Vec::new();
        for _ in 0..connections {
            clients.push(client(url).await);
        }
        let start = Arc::new(tokio::sync::Barrier::new(connections));
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(c, client)| {
                let start = Arc::clone(&start);
                tokio::spawn(async move {
                    let insert = client
                        .prepare("INSERT INTO idem_fleet.ceiling VALUES ($1, $2)")
                        .await
                        .expect("prepare");
                    let value = "x".repeat(330);
                    start.wait().await;
                    let began = Instant::now();
                    let mut n = 0u64;
                    while began.elapsed() < THROUGHPUT_FOR {
                        let key = format!("{c}-{n}");
                        client.execute(&insert, &[&key, &value]).await.expect("an insert");
                        n += 1;
                    }
                    n as f64 / began.elapsed().as_secs_f64()
                })
            })
            .collect();
        let mut rate = 0.0;
        for task in tasks {
            rate += task.await.expect("a connection's task");
        }
        setup.batch_execute("DROP TABLE idem_fleet.ceiling").await.expect("drop the scratch table");
        rate
    })
}
