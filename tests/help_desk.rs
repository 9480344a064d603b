//! `examples/help_desk.rs` as an MCP host runs it: two server processes on one SQLite file,
//! each with its own rmcp client, and a loopback hardware vendor. The same `open_ticket` sent
//! to both at once opens one ticket (one row, one record), the same `order_replacement` reaches
//! the vendor once, and `list_tickets` reads what was written. Needs the `rmcp` and `sqlite`
//! features (`cargo test --workspace --features idem/rmcp,idem/sqlite`, as `.ci/run` does).

#[cfg(not(all(feature = "rmcp", feature = "sqlite", unix)))]
#[test]
fn help_desk_needs_the_rmcp_and_sqlite_features() {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs tests/help_desk.rs with `--features idem/rmcp,idem/sqlite`"
    );
    eprintln!(
        "NOTICE: tests/help_desk.rs did not run: it needs the `rmcp` and `sqlite` features; run \
         `cargo test --workspace --features idem/rmcp,idem/sqlite`"
    );
}

#[cfg(all(feature = "rmcp", feature = "sqlite", unix))]
mod common;

#[cfg(all(feature = "rmcp", feature = "sqlite", unix))]
mod desk {
    use std::collections::HashMap;
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::http::{header, HeaderMap};
    use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
    use rmcp::service::RunningService;
    use rmcp::RoleClient;
    use serde_json::{json, Value};

    use super::common::{self, Lines};

    /// The vendor: every order it takes, by the `Idempotency-Key` it came with. It does not
    /// deduplicate, so that a second order would show.
    type Orders = Arc<Mutex<Vec<Option<String>>>>;

    async fn vendor() -> (String, Orders) {
        let orders = Orders::default();
        let app = axum::Router::new()
            .route(
                "/v1/replacements",
                axum::routing::post(
                    |State(orders): State<Orders>, headers: HeaderMap| async move {
                        let key = headers
                            .get("idempotency-key")
                            .and_then(|key| key.to_str().ok())
                            .map(str::to_owned);
                        let mut orders = orders.lock().unwrap();
                        orders.push(key);
                        let order = json!({ "order_id": format!("rep_{}", orders.len()) });
                        ([(header::CONTENT_TYPE, "application/json")], order.to_string())
                    },
                ),
            )
            .with_state(orders.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, orders)
    }

    struct Server {
        child: Child,
        stderr: Lines,
    }

    impl Server {
        fn start(db: &Path, vendor: &str) -> Server {
            let mut child = Command::new(common::example("help_desk", "rmcp,sqlite"))
                .env("HELP_DESK_DB", db)
                .env("HELP_DESK_VENDOR", vendor)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("the server starts");
            let mut stderr = Lines::read(child.stderr.take().expect("piped stderr"));
            stderr.until("serving MCP");
            Server { child, stderr }
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

    fn call(tool: &'static str, arguments: Value) -> CallToolRequestParams {
        let Value::Object(arguments) = arguments else { panic!("arguments are an object") };
        CallToolRequestParams::new(tool).with_arguments(JsonObject::from(arguments))
    }

    fn answer(result: CallToolResult) -> Value {
        assert_eq!(result.is_error, Some(false), "{result:?}");
        result.structured_content.expect("a structured answer")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_servers_on_one_file_open_one_ticket_and_order_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("desk.sqlite");
        let (url, orders) = vendor().await;
        let (mut first, mut second) = (Server::start(&db, &url), Server::start(&db, &url));
        let (a, b) = (first.client().await, second.client().await);

        let open = json!({ "request_id": "req-7", "customer": "ann", "title": "laptop dead" });
        let (x, y) = tokio::join!(
            a.call_tool(call("open_ticket", open.clone())),
            b.call_tool(call("open_ticket", open.clone()))
        );
        let (x, y) = (answer(x.unwrap()), answer(y.unwrap()));
        assert_eq!(x, y, "both servers answer with the one ticket");
        let ticket = x["id"].as_i64().expect("a ticket id");

        let listed =
            answer(a.call_tool(call("list_tickets", json!({ "customer": "ann" }))).await.unwrap());
        assert_eq!(listed["tickets"].as_array().map(Vec::len), Some(1), "one row: {listed}");
        assert_eq!(listed["tickets"][0]["id"], ticket);

        let order = json!({ "ticket_id": ticket, "model": "T14" });
        let (x, y) = tokio::join!(
            a.call_tool(call("order_replacement", order.clone())),
            b.call_tool(call("order_replacement", order.clone()))
        );
        assert_eq!(answer(x.unwrap()), answer(y.unwrap()), "both get the one order");
        let again = answer(b.call_tool(call("order_replacement", order)).await.unwrap());
        assert_eq!(again["order_id"], "rep_1", "a retry replays the vendor's answer");

        a.cancel().await.unwrap();
        b.cancel().await.unwrap();
        let logs = format!("{}\n{}", first.finish(), second.finish());
        assert_eq!(logs.matches("opened ticket").count(), 1, "one body ran:\n{logs}");

        let orders = orders.lock().unwrap().clone();
        assert_eq!(orders.len(), 1, "the vendor took one order: {orders:?}");
        assert!(orders[0].is_some(), "it carried the call's key as Idempotency-Key");

        // One record per intent: the ticket's, and the order's.
        let conn = idem::rusqlite::Connection::open(&db).unwrap();
        let records: HashMap<String, i64> = conn
            .prepare("SELECT tool, count(*) FROM idem_records GROUP BY tool")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(records.get("open_ticket"), Some(&1), "{records:?}");
        assert_eq!(records.get("order_replacement"), Some(&1), "{records:?}");
    }
}
