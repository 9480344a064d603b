//! The MCP server the proxy's client talks to: `tools/list` is the upstream's, `tools/call` goes
//! through [`IdempotentClient::call_tool`], and nothing else is offered.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer, ServiceError};
use rmcp::{ErrorData, ServerHandler};

use idem_runtime::mcp::IdempotentClient;

#[derive(Clone)]
pub(crate) struct Proxy {
    pub(crate) client: IdempotentClient,
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
        self.client.peer().list_tools(request).await.map_err(upstream_error)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.client.call_tool(request).await.map(Into::into).map_err(upstream_error)
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
