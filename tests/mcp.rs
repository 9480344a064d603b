//! `examples/mcp_server.rs` driven as an MCP client drives it: rmcp's own client, over an
//! in-process duplex pipe, through `initialize`, `tools/list` and `tools/call`. Needs the `rmcp`
//! feature (`cargo test --workspace --features idem/rmcp`, as `.ci/run` does).

#[cfg(not(feature = "rmcp"))]
#[test]
fn mcp_server_needs_the_rmcp_feature() {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs tests/mcp.rs with `--features idem/rmcp`"
    );
    eprintln!(
        "NOTICE: tests/mcp.rs did not run: it needs the `rmcp` feature; run \
         `cargo test --workspace --features idem/rmcp`"
    );
}

#[cfg(feature = "rmcp")]
#[allow(dead_code)]
#[path = "../examples/mcp_server.rs"]
mod mcp_server;

#[cfg(feature = "rmcp")]
mod mcp {
    use std::path::PathBuf;
    use std::process::Command;
    use std::sync::Arc;

    use rmcp::model::{CallToolRequestParams, JsonObject, ToolAnnotations};
    use rmcp::ServiceExt;
    use serde_json::json;

    use super::mcp_server::Bank;

    /// One sled store for the test binary: the tools use the process's default store.
    fn store() -> Arc<dyn idem::Store> {
        static STORE: std::sync::OnceLock<(tempfile::TempDir, Arc<dyn idem::Store>)> =
            std::sync::OnceLock::new();
        let (_, store) = STORE.get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temp dir");
            let store: Arc<dyn idem::Store> =
                Arc::new(idem::SledStore::open(dir.path().join("idem.sled")).expect("sled opens"));
            idem::set_default_store(store.clone());
            (dir, store)
        });
        store.clone()
    }

    fn hints(read_only: bool, idempotent: bool, destructive: bool) -> ToolAnnotations {
        let mut hints = ToolAnnotations::new();
        hints.read_only_hint = Some(read_only);
        hints.idempotent_hint = Some(idempotent);
        hints.destructive_hint = Some(destructive);
        hints
    }

    fn object(value: serde_json::Value) -> JsonObject {
        match value {
            serde_json::Value::Object(object) => object,
            other => panic!("not an object: {other}"),
        }
    }

    /// The `idem` command, built by this workspace's `cargo test --workspace`; built here when
    /// this test runs alone.
    fn idem_command() -> PathBuf {
        let exe = std::env::current_exe().expect("the test binary's path");
        let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/debug/deps/…");
        let idem = dir.join(format!("idem{}", std::env::consts::EXE_SUFFIX));
        if !idem.exists() {
            let status = Command::new(env!("CARGO"))
                .args(["build", "--quiet", "-p", "idem-agent-cli"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("cargo runs");
            assert!(status.success(), "cargo build -p idem-agent-cli failed");
        }
        idem
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_mcp_client_sees_the_hints_and_pays_an_invoice_once() {
        let store = store();
        let bank = Bank::new();
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(bank.clone().serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.expect("the client initializes");
        let _server = server.await.unwrap().expect("the server initializes");

        // tools/list: the hints come from #[read], #[idempotent] and #[write], with no call to
        // wire them; the renamed tool has its own, and the additive write is not destructive.
        let mut tools = client.list_all_tools().await.unwrap();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let listed: Vec<(&str, Option<ToolAnnotations>)> =
            tools.iter().map(|tool| (&*tool.name, tool.annotations.clone())).collect();
        assert_eq!(
            listed,
            [
                ("delete_account", Some(hints(false, false, true))),
                ("get_balance", Some(hints(true, true, false))),
                ("open_account", Some(hints(false, true, false))),
                ("refundOrder", Some(hints(false, true, true))),
                ("send_payment", Some(hints(false, true, true))),
            ]
        );

        // tools/call of send_payment, twice with the same arguments: one payment, one answer.
        let arguments = json!({
            "invoice_id": "inv-1",
            "from": "acct-1",
            "to": "acct-2",
            "amount_cents": 4200,
        });
        let pay = |arguments: &serde_json::Value| {
            CallToolRequestParams::new("send_payment").with_arguments(object(arguments.clone()))
        };
        let first = client.call_tool(pay(&arguments)).await.unwrap();
        let again = client.call_tool(pay(&arguments)).await.unwrap();
        let receipt = first.structured_content.clone().expect("structured content");
        assert_eq!(
            receipt,
            json!({"payment_id": "pay_1", "invoice_id": "inv-1", "amount_cents": 4200})
        );
        assert_eq!(again.structured_content, Some(receipt), "the repeat replays the receipt");
        assert_eq!(bank.payments_made(), 1, "the body ran once");

        let balance = client
            .call_tool(
                CallToolRequestParams::new("get_balance")
                    .with_arguments(object(json!({"account": "acct-2"}))),
            )
            .await
            .unwrap();
        assert_eq!(
            balance.structured_content,
            Some(json!({"account": "acct-2", "balance_cents": 4200})),
            "paid once, so credited once"
        );

        // Another invoice is another payment.
        let mut other = arguments.clone();
        other["invoice_id"] = json!("inv-2");
        let second = client.call_tool(pay(&other)).await.unwrap();
        assert_eq!(second.structured_content.unwrap()["payment_id"], "pay_2");
        assert_eq!(bank.payments_made(), 2);

        // The key `idem key` prints for the call's arguments is the key in the store.
        let output = Command::new(idem_command())
            .args(["key", "--tool", "send_payment", "--scope", "inv-1", "--args"])
            .arg(arguments.to_string())
            .output()
            .expect("idem runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let printed = String::from_utf8(output.stdout).unwrap().trim().to_owned();
        let filter = idem::admin::Filter::new().tool("send_payment");
        let records = idem::admin::scan(store.as_ref(), &filter).unwrap().records;
        let stored: Vec<(&str, &str)> =
            records.iter().map(|r| (r.scope.as_str(), r.key.as_str())).collect();
        assert!(stored.contains(&("inv-1", printed.as_str())), "{printed} not in {stored:?}");
        assert_eq!(stored.len(), 2, "one record per invoice: {stored:?}");

        client.cancel().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renamed_tool_is_keyed_and_recorded_by_its_mcp_name() {
        let store = store();
        let bank = Bank::new();
        assert_eq!(idem::tool_info!(Bank::refund_order).name, "refundOrder");
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(bank.clone().serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.unwrap();
        let _server = server.await.unwrap().unwrap();

        let arguments = json!({"order_id": "ord-1", "account": "acct-2", "amount_cents": 700});
        let refund =
            CallToolRequestParams::new("refundOrder").with_arguments(object(arguments.clone()));
        let first = client.call_tool(refund.clone()).await.unwrap();
        let again = client.call_tool(refund).await.unwrap();
        assert_eq!(first.content, again.content, "the repeat replays the first refund");
        assert_eq!(bank.refunds_made(), 1);

        let output = Command::new(idem_command())
            .args(["key", "--tool", "refundOrder", "--scope", "ord-1", "--args"])
            .arg(arguments.to_string())
            .output()
            .expect("idem runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let printed = String::from_utf8(output.stdout).unwrap().trim().to_owned();
        let key = idem::Key::parse(&printed).expect("idem key prints a key");
        let record = idem::admin::show(store.as_ref(), &key)
            .unwrap_or_else(|e| panic!("no record at the key `idem key` printed, {printed}: {e}"));
        assert_eq!(record.tool, "refundOrder");
        assert_eq!(record.function.as_deref(), Some("mcp::mcp_server::Bank::refund_order"));
        client.cancel().await.unwrap();
    }

    use std::sync::atomic::{AtomicU32, Ordering};

    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::Parameters;
    use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
    use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};

    #[derive(serde::Serialize, serde::Deserialize, rmcp::schemars::JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    struct Entry {
        entry_id: String,
        cents: i64,
    }

    /// The attributes stacked the other way round from the example's: `#[tool_router]` outside
    /// `#[idem::tools]`, and `#[idem::idempotent]` outside `#[tool]`. No call wires the hints,
    /// and `record_entry` sets some of its own, which win.
    #[derive(Clone)]
    struct Ledger {
        runs: Arc<AtomicU32>,
        tool_router: ToolRouter<Ledger>,
    }

    #[tool_router]
    #[idem::tools]
    impl Ledger {
        fn new() -> Self {
            Ledger { runs: Arc::new(AtomicU32::new(0)), tool_router: Self::tool_router() }
        }

        #[idem::idempotent(scope = "entry_id")]
        #[tool(
            description = "Record a ledger entry once",
            annotations(destructive_hint = false, open_world_hint = false)
        )]
        async fn record_entry(
            &self,
            #[idem(flatten)] Parameters(req): Parameters<Entry>,
        ) -> Result<CallToolResult, ErrorData> {
            let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            let text = format!("entry {} of {} cents, run {n}", req.entry_id, req.cents);
            Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
        }

        #[tool(description = "Note an entry once, synchronously")]
        #[idem::idempotent(scope = "entry_id")]
        fn note_entry(
            &self,
            #[idem(flatten)] Parameters(req): Parameters<Entry>,
        ) -> Result<String, String> {
            let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(format!("noted {}, run {n}", req.entry_id))
        }

        #[idem::idempotent(scope = "entry_id")]
        #[tool(description = "Post an entry to a bank whose answer may be lost")]
        async fn post_entry(
            &self,
            #[idem(flatten)] Parameters(req): Parameters<Entry>,
        ) -> Result<CallToolResult, ErrorData> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            idem::may_have_landed();
            Err(ErrorData::internal_error(format!("the bank timed out on {}", req.entry_id), None))
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Ledger {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }

    fn text(result: &CallToolResult) -> String {
        serde_json::to_value(&result.content).unwrap().to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_attributes_stack_in_either_order_and_call_tool_results_replay() {
        store();
        let ledger = Ledger::new();
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(ledger.clone().serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.unwrap();
        let _server = server.await.unwrap().unwrap();

        let mut tools = client.list_all_tools().await.unwrap();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let listed: Vec<(&str, Option<ToolAnnotations>)> =
            tools.iter().map(|tool| (&*tool.name, tool.annotations.clone())).collect();
        let mut own = hints(false, true, false);
        own.open_world_hint = Some(false);
        assert_eq!(
            listed,
            [
                ("note_entry", Some(hints(false, true, true))),
                ("post_entry", Some(hints(false, true, true))),
                ("record_entry", Some(own))
            ],
            "idem fills the hints a tool leaves unset, and keeps those it sets"
        );

        let entry = object(json!({"entry_id": "e-7", "cents": -300}));
        let call =
            |name: &'static str| CallToolRequestParams::new(name).with_arguments(entry.clone());
        let first = client.call_tool(call("record_entry")).await.unwrap();
        let again = client.call_tool(call("record_entry")).await.unwrap();
        assert_eq!(text(&first), text(&again), "the CallToolResult is replayed");
        assert!(text(&first).contains("run 1"), "{}", text(&first));
        let noted = client.call_tool(call("note_entry")).await.unwrap();
        let noted_again = client.call_tool(call("note_entry")).await.unwrap();
        assert_eq!(text(&noted), text(&noted_again));
        assert!(text(&noted).contains("noted e-7, run 2"), "{}", text(&noted));
        assert_eq!(ledger.runs.load(Ordering::SeqCst), 2, "each tool's body ran once");
        client.cancel().await.unwrap();
    }

    /// No line wires the router: `#[idem::tools]` (here below `#[tool_router]`) makes the router
    /// rmcp generates answer idem's errors as tool results, which a client shows the model.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_in_doubt_reaches_the_model_as_a_tool_result_with_no_wiring() {
        store();
        let ledger = Ledger::new();
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(ledger.clone().serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.unwrap();
        let _server = server.await.unwrap().unwrap();

        let entry = object(json!({"entry_id": "e-doubt", "cents": 500}));
        let call = || CallToolRequestParams::new("post_entry").with_arguments(entry.clone());
        let lost = client.call_tool(call()).await;
        assert!(lost.is_err(), "the body's own error stays a protocol error: {lost:?}");
        let again = client.call_tool(call()).await.expect("idem's answer is a tool result");
        assert_eq!(again.is_error, Some(true), "{again:?}");
        let idem = &again.structured_content.as_ref().expect("structuredContent")["idem"];
        assert_eq!(idem["error"], "in-doubt", "{again:?}");
        assert!(text(&again).contains("Do not call `post_entry` again"), "{}", text(&again));
        assert_eq!(ledger.runs.load(Ordering::SeqCst), 1, "the body ran once");
        client.cancel().await.unwrap();
    }

    /// A plain rmcp block, not under `#[idem::tools]`: its route's hints are filled by hand.
    #[derive(Clone)]
    struct Notes;

    #[tool_router]
    impl Notes {
        #[tool(description = "Add a note", annotations(destructive_hint = false))]
        fn add_note(&self) -> Result<String, ErrorData> {
            Ok("noted".to_owned())
        }
    }

    #[test]
    fn annotate_fills_only_the_hints_a_route_leaves_unset() {
        let classified =
            idem::ToolInfo::new("add_note", idem::Kind::Idempotent { scope: "note_id" });
        let router = idem::mcp::annotate(Notes::tool_router(), &[classified]);
        let listed = router.get("add_note").expect("the route").annotations.clone();
        assert_eq!(listed, Some(hints(false, true, false)), "the route's own hint is kept");
    }
}
