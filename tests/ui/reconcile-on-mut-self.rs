#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Payments {
    sent: u32,
}

#[idem::tools]
impl Payments {
    fn find_charge(&self, key: &idem::Key) -> Result<idem::Reconciled<String>, String> {
        Ok(idem::Reconciled::CannotTell)
    }

    #[idem::idempotent(scope = "order_id", reconcile = "find_charge")]
    fn charge_card(&mut self, order_id: &str) -> Result<String, PayError> {
        self.sent += 1;
        Ok("ch_1".into())
    }
}

fn main() {}
