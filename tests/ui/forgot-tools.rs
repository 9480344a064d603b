#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Bank;

// No `#[idem::tools]` on the block: a method taking `self` gets no classification from its
// attribute alone, since the attribute cannot tell an inherent impl from a trait impl.
impl Bank {
    #[idem::read]
    pub fn balance(&self, account: &str) -> Result<u64, PayError> {
        Ok(0)
    }
}

pub trait Tool {
    fn call(&self, account: &str) -> Result<u64, PayError>;
}

// Nor on a trait impl.
impl Tool for Bank {
    #[idem::read]
    fn call(&self, account: &str) -> Result<u64, PayError> {
        Ok(0)
    }
}

fn main() {
    let bank = Bank;
    let _ = idem::tool_info!(Bank::balance);
    let _ = idem::retry!(Bank::balance(&bank, "acct-1"));
    let _ = idem::tool_info!(<Bank as Tool>::call);
}
