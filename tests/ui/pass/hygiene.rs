#![allow(unused_variables, non_snake_case)]
//! Parameters and locals named like every binding and item the expansions introduce: the
//! expansion resolves its own names at the mixed site, so none of them collide.
#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

use std::sync::{Arc, LazyLock};

static STORE: LazyLock<Arc<dyn idem::Store>> =
    LazyLock::new(|| Arc::new(idem::SledStore::open("unused-in-this-test").unwrap()));

#[idem::idempotent(scope = "__idem_call", store = STORE, wait = "1s", ttl = "1h", in_doubt = "rerun")]
pub fn sync_tool(
    __idem_call: &str,
    __idem_args: Vec<u8>,
    __idem_body: u8,
    __idem_store: u8,
    __idem_ret: u8,
    __idem_lookup: u8,
    __idem_fallback: u8,
    info: u8,
    __IDEM_INFO: u8,
) -> Result<usize, PayError> {
    Ok(__idem_args.len() + usize::from(__idem_body + __idem_store + __idem_ret + info))
}

#[idem::idempotent(scope = "__idem_args")]
pub async fn async_tool(
    __idem_call: Vec<u8>,
    __idem_args: &str,
    __idem_body: u8,
    __idem_ret: u8,
) -> Result<usize, PayError> {
    Ok(__idem_call.len() + usize::from(__idem_body + __idem_ret))
}

#[idem::read]
pub fn get(__idem_call: u8) -> Result<u8, PayError> {
    Ok(__idem_call)
}

#[allow(non_upper_case_globals)]
const FOUND: u8 = 0;

mod __idem_lookup {}
mod __idem_fallback {}

fn main() {
    let __idem_call = 1;
    let info = 2;
    let _ = idem::retry!(get(__idem_call + info));
    const __IDEM_INFO: idem::ToolInfo = idem::tool_info!(get);
    let _ = (__IDEM_INFO, FOUND);
    let _ = async_tool(Vec::new(), "o-1", 1, 2);
}
