#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

// Takes the order, not the key: a reconciler is asked with the call's key only.
fn find_charge(order_id: &str) -> Result<idem::Reconciled<String>, String> {
    Ok(idem::Reconciled::CannotTell)
}

#[idem::idempotent(scope = "order_id", reconcile = "find_charge")]
fn charge_card(amount: u64, order_id: &str) -> Result<String, PayError> {
    Ok("ch_1".into())
}

fn main() {}
