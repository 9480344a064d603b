//! A `fn` returning `impl Future<Output = Result<…>>` is wrapped like an `async fn`.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

use std::future::Future;

#[idem::idempotent(scope = "order_id")]
pub fn charge(amount: u64, order_id: String) -> impl Future<Output = Result<u64, PayError>> + Send {
    async move {
        let _ = order_id;
        Ok(amount)
    }
}

async fn post(amount: u64) -> Result<u64, PayError> {
    Ok(amount)
}

#[idem::idempotent(scope = "order_id")]
pub fn forward<'a>(amount: u64, order_id: &'a str) -> impl Future<Output = Result<u64, PayError>> + 'a {
    let _ = order_id;
    post(amount)
}

fn assert_send<F: Future + Send>(_: F) {}

fn main() {
    assert_send(charge(1, "o-1".to_owned()));
    let _ = forward(1, "o-1");
}
