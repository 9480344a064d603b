//! What the model reads when a tool that calls an HTTP vendor fails, through rmcp's own client
//! (an in-process duplex pipe) and a loopback vendor that does not deduplicate. The tool ends its
//! request with `?` and nothing else: idem-reqwest's `rmcp` feature turns the error into rmcp's
//! `ErrorData`, and `#[idem::tools]` answers it as a tool result with `isError: true` that names
//! the next step. Covered here: a vendor that refused (4xx), one that cannot be reached, one that
//! went silent (then the key in doubt), a call still in flight elsewhere, and a tool's own
//! `isError` result, which is not recorded unless the tool marks it final.
//! `tests/mcp_approval.rs` covers awaiting approval and a denial the same way.
//!
//! Needs the `rmcp` feature (`cargo test --workspace --features idem/rmcp,idem/sqlite`, as
//! `.ci/run` does).

#[cfg(not(feature = "rmcp"))]
#[test]
fn mcp_failures_need_the_rmcp_feature() {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs tests/mcp_failures.rs with `--features idem/rmcp`"
    );
    eprintln!(
        "NOTICE: tests/mcp_failures.rs did not run: it needs the `rmcp` feature; run \
         `cargo test --workspace --features idem/rmcp,idem/sqlite`"
    );
}

#[cfg(feature = "rmcp")]
mod mcp {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, LazyLock};
    use std::time::Duration;

    use axum::extract::State;
    use axum::http::{header, StatusCode};
    use axum::routing::post;
    use idem::{SledStore, Store};
    use idem_reqwest::IdempotentRequest;
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::{Json, Parameters};
    use rmcp::model::{
        CallToolRequestParams, CallToolResult, ContentBlock, ServerCapabilities, ServerConfig,
    };
    use rmcp::schemars::JsonSchema;
    use rmcp::service::{RoleClient, RunningService};
    use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};
    use tokio::sync::{mpsc, Mutex, Notify};

    /// A real store in a temp dir, as the process's default store.
    static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.join("idem.sled")).expect("sled"));
        store
    });

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Order {
        pub ticket_id: String,
        /// Where the order goes: the vendor's route, which decides how the vendor behaves.
        pub url: String,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Ordered {
        pub order_id: String,
    }

    #[derive(Clone)]
    pub struct Desk {
        http: reqwest::Client,
        tool_router: ToolRouter<Desk>,
    }

    #[idem::tools]
    #[tool_router]
    impl Desk {
        fn new() -> Self {
            let http = reqwest::Client::builder().redirect(idem_reqwest::redirect_policy());
            Desk { http: http.build().expect("a client"), tool_router: Self::tool_router() }
        }

        // `wait = "0s"`: a call that finds the same intent running elsewhere answers at once.
        #[tool(description = "Order a replacement part for a ticket; once per ticket")]
        #[idem::idempotent(scope = "ticket_id", store = STORE, wait = "0s")]
        async fn order_part(
            &self,
            #[idem(flatten)] Parameters(order): Parameters<Order>,
        ) -> Result<Json<Ordered>, ErrorData> {
            let request = self.http.post(&order.url).timeout(Duration::from_millis(500));
            let body = json!({ "ticket": order.ticket_id });
            Ok(Json(request.json(&body).idempotent().send_json().await?))
        }
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Hold {
        pub ticket_id: String,
        /// What the warehouse says: `busy` (try again later) or `discontinued` (final).
        pub answer: String,
    }

    /// How many times `hold_part`'s body ran.
    static HOLDS: AtomicU32 = AtomicU32::new(0);

    #[idem::tools]
    #[tool_router(router = hold_router)]
    impl Warehouse {
        /// Tells the model of a failure as MCP does, with an `isError` result of its own.
        #[tool(description = "Hold a part in the warehouse for a ticket")]
        #[idem::idempotent(scope = "ticket_id", store = STORE)]
        async fn hold_part(
            &self,
            #[idem(flatten)] Parameters(hold): Parameters<Hold>,
        ) -> Result<CallToolResult, ErrorData> {
            HOLDS.fetch_add(1, Ordering::SeqCst);
            let said = vec![ContentBlock::text(format!("the warehouse says: {}", hold.answer))];
            Ok(match hold.answer.as_str() {
                "discontinued" => idem::mcp::final_error(CallToolResult::error(said)),
                _ => CallToolResult::error(said),
            })
        }
    }

    #[derive(Clone)]
    pub struct Warehouse {
        tool_router: ToolRouter<Warehouse>,
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Warehouse {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Desk {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }

    /// The loopback vendor: what each route does, and how many requests each received.
    #[derive(Clone, Default)]
    struct Vendor {
        refused: Arc<AtomicU32>,
        silent: Arc<AtomicU32>,
        gated: Arc<AtomicU32>,
        /// Told when a gated request has arrived.
        arrived: Arc<Mutex<Option<mpsc::UnboundedSender<()>>>>,
        /// Opens the gate.
        open: Arc<Notify>,
    }

    async fn refuse(State(vendor): State<Vendor>) -> (StatusCode, &'static str) {
        vendor.refused.fetch_add(1, Ordering::SeqCst);
        (StatusCode::BAD_REQUEST, "part model unknown: check the ticket's device")
    }

    async fn never_answer(State(vendor): State<Vendor>) -> StatusCode {
        vendor.silent.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<()>().await;
        StatusCode::OK
    }

    async fn gate(
        State(vendor): State<Vendor>,
    ) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
        let n = vendor.gated.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(arrived) = vendor.arrived.lock().await.as_ref() {
            let _ = arrived.send(());
        }
        vendor.open.notified().await;
        let body = json!({ "order_id": format!("ord-{n}") }).to_string();
        (StatusCode::CREATED, [(header::CONTENT_TYPE, "application/json")], body)
    }

    async fn start_vendor() -> (Vendor, String) {
        let vendor = Vendor::default();
        let app = axum::Router::new()
            .route("/refuse", post(refuse))
            .route("/silent", post(never_answer))
            .route("/gate", post(gate))
            .with_state(vendor.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (vendor, url)
    }

    /// A URL where nothing listens: a port bound and let go.
    fn nobody_listens() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        format!("http://{}/orders", listener.local_addr().expect("an address"))
    }

    async fn connect() -> RunningService<RoleClient, ()> {
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(Desk::new().serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.expect("the client initializes");
        let running = server.await.expect("the server task").expect("the server initializes");
        // The server runs until the client goes.
        tokio::spawn(async move { running.waiting().await });
        client
    }

    fn order(ticket_id: &str, url: &str) -> CallToolRequestParams {
        let Value::Object(arguments) = json!({ "ticket_id": ticket_id, "url": url }) else {
            unreachable!()
        };
        CallToolRequestParams::new("order_part").with_arguments(arguments)
    }

    /// What the model reads: the result is an error, of `kind`, and its text says `next`. Returns
    /// the text and the structured content.
    fn read(result: &CallToolResult, kind: &str, next: &str) -> (String, Value) {
        assert_eq!(result.is_error, Some(true), "{result:?}");
        let data = result.structured_content.clone().expect("structured content");
        assert_eq!(data["idem"]["error"], kind, "{data}");
        let text = serde_json::to_string(&result.content).expect("text");
        assert!(text.contains(next), "the model is not told `{next}`: {text}");
        (text, data)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vendor_that_refused_or_cannot_be_reached_releases_the_key_and_says_so() {
        let (vendor, url) = start_vendor().await;
        let client = connect().await;

        let refused = client.call_tool(order("t-1", &format!("{url}/refuse"))).await.unwrap();
        let (text, data) = read(&refused, "not-landed", "gets the same answer");
        assert_eq!(data["idem"]["status"], 400);
        assert_eq!(data["idem"]["retryable"], false);
        assert!(
            text.contains("part model unknown"),
            "the vendor's reason reaches the model: {text}"
        );
        let key = data["idem"]["key"].as_str().expect("the key");
        assert!(text.contains(key), "{text}");
        // Released: the same call runs the body again, and the vendor sees a second request.
        let again = client.call_tool(order("t-1", &format!("{url}/refuse"))).await.unwrap();
        read(&again, "not-landed", "gets the same answer");
        assert_eq!(vendor.refused.load(Ordering::SeqCst), 2);

        let down = nobody_listens();
        let unreachable = client.call_tool(order("t-2", &down)).await.unwrap();
        let (_, data) =
            read(&unreachable, "not-landed", "again with the same arguments in a while");
        assert_eq!(data["idem"]["retryable"], true);
        assert_eq!(data["idem"]["status"], Value::Null, "no answer");
        client.cancel().await.expect("the client closes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vendor_that_went_silent_leaves_the_key_in_doubt_and_the_model_stops() {
        let (vendor, url) = start_vendor().await;
        let client = connect().await;

        let silent = client.call_tool(order("t-3", &format!("{url}/silent"))).await.unwrap();
        let (_, data) = read(&silent, "may-have-landed", "Do not call `order_part` again");
        assert_eq!(data["idem"]["retryable"], false);
        let key = data["idem"]["key"].clone();

        let again = client.call_tool(order("t-3", &format!("{url}/silent"))).await.unwrap();
        let (_, data) = read(&again, "in-doubt", "An operator has to check and settle it");
        assert_eq!(data["idem"]["key"], key, "the same key the model was first told of");
        assert_eq!(vendor.silent.load(Ordering::SeqCst), 1, "the second call sent nothing");
        client.cancel().await.expect("the client closes");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_still_running_elsewhere_tells_the_model_to_wait_and_call_again() {
        let (vendor, url) = start_vendor().await;
        let (arrived, mut arrivals) = mpsc::unbounded_channel();
        *vendor.arrived.lock().await = Some(arrived);
        let client = Arc::new(connect().await);
        let gated = format!("{url}/gate");

        let first = tokio::spawn({
            let (client, gated) = (Arc::clone(&client), gated.clone());
            async move { client.call_tool(order("t-4", &gated)).await }
        });
        arrivals.recv().await.expect("the first call reached the vendor");

        let meanwhile = client.call_tool(order("t-4", &gated)).await.unwrap();
        read(&meanwhile, "in-flight", "Wait, then call `order_part` again with the same arguments");

        vendor.open.notify_one();
        let first = first.await.expect("the first call's task").expect("the first call");
        assert_eq!(first.is_error, Some(false), "{first:?}");
        let later = client.call_tool(order("t-4", &gated)).await.unwrap();
        assert_eq!(later.structured_content, first.structured_content, "replayed");
        assert_eq!(later.structured_content.expect("content")["order_id"], "ord-1");
        assert_eq!(vendor.gated.load(Ordering::SeqCst), 1, "the vendor saw one order");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_error_result_is_not_recorded_unless_the_tool_says_it_is_final() {
        let warehouse = Warehouse { tool_router: Warehouse::hold_router() };
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(warehouse.serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.expect("the client initializes");
        let running = server.await.expect("the server task").expect("the server initializes");
        tokio::spawn(async move { running.waiting().await });
        let hold = |answer: &str| {
            let Value::Object(arguments) = json!({ "ticket_id": "t-9", "answer": answer }) else {
                unreachable!()
            };
            CallToolRequestParams::new("hold_part").with_arguments(arguments)
        };

        // "Busy, try again": the model reads the tool's own error, and the next call runs again.
        for _ in 0..2 {
            let busy = client.call_tool(hold("busy")).await.unwrap();
            assert_eq!(busy.is_error, Some(true));
            let text = serde_json::to_string(&busy.content).unwrap();
            assert!(text.contains("the warehouse says: busy"), "{text}");
        }
        assert_eq!(HOLDS.load(Ordering::SeqCst), 2, "an error result is not replayed");

        // "Discontinued", marked final: recorded once and replayed.
        let first = client.call_tool(hold("discontinued")).await.unwrap();
        let again = client.call_tool(hold("discontinued")).await.unwrap();
        assert_eq!(first.is_error, Some(true));
        assert_eq!(again.content, first.content, "the final error is replayed");
        assert_eq!(HOLDS.load(Ordering::SeqCst), 3, "the final error ran once");
        client.cancel().await.expect("the client closes");
    }
}
