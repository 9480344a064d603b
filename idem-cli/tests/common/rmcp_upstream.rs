//! An upstream MCP server written with rmcp, for `idem mcp-proxy` to stand in front of: a charge
//! that acts every time it is called (it deduplicates nothing) and a balance that only reads, by
//! its hint. A test or bench binary serves it on stdio when it finds [`UPSTREAM`] in its
//! environment, so that the proxy can spawn the binary itself as its upstream (a test cannot add
//! a binary to the package). Each charge appends `charge ORDER` to the file `$PAYMENTS_EFFECTS`
//! names, when it names one, so that effects are counted across every process that ran.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Value};

/// Set in the environment of a binary that is to serve the upstream rather than run.
pub const UPSTREAM: &str = "IDEM_TEST_RMCP_UPSTREAM";

/// The upstream: a charge counts itself (and appends its line), a balance is a read.
#[derive(Clone, Default)]
pub struct Upstream {
    charges: Arc<AtomicU64>,
}

/// Serves the upstream on stdin and stdout until the client closes stdin.
pub fn serve() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the upstream's runtime");
    runtime.block_on(async {
        let server = Upstream::default()
            .serve(rmcp::transport::stdio())
            .await
            .expect("the upstream's client initializes");
        let _ = server.waiting().await;
    });
}

fn schema(properties: Value) -> Arc<JsonObject> {
    let Value::Object(schema) = json!({ "type": "object", "properties": properties }) else {
        unreachable!("a JSON object")
    };
    Arc::new(schema)
}

/// Appends `line` to `$PAYMENTS_EFFECTS`, if set.
fn record(line: &str) {
    let Some(path) = std::env::var_os("PAYMENTS_EFFECTS") else { return };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("the effects file opens");
    writeln!(file, "{line}").expect("the effect is written");
}

impl ServerHandler for Upstream {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let charge =
            schema(json!({ "order_id": { "type": "string" }, "amount": { "type": "integer" } }));
        let balance = schema(json!({ "account": { "type": "string" } }));
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("charge_card", "Charge a card for an order", charge),
            Tool::new("get_balance", "An account's balance", balance)
                .with_annotations(ToolAnnotations::new().read_only(true)),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let answer = match request.name.as_ref() {
            "charge_card" => {
                let n = self.charges.fetch_add(1, Ordering::Relaxed) + 1;
                let order = arguments.get("order_id").and_then(Value::as_str).unwrap_or("?");
                record(&format!("charge {order}"));
                format!("ch_{n}_{order}")
            }
            "get_balance" => {
                record("balance");
                "100".to_owned()
            }
            other => return Err(ErrorData::invalid_params(format!("no tool `{other}`"), None)),
        };
        Ok(CallToolResult::structured(json!({ "result": answer })).into())
    }
}
