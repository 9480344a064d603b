//! What the tests of `idem mcp-proxy` share: a python with the MCP SDK, one test's machine (a
//! store, the configuration, the upstream's effects file), and the proxy as a host runs it, with
//! rmcp's client on its stdin and stdout. The upstream is `tests/mcp_proxy/payments.py`, a
//! server on the official Python SDK (`mcp==2.3.0`) that deduplicates nothing and appends a line
//! per effect to a file, so that effects are counted across every process that ran.

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

use super::{Lines, DEADLINE};

/// A scope for every write: the configuration most tests run under.
pub const CONFIG: &str = r#"
server = "payments"

[tools.charge_card]
scope = "/order_id"
ttl = "1d"

[tools.ship_order]
scope = "/order_id"
in_doubt = "fail"
"#;

/// The python to run the SDK with (`$IDEM_TEST_PYTHON`); `None`, after a notice, where there
/// is none outside CI.
pub fn python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("IDEM_TEST_PYTHON") {
        return Some(python.into());
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs the mcp-proxy tests with IDEM_TEST_PYTHON set to a python with `mcp==2.3.0`, \
         which .ci/run installs"
    );
    eprintln!(
        "\n*** NOTICE: the idem-cli mcp-proxy tests did not run: set IDEM_TEST_PYTHON to a \
         python with the MCP SDK (`python3 -m venv target/py && target/py/bin/pip install \
         mcp==2.3.0`, as .ci/run does) ***\n"
    );
    None
}

/// One test's machine: a store, the configuration, and the upstream's effects file.
pub struct Setup {
    pub dir: TempDir,
    pub python: PathBuf,
    pub store: String,
    pub config: PathBuf,
    pub effects: PathBuf,
    /// When set, each charge waits after acting until this file exists.
    pub gate: Option<PathBuf>,
}

impl Setup {
    pub fn new(python: PathBuf, config: &str) -> Setup {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = format!("sqlite:{}", dir.path().join("idem.sqlite").display());
        let path = dir.path().join("proxy.toml");
        std::fs::write(&path, config).expect("the configuration is written");
        let effects = dir.path().join("effects.txt");
        Setup { python, store, config: path, effects, gate: None, dir }
    }

    pub fn on_sled(mut self) -> Setup {
        self.store = self.dir.path().join("idem.sled").display().to_string();
        self
    }

    /// Charges act, then wait for [`open_gate`](Self::open_gate) before they answer.
    pub fn gated(mut self) -> Setup {
        self.gate = Some(self.dir.path().join("gate"));
        self
    }

    /// Lets every waiting charge answer.
    pub fn open_gate(&self) {
        std::fs::write(self.gate.as_ref().expect("a gated setup"), "").expect("the gate opens");
    }

    /// A file of the test scripts, `tests/mcp_proxy/NAME`.
    pub fn script(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_proxy").join(name)
    }

    /// The proxy's command line, as a host's configuration gives it, spawning the upstream.
    pub fn args(&self, check: bool) -> Vec<String> {
        let mut args = self.proxy_args(check);
        args.extend(["--".to_owned(), self.python.display().to_string()]);
        args.push(Setup::script("payments.py").display().to_string());
        args
    }

    /// The proxy's command line in front of the upstream at `url`.
    pub fn http_args(&self, check: bool, url: &str) -> Vec<String> {
        let mut args = self.proxy_args(check);
        args.extend(["--upstream".to_owned(), url.to_owned()]);
        args
    }

    pub fn proxy_args(&self, check: bool) -> Vec<String> {
        let mut args = vec!["--store".to_owned(), self.store.clone(), "mcp-proxy".to_owned()];
        args.extend(["--config".to_owned(), self.config.display().to_string()]);
        if check {
            args.push("--check".to_owned());
        }
        args
    }

    /// Runs the upstream alone, serving streamable HTTP on a loopback port, and returns once
    /// that port accepts connections.
    pub fn http_upstream(&self) -> HttpUpstream {
        let port = free_port();
        let log = self.dir.path().join("upstream.log");
        let child = std::process::Command::new(&self.python)
            .arg(Setup::script("payments.py"))
            .args(["--http", &port.to_string()])
            .envs(self.envs())
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

    /// What the upstream needs in its environment (the proxy passes its own on).
    pub fn envs(&self) -> Vec<(&'static str, String)> {
        let mut envs = vec![("PAYMENTS_EFFECTS", self.effects.display().to_string())];
        if let Some(gate) = &self.gate {
            envs.push(("PAYMENTS_GATE", gate.display().to_string()));
        }
        envs
    }

    /// The lines the upstream servers appended, in order.
    pub fn effects(&self) -> Vec<String> {
        match std::fs::read_to_string(&self.effects) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => panic!("cannot read the effects: {error}"),
        }
    }

    /// Waits until the upstream has appended `line`, polling the file: the upstream acts in its
    /// own process, and the file is the only thing that says it did.
    pub fn wait_for_effect(&self, line: &str) {
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

    /// Runs `idem --store STORE args…` to completion, as an operator would beside the proxy.
    pub fn idem(&self, args: &[&str]) -> super::Run {
        let mut all = vec!["--store", self.store.as_str()];
        all.extend_from_slice(args);
        super::idem_in(Path::new("/"), &all)
    }

    /// Starts `idem mcp-proxy` as a host would, with rmcp's client on its stdin and stdout.
    pub async fn proxy(&self) -> Proxy {
        self.proxy_with(self.args(false)).await
    }

    /// Starts `idem ARGS…`, the proxy's command line, as [`proxy`](Self::proxy) does.
    pub async fn proxy_with(&self, args: Vec<String>) -> Proxy {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"));
        command.args(args).env_remove("IDEM_STORE");
        command.envs(self.envs());
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
pub struct HttpUpstream {
    child: Child,
    pub url: String,
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port no one listens on: the kernel's pick, released for the upstream to take.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("a loopback port");
    listener.local_addr().expect("its address").port()
}

/// The test's client handler: it notes each `notifications/tools/list_changed` the proxy sends.
#[derive(Clone, Default)]
pub struct Watcher {
    pub changed: Arc<Notify>,
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
pub struct Proxy {
    pub client: RunningService<RoleClient, Watcher>,
    pub pid: u32,
    pub stderr: Lines,
}

impl Proxy {
    pub async fn call(&self, params: CallToolRequestParams) -> CallToolResult {
        within(self.client.call_tool(params)).await.expect("a tool result")
    }

    /// SIGKILL, as a crash would: no handler runs, nothing is flushed or released.
    pub fn kill(&self) {
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(killed.success(), "the proxy is killed");
    }
}

/// `future`, failing the test if it takes longer than [`DEADLINE`].
pub async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future).await.expect("within the deadline")
}

pub fn params(tool: &'static str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else { unreachable!() };
    CallToolRequestParams::new(tool).with_arguments(JsonObject::from(arguments))
}

pub fn charge() -> CallToolRequestParams {
    params("charge_card", json!({ "order_id": "o-1", "amount": 42 }))
}

/// Five charges of order `o-1` through `proxy`: one charge upstream, five equal answers; the
/// answer.
pub async fn charge_five_times(setup: &Setup, proxy: &Proxy) -> CallToolResult {
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(proxy.call(charge()).await);
    }
    assert_eq!(setup.effects(), ["charge o-1 42"], "one charge upstream");
    assert!(answers.iter().all(|answer| answer == &answers[0]), "five equal answers");
    assert_eq!(charged(&answers[0]), "ch_1_o-1_42");
    answers.swap_remove(0)
}

/// The charge id of a successful charge.
pub fn charged(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let content = result.structured_content.as_ref().expect("structured content");
    content["result"].as_str().expect("a charge id").to_owned()
}

/// idem's outcome of kind `kind` in a tool result, and its key.
pub fn told(result: &CallToolResult, kind: &str) -> (Value, String) {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let idem = result.structured_content.as_ref().expect("structured content")["idem"].clone();
    assert_eq!(idem["error"], kind, "{idem}");
    let key = idem["key"].as_str().expect("the key").to_owned();
    let text = serde_json::to_string(&result.content).expect("the text");
    assert!(text.contains(&key), "the text names the key: {text}");
    (idem, key)
}
