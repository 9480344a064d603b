#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[idem::write]
fn send_fax(to: &str) -> Result<(), PayError> {
    Ok(())
}

fn main() {
    let _ = idem::retry!(send_fax("+1 555 0100"));
}
