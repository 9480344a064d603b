#![allow(unused_variables)]

#[derive(serde::Serialize)]
pub struct PaymentRequest {
    pub invoice_id: String,
}

#[idem::idempotent(scope = "invoice_id")]
fn send_payment(#[idem(flatten)] req: PaymentRequest, note: &str) -> Result<u64, String> {
    Ok(0)
}

fn main() {}
