//! A tool that needs a person's approval, served over MCP to rmcp's own client (an in-process
//! duplex pipe): `tools/list` says it needs approval, a call over the threshold comes back as a
//! tool result the model reads (a person must approve; other arguments are a new request), the
//! approved call runs once, and a denial reaches the model with its note. Needs the `rmcp`
//! feature (`cargo test --workspace --features idem/rmcp`, as `.ci/run` does).

#[cfg(not(feature = "rmcp"))]
#[test]
fn mcp_approval_needs_the_rmcp_feature() {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs tests/mcp_approval.rs with `--features idem/rmcp`"
    );
    eprintln!(
        "NOTICE: tests/mcp_approval.rs did not run: it needs the `rmcp` feature; run \
         `cargo test --workspace --features idem/rmcp`"
    );
}

#[cfg(feature = "rmcp")]
mod mcp {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, LazyLock};

    use idem::admin::{self, Decision};
    use idem::{Durability, SledStore, Store};
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::{Json, Parameters};
    use rmcp::model::{CallToolRequestParams, JsonObject, ServerCapabilities, ServerConfig};
    use rmcp::schemars::JsonSchema;
    use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        Arc::new(SledStore::builder(dir).durability(Durability::None).open().expect("sled"))
    });

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct RefundRequest {
        pub order_id: String,
        pub amount_cents: u64,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Refunded {
        pub refund_id: String,
    }

    #[derive(Clone)]
    pub struct Desk {
        refunds: Arc<AtomicU32>,
        tool_router: ToolRouter<Desk>,
    }

    #[idem::tools]
    #[tool_router]
    impl Desk {
        fn new() -> Self {
            Desk {
                refunds: Arc::new(AtomicU32::new(0)),
                tool_router: idem::mcp::annotate(Self::tool_router(), Self::idem_tools()),
            }
        }

        #[tool(description = "Refund an order")]
        #[idem::idempotent(
            scope = "order_id",
            store = STORE,
            approve_if = "req.amount_cents > 10_000"
        )]
        async fn refund(
            &self,
            #[idem(flatten)] Parameters(req): Parameters<RefundRequest>,
        ) -> Result<Json<Refunded>, ErrorData> {
            let n = self.refunds.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Json(Refunded { refund_id: format!("re_{n}_{}", req.order_id) }))
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Desk {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }

    fn refund(order_id: &str, amount_cents: u64) -> CallToolRequestParams {
        let Value::Object(arguments) = json!({"order_id": order_id, "amount_cents": amount_cents})
        else {
            unreachable!()
        };
        CallToolRequestParams::new("refund").with_arguments(arguments as JsonObject)
    }

    fn decide(key: &Value, decision: Decision, note: Option<&str>) {
        let key: idem::Key = key.as_str().expect("the key").parse().unwrap();
        admin::decide(STORE.as_ref(), &key, decision, "ann@ops", note).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_model_is_told_a_person_must_approve_and_the_approved_refund_runs_once() {
        let desk = Desk::new();
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(desk.clone().serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.expect("the client initializes");
        let _server = server.await.unwrap().expect("the server initializes");

        let tools = client.list_all_tools().await.unwrap();
        let description = tools[0].description.as_deref().unwrap_or_default();
        assert!(description.starts_with("Refund an order"), "{description}");
        assert!(description.contains(idem_runtime::mcp::NEEDS_APPROVAL), "{description}");

        let small = client.call_tool(refund("o-1", 500)).await.unwrap();
        assert_eq!(small.is_error, Some(false), "under the threshold: runs at once");

        let asked = client.call_tool(refund("o-2", 50_000)).await.unwrap();
        assert_eq!(asked.is_error, Some(true));
        let data = asked.structured_content.clone().expect("structured content");
        assert_eq!(data["idem"]["error"], "awaiting-approval", "{data}");
        let text = serde_json::to_string(&asked.content).unwrap();
        assert!(text.contains("a person must approve this exact request"), "{text}");
        assert!(text.contains("other arguments is a new request"), "{text}");
        assert_eq!(desk.refunds.load(Ordering::SeqCst), 1, "the large refund did not run");

        decide(&data["idem"]["key"], Decision::Approve, None);
        let approved = client.call_tool(refund("o-2", 50_000)).await.unwrap();
        let again = client.call_tool(refund("o-2", 50_000)).await.unwrap();
        assert_eq!(approved.is_error, Some(false), "{approved:?}");
        assert_eq!(approved.structured_content, again.structured_content, "replayed");
        assert_eq!(desk.refunds.load(Ordering::SeqCst), 2, "the approved refund ran once");

        let other = client.call_tool(refund("o-2", 60_000)).await.unwrap();
        let other = other.structured_content.expect("structured content");
        assert_eq!(other["idem"]["error"], "awaiting-approval", "a changed amount asks again");
        decide(&other["idem"]["key"], Decision::Deny, Some("refund the first amount only"));
        let denied = client.call_tool(refund("o-2", 60_000)).await.unwrap();
        assert_eq!(denied.is_error, Some(true));
        let data = denied.structured_content.expect("structured content");
        assert_eq!(data["idem"]["error"], "denied");
        assert_eq!(data["idem"]["note"], "refund the first amount only");
        let text = serde_json::to_string(&denied.content).unwrap();
        assert!(text.contains("a person denied this request"), "{text}");
        assert_eq!(desk.refunds.load(Ordering::SeqCst), 2);
    }
}

/// Where the MCP client supports elicitation, the server asks the person at the client, records
/// their answer as `idem approve` would, and the call runs at once; a "no" is a denial with the
/// person's note. Needs the `rmcp` feature.
#[cfg(feature = "rmcp")]
mod elicitation {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, LazyLock, Mutex};

    use idem::admin::Decision;
    use idem::{Durability, SledStore, Store};
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::{Json, Parameters};
    use rmcp::model::{
        CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult,
        ElicitationAction, ElicitationCapability, Implementation, ServerCapabilities, ServerConfig,
    };
    use rmcp::schemars::JsonSchema;
    use rmcp::service::{RequestContext, RoleClient};
    use rmcp::{
        tool, tool_handler, tool_router, ClientHandler, ErrorData, ServerHandler, ServiceExt,
    };
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        Arc::new(SledStore::builder(dir).durability(Durability::None).open().expect("sled"))
    });

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct DeleteRequest {
        pub account: String,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Deleted {
        pub account: String,
    }

    #[derive(Clone)]
    pub struct Accounts {
        deleted: Arc<AtomicU32>,
        tool_router: ToolRouter<Accounts>,
    }

    #[idem::tools]
    #[tool_router]
    impl Accounts {
        fn new() -> Self {
            let router = idem::mcp::annotate(Self::tool_router(), Self::idem_tools());
            Accounts {
                deleted: Arc::new(AtomicU32::new(0)),
                tool_router: idem::mcp::ask_for_approval(router, Arc::clone(&STORE)),
            }
        }

        #[tool(description = "Delete an account")]
        #[idem::idempotent(scope = "account", store = STORE, approve)]
        async fn delete_account(
            &self,
            #[idem(flatten)] Parameters(req): Parameters<DeleteRequest>,
        ) -> Result<Json<Deleted>, ErrorData> {
            self.deleted.fetch_add(1, Ordering::SeqCst);
            Ok(Json(Deleted { account: req.account }))
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Accounts {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }

    /// The person at the client: answers every question with `answer`, and keeps what it was
    /// asked.
    struct Person {
        answer: Value,
        asked: Arc<Mutex<Vec<String>>>,
        /// An operator's decision (`idem approve`/`idem deny`) recorded while the person is
        /// asked, before they answer.
        operator_first: Option<Decision>,
    }

    impl ClientHandler for Person {
        fn get_info(&self) -> ClientConfig {
            let mut capabilities = ClientCapabilities::default();
            capabilities.elicitation = Some(ElicitationCapability::new());
            ClientConfig::new(capabilities, Implementation::new("desk-app", "1.0"))
        }

        async fn create_elicitation(
            &self,
            request: ElicitRequestParams,
            _context: RequestContext<RoleClient>,
        ) -> Result<ElicitResult, ErrorData> {
            if let ElicitRequestParams::FormElicitationParams { message, .. } = request {
                if let Some(decision) = self.operator_first {
                    let key =
                        message.split("idem key ").nth(1).and_then(|rest| rest.split(')').next());
                    let key: idem::Key = key.expect("the question names the key").parse().unwrap();
                    tokio::task::spawn_blocking(move || {
                        idem::admin::decide(
                            STORE.as_ref(),
                            &key,
                            decision,
                            "ops@desk",
                            Some("operator"),
                        )
                    })
                    .await
                    .unwrap()
                    .expect("the operator decides first");
                }
                self.asked.lock().unwrap().push(message);
            }
            Ok(ElicitResult::new(ElicitationAction::Accept).with_content(self.answer.clone()))
        }
    }

    fn delete(account: &str) -> CallToolRequestParams {
        let Value::Object(arguments) = json!({ "account": account }) else { unreachable!() };
        CallToolRequestParams::new("delete_account").with_arguments(arguments)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_person_at_the_client_approves_and_the_call_runs_once_or_denies_with_a_note() {
        for (account, answer, runs) in [
            ("acct-1", json!({"approve": true, "note": "closing it myself"}), 1),
            ("acct-2", json!({"approve": false, "note": "keep it"}), 0),
        ] {
            let accounts = Accounts::new();
            let asked = Arc::new(Mutex::new(Vec::new()));
            let person = Person { answer, asked: Arc::clone(&asked), operator_first: None };
            let (server_io, client_io) = tokio::io::duplex(64 * 1024);
            let server = tokio::spawn(accounts.clone().serve(tokio::io::split(server_io)));
            let client = person.serve(tokio::io::split(client_io)).await.expect("initialized");
            let _server = server.await.unwrap().expect("the server initializes");

            let got = client.call_tool(delete(account)).await.unwrap();
            assert_eq!(accounts.deleted.load(Ordering::SeqCst), runs, "{got:?}");
            let asked = asked.lock().unwrap().clone();
            assert_eq!(asked.len(), 1, "asked once: {asked:?}");
            assert!(asked[0].contains("delete_account") && asked[0].contains(account), "{asked:?}");
            let data = got.structured_content.clone().expect("structured content");
            let key = match runs {
                1 => {
                    assert_eq!(got.is_error, Some(false), "{got:?}");
                    let key =
                        idem::Key::derive("delete_account", account, &json!({"account": account}));
                    key.unwrap()
                }
                _ => {
                    assert_eq!(got.is_error, Some(true));
                    assert_eq!(data["idem"]["error"], "denied", "{data}");
                    assert_eq!(data["idem"]["note"], "keep it");
                    data["idem"]["key"].as_str().unwrap().parse().unwrap()
                }
            };
            let history = idem::admin::history(STORE.as_ref(), &key).unwrap();
            let decided = &history[1];
            assert_eq!(decided.by, "the user of MCP client desk-app", "{history:?}");
        }
    }

    /// An operator decides with `idem approve` or `idem deny` while the person at the client is
    /// asked: the first decision stands. The person's answer is not recorded over it, and the
    /// call reads the operator's word: it runs once after an approval, never after a denial.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operator_deciding_while_the_person_is_asked_decides_first() {
        for (account, operator, answer, runs) in [
            ("acct-race-1", Decision::Deny, json!({"approve": true, "note": "fine by me"}), 0),
            ("acct-race-2", Decision::Approve, json!({"approve": false, "note": "no"}), 1),
        ] {
            let accounts = Accounts::new();
            let asked = Arc::new(Mutex::new(Vec::new()));
            let person =
                Person { answer, asked: Arc::clone(&asked), operator_first: Some(operator) };
            let (server_io, client_io) = tokio::io::duplex(64 * 1024);
            let server = tokio::spawn(accounts.clone().serve(tokio::io::split(server_io)));
            let client = person.serve(tokio::io::split(client_io)).await.expect("initialized");
            let _server = server.await.unwrap().expect("the server initializes");

            let got = client.call_tool(delete(account)).await.unwrap();
            assert_eq!(accounts.deleted.load(Ordering::SeqCst), runs, "{account}: {got:?}");
            assert_eq!(got.is_error, Some(runs == 0), "{account}: {got:?}");
            if runs == 0 {
                let data = got.structured_content.clone().expect("structured content");
                assert_eq!(data["idem"]["error"], "denied", "{data}");
                assert_eq!(data["idem"]["by"], "ops@desk", "the operator's word: {data}");
            }
            let key = idem::Key::derive("delete_account", account, &json!({"account": account}));
            let history = idem::admin::history(STORE.as_ref(), &key.unwrap()).unwrap();
            let deciders: Vec<&str> = history
                .iter()
                .filter(|entry| {
                    matches!(
                        entry.event,
                        idem::history::Event::Approved | idem::history::Event::Denied
                    )
                })
                .map(|entry| entry.by.as_str())
                .collect();
            assert_eq!(
                deciders,
                ["ops@desk"],
                "{account}: one decision, the operator's: {history:?}"
            );
        }
    }
}
