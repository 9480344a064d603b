//! What `idem mcp-proxy` adds to a tool call: rmcp's client over stdio, straight to an upstream
//! MCP server and through the proxy in front of the same server, on a SQLite store with
//! `Durability::Fsync` (the default), beside the store's own parts measured in the same run: a
//! raw SQLite commit (the durable point; a fresh call makes two) and a fresh call of the engine
//! in this process, each timed right after a fresh call through the proxy, so that the disk is
//! as the proxy's own commits find it. Criterion's rows first, then the p50 / p90 table of
//! BENCHMARKS.md's "Through `idem mcp-proxy`", from rounds that take every case in turn so that
//! the machine's drifting load falls on all alike.
//!
//! `cargo bench -p idem-agent-cli --bench proxy`
//!
//! The upstream is this binary itself: started with `IDEM_TEST_RMCP_UPSTREAM` set, it serves the
//! tiny rmcp server of `tests/common/rmcp_upstream.rs` on stdio instead of benchmarking (a bench cannot add a binary to the
//! package), so that the upstream's own time is small and steady and the proxy's shows.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use idem_runtime::rusqlite;
use idem_runtime::{Call, Error, SqliteStore, Store};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

// The upstream, shared with tests/mcp_proxy_rmcp.rs.
#[path = "../tests/common/rmcp_upstream.rs"]
mod rmcp_upstream;

use self::rmcp_upstream::UPSTREAM;

/// The proxy's configuration: the charge is a keyed write, the balance a read by its hint.
const CONFIG: &str = "server = \"bench\"\n[tools.charge_card]\nscope = \"/order_id\"\n";

/// Rounds of the p50 / p90 table, and each case's calls in a round.
const ROUNDS: usize = 5;
const FRESH_CALLS: usize = 200;
const QUICK_CALLS: usize = 400;

fn main() {
    if std::env::var_os(UPSTREAM).is_some() {
        return rmcp_upstream::serve();
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let mut cases = Cases::start(&runtime, dir.path());

    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut group = criterion.benchmark_group("proxy");
    for case in Case::ALL {
        group.bench_function(case.name(), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| cases.time(&runtime, case)).sum())
        });
    }
    group.finish();
    criterion.final_summary();

    // `--test` (each bench run once, to see that it works) and `--list` skip the long table.
    if !std::env::args().any(|arg| arg == "--test" || arg == "--list") {
        percentiles(&runtime, &mut cases);
    }
    runtime.block_on(cases.stop());
}

// ---- the raw commit ----------------------------------------------------------------------

/// A SQLite file set up as the store sets up its own (WAL, `synchronous = FULL`).
fn raw_sqlite(path: &Path) -> rusqlite::Connection {
    let raw = rusqlite::Connection::open(path).expect("a raw SQLite file");
    raw.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID;",
    )
    .expect("the raw table");
    raw
}

/// The store's durable point alone, as the SQLite store commits: `BEGIN IMMEDIATE`, a one-row
/// insert, `COMMIT`.
fn raw_commit(raw: &rusqlite::Connection, key: &str) {
    raw.execute_batch("BEGIN IMMEDIATE").expect("BEGIN");
    raw.execute("INSERT INTO t VALUES (?1, 'x')", [key]).expect("INSERT");
    raw.execute_batch("COMMIT").expect("COMMIT");
}

// ---- the cases ----------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Case {
    /// (a) A charge of a new order, straight to the upstream.
    DirectFresh,
    /// (b) A charge of a new order through the proxy: keyed, two durable points, forwarded.
    ProxyFresh,
    /// (c) The same charge again through the proxy: answered from the store.
    ProxyReplay,
    /// (d) A read straight to the upstream, and through the proxy (passed through).
    DirectRead,
    ProxyRead,
    /// The store's durable point alone ([`raw_commit`]), on the same disk, each right after a
    /// fresh call through the proxy (not timed), as the proxy's own commits follow each other.
    RawCommit,
    /// The same, back to back: on this disk a loop of commits alone is far slower (see
    /// BENCHMARKS.md), so it is shown, not used as the floor.
    RawCommitLoop,
    /// A fresh call of the engine in this process on a SQLite store like the proxy's (its two
    /// durable points and the engine's work, no MCP), each right after a fresh call through the
    /// proxy (not timed), as [`Case::RawCommit`].
    EngineFresh,
}

impl Case {
    const ALL: [Case; 8] = [
        Case::DirectFresh,
        Case::ProxyFresh,
        Case::ProxyReplay,
        Case::DirectRead,
        Case::ProxyRead,
        Case::RawCommit,
        Case::RawCommitLoop,
        Case::EngineFresh,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::DirectFresh => "direct_fresh",
            Case::ProxyFresh => "proxy_fresh",
            Case::ProxyReplay => "proxy_replay",
            Case::DirectRead => "direct_read",
            Case::ProxyRead => "proxy_read",
            Case::RawCommit => "raw_sqlite_commit",
            Case::RawCommitLoop => "raw_sqlite_commit_back_to_back",
            Case::EngineFresh => "engine_fresh_in_process",
        }
    }

    fn calls(self) -> usize {
        match self {
            Case::DirectFresh
            | Case::ProxyFresh
            | Case::RawCommit
            | Case::RawCommitLoop
            | Case::EngineFresh => FRESH_CALLS,
            Case::ProxyReplay | Case::DirectRead | Case::ProxyRead => QUICK_CALLS,
        }
    }

    /// Whether each call is timed right after an untimed fresh call through the proxy.
    fn among_proxy_calls(self) -> bool {
        matches!(self, Case::RawCommit | Case::EngineFresh)
    }
}

/// Everything the cases call: two client sessions, a raw SQLite connection and a store.
struct Cases {
    direct: RunningService<RoleClient, ()>,
    proxy: RunningService<RoleClient, ()>,
    raw: rusqlite::Connection,
    store: Arc<dyn Store>,
    /// A new order for each fresh call, so that each is a new intent with the same work.
    orders: u64,
}

impl Cases {
    fn start(runtime: &Runtime, dir: &Path) -> Cases {
        let config = dir.join("proxy.toml");
        std::fs::write(&config, CONFIG).expect("the configuration is written");
        let store = format!("sqlite:{}", dir.join("proxy.sqlite").display());
        let me = std::env::current_exe().expect("this binary's path");

        let mut direct = tokio::process::Command::new(&me);
        direct.env(UPSTREAM, "1");
        let mut proxy = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"));
        proxy.args(["--store", &store, "mcp-proxy", "--config"]).arg(&config).arg("--").arg(&me);
        proxy.env(UPSTREAM, "1").env_remove("IDEM_STORE");

        let raw = raw_sqlite(&dir.join("raw.sqlite"));
        let store = SqliteStore::open(dir.join("engine.sqlite")).expect("the engine's store");

        let mut cases = Cases {
            direct: runtime.block_on(connect(direct)),
            proxy: runtime.block_on(connect(proxy)),
            raw,
            store: Arc::new(store),
            orders: 0,
        };
        // The replayed charge's first call, and a check that the proxy keys and replays.
        let first = cases.call(runtime, Case::ProxyReplay);
        assert_eq!(first, cases.call(runtime, Case::ProxyReplay), "the repeat is replayed");
        cases
    }

    /// Makes one call of `case`, timed from the request to the answer.
    fn time(&mut self, runtime: &Runtime, case: Case) -> Duration {
        if case.among_proxy_calls() {
            self.call(runtime, Case::ProxyFresh);
        }
        let start = Instant::now();
        std::hint::black_box(self.call(runtime, case));
        start.elapsed()
    }

    fn call(&mut self, runtime: &Runtime, case: Case) -> String {
        let order = match case {
            Case::ProxyReplay => "o-replayed".to_owned(),
            _ => {
                self.orders += 1;
                format!("o-{}", self.orders)
            }
        };
        let charge = || params("charge_card", json!({ "order_id": order, "amount": 42 }));
        let read = || params("get_balance", json!({ "account": "acc-1" }));
        match case {
            Case::DirectFresh => answer(runtime.block_on(self.direct.call_tool(charge()))),
            Case::ProxyFresh | Case::ProxyReplay => {
                answer(runtime.block_on(self.proxy.call_tool(charge())))
            }
            Case::DirectRead => answer(runtime.block_on(self.direct.call_tool(read()))),
            Case::ProxyRead => answer(runtime.block_on(self.proxy.call_tool(read()))),
            Case::RawCommit | Case::RawCommitLoop => {
                raw_commit(&self.raw, &order);
                order
            }
            Case::EngineFresh => {
                let args = json!({ "order_id": order, "amount": 42 });
                let call = Call::new("charge_card", &order, &args).expect("a key");
                let charged: Result<String, Error> =
                    call.store(Arc::clone(&self.store)).run(|| Ok(format!("ch_{order}")));
                charged.expect("the engine's call")
            }
        }
    }

    async fn stop(self) {
        let _ = self.direct.cancel().await;
        let _ = self.proxy.cancel().await;
    }
}

async fn connect(command: tokio::process::Command) -> RunningService<RoleClient, ()> {
    let transport = TokioChildProcess::new(command).expect("the server starts");
    ().serve(transport).await.expect("the server initializes")
}

fn params(tool: &'static str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else { unreachable!("a JSON object") };
    CallToolRequestParams::new(tool).with_arguments(arguments)
}

/// The tool's answer; anything else stops the bench, which would otherwise time an error.
fn answer(result: Result<CallToolResult, rmcp::service::ServiceError>) -> String {
    let result = result.expect("a tool result");
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let content = result.structured_content.expect("structured content");
    content["result"].as_str().expect("a string result").to_owned()
}

// ---- the p50 / p90 table ------------------------------------------------------------------

/// Every case's calls, `ROUNDS` times in turn, then each case's p50 and p90 and what the proxy
/// adds, as markdown rows.
fn percentiles(runtime: &Runtime, cases: &mut Cases) {
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); Case::ALL.len()];
    for _ in 0..ROUNDS {
        for (i, case) in Case::ALL.into_iter().enumerate() {
            times[i].extend((0..case.calls()).map(|_| cases.time(runtime, case)));
        }
    }
    times.iter_mut().for_each(|t| t.sort());
    let p = |case: Case, q: f64| {
        let t = &times[Case::ALL.iter().position(|c| *c == case).expect("a case")];
        t[((t.len() - 1) as f64 * q).round() as usize]
    };
    println!("\n{ROUNDS} rounds, each case's calls in turn (fresh: {FRESH_CALLS} a round, others {QUICK_CALLS}):\n");
    println!("| case | p50 | p90 |");
    println!("| --- | --- | --- |");
    for case in Case::ALL {
        println!("| {} | {} | {} |", case.name(), show(p(case, 0.5)), show(p(case, 0.9)));
    }
    let added = |proxied: Case, direct: Case, q: f64| {
        p(proxied, q).as_secs_f64() - p(direct, q).as_secs_f64()
    };
    let (fresh50, fresh90) = (
        added(Case::ProxyFresh, Case::DirectFresh, 0.5),
        added(Case::ProxyFresh, Case::DirectFresh, 0.9),
    );
    let two_commits = 2.0 * p(Case::RawCommit, 0.5).as_secs_f64();
    println!("\n| what | p50 | p90 |");
    println!("| --- | --- | --- |");
    println!(
        "| added to a fresh call (proxy_fresh − direct_fresh) | {} | {} |",
        secs(fresh50),
        secs(fresh90)
    );
    println!(
        "| – less two raw_sqlite_commit at its p50 | {} | {} |",
        secs(fresh50 - two_commits),
        secs(fresh90 - two_commits)
    );
    println!(
        "| – less engine_fresh_in_process (same quantile) | {} | {} |",
        secs(fresh50 - p(Case::EngineFresh, 0.5).as_secs_f64()),
        secs(fresh90 - p(Case::EngineFresh, 0.9).as_secs_f64())
    );
    println!(
        "| added to a read (proxy_read − direct_read) | {} | {} |",
        secs(added(Case::ProxyRead, Case::DirectRead, 0.5)),
        secs(added(Case::ProxyRead, Case::DirectRead, 0.9))
    );
    println!(
        "| proxy_fresh ÷ direct_fresh | {:.2} | {:.2} |",
        ratio(Case::ProxyFresh, Case::DirectFresh, 0.5, &p),
        ratio(Case::ProxyFresh, Case::DirectFresh, 0.9, &p)
    );
    println!(
        "| proxy_read ÷ direct_read | {:.2} | {:.2} |",
        ratio(Case::ProxyRead, Case::DirectRead, 0.5, &p),
        ratio(Case::ProxyRead, Case::DirectRead, 0.9, &p)
    );
}

fn ratio(a: Case, b: Case, q: f64, p: &impl Fn(Case, f64) -> Duration) -> f64 {
    p(a, q).as_secs_f64() / p(b, q).as_secs_f64()
}

fn show(d: Duration) -> String {
    secs(d.as_secs_f64())
}

fn secs(s: f64) -> String {
    if s.abs() < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else {
        format!("{:.2} ms", s * 1e3)
    }
}
