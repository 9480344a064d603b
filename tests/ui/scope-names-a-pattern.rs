#![allow(unused_variables)]

#[derive(serde::Serialize)]
pub struct PaymentRequest {
    pub invoice_id: String,
}

struct Parameters<T>(T);

struct Bank;

impl Bank {
    #[idem::idempotent(scope = "req.invoice_id")]
    fn send_payment(&self, Parameters(req): Parameters<PaymentRequest>) -> Result<u64, String> {
        Ok(0)
    }
}

fn main() {}
