#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Charge {
    pub id: String,
}

#[idem::idempotent(scope = "order_id")]
fn charge_card(amount: u64, order_id: &str) -> Result<Charge, PayError> {
    Ok(Charge { id: format!("{order_id}-{amount}") })
}

fn main() {}
