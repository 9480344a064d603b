#![allow(unused_variables)]

#[idem::idempotent(scope = "to", ignore = ["body"])]
fn send_email(to: &str, body: &str) -> Result<(), String> {
    Ok(())
}

fn main() {}
