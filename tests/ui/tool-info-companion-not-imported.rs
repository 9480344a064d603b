#![allow(unused_variables)]

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
        Ok(amount)
    }
}

// The function alone: its classification stays in `charge`.
pub use charge::charge;

fn main() {
    let _ = idem::tool_info!(charge);
}
