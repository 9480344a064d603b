//! Raw identifiers as parameters, fields, scope paths and function names: the key and the
//! classification use their plain names, and `scope` may name them either way.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

#[derive(serde::Serialize)]
pub struct Request {
    pub r#type: String,
    pub r#ref: u32,
}

#[idem::idempotent(scope = "r#type")]
pub fn charge(r#type: &str, r#in: u64) -> Result<u64, PayError> {
    let _ = r#type;
    Ok(r#in)
}

#[idem::idempotent(scope = "type")]
pub async fn charge_async(r#type: String, amount: u64) -> Result<u64, PayError> {
    let _ = r#type;
    Ok(amount)
}

#[idem::idempotent(scope = "req.type")]
pub fn by_field(req: Request) -> Result<u32, PayError> {
    Ok(req.r#ref)
}

#[idem::idempotent(scope = "r#req.r#type")]
pub fn by_raw_field(r#req: Request) -> Result<u32, PayError> {
    Ok(r#req.r#ref)
}

#[idem::read]
pub fn r#match(r#type: &str) -> Result<usize, PayError> {
    Ok(r#type.len())
}

fn main() {
    let _ = idem::retry!(r#match("card"));
    const MATCH: idem::ToolInfo = idem::tool_info!(r#match);
    const BY_FIELD: idem::ToolInfo = idem::tool_info!(by_raw_field);
    let _ = (MATCH, BY_FIELD);
}
