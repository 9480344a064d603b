//! `examples/mcp_in_doubt.rs` run as the real processes an MCP host starts: rmcp's client on the
//! server's stdin and stdout, a server killed with SIGKILL mid-payment, a second server on the
//! same sled store, and a store that cannot be created. Needs the `rmcp` feature.

#![cfg(all(feature = "rmcp", unix))]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::json;

use self::common::Lines;

/// The example's binary, with `sqlite` too, as `tests/mcp_sqlite.rs` builds it: one binary for
/// both.
fn server_binary() -> std::path::PathBuf {
    common::example("mcp_in_doubt", "rmcp,sqlite")
}

/// A server process, and the lines it writes to stderr, as they come.
struct Server {
    child: Child,
    stderr: Lines,
}

impl Server {
    /// Starts the example with `env` set, its store wherever `env` (and the defaults) put it.
    fn start(env: &[(&str, &Path)], hangs: bool) -> Server {
        Server::start_in(Path::new(env!("CARGO_MANIFEST_DIR")), env, hangs)
    }

    /// Starts the example in the working directory `cwd`, as a host would.
    fn start_in(cwd: &Path, env: &[(&str, &Path)], hangs: bool) -> Server {
        let mut command = Command::new(server_binary());
        command.current_dir(cwd);
        command.env_remove("IDEM_STORE").env_remove("BANK_HANGS");
        command.envs(env.iter().map(|(name, value)| (name, value.as_os_str())));
        if hangs {
            command.env("BANK_HANGS", "1");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the server starts");
        let stderr = Lines::read(child.stderr.take().expect("piped stderr"));
        Server { child, stderr }
    }

    /// Waits for a line of stderr that contains `text` and returns it; fails the test, showing
    /// what it wrote, if the process closes stderr (exits) first or is stuck.
    fn wait_for(&mut self, text: &str) -> String {
        self.stderr.until(text)
    }

    /// Everything it writes to stderr until it exits, and whether it exited successfully.
    fn finish(mut self) -> (bool, String) {
        let stderr = self.stderr.rest();
        let status = self.child.wait().expect("the server is waited for");
        (status.success(), stderr.join("\n"))
    }

    /// An MCP client speaking to the server over its stdin and stdout.
    async fn client(&mut self) -> RunningService<RoleClient, ()> {
        common::mcp_client(&mut self.child).await
    }

    /// Kills the server with SIGKILL (what `Child::kill` sends on Unix), as a crash would.
    fn kill(mut self) {
        self.child.kill().expect("SIGKILL is sent");
        self.child.wait().expect("the killed server is reaped");
    }
}

fn payment(invoice_id: &str) -> CallToolRequestParams {
    let arguments = json!({ "invoice_id": invoice_id, "amount_cents": 4200 });
    let serde_json::Value::Object(arguments) = arguments else { unreachable!() };
    CallToolRequestParams::new("send_payment").with_arguments(JsonObject::from(arguments))
}

fn text(result: &CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_left_in_doubt_by_a_killed_server_reaches_the_model_as_a_tool_result() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("idem.sled");

    // The first server takes the payment, and is killed before the bank answers.
    let mut first = Server::start(&[("IDEM_STORE", &store)], true);
    first.wait_for("serving MCP");
    let client = first.client().await;
    let pending = tokio::spawn(async move {
        let answer = client.call_tool(payment("inv-1")).await;
        (client, answer)
    });
    first.wait_for("paying invoice inv-1");
    first.kill();
    let (_client, answer) = pending.await.unwrap();
    assert!(answer.is_err(), "the killed server never answered: {answer:?}");

    // A fresh server on the same store: the same call is a tool result for the model.
    let mut second = Server::start(&[("IDEM_STORE", &store)], false);
    second.wait_for("serving MCP");
    let client = second.client().await;
    let result =
        client.call_tool(payment("inv-1")).await.expect("a tool result, not a JSON-RPC error");
    assert_eq!(result.is_error, Some(true), "{result:?}");
    let idem = &result.structured_content.as_ref().expect("structured content")["idem"];
    assert_eq!(idem["error"], "in-doubt");
    assert_eq!(idem["retryable"], false);
    let key = idem["key"].as_str().expect("the key");
    assert_eq!(key.len(), 32, "{key}");
    let text = text(&result);
    assert!(text.contains("Do not call `send_payment` again"), "{text}");
    assert!(text.contains(key), "the text names the key: {text}");

    // The body did not run again, and another invoice is paid as usual.
    let paid = client.call_tool(payment("inv-2")).await.unwrap();
    assert_eq!(paid.is_error, Some(false), "{paid:?}");
    assert_eq!(paid.structured_content.unwrap()["payment_id"], "pay_1", "one payment ran here");
    client.cancel().await.unwrap();
    let (_, stderr) = second.finish();
    assert!(!stderr.contains("paying invoice inv-1"), "{stderr}");
}

#[test]
fn a_second_server_on_a_sled_store_says_another_process_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("idem.sled");
    let mut first = Server::start(&[("IDEM_STORE", &store)], false);
    first.wait_for("serving MCP");

    let (started, stderr) = Server::start(&[("IDEM_STORE", &store)], false).finish();
    first.kill();
    assert!(!started, "the second server must stop at start-up: {stderr}");
    let held = format!("the sled store at {} is open in another process", store.display());
    assert!(stderr.contains(&held), "{stderr}");
    assert!(stderr.contains("sled lets one process open a store at a time"), "{stderr}");
    assert!(stderr.contains("PostgreSQL store (idem-postgres)"), "{stderr}");
    assert!(stderr.contains("sqlite:PATH"), "names the SQLite store too: {stderr}");
    assert!(!stderr.contains("does not serve"), "{stderr}");
}

#[test]
fn a_store_that_cannot_be_created_stops_the_server_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    // Under a regular file, so that not even root can create it.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let store = file.join("idem.sled");

    let (started, stderr) = Server::start(&[("IDEM_STORE", &store)], false).finish();
    assert!(!started, "{stderr}");
    let cannot = format!("cannot create the idem store at {}", store.display());
    assert!(stderr.contains(&cannot), "{stderr}");
    assert!(stderr.contains("Not a directory"), "the cause: {stderr}");
    assert!(!stderr.contains("damaged"), "{stderr}");
}

#[test]
fn without_idem_store_the_store_is_in_the_data_directory_not_the_working_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cwd = dir.path().join("host-cwd");
    std::fs::create_dir(&cwd).unwrap();
    let env = [("XDG_DATA_HOME", data.as_path()), ("HOME", dir.path())];
    let mut server = Server::start_in(&cwd, &env, false);
    let line = server.wait_for("serving MCP");
    let expected = data.join("idem").join("idem.sled");
    assert!(line.ends_with(&format!("idem store at {}", expected.display())), "{line}");
    assert!(expected.join("conf").exists(), "created, with its parent directories");
    assert!(!cwd.join("idem.sled").exists(), "nothing in the host's working directory");
    drop(server.child.stdin.take());
    let (_, stderr) = server.finish();
    assert!(!stderr.contains("cannot"), "{stderr}");
}
