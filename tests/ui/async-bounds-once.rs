//! An async tool with a result that is not Serialize and an error with no From<idem::Error>:
//! each unmet bound is reported once, in idem's words, and never again at the attribute.
#![allow(unused_variables)]

pub struct Charge {
    pub id: String,
}

#[derive(Debug)]
pub struct PayError;

#[idem::idempotent(scope = "order_id")]
async fn charge_card(amount: u64, order_id: &str) -> Result<Charge, PayError> {
    Ok(Charge { id: format!("{order_id}-{amount}") })
}

fn main() {}
