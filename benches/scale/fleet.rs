//! A PostgreSQL fleet: real processes, each with its own store instance on one server, making
//! fresh calls or replays together; its table, the server's own ceiling beside it, and the
//! release before this one's notify trigger put back for comparison.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idem::Store;

use crate::{charge, percentile, pg_server, sorted, us, Curve, RAW_SAMPLES, THROUGHPUT_FOR};

/// The fleet: processes × callers in each.
const FLEET: [(usize, usize); 4] = [(1, 1), (1, 8), (4, 1), (4, 8)];
/// Records each fleet caller writes before it replays them.
const REPLAY_KEYS: usize = 200;

/// The section "A PostgreSQL fleet" against the server at `url`; returns the fleet's points of
/// the chart, as (callers in all, fresh calls/s, the limit two commits a call set).
pub(crate) fn report(url: &str) -> Curve {
    println!("\n## A PostgreSQL fleet (local server, default settings)\n");
    let raw_pg = pg_server::raw_durable_point(url);
    println!(
        "Raw PostgreSQL durable point (one autocommitted single-row INSERT), median of \
         {RAW_SAMPLES}: {}. CPU per fresh call is the whole machine's busy CPU time \
         during the run (the server's backends, the fleet's processes) ÷ the calls; the \
         CPU bound is the rate at which that would take every core, ÷ one caller's.\n",
        us(raw_pg)
    );
    let (curve, one_caller) = fresh_and_replay_table(url, raw_pg);
    if let (Some(one), Some(&(_, all, _))) = (one_caller, curve.last()) {
        server_ceiling(url, one, all);
    }
    trigger_table(url);
    curve
}

/// The fleet's table, one row per size; returns the chart's points and one caller's rate.
fn fresh_and_replay_table(url: &str, raw_pg: f64) -> (Curve, Option<f64>) {
    println!(
        "| processes × callers | fresh calls/s | fresh p50 | fresh p99 | CPU per fresh \
         call (machine) | cores busy | CPU bound, ÷ one caller | replays/s | replay p50 | \
         replay p99 |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut curve = Vec::new();
    let mut one_caller = None;
    let mut raw = Vec::new();
    for (processes, callers) in FLEET {
        let fresh = fleet(url, processes, callers, "fresh", false);
        let replay = fleet(url, processes, callers, "replay", false);
        raw.push(RawRow {
            processes,
            callers,
            raw: fleet(url, processes, callers, "raw", false),
            shaped: fleet(url, processes, callers, "raw-shaped", false),
            idem: fresh.as_ref().map(|f| (f.rate, f.cpu)),
        });
        match (fresh, replay) {
            (Some(fresh), Some(replay)) => {
                let one = *one_caller.get_or_insert(fresh.rate);
                println!(
                    "| {processes} × {callers} | {:.0} | {} | {} | {} | {:.0} % | {:.1} | \
                     {:.0} | {} | {} |",
                    fresh.rate,
                    us(fresh.p50),
                    us(fresh.p99),
                    us(fresh.cpu),
                    100.0 * fresh.busy,
                    cores / fresh.cpu / one,
                    replay.rate,
                    us(replay.p50),
                    us(replay.p99)
                );
                let all = processes * callers;
                curve.push((all, fresh.rate, all as f64 / (2.0 * raw_pg)));
            }
            _ => println!("| {processes} × {callers} | a fleet process failed | | | | | | | | |"),
        }
    }
    raw_table(&raw);
    (curve, one_caller)
}

/// A fleet's size, its raw runs, and idem's fresh calls/s and CPU per call beside them.
struct RawRow {
    processes: usize,
    callers: usize,
    raw: Option<Fleet>,
    shaped: Option<Fleet>,
    idem: Option<(f64, f64)>,
}

/// The same fleets with nothing of idem's, each run right after idem's: what two commits a
/// call cost this machine, and the same shaped as idem's statements, beside what idem's fresh
/// calls took.
fn raw_table(rows: &[RawRow]) {
    println!(
        "\nThe same fleets with nothing of idem's, each run right after idem's fresh calls, each \
         caller a connection of its own, its statements prepared once. Raw: the least a fresh \
         call needs, two autocommitted statements that each wait for their WAL flush (INSERT a \
         row of 330 bytes, then UPDATE it to 430). Shaped: the same as idem's statements are \
         shaped, each write inserting a history row in the same statement, and the read of the \
         key pipelined behind the insert.\n"
    );
    println!(
        "| processes × callers | raw calls/s | ÷ one raw caller | CPU per raw call (machine) \
         | cores busy | shaped calls/s | CPU per shaped call | idem's fresh calls/s ÷ raw | \
         idem's CPU ÷ raw | idem's CPU ÷ shaped |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let one = rows.iter().find_map(|row| row.raw.as_ref().map(|r| r.rate));
    for row in rows {
        let (processes, callers) = (row.processes, row.callers);
        match (&row.raw, &row.shaped, row.idem, one) {
            (Some(raw), Some(shaped), Some((rate, cpu)), Some(one)) => println!(
                "| {processes} × {callers} | {:.0} | {:.2} | {} | {:.0} % | {:.0} | {} | {:.2} | \
                 {:.2} | {:.2} |",
                raw.rate,
                raw.rate / one,
                us(raw.cpu),
                100.0 * raw.busy,
                shaped.rate,
                us(shaped.cpu),
                rate / raw.rate,
                cpu / raw.cpu,
                cpu / shaped.cpu
            ),
            _ => println!("| {processes} × {callers} | a fleet process failed | | | | | | | | |"),
        }
    }
}

/// The largest fleet's rate `all` against one caller's `one`, and against what the server itself
/// sustains on this machine: a fresh call needs two commits that wait for their WAL flush, so
/// half its commit rate bounds them.
fn server_ceiling(url: &str, one: f64, all: f64) {
    println!("\n32 callers ÷ 1 caller, fresh calls: {:.2} (goal ≥ 8).", all / one);
    let ceiling = pg_server::commit_ceiling(url, 32);
    println!(
        "\nThe server alone, 32 connections each committing single-row INSERTs \
         (autocommit, as pgbench's simplest script) for {} s: {ceiling:.0} commits/s, \
         so at most {:.0} fresh calls/s (two commits each), {:.2}× one caller's rate; \
         the fleet's 32 callers reached {:.0}% of that bound.",
        THROUGHPUT_FOR.as_secs(),
        ceiling / 2.0,
        ceiling / 2.0 / one,
        100.0 * all / (ceiling / 2.0)
    );
}

/// Fresh calls/s with the earlier release's notify trigger on the table, and without it.
fn trigger_table(url: &str) {
    println!(
        "\nBefore and after announcing changes after the commit: fresh calls/s with the \
         earlier release's notify trigger put back on the table (each write then also \
         notifies inside its own transaction), and without it.\n"
    );
    println!("| processes × callers | with the trigger | without (this release) |");
    println!("| --- | --- | --- |");
    for (processes, callers) in FLEET {
        let before = fleet(url, processes, callers, "fresh", true);
        let after = fleet(url, processes, callers, "fresh", false);
        match (before, after) {
            (Some(before), Some(after)) => {
                println!("| {processes} × {callers} | {:.0} | {:.0} |", before.rate, after.rate)
            }
            _ => println!("| {processes} × {callers} | a fleet process failed | |"),
        }
    }
}

/// The notify trigger of releases before this one, as their migration created it: each insert,
/// delete and update announced from inside its own transaction.
const EARLIER_TRIGGER: &str = r#"
CREATE OR REPLACE FUNCTION idem_fleet.records_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_fleet_earlier', CASE WHEN TG_OP = 'DELETE' THEN OLD.key ELSE NEW.key END);
    RETURN NULL;
END
$$;
CREATE TRIGGER records_notify_insert_delete AFTER INSERT OR DELETE ON idem_fleet.records
    FOR EACH ROW EXECUTE FUNCTION idem_fleet.records_notify();
CREATE TRIGGER records_notify_update AFTER UPDATE ON idem_fleet.records
    FOR EACH ROW EXECUTE FUNCTION idem_fleet.records_notify();
"#;

const DROP_EARLIER_TRIGGER: &str = "DROP TRIGGER IF EXISTS records_notify_insert_delete ON \
    idem_fleet.records; DROP TRIGGER IF EXISTS records_notify_update ON idem_fleet.records; \
    DROP FUNCTION IF EXISTS idem_fleet.records_notify()";

/// What a fleet run measured, over all its processes.
struct Fleet {
    rate: f64,
    p50: f64,
    p99: f64,
    /// CPU time of the whole machine (the server's backends, the fleet and anything else) per
    /// call, in seconds, and the share of all cores busy.
    cpu: f64,
    busy: f64,
}

/// The machine's busy and total CPU time so far, in seconds, from `/proc/stat` (all cores; idle
/// and I/O wait are not busy).
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    // USER_HZ: 100 a second on Linux.
    ((total - idle) / 100.0, total / 100.0)
}

/// `processes` child processes of `callers` threads each, making fresh calls (`mode` "fresh")
/// or replaying the keys they wrote ("replay") for the same stretch of time, started together
/// once every process says it is ready.
fn fleet(
    url: &str,
    processes: usize,
    callers: usize,
    mode: &str,
    triggered: bool,
) -> Option<Fleet> {
    // The table, created (and any trigger left behind dropped) by a store's migration; the
    // fleet's processes connect without migrating, so that a trigger put back stays.
    drop(idem_postgres::PgStore::builder(url).schema("idem_fleet").connect().ok()?);
    pg_server::runtime().block_on(async {
        let client = pg_server::client(url).await;
        if mode.starts_with("raw") {
            // The raw fleet's own tables, empty for each run as the store's table is.
            pg_server::scratch_table(&client, RAW_TABLE).await;
            client
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS idem_fleet.{RAW_HISTORY}; CREATE TABLE \
                     idem_fleet.{RAW_HISTORY} (key text, seq bigint GENERATED ALWAYS AS \
                     IDENTITY, at bigint, event text, PRIMARY KEY (key, seq))"
                ))
                .await
                .expect("the scratch history table");
        }
        // Each run on an empty table: the same store size for every row of the table.
        let _ = client.batch_execute("TRUNCATE idem_fleet.records").await;
        if triggered {
            client.batch_execute(EARLIER_TRIGGER).await.expect("the earlier trigger");
        }
    });
    let exe = std::env::current_exe().ok()?;
    let seconds = THROUGHPUT_FOR.as_secs().to_string();
    let mut children = Vec::new();
    for p in 0..processes {
        let prefix = format!("{mode}-{processes}x{callers}-{p}");
        let child = Command::new(&exe)
            .args(["fleet", url, &callers.to_string(), &seconds, mode, &prefix])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        children.push(child);
    }
    let mut readers = Vec::new();
    for child in &mut children {
        let mut reader = BufReader::new(child.stdout.take()?);
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        if line.trim() != "ready" {
            return None;
        }
        readers.push(reader);
    }
    let cpu_before = machine_cpu();
    for child in &mut children {
        writeln!(child.stdin.as_mut()?, "go").ok()?;
    }
    let (mut calls, mut latencies, mut took) = (0u64, Vec::new(), 0f64);
    for (child, mut reader) in children.iter_mut().zip(readers) {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let mut fields = line.trim().split(' ');
        calls += fields.next()?.parse::<u64>().ok()?;
        took = took.max(fields.next()?.parse::<f64>().ok()?);
        latencies.extend(fields.filter_map(|f| f.parse::<f64>().ok()));
        child.wait().ok()?;
    }
    let cpu_after = machine_cpu();
    if triggered {
        pg_server::runtime().block_on(async {
            let client = pg_server::client(url).await;
            let _ = client.batch_execute(DROP_EARLIER_TRIGGER).await;
        });
    }
    let latencies = sorted(latencies);
    Some(Fleet {
        rate: calls as f64 / took,
        cpu: (cpu_after.0 - cpu_before.0) / calls.max(1) as f64,
        busy: (cpu_after.0 - cpu_before.0) / (cpu_after.1 - cpu_before.1).max(0.01),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
    })
}

/// One process of the fleet: `callers` threads on one store instance. It prints `ready`, waits
/// for `go` on its input, runs for `run_for`, then prints the calls made, the seconds taken and
/// every call's latency.
pub(crate) fn child(url: &str, callers: usize, run_for: Duration, mode: &str, prefix: &str) {
    if let Some(shaped) = match mode {
        "raw" => Some(false),
        "raw-shaped" => Some(true),
        _ => None,
    } {
        return raw_child(url, callers, run_for, prefix, shaped);
    }
    let store: Arc<dyn Store> = Arc::new(
        idem_postgres::PgStore::builder(url)
            .schema("idem_fleet")
            .pool_size(callers + 1)
            .create(false)
            .connect()
            .expect("the fleet's store connects"),
    );
    let replaying = mode == "replay";
    if replaying {
        for caller in 0..callers {
            for n in 0..REPLAY_KEYS {
                charge(&store, &format!("{prefix}-{caller}-{n}"));
            }
        }
    }
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("the parent says go");
    let start = Arc::new(Barrier::new(callers));
    let threads: Vec<_> = (0..callers)
        .map(|caller| {
            let (store, start, prefix) = (store.clone(), start.clone(), prefix.to_owned());
            std::thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                let mut latencies = Vec::new();
                let mut n = 0usize;
                while began.elapsed() < run_for {
                    let scope = if replaying {
                        format!("{prefix}-{caller}-{}", n % REPLAY_KEYS)
                    } else {
                        format!("{prefix}-{caller}-{n}")
                    };
                    let call = Instant::now();
                    charge(&store, &scope);
                    latencies.push(call.elapsed().as_secs_f64());
                    n += 1;
                }
                (latencies, began.elapsed().as_secs_f64())
            })
        })
        .collect();
    report_to_parent(threads);
}

/// The scratch table of the raw fleet, in the schema `idem_fleet`, and its history table.
const RAW_TABLE: &str = "raw_calls";
const RAW_HISTORY: &str = "raw_calls_history";

/// The raw fleet's statements: as the least a fresh call needs, or `shaped` as idem's are.
struct RawStatements {
    insert: tokio_postgres::Statement,
    /// The read pipelined behind the insert (shaped only).
    get: Option<tokio_postgres::Statement>,
    update: tokio_postgres::Statement,
}

impl RawStatements {
    async fn prepare(client: &tokio_postgres::Client, shaped: bool) -> RawStatements {
        let (t, h) = (format!("idem_fleet.{RAW_TABLE}"), format!("idem_fleet.{RAW_HISTORY}"));
        let (insert, get, update) = if shaped {
            (
                format!(
                    "WITH r AS (INSERT INTO {t} VALUES ($1, $2) ON CONFLICT (key) DO NOTHING \
                     RETURNING key) INSERT INTO {h} (key, at, event) \
                     SELECT key, $3, 'reserved' FROM r RETURNING seq"
                ),
                Some(format!("SELECT key, value FROM {t} WHERE key = $1")),
                format!(
                    "WITH r AS (UPDATE {t} SET value = $2 WHERE key = $1 RETURNING key), \
                     e AS (INSERT INTO {h} (key, at, event) SELECT key, $3, 'done' FROM r \
                     RETURNING seq) SELECT e.seq FROM e, r"
                ),
            )
        } else {
            (
                format!("INSERT INTO {t} VALUES ($1, $2)"),
                None,
                format!("UPDATE {t} SET value = $2 WHERE key = $1"),
            )
        };
        let prepare = |sql: String| async move { client.prepare(&sql).await.expect("prepare") };
        RawStatements {
            insert: prepare(insert).await,
            get: match get {
                Some(get) => Some(prepare(get).await),
                None => None,
            },
            update: prepare(update).await,
        }
    }

    /// One call of key `key`: the insert (with the read behind it), then the update.
    async fn call(&self, client: &tokio_postgres::Client, key: &str, value: &str, done: &str) {
        let at = 0i64;
        match &self.get {
            Some(get) => {
                let insert: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&key, &value, &at];
                let read: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key];
                let (inserted, found) = tokio::try_join!(
                    client.query_opt(&self.insert, &insert),
                    client.query_opt(get, &read)
                )
                .expect("an insert and a read");
                assert!(inserted.is_some() && found.is_some(), "the raw row of {key} is missing");
                let updated =
                    client.query_opt(&self.update, &[&key, &done, &at]).await.expect("an update");
                assert!(updated.is_some(), "the raw row of {key} was not updated");
            }
            None => {
                client.execute(&self.insert, &[&key, &value]).await.expect("an insert");
                let updated =
                    client.execute(&self.update, &[&key, &done]).await.expect("an update");
                assert_eq!(updated, 1, "the raw row of {key} was not updated");
            }
        }
    }
}

/// One process of the raw fleet: as [`child`], each caller with a connection of its own making
/// two autocommitted writes a call, an insert and an update of the row it inserted (`shaped`:
/// as idem's statements are shaped).
fn raw_child(url: &str, callers: usize, run_for: Duration, prefix: &str, shaped: bool) {
    // Each caller connects and prepares on its own thread; all are ready at the first barrier,
    // and start together at the second, once the parent says go.
    let (ready, start) = (Arc::new(Barrier::new(callers + 1)), Arc::new(Barrier::new(callers + 1)));
    let threads: Vec<_> = (0..callers)
        .map(|caller| {
            let (ready, start, prefix, url) =
                (ready.clone(), start.clone(), prefix.to_owned(), url.to_owned());
            std::thread::spawn(move || {
                pg_server::runtime().block_on(async {
                    let client = pg_server::client(&url).await;
                    let statements = RawStatements::prepare(&client, shaped).await;
                    let (value, done) = ("i".repeat(330), "d".repeat(430));
                    ready.wait();
                    start.wait();
                    let began = Instant::now();
                    let mut latencies = Vec::new();
                    let mut n = 0usize;
                    while began.elapsed() < run_for {
                        let key = format!("{prefix}-{caller}-{n}");
                        let call = Instant::now();
                        statements.call(&client, &key, &value, &done).await;
                        latencies.push(call.elapsed().as_secs_f64());
                        n += 1;
                    }
                    (latencies, began.elapsed().as_secs_f64())
                })
            })
        })
        .collect();
    ready.wait();
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("the parent says go");
    start.wait();
    report_to_parent(threads);
}

/// Joins the callers and prints the calls they made, the seconds the slowest took and every
/// call's latency, on one line for the parent.
fn report_to_parent(threads: Vec<std::thread::JoinHandle<(Vec<f64>, f64)>>) {
    let mut line = String::new();
    let (mut calls, mut took) = (0usize, 0f64);
    let mut all = Vec::new();
    for thread in threads {
        let (latencies, seconds) = thread.join().expect("a caller");
        calls += latencies.len();
        took = took.max(seconds);
        all.extend(latencies);
    }
    line.push_str(&format!("{calls} {took}"));
    for latency in all {
        line.push_str(&format!(" {latency}"));
    }
    println!("{line}");
}
