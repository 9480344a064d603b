#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[idem::idempotent(scope = "order", wait = "soon", in_doubt = "maybe")]
const fn charge_card(amount: u64, order_id: &str) -> u64 {
    amount
}

fn main() {}
