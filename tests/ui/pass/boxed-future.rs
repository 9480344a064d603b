//! The shape rmcp's `#[tool]` writes: a plain fn returning a boxed future whose body is
//! `Box::pin(async move { … })`.
use std::future::Future;
use std::pin::Pin;
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct Server;

impl Server {
    #[idem::idempotent(scope = "order_id")]
    pub fn charge(&self, amount: u64, order_id: String) -> Pin<Box<dyn Future<Output = Result<u64, PayError>> + Send + '_>> {
        Box::pin(async move {
            let _ = (self, &order_id);
            Ok(amount)
        })
    }
}

#[idem::idempotent(scope = "order_id")]
pub fn charge_free(amount: u64, order_id: String) -> Pin<Box<dyn Future<Output = Result<u64, PayError>> + Send>> {
    std::boxed::Box::pin(async move {
        let _ = order_id;
        Ok(amount)
    })
}

fn main() {
    let _ = Server.charge(1, "o-1".to_owned());
    let _ = charge_free(1, "o-1".to_owned());
}
