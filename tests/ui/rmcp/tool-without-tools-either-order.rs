// rmcp `#[tool]`s classified by idem in `#[tool_router]` blocks that lack `#[idem::tools]`, with
// the attributes in either order: each fails to build, naming the method and the fix.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router, ErrorData};

#[derive(serde::Serialize, serde::Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Invoice {
    pub invoice_id: String,
}

#[derive(Clone)]
pub struct Bank {
    pub tool_router: ToolRouter<Bank>,
}

#[tool_router]
impl Bank {
    // The README's order: rmcp's `#[tool]` expands first and takes itself off the method.
    #[tool(description = "Pay an invoice once")]
    #[idem::idempotent(scope = "invoice_id")]
    async fn pay(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<Invoice>,
    ) -> Result<String, ErrorData> {
        Ok(format!("paid {}", req.invoice_id))
    }

    // The other order: ours sees `#[tool]` below it.
    #[idem::idempotent(scope = "invoice_id")]
    #[tool(description = "Refund an invoice once")]
    async fn refund(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<Invoice>,
    ) -> Result<String, ErrorData> {
        Ok(format!("refunded {}", req.invoice_id))
    }

    // A sync read, in the README's order.
    #[tool(description = "The balance, in cents")]
    #[idem::read]
    fn balance(&self) -> Result<String, ErrorData> {
        Ok("0".to_owned())
    }
}

#[derive(Clone)]
pub struct Vault<T> {
    pub tool_router: ToolRouter<Vault<T>>,
}

// A generic block, with a write named by `#[tool(name = …)]`.
#[tool_router]
impl<T: Send + Sync + 'static> Vault<T> {
    #[tool(name = "lockVault", description = "Lock the vault")]
    #[idem::write]
    fn lock(&self) -> Result<String, ErrorData> {
        Ok("locked".to_owned())
    }
}

fn main() {}
