//! What the PostgreSQL tests share: the database URL (or a skip), and a schema of their own
//! that is dropped when the test ends.
//!
//! The suite runs twice in CI: with `DATABASE_URL` at the server, and with it at a PgBouncer in
//! transaction mode (`IDEM_TEST_POOLER_URL`), with `IDEM_TEST_SERVER_URL` at the server behind
//! it. The helpers' own statements are unnamed (`simple_query`, `query_typed`), so that they
//! work through the pooler as the store's do; what a test does to the server itself (ending
//! backends, looking at `pg_stat_activity`) goes to [`server_url`].

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_runtime::conformance::transition;
use idem_runtime::store::Guard;

/// The database under test, or `None` (with a notice) when `DATABASE_URL` is not set. Under
/// `CI=true` a missing URL fails the test: CI must run it.
pub fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI must set DATABASE_URL (.ci/run starts PostgreSQL and sets it)"
            );
            eprintln!("SKIPPED: DATABASE_URL is not set, so the PostgreSQL store tests do not run");
            None
        }
    }
}

/// The server itself, for what a test does to it rather than through the store: ending
/// backends, reading `pg_stat_activity`. `IDEM_TEST_SERVER_URL` when the suite runs through a
/// pooler, else the database under test.
pub fn server_url(url: &str) -> String {
    match std::env::var("IDEM_TEST_SERVER_URL") {
        Ok(server) if !server.is_empty() => server,
        _ => url.to_owned(),
    }
}

/// Whether the database under test is reached through a pooler (its URL is not the server's).
pub fn through_pooler(url: &str) -> bool {
    server_url(url) != url
}

/// The PgBouncer in transaction mode that CI starts (`IDEM_TEST_POOLER_URL`), or `None` with a
/// loud notice. Under `CI=true` a missing pooler fails the test: CI must run it.
pub fn pooler_url() -> Option<String> {
    match std::env::var("IDEM_TEST_POOLER_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI must set IDEM_TEST_POOLER_URL (.ci/run starts a PgBouncer and sets it)"
            );
            eprintln!(
                "SKIPPED: IDEM_TEST_POOLER_URL is not set, so this test through a transaction-mode \
                 pooler does not run; `bash .ci/run` starts a PgBouncer and sets it"
            );
            None
        }
    }
}

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A schema name no other test or run uses.
pub fn unique_schema(prefix: &str) -> String {
    format!(
        "t_{prefix}_{}_{}_{}",
        std::process::id(),
        idem_runtime::store::now_ms() % 1_000_000_000,
        NONCE.fetch_add(1, Ordering::Relaxed)
    )
}

/// The database under test with a schema of the test's own, and the guard that drops the schema
/// when the test ends; `None` (with a notice) when `DATABASE_URL` is not set.
pub fn scratch_schema(prefix: &str) -> Option<(String, String, DropSchema)> {
    database_url().map(|url| with_schema(url, prefix))
}

/// `url` with a schema no other test uses, named after `prefix`, and the guard that drops it.
pub fn with_schema(url: String, prefix: &str) -> (String, String, DropSchema) {
    let schema = unique_schema(prefix);
    let guard = DropSchema { url: url.clone(), schema: schema.clone() };
    (url, schema, guard)
}

/// Drops its schema (and so the test's records) when it goes.
pub struct DropSchema {
    pub url: String,
    pub schema: String,
}

impl Drop for DropSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema);
        let _ = run_sql(&self.url, &sql);
    }
}

/// Runs `sql` on a connection of its own (from a plain thread).
pub fn run_sql(url: &str, sql: &str) -> Result<(), tokio_postgres::Error> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let outcome = client.batch_execute(sql).await;
        drop(client);
        let _ = tokio::time::timeout(Duration::from_secs(5), driver).await;
        outcome
    })
}

/// Runs a query returning `(i64, i64)` rows on a connection of its own.
pub fn query_pairs(url: &str, sql: &str) -> Vec<(i64, i64)> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let rows = client.query_typed(sql, &[]).await.unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    })
}

/// The environment variable that turns a test binary into a child process of a test.
pub const CHILD_ROLE: &str = "IDEM_PG_TEST_CHILD";

/// What a child prints before each line meant for its parent (the test harness prints too).
pub const CHILD_SAYS: &str = "IDEM-CHILD ";

/// Starts this test binary again as a child running only `test_name`, in `role`.
pub fn spawn_child(test_name: &str, role: &str, envs: &[(&str, &str)]) -> std::process::Child {
    let mut command = std::process::Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ROLE, role)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    for (name, value) in envs {
        command.env(name, value);
    }
    command.spawn().expect("the child process starts")
}

/// Sends the lines a child says (without the prefix) to the returned channel.
pub fn child_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // The harness may have begun the line (`test name ... `) before the child spoke.
            if let Some(at) = line.find(CHILD_SAYS) {
                if tx.send(line[at + CHILD_SAYS.len()..].to_owned()).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// Says `line` to the parent, at once.
pub fn say(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "\n{CHILD_SAYS}{line}");
    let _ = stdout.flush();
}

/// Runs a query returning one `bigint` on a connection of its own.
pub fn query_i64(url: &str, sql: &str) -> i64 {
    query_pairs(url, &format!("SELECT ({sql})::bigint, 0::bigint"))[0].0
}

/// Adds `name=value` to a URL's query.
pub fn with_param(url: &str, name: &str, value: &str) -> String {
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}{name}={value}")
}

/// Waits until `done` holds, checking every 50 ms for at most `at_most`; returns whether it held.
/// For states another process or the server reaches in its own time, such as a lease lapsing.
pub fn eventually(at_most: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = std::time::Instant::now() + at_most;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A store on `schema` whose leases last `lease`, renewed every 250 ms: for tests that wait for
/// a killed owner's lease to lapse.
pub fn short_lease_store(
    url: &str,
    schema: &str,
    lease: Duration,
) -> std::sync::Arc<dyn idem_runtime::Store> {
    std::sync::Arc::new(
        idem_postgres::PgStore::builder(url)
            .schema(schema)
            .lease(lease)
            .heartbeat(Duration::from_millis(250))
            .connect()
            .expect("the store connects"),
    )
}

/// Renews `record`'s lease as the engine's heartbeat would (one `Store::renew`, to a lease past
/// the store's clock now): whether the store extended it.
pub fn renew(store: &dyn idem_runtime::Store, record: &idem_runtime::Record) -> bool {
    let lease = store.instance().lease().expect("a PostgreSQL store leases its records");
    let held = [idem_runtime::store::lease::Held::of(record)];
    let renewed = idem_runtime::block_on(store.renew(&held, lease.until(store.clock())));
    renewed.expect("the renewal reaches the database") == [true]
}

/// Reserves `key` for `owner` as the engine would, on `store`'s clock and lease terms: the
/// record the reservation writes, and what the store answered.
pub fn reserve(
    store: &dyn idem_runtime::Store,
    key: &str,
    tool: &str,
    scope: &str,
    owner: &idem_runtime::store::Owner,
) -> (idem_runtime::Record, idem_runtime::store::Inserted) {
    let lease = store.instance().lease();
    let step = transition::reserve(key, tool, scope, None, owner, store.clock(), lease);
    let record = step.new.clone().expect("a reservation makes a record");
    let inserted = idem_runtime::block_on(store.insert_if_absent(&record, step.change)).unwrap();
    (record, inserted)
}

/// Writes `step` over `expected` on `store`, fenced as the step's own caller on this store
/// instance would: the token of the write, or `None` when the fence refused it.
pub fn swap(
    store: &dyn idem_runtime::Store,
    expected: &idem_runtime::Record,
    step: transition::Step<'_>,
) -> Option<u64> {
    let guard = Guard::of(expected.fence(), step.change.by(), store.instance().id());
    let swapped = store.compare_and_swap(expected, guard, step.new.as_ref(), step.change);
    idem_runtime::block_on(swapped).unwrap()
}
