#[derive(Debug)]
pub struct ShopError;

impl From<idem::Error> for ShopError {
    fn from(_: idem::Error) -> Self {
        ShopError
    }
}

// A read changes nothing, so it is never destructive.
#[idem::read(destructive = false)]
fn get_order(order_id: &str) -> Result<String, ShopError> {
    Ok(order_id.to_owned())
}

fn main() {}
