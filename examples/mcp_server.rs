//! An MCP server over stdio whose tools are classified by idem: `get_balance` is a read,
//! `send_payment` runs once per invoice however often the client calls it, `refundOrder` (a
//! method renamed for MCP) once per order, `open_account` is a write that only adds (one account
//! per request), and `delete_account` is a write that is never retried. The MCP hints that
//! clients see in `tools/list` come from those attributes, with no further call.
//!
//! ```text
//! cargo run --features rmcp --example mcp_server    # then speak MCP on stdin and stdout
//! ```
//!
//! The idem store is the default store: `$IDEM_STORE`, else the user's data directory (see the
//! README). `tests/mcp.rs` drives this same server as an MCP client would.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::schemars::JsonSchema;
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

/// Which account a read or a deletion is about.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct AccountRequest {
    /// The account id, such as `acct-1`.
    pub account: String,
}

/// A payment for one invoice: the invoice is the unit of work, so it is the scope.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct PaymentRequest {
    /// The invoice this payment settles; paying it twice is the mistake to prevent.
    pub invoice_id: String,
    /// The account paid from.
    pub from: String,
    /// The account paid to.
    pub to: String,
    /// The amount, in cents.
    pub amount_cents: u64,
}

/// A refund of one card order to an account: the order is the scope.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RefundRequest {
    /// The order refunded; refunding it twice is the mistake to prevent.
    pub order_id: String,
    /// The account credited.
    pub account: String,
    /// The amount, in cents.
    pub amount_cents: u64,
}

/// A new account, asked for once per request: the client's request id is the scope.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct OpenAccountRequest {
    /// An id the client makes up once per account it means to open, and sends again on a retry.
    pub request_id: String,
    /// Who owns the account.
    pub owner: String,
}

/// What `open_account` answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Opened {
    /// The new account's id.
    pub account: String,
}

/// What `get_balance` answers.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Balance {
    /// The account asked about.
    pub account: String,
    /// Its balance, in cents.
    pub balance_cents: u64,
}

/// What `send_payment` answers, stored by idem and replayed to every repeat of the call.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Receipt {
    /// The bank's id for the payment: one per payment actually made.
    pub payment_id: String,
    /// The invoice it settled.
    pub invoice_id: String,
    /// The amount moved, in cents.
    pub amount_cents: u64,
}

/// A toy bank behind the tools. `pub` so that `tests/mcp.rs` can serve it in-process.
#[derive(Clone)]
pub struct Bank {
    balances: Arc<Mutex<HashMap<String, u64>>>,
    payments: Arc<AtomicU32>,
    refunds: Arc<AtomicU32>,
    opened: Arc<AtomicU32>,
    tool_router: ToolRouter<Bank>,
}

#[idem::tools]
#[tool_router]
impl Bank {
    /// A bank with two funded accounts. `#[idem::tools]` has written each tool's MCP hints into
    /// its `#[tool]`, and makes the router rmcp generates answer idem's outcomes (in doubt, in
    /// flight, …) as tool results the model reads: no line wires either.
    pub fn new() -> Self {
        let balances = HashMap::from([("acct-1".to_owned(), 100_000), ("acct-2".to_owned(), 0)]);
        Bank {
            balances: Arc::new(Mutex::new(balances)),
            payments: Arc::new(AtomicU32::new(0)),
            refunds: Arc::new(AtomicU32::new(0)),
            opened: Arc::new(AtomicU32::new(0)),
            tool_router: Self::tool_router(),
        }
    }

    /// How many payments the bank has actually made (bodies of `send_payment` that ran).
    pub fn payments_made(&self) -> u32 {
        self.payments.load(Ordering::SeqCst)
    }

    /// How many refunds the bank has actually made (bodies of `refundOrder` that ran).
    pub fn refunds_made(&self) -> u32 {
        self.refunds.load(Ordering::SeqCst)
    }

    #[tool(description = "The balance of an account, in cents")]
    #[idem::read]
    async fn get_balance(
        &self,
        Parameters(req): Parameters<AccountRequest>,
    ) -> Result<Json<Balance>, ErrorData> {
        let balances = self.balances.lock().expect("no panic holds the lock");
        match balances.get(&req.account) {
            Some(&balance_cents) => Ok(Json(Balance { account: req.account, balance_cents })),
            None => Err(ErrorData::invalid_params(format!("no account {}", req.account), None)),
        }
    }

    #[tool(description = "Pay an invoice from one account to another; paying the same invoice \
                          again returns the first payment's receipt")]
    #[idem::idempotent(scope = "invoice_id")]
    async fn send_payment(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<PaymentRequest>,
    ) -> Result<Json<Receipt>, ErrorData> {
        let mut balances = self.balances.lock().expect("no panic holds the lock");
        let from = balances.get(&req.from).copied().unwrap_or(0);
        if from < req.amount_cents {
            // Nothing moved: the key is released, and a later call may try again.
            return Err(ErrorData::invalid_params(format!("{} cannot cover it", req.from), None));
        }
        balances.insert(req.from.clone(), from - req.amount_cents);
        *balances.entry(req.to.clone()).or_insert(0) += req.amount_cents;
        let n = self.payments.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Json(Receipt {
            payment_id: format!("pay_{n}"),
            invoice_id: req.invoice_id,
            amount_cents: req.amount_cents,
        }))
    }

    // MCP clients know this tool as `refundOrder`: that is its name in idem too, in its keys
    // (`idem key --tool refundOrder …`), its records and its hints.
    #[tool(
        name = "refundOrder",
        description = "Refund a card order to an account; refunding the same order again \
                       returns the first refund"
    )]
    #[idem::idempotent(scope = "order_id")]
    async fn refund_order(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<RefundRequest>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut balances = self.balances.lock().expect("no panic holds the lock");
        let Some(balance) = balances.get_mut(&req.account) else {
            return Err(ErrorData::invalid_params(format!("no account {}", req.account), None));
        };
        *balance += req.amount_cents;
        let n = self.refunds.fetch_add(1, Ordering::SeqCst) + 1;
        let text = format!("refund_{n}: {} cents for {}", req.amount_cents, req.order_id);
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    // Opening an account only adds one: `destructive = false` tells MCP clients so. The request
    // id keys it, and is kept for a week, longer than any client retries one request.
    #[tool(description = "Open a new, empty account; the same request opens one account")]
    #[idem::idempotent(scope = "request_id", destructive = false, ttl = "7d")]
    async fn open_account(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<OpenAccountRequest>,
    ) -> Result<Json<Opened>, ErrorData> {
        let n = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
        let account = format!("acct-{}-{n}", req.owner);
        self.balances.lock().expect("no panic holds the lock").insert(account.clone(), 0);
        Ok(Json(Opened { account }))
    }

    #[tool(description = "Delete an account and its history")]
    #[idem::write]
    async fn delete_account(
        &self,
        Parameters(req): Parameters<AccountRequest>,
    ) -> Result<CallToolResult, ErrorData> {
        let removed = self.balances.lock().expect("no panic holds the lock").remove(&req.account);
        match removed {
            Some(_) => Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                "deleted {}",
                req.account
            ))])),
            None => Err(ErrorData::invalid_params(format!("no account {}", req.account), None)),
        }
    }
}

impl Default for Bank {
    fn default() -> Self {
        Bank::new()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bank {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "A toy bank: send_payment pays an invoice once, however often called.",
        )
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // stdout carries the protocol; anything for a person goes to stderr.
    eprintln!(
        "mcp_server: serving MCP on stdio; idem store at {}",
        idem::default_store_path().display()
    );
    let service = Bank::new().serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
