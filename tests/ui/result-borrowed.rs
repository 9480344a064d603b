#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[idem::idempotent(scope = "order_id")]
fn charge_card(amount: u64, order_id: &str) -> Result<&'static str, PayError> {
    Ok("charged")
}

fn main() {}
