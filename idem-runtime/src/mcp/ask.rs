//! Asking the person at the MCP client whether a call that awaits approval may run
//! (elicitation), and recording the answer as `idem approve` or `idem deny` would.
//!
//! A client that supports form elicitation shows the person the tool and its exact arguments
//! and asks for a yes or no, with an optional note. Yes approves the key and the call runs at
//! once (the route is called again with the same arguments, and runs the body once); no denies
//! it with the note; dismissing the question leaves the key awaiting a decision, and the model
//! reads that it awaits approval, as with a client that cannot ask.

use std::sync::Arc;

use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::schemars::JsonSchema;
use rmcp::service::{ElicitationError, ElicitationMode, MaybeSend, Peer, RoleServer};
use rmcp::ErrorData;
use serde::Deserialize;
use serde_json::Value;

use crate::admin;
use crate::key::Key;
use crate::lifecycle::transition::Decision;
use crate::lifecycle::Status;
use crate::store::Store;

/// What the person answers.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct Answer {
    /// Approve this exact request?
    approve: bool,
    /// Why (kept in the request's history)
    #[serde(default)]
    note: String,
}

rmcp::elicit_safe!(Answer);

/// Wraps every route of `router` so that a call that comes back awaiting approval asks the
/// person at the MCP client, when the client supports form elicitation, and records their
/// answer in `store` (the store the tools use) as `idem approve` or `idem deny` would, by "the
/// user of MCP client NAME". Apply it after [`super::annotate`] or before: it reads the awaiting
/// approval either as idem's error or as the tool result `annotate` made of it.
///
/// ```text
/// let router = idem::mcp::ask_for_approval(
///     idem::mcp::annotate(Self::tool_router(), Self::idem_tools()),
///     idem::default_store()?,
/// );
/// ```
pub fn ask_for_approval<S: MaybeSend + 'static>(
    mut router: ToolRouter<S>,
    store: Arc<dyn Store>,
) -> ToolRouter<S> {
    for route in router.map.values_mut() {
        let call = Arc::clone(&route.call);
        let store = Arc::clone(&store);
        *route = ToolRoute::new_dyn(route.attr.clone(), move |context| {
            let (call, store) = (Arc::clone(&call), Arc::clone(&store));
            let service = context.service;
            let request_context = context.request_context.clone();
            let (name, arguments) = (context.name.clone(), context.arguments.clone());
            let running = call(context);
            Box::pin(async move {
                let outcome = running.await;
                let Some(key) = awaiting(&outcome) else { return outcome };
                let peer = request_context.peer.clone();
                if !ask(&peer, &store, &key, &name, arguments.as_ref()).await {
                    return outcome;
                }
                // Decided: the same call again runs the approved body once, or reads the denial.
                let mut params = CallToolRequestParams::new(name);
                if let Some(arguments) = arguments {
                    params = params.with_arguments(arguments);
                }
                call(ToolCallContext::new(service, params, request_context)).await
            })
        });
    }
    router
}

/// The key of a call that came back awaiting approval, as idem's error or as the tool result
/// `annotate` made of it.
fn awaiting(outcome: &Result<CallToolResponse, ErrorData>) -> Option<Key> {
    let data = match outcome {
        Err(error) => error.data.as_ref()?,
        Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
            result.structured_content.as_ref()?
        }
        Ok(_) => return None,
    };
    let idem = data.get("idem")?;
    if idem.get("error")?.as_str()? != Status::AwaitingApproval.as_str() {
        return None;
    }
    Key::parse(idem.get("key")?.as_str()?).ok()
}

/// Asks the person at the client about `key` and records their answer; whether a decision was
/// recorded (by them, or by someone else meanwhile).
async fn ask(
    peer: &Peer<RoleServer>,
    store: &Arc<dyn Store>,
    key: &Key,
    tool: &str,
    arguments: Option<&serde_json::Map<String, Value>>,
) -> bool {
    if !peer.supported_elicitation_modes().contains(&ElicitationMode::Form) {
        return false;
    }
    let arguments =
        arguments.map_or_else(|| "{}".to_owned(), |a| Value::Object(a.clone()).to_string());
    let message = format!(
        "The assistant asks to run `{tool}` with exactly these arguments: {arguments}. It needs \
         your approval (idem key {key}). Approve it?"
    );
    let (decision, note) = match peer.elicit::<Answer>(message).await {
        Ok(Some(Answer { approve, note })) => {
            let decision = if approve { Decision::Approve } else { Decision::Deny };
            (decision, Some(note).filter(|note| !note.trim().is_empty()))
        }
        Err(ElicitationError::UserDeclined) => {
            (Decision::Deny, Some("declined in the MCP client".to_owned()))
        }
        // Dismissed, or the client could not answer: the key still awaits a decision.
        Ok(None) | Err(_) => return false,
    };
    let client =
        peer.peer_info().map_or_else(|| "unknown".to_owned(), |info| info.client_info.name.clone());
    let by = format!("the user of MCP client {client}");
    let (store, key) = (Arc::clone(store), key.clone());
    let decided = tokio::task::spawn_blocking(move || {
        admin::decide(store.as_ref(), &key, decision, &by, note.as_deref())
    })
    .await;
    match decided {
        Ok(Ok(_)) => true,
        // Someone decided first (`idem approve` at the same moment): the call reads their word.
        Ok(Err(crate::error::Error::NotAwaitingApproval { .. })) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "idem: cannot record the MCP client's decision");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "idem: the MCP client's decision was not recorded");
            false
        }
    }
}
