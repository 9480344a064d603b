#![allow(unused_variables)]

#[idem::idempotent(scope = "order_id")]
fn charge_card(amount: u64, order_id: &str) -> u64 {
    amount
}

fn main() {}
