//! Connection faults while the server stays up (killed backends, connections the server closed
//! while they sat in the pool), and what an error says when the server refuses a statement.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::block_on;
use idem_runtime::{Call, Error, Store};

/// Terminates, until told to stop, every backend whose `application_name` is `name` (and only
/// those: other tests share the server). Returns how many it terminated.
fn kill_backends(url: String, name: String, every: Duration, stop: Arc<AtomicBool>) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let mut killed = 0;
        while !stop.load(Ordering::SeqCst) {
            let row = client
                .query_typed_one(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) \
                     FROM pg_stat_activity WHERE application_name = $1",
                    &[(&name, tokio_postgres::types::Type::TEXT)],
                )
                .await
                .unwrap();
            killed += row.get::<_, i64>(0);
            tokio::time::sleep(every).await;
        }
        killed
    })
}

#[test]
fn killed_backends_fail_no_caller() {
    let Some((url, schema, _guard)) = common::scratch_schema("kill") else { return };
    let name = format!("idem_{schema}");
    let store: Arc<dyn Store> = Arc::new(
        PgStore::builder(&common::with_param(&url, "application_name", &name))
            .schema(&schema)
            .lease(Duration::from_secs(10))
            .pool_size(6)
            .connect()
            .expect("the store connects"),
    );
    const KEYS: usize = 60;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (url, name, stop) = (url.clone(), name.clone(), Arc::clone(&stop));
        let url = common::server_url(&url);
        std::thread::spawn(move || kill_backends(url, name, Duration::from_millis(37), stop))
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let results = runtime.block_on(async {
        // Two callers per key: one owns it, the other waits for it (or replays it).
        let tasks: Vec<_> = (0..KEYS * 2)
            .map(|i| {
                let n = i % KEYS;
                let (store, runs) = (Arc::clone(&store), Arc::clone(&runs));
                tokio::spawn(async move {
                    let got: Result<String, Error> = Call::new("killed", "k", &n)
                        .unwrap()
                        .store(store)
                        .wait(Duration::from_secs(60))
                        .run_async(|| async move {
                            runs[n].fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok(format!("{n}:{i}"))
                        })
                        .await;
                    (n, got)
                })
            })
            .collect();
        let mut results: Vec<Vec<_>> = (0..KEYS).map(|_| Vec::new()).collect();
        for task in tasks {
            let (n, got) = task.await.unwrap();
            results[n].push(got);
        }
        results
    });
    stop.store(true, Ordering::SeqCst);
    let killed = killer.join().unwrap();
    eprintln!("{killed} backends terminated during the calls");
    assert!(killed > 0, "the test killed no backend, so it tested nothing");

    for (n, got) in results.iter().enumerate() {
        for outcome in got {
            assert!(
                outcome.is_ok(),
                "key {n}: a caller failed while the server was up: {outcome:?}"
            );
        }
        assert_eq!(got[0].as_ref().ok(), got[1].as_ref().ok(), "key {n}: both callers agree");
        assert_eq!(runs[n].load(Ordering::SeqCst), 1, "key {n}: the body ran once");
    }
    let stuck = common::query_i64(
        &url,
        &format!("SELECT count(*) FROM \"{schema}\".records WHERE status <> 'done'"),
    );
    assert_eq!(stuck, 0, "no key stays in flight or in doubt");
}

#[test]
fn heartbeats_survive_killed_backends() {
    let Some((url, schema, _guard)) = common::scratch_schema("beat") else { return };
    let name = format!("idem_{schema}");
    // The owner's store, whose backends are killed; a two-second lease that only heartbeats
    // keep alive while the body runs for three.
    let owner: Arc<dyn Store> = Arc::new(
        PgStore::builder(&common::with_param(&url, "application_name", &name))
            .schema(&schema)
            .lease(Duration::from_secs(2))
            .pool_size(2)
            .connect()
            .expect("the store connects"),
    );
    // A peer in another instance, left alone.
    let peer: Arc<dyn Store> =
        Arc::new(PgStore::builder(&url).schema(&schema).pool_size(2).connect().unwrap());
    let runs = Arc::new(AtomicU32::new(0));
    let call = |store: &Arc<dyn Store>| {
        Call::new("long", "l", &1).unwrap().store(Arc::clone(store)).wait(Duration::from_secs(60))
    };
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let owning = {
        let (call, runs) = (call(&owner), Arc::clone(&runs));
        std::thread::spawn(move || {
            call.run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_secs(3));
                Ok::<_, Error>("finished".to_owned())
            })
        })
    };
    started_rx.recv().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (url, name, stop) = (url.clone(), name.clone(), Arc::clone(&stop));
        let url = common::server_url(&url);
        std::thread::spawn(move || kill_backends(url, name, Duration::from_millis(37), stop))
    };
    let waited: Result<String, Error> = call(&peer).run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok("peer".to_owned())
    });
    stop.store(true, Ordering::SeqCst);
    assert!(killer.join().unwrap() > 0, "the test killed no backend, so it tested nothing");
    assert_eq!(owning.join().unwrap().unwrap(), "finished");
    assert_eq!(
        waited.expect("the owner's lease never lapsed, so the peer waited for its result"),
        "finished"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The pids of the sessions named `name`: (listening, pooled). The listening session's last
/// statement is its `LISTEN`, or the setting it makes once its probe came back.
fn sessions(url: &str, name: &str) -> (Vec<i64>, Vec<i64>) {
    let rows = common::query_pairs(
        &common::server_url(url),
        &format!(
            "SELECT pid::bigint, (query LIKE '%LISTEN%' OR query LIKE '%idle_session_timeout%') \
             ::int::bigint FROM pg_stat_activity WHERE application_name = '{name}'"
        ),
    );
    let pids = |listening: i64| rows.iter().filter(|r| r.1 == listening).map(|r| r.0).collect();
    (pids(1), pids(0))
}

#[test]
fn sessions_the_server_ends_while_idle_are_replaced_and_the_listener_is_kept() {
    let Some((url, schema, _guard)) = common::scratch_schema("idle") else { return };
    drop(PgStore::builder(&url).schema(&schema).connect().expect("the table is created"));
    let name = format!("idem_{schema}");
    if common::through_pooler(&url) {
        return pooled_sessions_the_server_ends_are_replaced(&url, &schema, &name);
    }
    // The server ends every session of this store that sits idle for 300 ms, as a role's
    // idle_session_timeout does.
    let timed = common::with_param(
        &common::with_param(&url, "application_name", &name),
        "options",
        "-c%20idle_session_timeout%3D300",
    );
    let store: Arc<dyn Store> = Arc::new(
        PgStore::builder(&timed)
            .schema(&schema)
            .create(false)
            .pool_size(4)
            .connect()
            .expect("the store connects"),
    );
    let call = |n: u32| {
        Call::new("idle", "i", &n).unwrap().store(Arc::clone(&store)).run(|| Ok::<_, Error>(n))
    };
    assert_eq!(call(1).unwrap(), 1);
    let mut listening = Vec::new();
    assert!(
        common::eventually(Duration::from_secs(10), || {
            listening = sessions(&url, &name).0;
            listening.len() == 1
        }),
        "one listening session: {listening:?}"
    );
    let (_, pooled) = sessions(&url, &name);
    assert!(!pooled.is_empty(), "the call left pooled sessions");
    assert!(
        common::eventually(Duration::from_secs(20), || {
            let (_, now) = sessions(&url, &name);
            pooled.iter().all(|pid| !now.contains(pid))
        }),
        "the server ended the idle pooled sessions"
    );
    assert_eq!(
        sessions(&url, &name).0,
        listening,
        "the listening session, idle for longer still, was kept"
    );
    for n in 2..10 {
        assert_eq!(call(n).expect("a fresh connection serves the call"), n);
    }
    assert_eq!(call(1).unwrap(), 1, "and replays");
}

/// Through a pooler the store's sessions are the pooler's, which no startup option of the
/// store's URL reaches: the server ends the server connections the pooler lent the store while
/// they sit idle (as an idle_session_timeout would), and calls go on, on fresh ones.
fn pooled_sessions_the_server_ends_are_replaced(url: &str, schema: &str, name: &str) {
    let named = common::with_param(url, "application_name", name);
    let store: Arc<dyn Store> = Arc::new(
        PgStore::builder(&named).schema(schema).create(false).pool_size(4).connect().unwrap(),
    );
    let call = |n: u32| {
        Call::new("idle", "i", &n).unwrap().store(Arc::clone(&store)).run(|| Ok::<_, Error>(n))
    };
    assert_eq!(call(1).unwrap(), 1);
    let end_idle = format!(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = '{name}' AND state = 'idle'"
    );
    // The pool is shared with the other tests of this binary, which may take the server
    // connection the call used (and rename it) before it is ended: call again until one of
    // ours sits idle when the terminating query runs.
    let ended_one = common::eventually(Duration::from_secs(20), || {
        assert_eq!(call(1).unwrap(), 1);
        common::query_i64(&common::server_url(url), &end_idle) > 0
    });
    assert!(ended_one, "no call left an idle server session to end, so this tested nothing");
    for n in 2..10 {
        assert_eq!(call(n).expect("a fresh server connection serves the call"), n);
    }
    assert_eq!(call(1).unwrap(), 1, "and replays");
}

#[test]
fn a_statement_timeout_is_reported_as_one() {
    let Some((url, schema, _guard)) = common::scratch_schema("timeout") else { return };
    drop(PgStore::builder(&url).schema(&schema).connect().expect("the table is created"));
    common::run_sql(
        &url,
        &format!(
            "CREATE FUNCTION \"{schema}\".slow() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN PERFORM pg_sleep(5); RETURN NEW; END $$; \
             CREATE TRIGGER slow BEFORE INSERT ON \"{schema}\".records \
             FOR EACH ROW EXECUTE FUNCTION \"{schema}\".slow();"
        ),
    )
    .unwrap();
    if common::through_pooler(&url) {
        return pooled_statement_cancelled(&url, &schema);
    }
    // The session's statement_timeout, as a role's or a database's setting would give it.
    let timed = common::with_param(&url, "options", "-c%20statement_timeout%3D500");
    let store: Arc<dyn Store> =
        Arc::new(PgStore::builder(&timed).schema(&schema).create(false).connect().unwrap());
    let got: Result<u32, Error> =
        Call::new("slow", "s", &1).unwrap().store(store).run(|| Ok::<_, Error>(1));
    let message = got.expect_err("the reservation timed out").to_string();
    assert!(message.contains("canceling statement due to statement timeout"), "{message}");
    assert!(message.contains("57014"), "the SQLSTATE is in the text: {message}");
    assert!(message.contains("statement_timeout"), "the advice names the setting: {message}");
    assert!(!message.contains("privileges"), "the advice fits the cause: {message}");
}

/// Through a pooler no startup option of the URL reaches the server: the slow statement is
/// cancelled on the server instead (as an operator would), which the server reports with the
/// same SQLSTATE as a timeout.
fn pooled_statement_cancelled(url: &str, schema: &str) {
    let store: Arc<dyn Store> =
        Arc::new(PgStore::builder(url).schema(schema).create(false).connect().unwrap());
    let calling = std::thread::spawn(move || {
        Call::new("slow", "s", &1).unwrap().store(store).run(|| Ok::<_, Error>(1u32))
    });
    let server = common::server_url(url);
    let cancel = format!(
        "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity \
         WHERE state = 'active' AND query LIKE '%\"{schema}\".%records%' \
         AND query NOT LIKE '%pg_cancel_backend%'"
    );
    assert!(
        common::eventually(Duration::from_secs(10), || common::query_i64(&server, &cancel) == 1),
        "the reservation's statement never ran to be cancelled"
    );
    let message = calling.join().unwrap().expect_err("the reservation was cancelled").to_string();
    assert!(message.contains("canceling statement due to user request"), "{message}");
    assert!(message.contains("57014"), "the SQLSTATE is in the text: {message}");
    assert!(message.contains("statement_timeout"), "the advice names the setting: {message}");
}

#[test]
fn a_dropped_table_is_reported_with_the_servers_reason() {
    let Some((url, schema, _guard)) = common::scratch_schema("dropped") else { return };
    let store = PgStore::builder(&url).schema(&schema).connect().unwrap();
    common::run_sql(&url, &format!("DROP TABLE \"{schema}\".records CASCADE")).unwrap();
    let message = block_on(store.get("k")).expect_err("the table is gone").to_string();
    assert!(message.contains("does not exist"), "the server's reason: {message}");
    assert!(message.contains("42P01"), "the SQLSTATE: {message}");
    assert!(message.contains("migrate"), "what to do: {message}");
    assert!(message.contains("key k"), "what it was doing: {message}");
}
