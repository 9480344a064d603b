#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

fn find_balance(key: &idem::Key) -> Result<idem::Reconciled<u64>, String> {
    Ok(idem::Reconciled::CannotTell)
}

#[idem::read(reconcile = "find_balance")]
fn get_balance(customer: &str) -> Result<u64, PayError> {
    Ok(0)
}

fn main() {}
