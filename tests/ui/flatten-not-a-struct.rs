#![allow(unused_variables)]

struct Parameters<T>(T);

#[idem::idempotent(scope = "invoice_id")]
fn send_payment(#[idem(flatten)] amount: u64, invoice_id: &str) -> Result<u64, String> {
    Ok(amount)
}

#[idem::idempotent(scope = "invoice_id")]
fn refund(
    #[idem(flatten)] Parameters(ids): Parameters<Vec<String>>,
    invoice_id: &str,
) -> Result<u64, String> {
    Ok(0)
}

fn main() {}
