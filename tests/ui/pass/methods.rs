//! Methods taking `&self` and `&mut self` (never part of the key), sync and async, and
//! associated functions naming `Self`.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Payments {
    pub charged: u64,
}

impl Payments {
    #[idem::idempotent(scope = "order_id")]
    pub async fn charge(&self, amount: u64, order_id: &str) -> Result<u64, PayError> {
        Ok(self.charged + amount + order_id.len() as u64)
    }

    #[idem::idempotent(scope = "order_id")]
    pub fn refund(&mut self, amount: u64, order_id: String) -> Result<u64, PayError> {
        self.charged -= amount;
        let _ = order_id;
        Ok(self.charged)
    }

    #[idem::read]
    pub fn open(name: &str) -> Result<Self, PayError> {
        let _ = name;
        Ok(Payments { charged: 0 })
    }

    #[idem::write]
    pub fn reset(&mut self) -> Result<(), PayError> {
        self.charged = 0;
        Ok(())
    }
}

fn assert_send<F: std::future::Future + Send>(_: F) {}

fn main() {
    let payments = Payments { charged: 0 };
    assert_send(payments.charge(1, "o-1"));
}
