#![allow(unused_variables)]

#[derive(serde::Serialize)]
pub struct PaymentRequest {
    pub invoice_id: String,
    pub amount: u64,
}

struct Parameters<T>(T);

#[idem::idempotent(scope = "invoice")]
fn send_payment(
    #[idem(flatten)] Parameters(req): Parameters<PaymentRequest>,
) -> Result<u64, String> {
    Ok(req.amount)
}

fn main() {}
