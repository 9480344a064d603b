#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Bank;

impl Bank {
    #[idem::read]
    pub fn balance(&self) -> Result<u64, PayError> {
        Ok(0)
    }
}

fn main() {
    let _ = idem::retry!(Bank.balance());
}
