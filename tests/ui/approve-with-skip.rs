// `approve` with parameters left out of the key: what the body receives from them is not what a
// person approved. One error per skipped parameter; the skipped scope is refused on its own.

#![allow(unused_variables)]

pub struct Mailer;

#[idem::idempotent(scope = "to", approve)]
fn send_email(
    #[idem(skip)] mailer: &Mailer,
    to: &str,
    #[idem(skip)] body: String,
) -> Result<(), String> {
    Ok(())
}

fn main() {}
