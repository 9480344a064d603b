//! A tool in a module of its own name (`mod charge; pub use charge::charge;`), a common layout:
//! it compiles, is classified through the module, and through the re-export once its companion
//! is re-exported with it.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

mod charge {
    #[idem::idempotent(scope = "order_id")]
    pub fn charge(amount: u64, order_id: &str) -> Result<u64, crate::PayError> {
        let _ = order_id;
        Ok(amount)
    }
}
pub use charge::charge;

mod refund {
    #[idem::read]
    pub fn refund(id: u32) -> Result<u32, crate::PayError> {
        Ok(id)
    }
}
pub use refund::{__idem_tool_refund, refund};

fn main() {
    let _ = charge(1, "o-1");
    let _ = idem::retry!(charge::charge(1, "o-1"));
    let _ = idem::retry!(self::charge::charge(1, "o-1"));
    let _ = idem::retry!(refund(1));
    const CHARGE: idem::ToolInfo = idem::tool_info!(charge::charge);
    const REFUND: idem::ToolInfo = idem::tool_info!(refund);
    let _ = (CHARGE, REFUND);
}
