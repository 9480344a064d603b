#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

#[idem::idempotent(scope = "order_id")]
fn charge_card(amount: u64, order_id: &str) -> Result<u64, PayError> {
    Ok(amount)
}

fn main() {}
