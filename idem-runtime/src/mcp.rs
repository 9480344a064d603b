//! rmcp without glue (the `rmcp` feature): idem's errors as rmcp's `ErrorData`, the MCP
//! hints of an rmcp `ToolRouter` filled from idem's classification, and idem's outcomes sent to
//! the model as tool results (`mcp/tool_result.rs`).
//!
//! The `From` impl has to live here: `ErrorData` is rmcp's and [`Error`] is ours, so the orphan
//! rule allows it only in this crate (or in rmcp).

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{ErrorCode, ToolAnnotations};
use rmcp::ErrorData;

use crate::classify::ToolInfo;
use crate::error::Error;

mod ask;
mod client;
mod tool_result;

pub use self::ask::ask_for_approval;
pub use self::client::{
    IdempotentClient, Protection, ToolPolicy, IDEMPOTENCY_KEY_META, KEY_META, SCOPE_META,
};

/// Marks a tool result with `isError: true` as the final answer for its intent, to be recorded
/// and replayed to every later call with the same arguments (a vendor's "card declined" for this
/// exact charge). Without it, an error result is not recorded: it tells the model of a failure,
/// the key is released (or left in doubt, when the body said its effect may have landed), and a
/// later call runs the body again.
///
/// ```
/// use rmcp::model::{CallToolResult, ContentBlock};
///
/// let declined = CallToolResult::error(vec![ContentBlock::text("card declined")]);
/// let declined = idem_runtime::mcp::final_error(declined);
/// assert_eq!(declined.meta.unwrap().0["io.idem/final"], true);
/// ```
pub fn final_error(mut result: rmcp::model::CallToolResult) -> rmcp::model::CallToolResult {
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.insert(crate::engine::FINAL_ERROR.to_owned(), serde_json::Value::Bool(true));
    result.meta = Some(meta);
    result
}

impl From<Error> for ErrorData {
    /// Arguments that have no key (and a text that is not one) are the caller's to fix (`invalid_params`); everything else is
    /// the server's (`internal_error`). The message is idem's, which names the key and says what
    /// to do; `data` carries the key and the kind, so that a client or an operator can act on it
    /// without parsing the text.
    fn from(error: Error) -> Self {
        let code = match error {
            Error::Key { .. } | Error::NotAKey { .. } => ErrorCode::INVALID_PARAMS,
            _ => ErrorCode::INTERNAL_ERROR,
        };
        let kind = error.kind();
        let mut data = serde_json::json!({
            "idem": { "error": kind, "key": error.key(), "retryable": error.is_retryable() }
        });
        // What a person decided reaches the model too: who denied the call, and why.
        if let Error::Denied { by, note, .. } = &error {
            data["idem"]["by"] = by.as_str().into();
            data["idem"]["note"] = note.as_deref().into();
        }
        ErrorData::new(code, error.to_string(), Some(data))
    }
}

/// What a tool's description says of a tool that may need a person's approval: MCP has no hint
/// for it, and a model that knows calls it with the arguments it means, once.
pub const NEEDS_APPROVAL: &str = "Needs a person's approval: a call may answer that it awaits \
     approval, and runs once a person approves exactly those arguments; other arguments are a \
     new request.";

/// Fills the MCP hints (`readOnlyHint`, `idempotentHint`, `destructiveHint`) that a route in
/// `router` leaves unset from idem's classification in `tools`, matched by tool name, and returns
/// the router. A hint the route sets (rmcp's `#[tool(annotations(…))]`) is kept, as are its
/// title and `openWorldHint`; routes idem does not classify are left as they are. A tool that
/// may need a person's approval ([`ToolInfo::approval`]) gets [`NEEDS_APPROVAL`] at the end of
/// its description, once.
///
/// A block under `#[idem::tools]` needs no call: the attribute writes the hints into each
/// method's `#[tool(annotations(…))]` itself, and passes the router `#[tool_router]` generates
/// through this function. This is for routers built by hand (routes added with `with_route`),
/// with the classification of their tools:
///
/// ```text
/// let router = idem::mcp::annotate(router, &[idem::tool_info!(refund)]);
/// ```
///
/// It also makes idem's outcomes reach the model: on every route of `router`, an error made
/// from an idem [`Error`] (in doubt, in flight elsewhere, a tool name shared by two functions,
/// a store that failed, …) is answered as a tool result with `isError: true` instead of a
/// JSON-RPC error, whatever the tool's return type: a text that tells the model what to do
/// (wait, call again unchanged, or stop and tell the user) and, as `structuredContent`, the
/// `data` of the error (`{"idem": {"error": kind, "key": …, "retryable": …}}`). Other errors,
/// and routes added to the router afterwards, are left as they are.
pub fn annotate<S: rmcp::service::MaybeSend + 'static>(
    mut router: ToolRouter<S>,
    tools: &[ToolInfo],
) -> ToolRouter<S> {
    for info in tools {
        let Some(route) = router.map.get_mut(info.name) else {
            continue;
        };
        let hints = info.annotations();
        let mut annotations = route.attr.annotations.take().unwrap_or_else(ToolAnnotations::new);
        annotations.read_only_hint.get_or_insert(hints.read_only_hint);
        annotations.idempotent_hint.get_or_insert(hints.idempotent_hint);
        annotations.destructive_hint.get_or_insert(hints.destructive_hint);
        route.attr.annotations = Some(annotations);
        if info.approval {
            let described = route.attr.description.as_deref().unwrap_or_default();
            if !described.contains(NEEDS_APPROVAL) {
                let joined = match described.trim_end() {
                    "" => NEEDS_APPROVAL.to_owned(),
                    text => format!("{text} {NEEDS_APPROVAL}"),
                };
                route.attr.description = Some(joined.into());
            }
        }
    }
    tool_result::report_to_the_model(&mut router);
    router
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idem_error_reaches_the_client_with_its_key_and_what_to_do() {
        let key = "82e1e1a327aa97bb3929e05cc4ca3bd5";
        let error = Error::InDoubt {
            key: key.into(),
            tool: "send_payment".into(),
            since_ms: 0,
            reason: None,
        };
        let message = error.to_string();
        let data = ErrorData::from(error);
        assert_eq!(data.code, ErrorCode::INTERNAL_ERROR);
        assert_eq!(data.message, message);
        assert!(data.message.contains("idem resolve"), "{}", data.message);
        assert_eq!(
            data.data,
            Some(serde_json::json!({
                "idem": { "error": "in-doubt", "key": key, "retryable": false }
            }))
        );

        let refused = ErrorData::from(Error::Key { tool: "t".into(), reason: "NaN".into() });
        assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "the caller's arguments to fix");
    }
}
