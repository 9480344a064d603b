//! The MCP server the proxy's client talks to: `tools/list` is the upstream's, `tools/call` goes
//! through [`IdempotentClient::call_tool`], and nothing else is offered (but the upstream's
//! `notifications/tools/list_changed`, which the proxy's loop passes on).

use std::sync::{Arc, PoisonError, RwLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer, ServiceError};
use rmcp::{ErrorData, ServerHandler};

use idem_runtime::mcp::IdempotentClient;

#[derive(Clone)]
pub(crate) struct Proxy {
    pub(crate) client: Classified,
    /// What `initialize` answers: tools, under the configured server's name.
    pub(crate) info: ServerConfig,
}

impl ServerHandler for Proxy {
    fn get_info(&self) -> ServerConfig {
        self.info.clone()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.client.current().peer().list_tools(request).await.map_err(upstream_error)
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // rmcp hands a request's `_meta` to the handler in its context, not in the params: put
        // it back, so that the client's scope or idempotency key reaches the client layer and
        // goes upstream with the rest. Not what describes the client's own session with the
        // proxy (its progress token, which the proxy does not relay, and MCP's
        // `io.modelcontextprotocol/` entries): the upstream session is the proxy's.
        let forwarded = context.meta.0 .0.into_iter().filter(|(name, _)| {
            name != "progressToken" && !name.starts_with("io.modelcontextprotocol/")
        });
        for (name, value) in forwarded {
            let params = request.meta.get_or_insert_with(Default::default);
            params.0.entry(name).or_insert(value);
        }
        self.client.current().call_tool(request).await.map(Into::into).map_err(upstream_error)
    }
}

/// The upstream client with its latest classification of the upstream's tools. The proxy's
/// loop replaces it when the upstream's tool list changes; a call in progress finishes with the
/// one it started with.
#[derive(Clone)]
pub(crate) struct Classified(Arc<RwLock<Arc<IdempotentClient>>>);

impl Classified {
    pub(crate) fn new(client: IdempotentClient) -> Classified {
        Classified(Arc::new(RwLock::new(Arc::new(client))))
    }

    pub(crate) fn current(&self) -> Arc<IdempotentClient> {
        // Nothing panics while holding the lock: a poisoned one still holds a whole client.
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn replace(&self, client: IdempotentClient) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(client);
    }
}

/// The upstream's own JSON-RPC error (unknown tool, invalid arguments) goes to the client as the
/// upstream sent it; a request the proxy could not get answered is an internal error that says
/// so. idem's own outcomes never come here: they are tool results.
fn upstream_error(error: ServiceError) -> ErrorData {
    match error {
        ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(
            format!("idem mcp-proxy: no answer from the upstream server: {other}"),
            None,
        ),
    }
}
