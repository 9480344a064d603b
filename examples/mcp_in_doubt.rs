//! What a model sees when a payment is left in doubt: an MCP server over stdio whose
//! `send_payment` runs once per invoice, and whose errors from idem reach the model as tool
//! results (`isError: true`) that say what to do, not as protocol errors.
//!
//! ```text
//! BANK_HANGS=1 cargo run --features rmcp --example mcp_in_doubt   # call send_payment, then kill -9 it
//! cargo run --features rmcp --example mcp_in_doubt                # call it again: "Do not call … again"
//! ```
//!
//! With `BANK_HANGS` set, the bank never answers: the payment was sent, and whether it landed is
//! unknown. Killing the server there leaves the invoice's key in doubt, and the next server on
//! the same store answers the same call with a tool result that tells the model not to pay
//! again, until an operator settles the key (`idem resolve`).
//!
//! The store is opened at start-up (`idem::open_default_store`), so a store that cannot be
//! opened (a path it may not create, a sled store another process holds) stops the server with
//! the reason before it serves. `tests/mcp_processes.rs` runs this server as real processes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::schemars::JsonSchema;
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

/// A payment for one invoice: the invoice is the unit of work, so it is the scope.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct PaymentRequest {
    /// The invoice this payment settles.
    pub invoice_id: String,
    /// The amount, in cents.
    pub amount_cents: u64,
}

/// What `send_payment` answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Receipt {
    /// The bank's id for the payment.
    pub payment_id: String,
    /// The invoice it settled.
    pub invoice_id: String,
}

/// A bank that, with `BANK_HANGS` set, takes the payment and never answers.
#[derive(Clone)]
struct Bank {
    hangs: bool,
    payments: Arc<AtomicU32>,
    tool_router: ToolRouter<Bank>,
}

#[idem::tools]
#[tool_router]
impl Bank {
    fn new(hangs: bool) -> Self {
        Bank {
            hangs,
            payments: Arc::new(AtomicU32::new(0)),
            // `#[idem::tools]` gives the router the hints and idem's outcomes as tool results.
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Pay an invoice; paying the same invoice again returns the first \
                          payment's receipt")]
    #[idem::idempotent(scope = "invoice_id")]
    async fn send_payment(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<PaymentRequest>,
    ) -> Result<Json<Receipt>, ErrorData> {
        eprintln!("mcp_in_doubt: paying invoice {}", req.invoice_id);
        if self.hangs {
            std::future::pending::<()>().await;
        }
        let n = self.payments.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Json(Receipt { payment_id: format!("pay_{n}"), invoice_id: req.invoice_id }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bank {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Open the store now: a server that cannot keep its records should not start serving.
    if let Err(error) = idem::open_default_store() {
        eprintln!("mcp_in_doubt: cannot start: {error}");
        std::process::exit(1);
    }
    // stdout carries the protocol; anything for a person goes to stderr.
    eprintln!(
        "mcp_in_doubt: serving MCP on stdio; idem store at {}",
        idem::default_store_path().display()
    );
    let hangs = std::env::var_os("BANK_HANGS").is_some();
    let service = Bank::new(hangs).serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
