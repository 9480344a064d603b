//! A tool's result as the engine keeps it: how it is written to the record and read back
//! ([`Codec`]), and whether its JSON says the call failed ([`reports_failure`]).

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Error;

/// How the engine turns a tool's `Ok` value into stored JSON and back, and an idem [`Error`]
/// into the tool's error type: plain function pointers, so that the engine's futures carry no
/// trait bounds on either type.
#[doc(hidden)]
pub struct Codec<T, E> {
    /// The value as JSON text.
    pub encode: fn(&T) -> serde_json::Result<String>,
    /// A stored value read back.
    pub decode: fn(&str) -> serde_json::Result<T>,
    /// An idem error in the tool's error type.
    pub error: fn(Error) -> E,
}

impl<T, E> Clone for Codec<T, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T, E> Copy for Codec<T, E> {}

impl<T: Serialize + DeserializeOwned, E: From<Error>> Codec<T, E> {
    /// The codec of a type that is `Serialize + DeserializeOwned` and an error with
    /// `From<Error>`.
    pub fn serde() -> Self {
        Codec {
            encode: |value| serde_json::to_string(value),
            decode: |json| serde_json::from_str(json),
            error: E::from,
        }
    }
}

/// Whether a result's JSON says the call failed: an MCP tool result with `isError: true` (rmcp's
/// `CallToolResult::error`), which is how a tool tells the model of an error it may act on. Such
/// a result is the body's error, not its effect's record: the engine does not record it (the
/// key is released, or left in doubt when the body said the effect may have landed), so that a
/// later call runs the body again rather than replay the error for ever.
pub(crate) fn reports_failure(json: &str) -> bool {
    // Most results are not MCP tool results: a look for the field first, then a parse.
    if !json.contains("\"isError\"") {
        return false;
    }
    #[derive(serde::Deserialize)]
    struct ToolResult {
        #[serde(rename = "isError")]
        is_error: Option<bool>,
        content: Option<serde_json::Value>,
        #[serde(rename = "_meta")]
        meta: Option<serde_json::Map<String, serde_json::Value>>,
    }
    serde_json::from_str::<ToolResult>(json).is_ok_and(|result| {
        // A tool records an error as the intent's final answer only by saying so.
        let last = result.meta.as_ref().and_then(|meta| meta.get(FINAL_ERROR));
        result.is_error == Some(true) && result.content.is_some() && last != Some(&true.into())
    })
}

/// The `_meta` entry of an MCP tool result with `isError: true` that asks idem to record it as
/// the intent's answer (`idem::mcp::final_error`), replayed to every later call.
pub(crate) const FINAL_ERROR: &str = "io.idem/final";
