//! The README's recipe, word for word below this header (`tests/readme.rs` checks that it is):
//! an MCP server that several processes share. Every process opens the same SQLite file, which
//! holds idem's records and the desk's own `tickets` table; `examples/help_desk.rs` is the same
//! server with a vendor's HTTP API beside it, and `tests/help_desk.rs` runs two of those.
//!
//! ```text
//! DESK_DB=/tmp/desk.sqlite cargo run --features rmcp,sqlite --example shared_desk
//! ```

use std::sync::{Arc, LazyLock};

use idem::{rusqlite, SqliteStore};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::schemars::JsonSchema;
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

/// The one file every process opens: idem's records and the `tickets` table, side by side.
static DESK: LazyLock<Arc<SqliteStore>> = LazyLock::new(|| {
    let path = std::env::var_os("DESK_DB").unwrap_or_else(|| "desk.sqlite".into());
    Arc::new(SqliteStore::open(path).expect("the desk's store opens"))
});

#[derive(Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct OpenTicket {
    /// The client's id for this request: the same request opens one ticket.
    request_id: String,
    customer: String,
    title: String,
}

#[derive(Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct Ticket {
    id: i64,
    customer: String,
    title: String,
}

#[derive(Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct TicketId {
    id: i64,
}

#[derive(Clone)]
struct Desk {
    tool_router: ToolRouter<Desk>,
}

fn failed(error: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(error.to_string(), None)
}

#[idem::tools]
#[tool_router]
impl Desk {
    fn new() -> Self {
        Desk { tool_router: Self::tool_router() }
    }

    #[tool(description = "A ticket, by its id")]
    #[idem::read]
    async fn get_ticket(
        &self,
        Parameters(req): Parameters<TicketId>,
    ) -> Result<Json<Ticket>, ErrorData> {
        let conn = rusqlite::Connection::open(DESK.path()).map_err(failed)?;
        let ticket = conn.query_row(
            "SELECT id, customer, title FROM tickets WHERE id = ?1",
            [req.id],
            |row| Ok(Ticket { id: row.get(0)?, customer: row.get(1)?, title: row.get(2)? }),
        );
        Ok(Json(ticket.map_err(failed)?))
    }

    #[tool(description = "Open a ticket; the same request opens one ticket")]
    #[idem::idempotent(scope = "request_id", transactional = "tx", store = DESK, destructive = false)]
    fn open_ticket(
        &self,
        tx: &rusqlite::Transaction<'_>,
        #[idem(flatten)] Parameters(req): Parameters<OpenTicket>,
    ) -> Result<Json<Ticket>, ErrorData> {
        tx.execute(
            "INSERT INTO tickets (customer, title) VALUES (?1, ?2)",
            (&req.customer, &req.title),
        )
        .map_err(failed)?;
        Ok(Json(Ticket { id: tx.last_insert_rowid(), customer: req.customer, title: req.title }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Desk {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Open the store first (it marks a new file as idem's), then make the desk's table in it.
    let conn = rusqlite::Connection::open(DESK.path())?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS tickets (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, \
         title TEXT NOT NULL)",
    )?;
    // Every other tool's records go to the same file.
    idem::set_default_store(DESK.clone());
    // stdout carries the protocol: the MCP host starts this process and talks to it there.
    Desk::new().serve(rmcp::transport::stdio()).await?.waiting().await?;
    Ok(())
}
