//! idem's outcomes as MCP tool results rather than JSON-RPC errors.
//!
//! MCP keeps two kinds of failure apart: a protocol error (an unknown tool, a malformed request)
//! is for the client, and a tool result with `isError: true` is for the model, which reads it and
//! decides what to do next. rmcp sends a tool's `Err(ErrorData)` as a protocol error, so a model
//! whose tool returns `Result<Json<T>, ErrorData>` never learns that a payment may already have
//! happened, and calls again. The routes are wrapped here so that an `ErrorData` made from an
//! idem [`Error`](crate::Error) (its `data.idem` names the kind) comes back as a tool result: a
//! text that tells the model what to do, and the same `data` as `structuredContent`.

use std::sync::Arc;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::MaybeSend;
use rmcp::ErrorData;

/// Wraps every route of `router` so that the idem errors its tools return reach the client as
/// tool results with `isError: true`; every other error is left as it is. Wrapping twice is
/// harmless: the outer wrapper sees results, not errors.
pub(super) fn report_to_the_model<S: MaybeSend + 'static>(router: &mut ToolRouter<S>) {
    for route in router.map.values_mut() {
        let call = Arc::clone(&route.call);
        *route = ToolRoute::new_dyn(route.attr.clone(), move |context| {
            let tool = context.name.clone();
            let running = call(context);
            Box::pin(async move {
                running.await.or_else(|error| match tool_result(&tool, &error) {
                    Some(result) => Ok(result.into()),
                    None => Err(error),
                })
            })
        });
    }
}

/// The tool result that tells the model about the idem error in `error`, or `None` when
/// `error` is not one of idem's (no `data.idem.error`).
pub(crate) fn tool_result(tool: &str, error: &ErrorData) -> Option<CallToolResult> {
    let data = error.data.as_ref()?;
    let idem = data.get("idem")?;
    let kind = idem.get("error")?.as_str()?;
    let key = idem.get("key").and_then(|key| key.as_str()).unwrap_or("none");
    let retryable = idem.get("retryable").and_then(|r| r.as_bool()).unwrap_or(false);
    let status = idem.get("status").and_then(|status| status.as_u64());
    let next = what_to_do(tool, kind, key, retryable, status, &error.message);
    let details = format!("For the operator: {}", error.message);
    let mut result =
        CallToolResult::error(vec![ContentBlock::text(next), ContentBlock::text(details)]);
    result.structured_content = Some(data.clone());
    Some(result)
}

/// What the model should do next, by the error's kind: wait, call again unchanged, or stop and
/// tell the user. Never "try other arguments" for an effect that may have happened: that is how
/// a retry becomes a second payment. The kinds are idem's own ([`Error::kind`]) and those of
/// idem-reqwest's errors (`not-landed`, `may-have-landed`, `other-intent`, `outside-call`,
/// `cannot-tell`), which carry the vendor's `status` when it answered.
///
/// [`Error::kind`]: crate::Error::kind
fn what_to_do(
    tool: &str,
    kind: &str,
    key: &str,
    retryable: bool,
    status: Option<u64>,
    message: &str,
) -> String {
    match kind {
        "in-doubt" => format!(
            "Do not call `{tool}` again for this request, with these or with other arguments: \
             an earlier attempt was interrupted, and its effect may or may not have happened. \
             An operator has to check and settle it (idem key {key}); that is not for you to \
             do. Tell the user that the outcome is not known yet and is being checked."
        ),
        "in-flight" => format!(
            "Another call of `{tool}` with the same intent (idem key {key}) is still running. \
             Wait, then call `{tool}` again with the same arguments to get its answer; do not \
             change the arguments to get around this, which would do the work twice."
        ),
        "shared-tool-name" => format!(
            "`{tool}` did not run: on the server, two functions share this tool name (idem key \
             {key}). Do not retry; tell the user that the server needs fixing."
        ),
        "replay" => format!(
            "`{tool}` already ran for this request (idem key {key}), but its recorded answer \
             cannot be read back. Do not call it again; tell the user that an operator has to \
             fix the record."
        ),
        "result" => format!(
            "`{tool}` ran and its effect may have happened, but its answer could not be \
             recorded, so it is in doubt (idem key {key}). Do not call it again, with these or \
             with other arguments; tell the user that the outcome is being checked."
        ),
        "superseded" => format!(
            "`{tool}` ran, but while it ran the same request was taken over elsewhere (idem key \
             {key}), and its answer was not recorded: its effect may have happened twice. Do not \
             call it again; tell the user that an operator has to check the outcome."
        ),
        "awaiting-approval" => format!(
            "`{tool}` did not run: a person must approve this exact request first (idem key \
             {key}), and has not decided yet. Tell the user that it awaits their approval. Once \
             it is approved, call `{tool}` again with exactly the same arguments and it runs \
             once; calling it with other arguments is a new request, which needs its own \
             approval, so do not change them to get around this."
        ),
        "denied" => format!(
            "`{tool}` did not run and will not: a person denied this request (idem key {key}): \
             {message}. Do not call `{tool}` again for it, with these or with other arguments \
             to get around the decision; tell the user it was denied and why."
        ),
        "not-landed" if retryable => format!(
            "`{tool}` did not take effect: {why}, so nothing happened (idem key {key} is \
             released). Call `{tool}` again with the same arguments in a while; if it keeps \
             failing, tell the user.",
            why = match status {
                Some(code) => format!("the vendor asked to wait (it answered {code})"),
                None => "its request cannot have reached the vendor".to_owned(),
            }
        ),
        "not-landed" => format!(
            "The vendor refused `{tool}`'s request{answered}, so nothing happened (idem key {key} \
             is released). Calling again with the same arguments gets the same answer: read the \
             vendor's reason below, change the argument it objects to if that is yours to \
             change, or else tell the user.",
            answered = status.map(|code| format!(" (it answered {code})")).unwrap_or_default()
        ),
        "may-have-landed" | "cannot-tell" => format!(
            "`{tool}`'s request may have reached the vendor, but no usable answer came back, so \
             it is not known whether it took effect (idem key {key}). Do not call `{tool}` again \
             for this request, with these or with other arguments: that could do it twice. Tell \
             the user that the outcome is not known yet and is being checked."
        ),
        "other-intent" => format!(
            "The vendor already holds a different request under `{tool}`'s idem key {key}, so \
             something was done for this request before. Do not call `{tool}` again for it; \
             tell the user that an operator has to check what the vendor holds."
        ),
        "outside-call" => format!(
            "`{tool}` did not send its request: the server sends a keyed request from outside an \
             idempotent call, which is a fault in the server. Do not retry; tell the user that \
             the server needs fixing."
        ),
        "key-reused" => format!(
            "`{tool}` did not run: the idempotency key sent with this call was already used for \
             a `{tool}` call with other arguments (idem key {key}). A key names one request. To \
             retry that request, send its arguments unchanged; for a new request, send a new \
             key. Never reuse a key to get around this."
        ),
        "key" => format!(
            "`{tool}` did not run: its arguments cannot identify the request ({message}). \
             Change the argument that was refused, then call again."
        ),
        "store" if retryable => format!(
            "`{tool}` did not run: the server could not reach its record of calls. Call `{tool}` \
             again with the same arguments in a while; if it keeps failing, tell the user."
        ),
        "store" => format!(
            "`{tool}` did not run: the server's record of calls cannot be used. Do not retry; \
             tell the user that the server needs fixing."
        ),
        _ => format!("`{tool}` failed: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn an_idem_error_becomes_a_tool_result_that_says_what_to_do() {
        let key = "82e1e1a327aa97bb3929e05cc4ca3bd5";
        let error = Error::InDoubt {
            key: key.into(),
            tool: "send_payment".into(),
            since_ms: 0,
            reason: None,
        };
        let data = ErrorData::from(error);
        let result = tool_result("send_payment", &data).expect("an idem error");
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            result.structured_content,
            Some(serde_json::json!({
                "idem": { "error": "in-doubt", "key": key, "retryable": false }
            }))
        );
        let text = serde_json::to_string(&result.content).unwrap();
        assert!(text.contains("Do not call `send_payment` again"), "{text}");
        assert!(text.contains(key), "{text}");
    }

    #[test]
    fn each_outcome_tells_the_model_whether_to_wait_call_again_or_stop() {
        let key = "82e1e1a327aa97bb3929e05cc4ca3bd5";
        let in_flight = Error::InFlight { key: key.into(), tool: "pay".into(), since_ms: 0 };
        let shared = Error::SharedToolName {
            key: key.into(),
            tool: "pay".into(),
            recorded: "a::pay".into(),
            calling: "b::pay".into(),
        };
        let lasting = Error::Store {
            key: None,
            tool: None,
            source: crate::error::StoreError::new("cannot create").lasting(),
        };
        let passing =
            Error::Store { key: None, tool: None, source: crate::error::StoreError::new("down") };
        for (error, told) in [
            (in_flight, "Wait, then call `pay` again with the same arguments"),
            (shared, "Do not retry"),
            (lasting, "Do not retry"),
            (passing, "again with the same arguments in a while"),
        ] {
            let kind = error.kind();
            let result = tool_result("pay", &ErrorData::from(error)).expect("an idem error");
            assert_eq!(result.is_error, Some(true), "{kind}");
            assert_eq!(result.structured_content.as_ref().unwrap()["idem"]["error"], kind);
            let text = serde_json::to_string(&result.content).unwrap();
            assert!(text.contains(told), "{kind}: {text}");
        }
    }

    #[test]
    fn a_vendors_answer_tells_the_model_whether_calling_again_can_help() {
        use serde_json::json;
        let data = |kind: &str, retryable: bool, status: Option<u16>| {
            let idem = serde_json::json!({
                "error": kind, "key": "k1", "retryable": retryable, "status": status,
            });
            ErrorData::internal_error(
                "POST https://vendor.example failed",
                Some(json!({ "idem": idem })),
            )
        };
        for (error, told) in [
            (data("not-landed", true, None), "cannot have reached the vendor"),
            (data("not-landed", true, Some(429)), "asked to wait (it answered 429)"),
            (data("not-landed", false, Some(400)), "gets the same answer"),
            (data("may-have-landed", false, None), "Do not call `pay` again"),
            (data("other-intent", false, Some(422)), "a different request"),
            (data("outside-call", false, None), "Do not retry"),
        ] {
            let result = tool_result("pay", &error).expect("an idem-reqwest error");
            assert_eq!(result.is_error, Some(true));
            let text = serde_json::to_string(&result.content).unwrap();
            assert!(text.contains(told), "{text}");
            assert!(text.contains("POST https://vendor.example failed"), "the operator's details");
        }
    }

    #[test]
    fn other_errors_stay_errors() {
        let mine = ErrorData::invalid_params("no account acct-9", None);
        assert!(tool_result("get_balance", &mine).is_none());
        let other_data = ErrorData::internal_error("boom", Some(serde_json::json!({"x": 1})));
        assert!(tool_result("get_balance", &other_data).is_none());
    }
}
