//! `idem::mcp::IdempotentClient` in front of an MCP server that does not deduplicate anything:
//! a plain rmcp server (no idem in it), reached by rmcp's own client over an in-process duplex
//! pipe, with its keys in a real SQLite store. Needs the `rmcp` and `sqlite` features
//! (`cargo test --workspace --features idem/rmcp,idem/sqlite`, as `.ci/run` does).

#[cfg(not(all(feature = "rmcp", feature = "sqlite")))]
#[test]
fn mcp_client_needs_the_rmcp_and_sqlite_features() {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs tests/mcp_client.rs with `--features idem/rmcp,idem/sqlite`"
    );
    eprintln!(
        "NOTICE: tests/mcp_client.rs did not run: it needs the `rmcp` and `sqlite` features; run \
         `cargo test --workspace --features idem/rmcp,idem/sqlite`"
    );
}

#[cfg(all(feature = "rmcp", feature = "sqlite"))]
mod client {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    use idem::mcp::{IdempotentClient, Protection, ToolPolicy};
    use idem::{SqliteStore, Store};
    // The names of the request's meta fields, which only a test of the wire reads.
    use idem_runtime::mcp::{IDEMPOTENCY_KEY_META, KEY_META, SCOPE_META};
    use rmcp::handler::server::router::tool::ToolRouter;
    use rmcp::handler::server::wrapper::{Json, Parameters};
    use rmcp::model::{
        CallToolRequestParams, CallToolResult, ContentBlock, RequestMetaObject, ServerCapabilities,
        ServerConfig,
    };
    use rmcp::schemars::JsonSchema;
    use rmcp::service::{RoleClient, RunningService};
    use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};
    use tokio::sync::{mpsc, Notify};

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Charge {
        pub order_id: String,
        pub amount: u64,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Charged {
        pub charge_id: String,
    }

    #[derive(Debug, Serialize, Deserialize, JsonSchema)]
    #[schemars(crate = "rmcp::schemars")]
    pub struct Account {
        pub account: String,
    }

    /// What the upstream did, shared by every instance of it on one test's "machine".
    #[derive(Default)]
    struct Effects {
        charges: AtomicU32,
        balances: AtomicU32,
        shipments: AtomicU32,
        holds: AtomicU32,
        /// The `_meta` key each charge arrived with.
        keys: Mutex<Vec<Option<String>>>,
        /// Told when a charge or a shipment has acted.
        acted: Mutex<Option<mpsc::UnboundedSender<()>>>,
        /// Charges wait for it when `gated`.
        gate: Notify,
        gated: std::sync::atomic::AtomicBool,
    }

    impl Effects {
        fn acted(&self) {
            if let Some(acted) = self.acted.lock().unwrap().as_ref() {
                let _ = acted.send(());
            }
        }
    }

    /// A payments server that knows nothing of idem: every call it gets, it acts on.
    #[derive(Clone)]
    pub struct Payments {
        effects: Arc<Effects>,
        tool_router: ToolRouter<Payments>,
    }

    #[tool_router]
    impl Payments {
        #[tool(description = "Charge a card for an order")]
        async fn charge_card(
            &self,
            meta: RequestMetaObject,
            Parameters(charge): Parameters<Charge>,
        ) -> Result<Json<Charged>, ErrorData> {
            let n = self.effects.charges.fetch_add(1, Ordering::SeqCst) + 1;
            let key = meta.0.get(KEY_META).and_then(Value::as_str).map(str::to_owned);
            self.effects.keys.lock().unwrap().push(key);
            self.effects.acted();
            if self.effects.gated.load(Ordering::SeqCst) {
                self.effects.gate.notified().await;
            }
            Ok(Json(Charged { charge_id: format!("ch_{n}_{}_{}", charge.order_id, charge.amount) }))
        }

        #[tool(description = "An account's balance", annotations(read_only_hint = true))]
        async fn get_balance(&self, Parameters(_): Parameters<Account>) -> String {
            self.effects.balances.fetch_add(1, Ordering::SeqCst);
            "100".into()
        }

        #[tool(description = "Ship an order; never answers after shipping")]
        async fn ship_order(&self, Parameters(_): Parameters<Account>) -> String {
            self.effects.shipments.fetch_add(1, Ordering::SeqCst);
            self.effects.acted();
            std::future::pending::<String>().await
        }

        #[tool(description = "Hold stock; the warehouse is busy")]
        async fn hold_stock(&self, Parameters(_): Parameters<Account>) -> CallToolResult {
            self.effects.holds.fetch_add(1, Ordering::SeqCst);
            CallToolResult::error(vec![ContentBlock::text("warehouse busy, try again")])
        }
    }

    #[tool_handler(router = self.tool_router)]
    impl ServerHandler for Payments {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }
    }

    struct Upstream {
        client: RunningService<RoleClient, ()>,
        server: tokio::task::JoinHandle<()>,
    }

    /// A fresh upstream server process stand-in (its own connection) acting on `effects`.
    async fn connect(effects: &Arc<Effects>) -> Upstream {
        let payments =
            Payments { effects: Arc::clone(effects), tool_router: Payments::tool_router() };
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(payments.serve(tokio::io::split(server_io)));
        let client = ().serve(tokio::io::split(client_io)).await.expect("the client initializes");
        let running = server.await.expect("the server task").expect("the server initializes");
        let server = tokio::spawn(async move {
            let _ = running.waiting().await;
        });
        Upstream { client, server }
    }

    async fn guard(upstream: &Upstream, store: &Arc<dyn Store>) -> IdempotentClient {
        IdempotentClient::new(upstream.client.peer().clone(), "payments")
            .store(Arc::clone(store))
            .tool("charge_card", ToolPolicy::scope(["/order_id"]))
            .tool("ship_order", ToolPolicy::scope(["/account"]))
            .tool("hold_stock", ToolPolicy::scope(["/account"]))
            .classify()
            .await
            .expect("tools/list")
    }

    fn store() -> Arc<dyn Store> {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        Arc::new(SqliteStore::open(dir.join("proxy.sqlite")).expect("the store opens"))
    }

    fn params(tool: &'static str, arguments: Value) -> CallToolRequestParams {
        let Value::Object(arguments) = arguments else { unreachable!() };
        CallToolRequestParams::new(tool).with_arguments(arguments)
    }

    fn told(result: &CallToolResult, kind: &str) -> Value {
        assert_eq!(result.is_error, Some(true), "{result:?}");
        let data = result.structured_content.clone().expect("structured content");
        assert_eq!(data["idem"]["error"], kind, "{data}");
        data
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn five_calls_charge_once_and_a_fresh_client_replays() {
        let (store, effects) = (store(), Arc::new(Effects::default()));
        let upstream = connect(&effects).await;
        let payments = guard(&upstream, &store).await;
        assert_eq!(payments.protection("get_balance"), Protection::Read, "from readOnlyHint");
        assert_eq!(
            payments.protection("charge_card"),
            Protection::Keyed { scope: vec!["/order_id".into()] }
        );

        let charge = || params("charge_card", json!({ "order_id": "o-1", "amount": 42 }));
        let mut answers = Vec::new();
        for _ in 0..5 {
            answers.push(payments.call_tool(charge()).await.expect("the call"));
        }
        assert_eq!(effects.charges.load(Ordering::SeqCst), 1, "one charge upstream");
        assert!(answers.iter().all(|answer| answer == &answers[0]), "five equal answers");
        assert_eq!(answers[0].is_error, Some(false));

        // The key went upstream, and it is the one in the store.
        let keys = effects.keys.lock().unwrap().clone();
        let [Some(key)] = keys.as_slice() else { panic!("one charge with a key: {keys:?}") };
        let record = store.get(key).await.expect("the store reads").expect("a record");
        assert_eq!(record.tool, "payments/charge_card");

        // Another amount is another intent.
        payments
            .call_tool(params("charge_card", json!({ "order_id": "o-1", "amount": 43 })))
            .await
            .expect("the call");
        assert_eq!(effects.charges.load(Ordering::SeqCst), 2);

        // Reads pass through every time.
        for _ in 0..3 {
            let balance = params("get_balance", json!({ "account": "a-1" }));
            payments.call_tool(balance).await.expect("the read");
        }
        assert_eq!(effects.balances.load(Ordering::SeqCst), 3);

        // A new connection, a new server, the same store: the answer is replayed.
        let fresh = connect(&effects).await;
        let replayed = guard(&fresh, &store).await.call_tool(charge()).await.expect("the call");
        assert_eq!(replayed, answers[0]);
        assert_eq!(effects.charges.load(Ordering::SeqCst), 2, "no charge from the fresh client");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_duplicates_wait_for_the_one_charge() {
        let (store, effects) = (store(), Arc::new(Effects::default()));
        let (acted, mut actions) = mpsc::unbounded_channel();
        *effects.acted.lock().unwrap() = Some(acted);
        effects.gated.store(true, Ordering::SeqCst);
        let upstream = connect(&effects).await;
        let payments = guard(&upstream, &store).await;
        let charge = || params("charge_card", json!({ "order_id": "o-2", "amount": 7 }));

        let first = tokio::spawn({
            let payments = payments.clone();
            async move { payments.call_tool(charge()).await }
        });
        actions.recv().await.expect("the first charge reached upstream");
        let others: Vec<_> = (0..3)
            .map(|_| {
                let payments = payments.clone();
                tokio::spawn(async move { payments.call_tool(charge()).await })
            })
            .collect();
        // Whatever the others are doing, none of them has reached upstream while the first runs.
        effects.gate.notify_one();
        let first = first.await.expect("the task").expect("the call");
        for other in others {
            assert_eq!(other.await.expect("the task").expect("the call"), first);
        }
        assert_eq!(effects.charges.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_lost_after_upstream_acted_leaves_the_key_in_doubt() {
        let (store, effects) = (store(), Arc::new(Effects::default()));
        let (acted, mut actions) = mpsc::unbounded_channel();
        *effects.acted.lock().unwrap() = Some(acted);
        let upstream = connect(&effects).await;
        let payments = guard(&upstream, &store).await;
        let ship = || params("ship_order", json!({ "account": "a-3" }));

        let call = tokio::spawn({
            let payments = payments.clone();
            async move { payments.call_tool(ship()).await }
        });
        actions.recv().await.expect("upstream shipped");
        // The upstream server dies with the call open.
        upstream.server.abort();
        drop(upstream.client);
        let lost = call.await.expect("the task").expect("idem's answer, not an error");
        let data = told(&lost, "in-doubt");
        let text = serde_json::to_string(&lost.content).unwrap();
        assert!(text.contains("Do not call `ship_order` again"), "{text}");

        // Were the key released, this call would ship again and wait for an answer that never
        // comes: bound it, so that the test fails rather than hangs.
        let fresh = connect(&effects).await;
        let guarded = guard(&fresh, &store).await;
        let again = guarded.call_tool(ship());
        let again = tokio::time::timeout(std::time::Duration::from_secs(30), again)
            .await
            .unwrap_or_else(|_| panic!("the second call went upstream: the key was not in doubt"))
            .expect("the call");
        assert_eq!(told(&again, "in-doubt")["idem"]["key"], data["idem"]["key"]);
        assert_eq!(effects.shipments.load(Ordering::SeqCst), 1, "never shipped twice");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn error_results_unscoped_writes_and_missing_scopes() {
        let (store, effects) = (store(), Arc::new(Effects::default()));
        let upstream = connect(&effects).await;
        let payments = IdempotentClient::new(upstream.client.peer().clone(), "payments")
            .store(Arc::clone(&store))
            .tool("charge_card", ToolPolicy::scope(["/order_id"]))
            .tool("hold_stock", ToolPolicy::scope(["/account"]))
            .classify()
            .await
            .expect("tools/list");

        // An upstream isError result is not recorded: the next call goes upstream again.
        for _ in 0..2 {
            let held = payments.call_tool(params("hold_stock", json!({ "account": "a-4" })));
            assert_eq!(held.await.expect("the call").is_error, Some(true));
        }
        assert_eq!(effects.holds.load(Ordering::SeqCst), 2);

        // A write with no scope passes through, and is listed as unprotected...
        assert_eq!(payments.unprotected(), ["ship_order"]);
        // ... unless the call names its scope.
        let (acted, mut actions) = mpsc::unbounded_channel();
        *effects.acted.lock().unwrap() = Some(acted);
        let mut scoped = params("ship_order", json!({ "account": "a-5" }));
        let mut meta = RequestMetaObject::default();
        meta.0.insert(SCOPE_META.into(), json!("order-5"));
        scoped.meta = Some(meta);
        let call = tokio::spawn({
            let payments = payments.clone();
            async move { payments.call_tool(scoped).await }
        });
        actions.recv().await.expect("shipped");
        let mut again = params("ship_order", json!({ "account": "a-5" }));
        let mut meta = RequestMetaObject::default();
        meta.0.insert(SCOPE_META.into(), json!("order-5"));
        again.meta = Some(meta);
        let second = IdempotentClient::new(upstream.client.peer().clone(), "payments")
            .store(Arc::clone(&store))
            .tool("ship_order", ToolPolicy::scope(["/account"]).wait(std::time::Duration::ZERO));
        let meanwhile = second.call_tool(again).await.expect("the call");
        told(&meanwhile, "in-flight");
        assert_eq!(effects.shipments.load(Ordering::SeqCst), 1);
        call.abort();

        // A configured scope missing from the arguments is refused before anything is sent.
        let missing = payments.call_tool(params("charge_card", json!({ "amount": 5 })));
        let missing = missing.await.expect("the call");
        told(&missing, "key");
        let text = serde_json::to_string(&missing.content).unwrap();
        assert!(text.contains("`/order_id` is not in the arguments"), "{text}");
        assert_eq!(effects.charges.load(Ordering::SeqCst), 0);
    }

    /// `params` with the client's own idempotency key (SEP-3182) in its `_meta`.
    fn keyed(mut params: CallToolRequestParams, key: Value) -> CallToolRequestParams {
        let mut meta = RequestMetaObject::default();
        meta.0.insert(IDEMPOTENCY_KEY_META.into(), key);
        params.meta = Some(meta);
        params
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_key_runs_once_and_is_refused_for_other_arguments() {
        let (store, effects) = (store(), Arc::new(Effects::default()));
        let upstream = connect(&effects).await;
        let payments = guard(&upstream, &store).await;
        let charge =
            |amount: u64| params("charge_card", json!({ "order_id": "o-7", "amount": amount }));

        // The client's key stands in for the scope: the same key and arguments charge once.
        let first = payments.call_tool(keyed(charge(42), json!("k-1"))).await.expect("the call");
        assert_eq!(first.is_error, Some(false), "{first:?}");
        let again = payments.call_tool(keyed(charge(42), json!("k-1"))).await.expect("the call");
        assert_eq!(again, first);
        assert_eq!(effects.charges.load(Ordering::SeqCst), 1);
        let keys = effects.keys.lock().unwrap().clone();
        let [Some(key)] = keys.as_slice() else { panic!("one charge with a key: {keys:?}") };
        let record = store.get(key).await.expect("the store reads").expect("a record");
        assert_eq!(record.scope, "k-1", "the client's key is the scope");

        // The same key with other arguments is refused, naming both keys, and runs nothing;
        // a fresh client on the same store refuses it too.
        let fresh = connect(&effects).await;
        for client in [&payments, &guard(&fresh, &store).await] {
            let reused = client.call_tool(keyed(charge(43), json!("k-1"))).await.expect("the call");
            let data = told(&reused, "key-reused");
            assert_eq!(data["idem"]["idempotencyKey"], "k-1");
            assert_eq!(data["idem"]["key"], key.as_str(), "the first call's key");
            let text = serde_json::to_string(&reused.content).unwrap();
            assert!(text.contains("send a new key"), "{text}");
        }
        assert_eq!(effects.charges.load(Ordering::SeqCst), 1);

        // A new key is a new request, and a key protects a write with no scope configured.
        let other = payments.call_tool(keyed(charge(43), json!("k-2"))).await.expect("the call");
        assert_eq!(other.is_error, Some(false), "{other:?}");
        let (acted, mut actions) = mpsc::unbounded_channel();
        *effects.acted.lock().unwrap() = Some(acted);
        let no_scope = ToolPolicy::scope(Vec::<String>::new()).wait(std::time::Duration::ZERO);
        let unscoped = IdempotentClient::new(upstream.client.peer().clone(), "payments")
            .store(Arc::clone(&store))
            .tool("ship_order", no_scope)
            .classify()
            .await
            .expect("tools/list");
        assert_eq!(unscoped.protection("ship_order"), Protection::Unscoped);
        let ship = || keyed(params("ship_order", json!({ "account": "a-7" })), json!("k-3"));
        let call = tokio::spawn({
            let unscoped = unscoped.clone();
            async move { unscoped.call_tool(ship()).await }
        });
        actions.recv().await.expect("shipped");
        told(&unscoped.call_tool(ship()).await.expect("the call"), "in-flight");
        call.abort();
        assert_eq!(effects.charges.load(Ordering::SeqCst), 2);
        assert_eq!(effects.shipments.load(Ordering::SeqCst), 1);

        // A key that is not a non-empty string is refused before anything is sent.
        for bad in [json!(7), json!("")] {
            let refused = payments.call_tool(keyed(charge(44), bad)).await.expect("the call");
            let text = serde_json::to_string(&refused.content).unwrap();
            told(&refused, "key");
            assert!(text.contains("must be a non-empty string"), "{text}");
        }
        // So is a key too long to keep (255 bytes at most), naming its length.
        let long = payments.call_tool(keyed(charge(44), json!("k".repeat(256)))).await.unwrap();
        let text = serde_json::to_string(&long.content).unwrap();
        told(&long, "key");
        assert!(text.contains("is 256 bytes long, more than the 255 taken"), "{text}");
        let longest = payments.call_tool(keyed(charge(45), json!("k".repeat(255)))).await;
        assert!(!longest.expect("the call").is_error.unwrap_or(false), "255 bytes are taken");
        assert_eq!(effects.charges.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_key_reused_while_its_first_call_runs_is_refused_at_once() {
        let (store, effects) = (store(), Arc::new(Effects::default()));
        let (acted, mut actions) = mpsc::unbounded_channel();
        *effects.acted.lock().unwrap() = Some(acted);
        effects.gated.store(true, Ordering::SeqCst);
        let upstream = connect(&effects).await;
        let payments = guard(&upstream, &store).await;
        let charge = |amount: u64| {
            keyed(
                params("charge_card", json!({ "order_id": "o-8", "amount": amount })),
                json!("k-8"),
            )
        };

        let first = tokio::spawn({
            let payments = payments.clone();
            async move { payments.call_tool(charge(42)).await }
        });
        actions.recv().await.expect("the first charge reached upstream");
        // The first call holds the key open upstream; other arguments under its client key are
        // refused without waiting for it. Were they to wait, they would wait for the gate this
        // test opens after: bound it, so that the test fails rather than hangs.
        let reused = payments.call_tool(charge(43));
        let reused = tokio::time::timeout(std::time::Duration::from_secs(30), reused)
            .await
            .unwrap_or_else(|_| panic!("the reused key waited for the first call"))
            .expect("the call");
        told(&reused, "key-reused");
        effects.gate.notify_one();
        let first = first.await.expect("the task").expect("the call");
        assert_eq!(first.is_error, Some(false), "{first:?}");
        assert_eq!(effects.charges.load(Ordering::SeqCst), 1);
    }
}
