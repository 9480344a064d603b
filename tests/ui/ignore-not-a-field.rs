#![allow(unused_variables)]

#[derive(serde::Serialize)]
pub struct Email {
    pub to: String,
    pub subject: String,
    pub body: String,
}

struct Parameters<T>(T);

#[idem::idempotent(scope = "to", ignore = ["subject", "bdy"])]
fn send_email(#[idem(flatten)] Parameters(email): Parameters<Email>) -> Result<(), String> {
    Ok(())
}

fn main() {}
