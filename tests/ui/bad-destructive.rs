#[derive(Debug)]
pub struct ShopError;

impl From<idem::Error> for ShopError {
    fn from(_: idem::Error) -> Self {
        ShopError
    }
}

// `destructive` takes `true` or `false`, not a word in a string.
#[idem::idempotent(scope = "order_id", destructive = "no")]
fn create_order(order_id: &str) -> Result<String, ShopError> {
    Ok(order_id.to_owned())
}

fn main() {}
