#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[idem::read(approve)]
fn get_balance(customer: &str) -> Result<u64, PayError> {
    Ok(0)
}

fn main() {}
