//! A small help desk as an MCP server over stdio, written as a new user would write it: every
//! tool is an rmcp `#[tool]` with one idem attribute, and the set-up is the store's. Run several
//! at once on one SQLite file, as an MCP host starts one server per window: each intent still
//! runs once.
//!
//! - `list_tickets` reads the desk's tickets: `#[idem::read]`, run every time.
//! - `open_ticket` writes a row into the desk's own table, in the SQLite file that holds idem's
//!   records: `transactional = "tx"` hands it the transaction its record commits in, so the row
//!   and the record are both there or neither is, with one record per request.
//! - `order_replacement` asks a hardware vendor's HTTP API for a replacement device, once per
//!   ticket: idem-reqwest sends the call's key as `Idempotency-Key` and says whether a failure
//!   may have landed.
//!
//! ```text
//! HELP_DESK_DB=/tmp/desk.sqlite HELP_DESK_VENDOR=http://127.0.0.1:8080 \
//!     cargo run --features rmcp,sqlite --example help_desk
//! ```
//!
//! `HELP_DESK_DB` is the SQLite file (created on first use), `HELP_DESK_VENDOR` the vendor's base
//! URL. `tests/help_desk.rs` runs two of these servers on one file against a loopback vendor.

use std::sync::{Arc, LazyLock};

use idem::{rusqlite, SqliteStore};
use idem_reqwest::IdempotentRequest;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::schemars::JsonSchema;
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

/// The desk's SQLite file: idem's records and the `tickets` table, side by side.
static DESK: LazyLock<Arc<SqliteStore>> = LazyLock::new(|| {
    let path = std::env::var_os("HELP_DESK_DB").unwrap_or_else(|| "help_desk.sqlite".into());
    match SqliteStore::open(&path) {
        Ok(store) => Arc::new(store),
        Err(error) => {
            eprintln!("help_desk: cannot open the desk's store: {error}");
            std::process::exit(1);
        }
    }
});

/// A request to open a ticket; the client's request id is the unit of work.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct OpenTicket {
    /// The client's id for this request: the same request opens one ticket.
    pub request_id: String,
    /// Who the ticket is for.
    pub customer: String,
    /// What is wrong.
    pub title: String,
}

/// A ticket as the desk keeps it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Ticket {
    /// The desk's id for it.
    pub id: i64,
    /// Who it is for.
    pub customer: String,
    /// What is wrong.
    pub title: String,
}

/// Whose tickets to list.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Customer {
    /// The customer.
    pub customer: String,
}

/// A customer's tickets.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Tickets {
    /// Oldest first.
    pub tickets: Vec<Ticket>,
}

/// A replacement device for the customer of a ticket; the ticket is the unit of work.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Replacement {
    /// The ticket the device replaces a broken one for.
    pub ticket_id: i64,
    /// The device's model.
    pub model: String,
}

/// What the vendor answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct VendorOrder {
    /// The vendor's id for the order.
    pub order_id: String,
}

#[derive(Clone)]
struct HelpDesk {
    http: reqwest::Client,
    vendor: String,
    tool_router: ToolRouter<HelpDesk>,
}

fn failed(error: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(error.to_string(), None)
}

#[idem::tools]
#[tool_router]
impl HelpDesk {
    fn new(vendor: String) -> Self {
        let http = reqwest::Client::builder().redirect(idem_reqwest::redirect_policy()).build();
        HelpDesk {
            http: http.expect("a client with no TLS builds"),
            vendor,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "A customer's tickets, oldest first")]
    #[idem::read]
    async fn list_tickets(
        &self,
        Parameters(req): Parameters<Customer>,
    ) -> Result<Json<Tickets>, ErrorData> {
        let conn = rusqlite::Connection::open(DESK.path()).map_err(failed)?;
        let mut rows = conn
            .prepare("SELECT id, customer, title FROM tickets WHERE customer = ?1 ORDER BY id")
            .map_err(failed)?;
        let tickets = rows
            .query_map([&req.customer], |row| {
                Ok(Ticket { id: row.get(0)?, customer: row.get(1)?, title: row.get(2)? })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(failed)?;
        Ok(Json(Tickets { tickets }))
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
        eprintln!(
            "help_desk: opened ticket {} for request {}",
            tx.last_insert_rowid(),
            req.request_id
        );
        Ok(Json(Ticket { id: tx.last_insert_rowid(), customer: req.customer, title: req.title }))
    }

    #[tool(
        description = "Order a replacement device from the vendor for a ticket; once per ticket"
    )]
    #[idem::idempotent(scope = "ticket_id")]
    async fn order_replacement(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<Replacement>,
    ) -> Result<Json<VendorOrder>, ErrorData> {
        let url = format!("{}/v1/replacements", self.vendor);
        let body = serde_json::json!({ "ticket": req.ticket_id, "model": req.model });
        // idem-reqwest's `rmcp` feature makes its error an `ErrorData` that tells the model
        // whether the vendor may have acted and whether to call again.
        Ok(Json(self.http.post(url).json(&body).idempotent().send_json().await?))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for HelpDesk {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The desk's table lives in the store's file: open the store first (it marks a new file as
    // idem's), then make the table. Every tool's records go to this store.
    let conn = rusqlite::Connection::open(DESK.path())?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS tickets (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, \
         title TEXT NOT NULL)",
    )?;
    idem::set_default_store(DESK.clone());
    let vendor =
        std::env::var("HELP_DESK_VENDOR").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    // stdout carries the protocol; anything for a person goes to stderr.
    eprintln!("help_desk: serving MCP on stdio; desk at {}", DESK.path().display());
    let service = HelpDesk::new(vendor).serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
