#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Card {
    pub number: String,
}

#[idem::idempotent(scope = "order_id")]
fn charge_card(card: Card, order_id: &str) -> Result<u64, PayError> {
    Ok(card.number.len() as u64)
}

fn main() {}
