//! Two MCP servers (`examples/mcp_in_doubt.rs`, as an MCP host starts one per window) on one
//! SQLite store, `IDEM_STORE=sqlite:PATH`: the same `tools/call` sent to both at once runs the
//! payment once, and both clients get its receipt. Needs the `rmcp` feature; the example is
//! built with `sqlite` too.

#![cfg(all(feature = "rmcp", unix))]

mod common;

use std::process::{Child, Command, Stdio};

use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::json;

use self::common::Lines;

fn server_binary() -> std::path::PathBuf {
    common::example("mcp_in_doubt", "rmcp,sqlite")
}

struct Server {
    child: Child,
    stderr: Lines,
}

impl Server {
    fn start(store: &str) -> Server {
        let mut child = Command::new(server_binary())
            .env("IDEM_STORE", store)
            .env_remove("BANK_HANGS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the server starts");
        let stderr = Lines::read(child.stderr.take().expect("piped stderr"));
        Server { child, stderr }
    }

    fn wait_for(&mut self, text: &str) {
        self.stderr.until(text);
    }

    async fn client(&mut self) -> RunningService<RoleClient, ()> {
        common::mcp_client(&mut self.child).await
    }

    /// What it wrote to stderr until it exited (its stdin closed with its client).
    fn finish(mut self) -> String {
        let stderr = self.stderr.rest();
        self.child.wait().expect("the server is waited for");
        stderr.join("\n")
    }
}

fn payment(invoice_id: &str) -> CallToolRequestParams {
    let arguments = json!({ "invoice_id": invoice_id, "amount_cents": 4200 });
    let serde_json::Value::Object(arguments) = arguments else { unreachable!() };
    CallToolRequestParams::new("send_payment").with_arguments(JsonObject::from(arguments))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_sqlite_store_run_the_same_call_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("agents.sqlite").display());
    let (mut first, mut second) = (Server::start(&store), Server::start(&store));
    first.wait_for("serving MCP");
    second.wait_for("serving MCP");
    let (a, b) = (first.client().await, second.client().await);
    for invoice in ["inv-1", "inv-2", "inv-3"] {
        let (x, y) = tokio::join!(a.call_tool(payment(invoice)), b.call_tool(payment(invoice)));
        let (x, y) = (x.expect("a tool result"), y.expect("a tool result"));
        assert_eq!(x.is_error, Some(false), "{x:?}");
        assert_eq!(x.structured_content, y.structured_content, "both get the one receipt");
    }
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    let logs = format!("{}\n{}", first.finish(), second.finish());
    for invoice in ["inv-1", "inv-2", "inv-3"] {
        let paid = logs.matches(&format!("paying invoice {invoice}")).count();
        assert_eq!(paid, 1, "{invoice} was paid once across both servers:\n{logs}");
    }
}
