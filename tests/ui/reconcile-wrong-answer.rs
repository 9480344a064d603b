#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

// Answers with the charge itself, not with whether it landed.
async fn find_charge(key: &idem::Key) -> Result<String, String> {
    Ok("ch_1".into())
}

#[idem::idempotent(scope = "order_id", reconcile = "find_charge")]
async fn charge_card(amount: u64, order_id: &str) -> Result<String, PayError> {
    Ok("ch_1".into())
}

fn main() {}
