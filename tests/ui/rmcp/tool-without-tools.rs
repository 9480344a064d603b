// An rmcp `#[tool]` classified by idem in a `#[tool_router]` block that lacks `#[idem::tools]`.

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
    #[idem::idempotent(scope = "invoice_id")]
    #[tool(description = "Pay an invoice once")]
    async fn pay(
        &self,
        #[idem(flatten)] Parameters(req): Parameters<Invoice>,
    ) -> Result<String, ErrorData> {
        Ok(format!("paid {}", req.invoice_id))
    }
}

fn main() {}
