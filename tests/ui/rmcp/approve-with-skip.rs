// An rmcp `#[tool]` under `#[idem::tools]` with `approve` and an input left out of the key: a
// request context that rmcp passes beside the arguments.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};

#[derive(serde::Serialize, serde::Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Account {
    pub account: String,
}

#[derive(Clone)]
pub struct Accounts {
    pub tool_router: ToolRouter<Accounts>,
}

#[idem::tools]
#[tool_router]
impl Accounts {
    #[tool(description = "Delete an account")]
    #[idem::idempotent(scope = "account", approve)]
    async fn delete_account(
        &self,
        #[idem(skip)] context: RequestContext<RoleServer>,
        #[idem(flatten)] Parameters(req): Parameters<Account>,
    ) -> Result<String, ErrorData> {
        let _ = context;
        Ok(format!("deleted {}", req.account))
    }
}

fn main() {}
