//! `idem mcp-proxy` as an MCP host runs it: rmcp's client spawns the proxy, which spawns a real
//! MCP server that deduplicates nothing, `tests/mcp_proxy/payments.py` on the official Python
//! SDK (`mcp==2.3.0`), or reaches the same server over streamable HTTP on a loopback port
//! (`--upstream`). Each charge, shipment and quote appends a line to a file, so the effects are
//! counted across every process that ran. `$IDEM_TEST_PYTHON` names a python with the SDK
//! installed; `.ci/run` makes one under the target directory and sets it.
#![cfg(unix)]

mod common;

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig, JsonObject};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::sync::Notify;

use self::common::{Lines, DEADLINE};

/// A scope for every write: the configuration the tests run under.
const CONFIG: &str = r#"
server = "payments"

[tools.charge_card]
scope = "/order_id"
ttl = "1d"

[tools.ship_order]
scope = "/order_id"
in_doubt = "fail"
"#;

/// The python to run the upstream with; `None`, after a notice, where there is none outside CI.
fn python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("IDEM_TEST_PYTHON") {
        return Some(python.into());
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs tests/mcp_proxy.rs with IDEM_TEST_PYTHON set to a python with `mcp==2.3.0`, \
         which .ci/run installs"
    );
    eprintln!(
        "\n*** NOTICE: idem-cli/tests/mcp_proxy.rs did not run: set IDEM_TEST_PYTHON to a python \
         with the MCP SDK (`python3 -m venv target/py && target/py/bin/pip install mcp==2.3.0`, \
         as .ci/run does) ***\n"
    );
    None
}

/// One test's machine: a store, the configuration, and the upstream's effects file.
struct Setup {
    _dir: TempDir,
    python: PathBuf,
    store: String,
    config: PathBuf,
    effects: PathBuf,
}

impl Setup {
    fn new(python: PathBuf, config: &str) -> Setup {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = format!("sqlite:{}", dir.path().join("idem.sqlite").display());
        let path = dir.path().join("proxy.toml");
        std::fs::write(&path, config).expect("the configuration is written");
        let effects = dir.path().join("effects.txt");
        Setup { python, store, config: path, effects, _dir: dir }
    }

    fn on_sled(mut self) -> Setup {
        self.store = self._dir.path().join("idem.sled").display().to_string();
        self
    }

    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_proxy/payments.py")
    }

    /// The proxy's command line, as a host's configuration gives it, spawning the upstream.
    fn args(&self, check: bool) -> Vec<String> {
        let mut args = self.proxy_args(check);
        args.extend(["--".to_owned(), self.python.display().to_string()]);
        args.push(Setup::script().display().to_string());
        args
    }

    /// The proxy's command line in front of the upstream at `url`.
    fn http_args(&self, check: bool, url: &str) -> Vec<String> {
        let mut args = self.proxy_args(check);
        args.extend(["--upstream".to_owned(), url.to_owned()]);
        args
    }

    fn proxy_args(&self, check: bool) -> Vec<String> {
        let mut args = vec!["--store".to_owned(), self.store.clone(), "mcp-proxy".to_owned()];
        args.extend(["--config".to_owned(), self.config.display().to_string()]);
        if check {
            args.push("--check".to_owned());
        }
        args
    }

    /// Runs the upstream alone, serving streamable HTTP on a loopback port, and returns once
    /// that port accepts connections.
    fn http_upstream(&self) -> HttpUpstream {
        let port = free_port();
        let log = self._dir.path().join("upstream.log");
        let child = std::process::Command::new(&self.python)
            .arg(Setup::script())
            .args(["--http", &port.to_string()])
            .env("PAYMENTS_EFFECTS", &self.effects)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("the upstream's log"))
            .spawn()
            .expect("the upstream starts");
        let mut upstream = HttpUpstream { child, url: format!("http://127.0.0.1:{port}/mcp") };
        let until = Instant::now() + DEADLINE;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = upstream.child.try_wait().expect("the upstream's status");
            let log = || std::fs::read_to_string(&log).unwrap_or_default();
            assert!(exited.is_none(), "the upstream exited ({exited:?}): {}", log());
            assert!(Instant::now() < until, "port {port} not open within {DEADLINE:?}: {}", log());
            std::thread::sleep(Duration::from_millis(20));
        }
        upstream
    }

    /// The lines the upstream servers appended, in order.
    fn effects(&self) -> Vec<String> {
        match std::fs::read_to_string(&self.effects) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => panic!("cannot read the effects: {error}"),
        }
    }

    /// Waits until the upstream has appended `line`, polling the file: the upstream acts in its
    /// own process, and the file is the only thing that says it did.
    fn wait_for_effect(&self, line: &str) {
        let until = Instant::now() + DEADLINE;
        while !self.effects().iter().any(|effect| effect == line) {
            assert!(
                Instant::now() < until,
                "no `{line}` within {DEADLINE:?}: {:?}",
                self.effects()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `idem mcp-proxy` as a host would, with rmcp's client on its stdin and stdout.
    async fn proxy(&self) -> Proxy {
        self.proxy_with(self.args(false)).await
    }

    /// Starts `idem ARGS…`, the proxy's command line, as [`proxy`](Self::proxy) does.
    async fn proxy_with(&self, args: Vec<String>) -> Proxy {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"));
        command.args(args).env_remove("IDEM_STORE");
        command.env("PAYMENTS_EFFECTS", &self.effects);
        let (transport, stderr) = TokioChildProcess::builder(command)
            .stderr(Stdio::piped())
            .spawn()
            .expect("the proxy starts");
        let pid = transport.id().expect("the proxy's pid");
        let stderr: OwnedFd = stderr.expect("piped stderr").into_owned_fd().expect("its fd");
        let stderr = Lines::read(File::from(stderr));
        let watcher = Watcher::default();
        let client = within(watcher.serve(transport)).await.expect("the proxy initializes");
        Proxy { client, pid, stderr }
    }
}

/// The upstream serving streamable HTTP, killed when dropped.
struct HttpUpstream {
    child: Child,
    url: String,
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port no one listens on: the kernel's pick, released for the upstream to take.
fn free_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("a loopback port");
    listener.local_addr().expect("its address").port()
}

/// The test's client handler: it notes each `notifications/tools/list_changed` the proxy sends.
#[derive(Clone, Default)]
struct Watcher {
    changed: Arc<Notify>,
}

impl ClientHandler for Watcher {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

/// A running proxy, its client session, and what it writes to stderr.
struct Proxy {
    client: RunningService<RoleClient, Watcher>,
    pid: u32,
    stderr: Lines,
}

impl Proxy {
    async fn call(&self, params: CallToolRequestParams) -> CallToolResult {
        within(self.client.call_tool(params)).await.expect("a tool result")
    }

    /// SIGKILL, as a crash would: no handler runs, nothing is flushed or released.
    fn kill(&self) {
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(killed.success(), "the proxy is killed");
    }
}

/// `future`, failing the test if it takes longer than [`DEADLINE`].
async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future).await.expect("within the deadline")
}

fn params(tool: &'static str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else { unreachable!() };
    CallToolRequestParams::new(tool).with_arguments(JsonObject::from(arguments))
}

fn charge() -> CallToolRequestParams {
    params("charge_card", json!({ "order_id": "o-1", "amount": 42 }))
}

fn charged(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let content = result.structured_content.as_ref().expect("structured content");
    content["result"].as_str().expect("a charge id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_charges_through_the_proxy_charge_once_and_a_fresh_proxy_replays() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);

    let proxy = setup.proxy().await;
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(proxy.call(charge()).await);
    }
    assert_eq!(setup.effects(), ["charge o-1 42"], "one charge upstream");
    assert!(answers.iter().all(|answer| answer == &answers[0]), "five equal answers");
    assert_eq!(charged(&answers[0]), "ch_1_o-1_42");
    within(proxy.client.cancel()).await.expect("the session closes");

    // Another proxy process, another upstream process, the same store: a replay.
    let again = setup.proxy().await;
    assert_eq!(again.call(charge()).await, answers[0]);
    assert_eq!(setup.effects(), ["charge o-1 42"], "still one charge");

    // Another order is charged, once.
    let other = again.call(params("charge_card", json!({ "order_id": "o-2", "amount": 42 })));
    assert_eq!(charged(&other.await), "ch_2_o-2_42");
    assert_eq!(setup.effects(), ["charge o-1 42", "charge o-2 42"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_passes_through_every_time() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);
    let proxy = setup.proxy().await;
    let tools = within(proxy.client.list_all_tools()).await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    let upstream =
        ["charge_card", "get_balance", "ship_order", "get_quote", "hold_stock_on_quotes"];
    assert_eq!(names, upstream, "the upstream's tools");
    let hints = tools[1].annotations.as_ref().and_then(|hints| hints.read_only_hint);
    assert_eq!(hints, Some(true), "the upstream's hints, as they are");

    let balance = || params("get_balance", json!({ "account": "acc-1" }));
    for _ in 0..3 {
        let answer = proxy.call(balance()).await;
        assert_eq!(answer.is_error, Some(false), "{answer:?}");
        assert_eq!(answer.structured_content.unwrap()["result"], "100");
    }
    assert!(setup.effects().is_empty());
    let listed = common::idem_in(Path::new("/"), &["--store", &setup.store, "ls", "--json"]);
    assert_eq!(listed.ok(), "", "a read leaves no record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_killed_while_a_shipment_runs_leaves_it_in_doubt() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG).on_sled();
    let ship = || params("ship_order", json!({ "order_id": "o-1" }));

    let first = setup.proxy().await;
    let client = first.client.clone();
    let pending = tokio::spawn(async move { client.call_tool(ship()).await });
    setup.wait_for_effect("ship o-1");
    first.kill();
    let lost = within(pending).await.expect("the call's task");
    assert!(lost.is_err(), "the killed proxy never answered: {lost:?}");

    // The next proxy on the same store says so, as a tool result, and does not ship again.
    let second = setup.proxy().await;
    let answer = second.call(ship()).await;
    assert_eq!(answer.is_error, Some(true), "{answer:?}");
    let idem = &answer.structured_content.as_ref().expect("structured content")["idem"];
    assert_eq!(idem["error"], "in-doubt", "{idem}");
    let key = idem["key"].as_str().expect("the key");
    assert_eq!(setup.effects(), ["ship o-1"], "one shipment");

    // The operator sees the same key in doubt.
    within(second.client.cancel()).await.expect("the session closes");
    let mut stderr = second.stderr;
    stderr.end();
    let listed = common::idem_in(Path::new("/"), &["--store", &setup.store, "ls", "--json"]);
    let record: Value = serde_json::from_str(listed.ok().trim()).expect("one record");
    assert_eq!(record["key"], key);
    assert_eq!(record["status"], "in-doubt");
    assert_eq!(record["tool"], "payments/ship_order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_sqlite_store_charge_once() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);
    let (a, b) = tokio::join!(setup.proxy(), setup.proxy());
    let (one, two) = tokio::join!(a.call(charge()), b.call(charge()));
    assert_eq!(setup.effects(), ["charge o-1 42"], "one charge for both proxies");
    assert_eq!(one, two, "both get the one charge's answer");
    assert_eq!(charged(&one), "ch_1_o-1_42");
}

#[test]
fn check_prints_each_tool_with_its_classification() {
    let Some(python) = python() else { return };
    let unscoped_ship = "server = \"payments\"\n[tools.charge_card]\nscope = \"/order_id\"\n";
    let setup = Setup::new(python, unscoped_ship);
    let args = setup.args(true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let effects = setup.effects.display().to_string();
    let run = common::idem_in_with(Path::new("/"), &args, &[("PAYMENTS_EFFECTS", &effects)]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "charge_card           keyed by /order_id\n\
         get_balance           read: passed through every time\n\
         ship_order            unprotected: a write with no scope, passed through\n\
         get_quote             read: passed through every time\n\
         hold_stock_on_quotes  unprotected: a write with no scope, passed through\n"
    );
    assert!(!Path::new(&setup.store["sqlite:".len()..]).exists(), "--check opens no store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_warns_of_the_writes_that_pass_through_unprotected() {
    let Some(python) = python() else { return };
    let config = "server = \"payments\"\n[tools.charge_card]\nscope = \"/order_id\"\n\
                  [tools.charge_crad]\nscope = \"/order_id\"\n";
    let setup = Setup::new(python, config);
    let mut proxy = setup.proxy().await;
    let warning = proxy.stderr.next("the unprotected tools' warning");
    assert!(warning.contains("pass through unprotected"), "{warning}");
    assert!(warning.ends_with(": hold_stock_on_quotes, ship_order"), "{warning}");
    let typo = proxy.stderr.next("the unknown tools' warning");
    assert!(typo.ends_with("does not list: charge_crad"), "{typo}");
}

#[test]
fn a_bad_configuration_names_the_tool_and_the_key() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, "server = \"payments\"\n[tools.charge_card]\nscop = \"/id\"\n");
    let args = setup.args(false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let error = common::idem_in(Path::new("/"), &args);
    let line = error.fails(2);
    assert!(line.contains("proxy.toml: tool `charge_card`: unknown field `scop`"), "{line}");
    assert!(setup.effects().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_is_classified_again_and_passed_on() {
    let Some(python) = python() else { return };
    let config = format!("{CONFIG}\n[tools.get_quote]\nscope = \"/order_id\"\n");
    let setup = Setup::new(python, &config);
    let proxy = setup.proxy().await;
    let quote = || params("get_quote", json!({ "order_id": "o-1" }));

    // The upstream says get_quote only reads: its hint wins, and each quote reaches it.
    let first = proxy.call(quote()).await;
    let second = proxy.call(quote()).await;
    assert_ne!(first, second, "a read passes through every time");
    assert_eq!(setup.effects(), ["quote o-1", "quote o-1"]);

    // Now quotes hold stock: the upstream lists get_quote without the hint and says so.
    let held = proxy.call(params("hold_stock_on_quotes", json!({}))).await;
    assert_eq!(held.is_error, Some(false), "{held:?}");
    within(proxy.client.service().changed.notified()).await;
    let tools = within(proxy.client.list_all_tools()).await.expect("tools/list");
    let listed = tools.iter().find(|tool| tool.name == "get_quote").expect("get_quote listed");
    let hint = listed.annotations.as_ref().and_then(|hints| hints.read_only_hint);
    assert_eq!(hint, None, "the upstream's new listing");

    // The proxy classified the list again before passing the notification on: a write now,
    // keyed by its configured scope.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(proxy.call(quote()).await);
    }
    assert_eq!(setup.effects(), ["quote o-1", "quote o-1", "quote o-1"], "one more quote");
    assert!(answers.iter().all(|answer| answer == &answers[0]), "three equal answers");
    assert_eq!(answers[0].structured_content.as_ref().unwrap()["result"], "q_3_o-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_in_front_of_a_streamable_http_upstream_charges_once() {
    let Some(python) = python() else { return };
    let setup =
        Setup::new(python, &format!("{CONFIG}\n[tools.get_quote]\nscope = \"/order_id\"\n"));
    let upstream = setup.http_upstream();

    let args = setup.http_args(true, &upstream.url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let check = common::idem_in(Path::new("/"), &args);
    assert!(check.ok().starts_with("charge_card           keyed by /order_id\n"), "{check:?}");

    let proxy = setup.proxy_with(setup.http_args(false, &upstream.url)).await;
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(proxy.call(charge()).await);
    }
    assert_eq!(setup.effects(), ["charge o-1 42"], "one charge upstream");
    assert!(answers.iter().all(|answer| answer == &answers[0]), "five equal answers");
    assert_eq!(charged(&answers[0]), "ch_1_o-1_42");

    let balance = proxy.call(params("get_balance", json!({ "account": "acc-1" }))).await;
    assert_eq!(balance.structured_content.unwrap()["result"], "100", "a read passes through");
    assert_eq!(setup.effects(), ["charge o-1 42"]);
    let listed = common::idem_in(Path::new("/"), &["--store", &setup.store, "ls", "--json"]);
    let record: Value = serde_json::from_str(listed.ok().trim()).expect("one record");
    assert_eq!(record["tool"], "payments/charge_card");

    // A tool list change reaches the proxy over HTTP too (on the call's event stream): once
    // the proxy passed it on, get_quote is a write, keyed by its configured scope.
    let held = proxy.call(params("hold_stock_on_quotes", json!({}))).await;
    assert_eq!(held.is_error, Some(false), "{held:?}");
    within(proxy.client.service().changed.notified()).await;
    let quote = || params("get_quote", json!({ "order_id": "o-1" }));
    assert_eq!(proxy.call(quote()).await, proxy.call(quote()).await, "a replay");
    assert_eq!(setup.effects(), ["charge o-1 42", "quote o-1"], "one quote");
}

#[test]
fn an_upstream_url_no_one_answers_is_named_at_start_up() {
    let setup = Setup::new(PathBuf::new(), CONFIG);
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    let args = setup.http_args(false, &url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = common::idem_in(Path::new("/"), &args);
    let line = run.fails(1);
    assert!(line.contains(&format!("cannot reach the upstream server at {url}")), "{line}");
    assert!(line.contains("start it, or give --upstream the URL"), "{line}");
}

#[test]
fn the_upstream_is_given_exactly_once() {
    let setup = Setup::new(PathBuf::from("python3"), CONFIG);
    let both = setup.http_args(false, "http://127.0.0.1:9/mcp");
    let both: Vec<&str> = both.iter().map(String::as_str).chain(["--", "python3"]).collect();
    let line = common::idem_in(Path::new("/"), &both).fails(2).to_owned();
    assert!(line.contains("'--upstream <URL>' cannot be used with '[COMMAND]...'"), "{line}");

    let neither = setup.proxy_args(false);
    let neither: Vec<&str> = neither.iter().map(String::as_str).collect();
    let line = common::idem_in(Path::new("/"), &neither).fails(2).to_owned();
    assert!(line.contains("not provided: <--upstream <URL>|COMMAND>"), "{line}");

    let tls = setup.http_args(false, "https://payments.example/mcp");
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let line = common::idem_in(Path::new("/"), &tls).fails(2).to_owned();
    assert!(line.contains("https://payments.example/mcp: this idem speaks plain HTTP"), "{line}");
    assert!(!Path::new(&setup.store["sqlite:".len()..]).exists(), "no store for bad usage");
}

/// Runs when `DATABASE_URL` names a PostgreSQL database, as idem-cli's other PostgreSQL test
/// does: the default schema and table, an order of this run's own.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_postgresql_store_charge_once() {
    let Some(python) = python() else { return };
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let mut setup = Setup::new(python, CONFIG);
    setup.store = url;
    let order = format!("pg-{}-{}", std::process::id(), idem_runtime::store::now_ms());
    let charge = || params("charge_card", json!({ "order_id": order, "amount": 42 }));
    let (a, b) = tokio::join!(setup.proxy(), setup.proxy());
    let (one, two) = tokio::join!(a.call(charge()), b.call(charge()));
    assert_eq!(setup.effects(), [format!("charge {order} 42")], "one charge for both proxies");
    assert_eq!(one, two, "both get the one charge's answer");

    // A third proxy, after both: a replay.
    within(a.client.cancel()).await.expect("the session closes");
    let again = setup.proxy().await;
    assert_eq!(again.call(charge()).await, one);
    assert_eq!(setup.effects().len(), 1, "still one charge");
}
