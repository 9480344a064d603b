#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[idem::idempotent(scope = "order_id")]
async fn charge_card(amount: u64, order_id: &str) -> Result<u64, PayError> {
    let _ = order_id;
    Ok(amount)
}

pub struct Bank;

#[idem::tools]
impl Bank {
    #[idem::idempotent(scope = "invoice_id")]
    async fn pay(&self, invoice_id: &str) -> Result<u64, PayError> {
        let _ = invoice_id;
        Ok(1)
    }
}

async fn agent() -> Result<u64, PayError> {
    let charged = idem::retry!(charge_card(4200, "o-17"))?;
    let paid = idem::retry!(Bank::pay(&Bank, "inv-1"))?;
    Ok(charged + paid)
}

fn main() {
    let _ = agent();
}
