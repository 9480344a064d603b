#![allow(unused_variables)]

#[derive(Debug)]
pub struct FaxError;

impl From<idem::Error> for FaxError {
    fn from(_: idem::Error) -> Self {
        FaxError
    }
}

fn find_fax(key: &idem::Key) -> Result<idem::Reconciled<()>, String> {
    Ok(idem::Reconciled::CannotTell)
}

#[idem::write(reconcile = "find_fax")]
fn send_fax(to: &str, body: &str) -> Result<(), FaxError> {
    Ok(())
}

fn main() {}
