#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

use std::future::Future;
use std::pin::Pin;

async fn post_charge(amount: u64) -> Result<u64, PayError> {
    Ok(amount)
}

#[idem::idempotent(scope = "order_id")]
fn charge_card(amount: u64, order_id: &str) -> Pin<Box<dyn Future<Output = Result<u64, PayError>>>> {
    Box::pin(post_charge(amount))
}

fn main() {}
