// `approve_if` asks a person for some calls: those approvals must cover every input too.

#![allow(unused_variables)]

pub struct Bank;

#[derive(serde::Serialize)]
pub struct Refund {
    pub order_id: String,
    pub amount: u64,
    pub reason: String,
}

#[idem::idempotent(scope = "order_id", approve_if = "req.amount > 100", ignore = ["reason"])]
fn refund(#[idem(skip)] bank: &Bank, #[idem(flatten)] req: Refund) -> Result<(), String> {
    Ok(())
}

fn main() {}
