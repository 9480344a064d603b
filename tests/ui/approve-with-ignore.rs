// `approve` with fields of the argument object left out of the key: a person would approve one
// mail and another body could be sent under that approval. One error per ignored field.

#![allow(unused_variables)]

#[derive(serde::Serialize)]
pub struct Email {
    pub to: String,
    pub subject: String,
    pub body: String,
}

#[idem::idempotent(scope = "to", approve, ignore = ["subject", "body"])]
fn send_email(#[idem(flatten)] email: Email) -> Result<(), String> {
    Ok(())
}

fn main() {}
