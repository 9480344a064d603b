#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[idem::idempotent(scope = "order_id", approval_ttl = "1h", approve_wait = "5m")]
fn refund(amount: u64, order_id: &str) -> Result<String, PayError> {
    Ok(String::new())
}

fn main() {}
