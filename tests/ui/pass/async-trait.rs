//! A trait impl under `#[async_trait]`, which rewrites the body into
//! `Box::pin(async move { … })` before the attribute sees it.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[async_trait::async_trait]
pub trait Charger {
    async fn charge(&self, amount: u64, order_id: &str) -> Result<u64, PayError>;
}

pub struct Stripe;

#[async_trait::async_trait]
impl Charger for Stripe {
    #[idem::idempotent(scope = "order_id")]
    async fn charge(&self, amount: u64, order_id: &str) -> Result<u64, PayError> {
        let _ = order_id;
        if amount == 0 {
            return Err(PayError);
        }
        Ok(amount)
    }
}

fn assert_send<F: std::future::Future + Send>(_: F) {}

fn main() {
    assert_send(Stripe.charge(1, "o-1"));
}
