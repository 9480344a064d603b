//! `#[cfg]` on parameters, kept and compiled out, on sync and async tools and beside a skipped
//! one: each key parameter is used only where it exists.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[idem::idempotent(scope = "id")]
pub fn f(
    id: u64,
    #[cfg(any())] gone: String,
    kept: u8,
    #[cfg_attr(all(), cfg(any()))] gone_too: String,
    #[cfg_attr(any(), cfg(any()))] kept_too: u8,
) -> Result<u8, PayError> {
    Ok(kept)
}

#[idem::idempotent(scope = "id")]
pub async fn g(
    #[cfg(all())] present: bool,
    id: u64,
    #[cfg(any())]
    #[idem(skip)]
    skipped_and_gone: String,
    #[cfg(any())] gone: Vec<u8>,
) -> Result<bool, PayError> {
    Ok(present)
}

#[idem::read]
pub fn h(#[cfg(any())] gone: String, id: u64) -> Result<u64, PayError> {
    Ok(id)
}

fn main() {
    let _ = f(1, 2, 3);
    let _ = g(true, 1);
    let _ = h(1);
}
