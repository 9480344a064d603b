//! A fleet of processes sharing one PostgreSQL store: every key runs once, whoever calls it.

mod common;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::{Call, Error, Store};
use tokio_postgres::types::Type;

const PROCESSES: usize = 4;
const KEYS: usize = 200;

/// In a child: connect, say `ready`, wait for `go` on stdin, call every key at once (each body
/// inserts one effect row and returns a value naming this process), and say each result.
#[test]
fn fleet_child() {
    if std::env::var(common::CHILD_ROLE).as_deref() != Ok("fleet") {
        return;
    }
    let url = std::env::var("DATABASE_URL").unwrap();
    let schema = std::env::var("IDEM_PG_TEST_SCHEMA").unwrap();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(
            PgStore::builder(&url)
                .schema(&schema)
                .pool_size(8)
                .connect_async()
                .await
                .expect("the store connects"),
        );
        let (client, connection) =
            tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let client = Arc::new(client);
        let insert = format!("INSERT INTO \"{schema}\".effects (n, pid) VALUES ($1, $2)");
        common::say("ready");
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
        let pid = std::process::id();
        let offset = (pid as usize) % KEYS;
        let tasks: Vec<_> = (0..KEYS)
            .map(|i| {
                // Each process walks the keys from a different place, so that owners mix.
                let n = (i + offset) % KEYS;
                let (store, client, insert) =
                    (Arc::clone(&store), Arc::clone(&client), insert.clone());
                tokio::spawn(async move {
                    let got: Result<String, Error> =
                        Call::new("fleet_effect", "fleet", &serde_json::json!({ "n": n }))
                            .unwrap()
                            .store(store)
                            .wait(Duration::from_secs(60))
                            .run_async(|| async move {
                                let (n, pid) = (n as i32, pid as i32);
                                client
                                    .execute_typed(&insert, &[(&n, Type::INT4), (&pid, Type::INT4)])
                                    .await
                                    .expect("the effect lands");
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                Ok(format!("{pid}:{n}"))
                            })
                            .await;
                    (n, got.expect("every call succeeds"))
                })
            })
            .collect();
        for task in tasks {
            let (n, got) = task.await.unwrap();
            common::say(&format!("result {n} {got}"));
        }
        common::say("done");
    });
}

#[test]
fn four_processes_run_each_key_once() {
    let Some((url, schema, _guard)) = common::scratch_schema("fleet") else { return };
    common::run_sql(
        &url,
        &format!("CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".effects (n int NOT NULL, pid int NOT NULL)"),
    )
    .unwrap();

    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let mut child = common::spawn_child(
                "fleet_child",
                "fleet",
                &[("DATABASE_URL", &url), ("IDEM_PG_TEST_SCHEMA", &schema)],
            );
            let lines = common::child_lines(&mut child);
            (child, lines)
        })
        .collect();
    for (_, lines) in &children {
        assert_eq!(
            lines.recv_timeout(Duration::from_secs(60)).expect("the child gets ready"),
            "ready"
        );
    }
    // Every process starts calling at once.
    for (child, _) in &mut children {
        writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    }

    let mut results = vec![Vec::new(); KEYS];
    for (child, lines) in &mut children {
        loop {
            let line = lines.recv_timeout(Duration::from_secs(120)).expect("the child reports");
            if line == "done" {
                break;
            }
            let mut parts = line.split(' ');
            assert_eq!(parts.next(), Some("result"));
            let n: usize = parts.next().unwrap().parse().unwrap();
            results[n].push(parts.next().unwrap().to_owned());
        }
        assert!(child.wait().unwrap().success(), "the child exits cleanly");
    }

    for (n, got) in results.iter().enumerate() {
        assert_eq!(got.len(), PROCESSES, "key {n}: every process called it");
        assert!(
            got.iter().all(|r| r == &got[0]),
            "key {n}: every caller got the same result: {got:?}"
        );
        assert!(got[0].ends_with(&format!(":{n}")), "key {n}: the result is this key's: {got:?}");
    }
    let mut winners = std::collections::BTreeMap::<&str, usize>::new();
    for got in &results {
        *winners.entry(got[0].split(':').next().unwrap()).or_default() += 1;
    }
    eprintln!("keys run, by owning process: {winners:?}");
    let effects = common::query_pairs(
        &url,
        &format!("SELECT n::bigint, count(*) FROM \"{schema}\".effects GROUP BY n ORDER BY n"),
    );
    assert_eq!(effects.len(), KEYS, "every key's effect landed");
    for (n, count) in effects {
        assert_eq!(count, 1, "key {n}: the effect ran {count} times across {PROCESSES} processes");
    }
}
