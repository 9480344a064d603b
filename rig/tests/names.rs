//! Two rig tools in one module, both `call` under `#[idem::idempotent]`, keyed by the names rig
//! gives them (`<T as Tool>::NAME`): each runs and answers for itself, dispatched by rig itself.
//! Two impls that share a `NAME` share their keys, and the record says which wrote it, so the
//! second is refused with both named rather than handed the first one's result.

mod common;

use rig_core::effect::{EffectKind, Outcome};
use rig_core::serve::adapters::ToolAdapter;
use rig_core::serve::{serve_inline, ErasedHandler};
use rig_core::tool::{Tool, ToolContext};
use serde::{Deserialize, Serialize};

use common::store;

#[derive(Debug)]
pub struct TicketError(String);

impl std::fmt::Display for TicketError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TicketError {}

impl From<idem::Error> for TicketError {
    fn from(error: idem::Error) -> Self {
        TicketError(error.to_string())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TicketArgs {
    pub request_id: String,
}

fn ticket_parameters() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {"request_id": {"type": "string"}},
        "required": ["request_id"]
    })
}

/// The tools as the issue's user wrote them: no `tool = "…"`, which rig's `NAME` makes needless.
mod tickets {
    use super::*;

    pub struct OpenTicket;

    #[idem::tools]
    impl Tool for OpenTicket {
        const NAME: &'static str = "open_ticket";
        type Args = TicketArgs;
        type Output = String;
        type Error = TicketError;

        fn description(&self) -> String {
            "Opens a ticket".to_owned()
        }

        fn parameters(&self) -> serde_json::Value {
            ticket_parameters()
        }

        #[idem::idempotent(scope = "request_id", destructive = false)]
        async fn call(
            &self,
            #[idem(skip)] context: &mut ToolContext,
            #[idem(flatten)] args: TicketArgs,
        ) -> Result<String, TicketError> {
            let _ = context;
            Ok(format!("opened {}", args.request_id))
        }
    }

    pub struct CloseTicket;

    #[idem::tools]
    impl Tool for CloseTicket {
        const NAME: &'static str = "close_ticket";
        type Args = TicketArgs;
        type Output = String;
        type Error = TicketError;

        fn description(&self) -> String {
            "Closes a ticket".to_owned()
        }

        fn parameters(&self) -> serde_json::Value {
            ticket_parameters()
        }

        #[idem::idempotent(scope = "request_id")]
        async fn call(
            &self,
            #[idem(skip)] context: &mut ToolContext,
            #[idem(flatten)] args: TicketArgs,
        ) -> Result<String, TicketError> {
            let _ = context;
            Ok(format!("closed {}", args.request_id))
        }
    }

    /// Two more tools that share one `NAME` by mistake.
    pub struct Escalate;
    pub struct Reassign;

    #[idem::tools]
    impl Tool for Escalate {
        const NAME: &'static str = "route_ticket";
        type Args = TicketArgs;
        type Output = String;
        type Error = TicketError;

        fn description(&self) -> String {
            "Escalates a ticket".to_owned()
        }

        fn parameters(&self) -> serde_json::Value {
            ticket_parameters()
        }

        #[idem::idempotent(scope = "request_id")]
        async fn call(
            &self,
            #[idem(skip)] context: &mut ToolContext,
            #[idem(flatten)] args: TicketArgs,
        ) -> Result<String, TicketError> {
            let _ = context;
            Ok(format!("escalated {}", args.request_id))
        }
    }

    #[idem::tools]
    impl Tool for Reassign {
        const NAME: &'static str = Escalate::NAME;
        type Args = TicketArgs;
        type Output = String;
        type Error = TicketError;

        fn description(&self) -> String {
            "Reassigns a ticket".to_owned()
        }

        fn parameters(&self) -> serde_json::Value {
            ticket_parameters()
        }

        #[idem::idempotent(scope = "request_id")]
        async fn call(
            &self,
            #[idem(skip)] context: &mut ToolContext,
            #[idem(flatten)] args: TicketArgs,
        ) -> Result<String, TicketError> {
            let _ = context;
            Ok(format!("reassigned {}", args.request_id))
        }
    }
}

use tickets::{CloseTicket, Escalate, OpenTicket, Reassign};

/// What rig's own dispatch answers for a call of `name` with the model's `arguments`: the
/// tool's text, or its error's.
async fn dispatch(handler: &ErasedHandler, name: &str, arguments: &str) -> Result<String, String> {
    let kind = EffectKind::ToolCall { name: name.to_owned(), args: arguments.to_owned() };
    match serve_inline(handler, kind).await {
        Ok(Outcome::ToolResult { result }) => {
            let text = result.output().render();
            if result.is_success() {
                Ok(serde_json::from_str::<String>(&text).unwrap_or(text))
            } else {
                Err(text)
            }
        }
        other => panic!("rig did not answer with a tool result: {other:?}"),
    }
}

#[tokio::test]
async fn two_rig_tools_with_the_same_arguments_answer_each_for_itself() {
    let store = store();
    let open = ErasedHandler::new(ToolAdapter::new(OpenTicket));
    let close = ErasedHandler::new(ToolAdapter::new(CloseTicket));
    let arguments = r#"{"request_id":"req-1"}"#;
    assert_eq!(dispatch(&open, "open_ticket", arguments).await, Ok("opened req-1".into()));
    assert_eq!(dispatch(&close, "close_ticket", arguments).await, Ok("closed req-1".into()));
    assert_eq!(dispatch(&open, "open_ticket", arguments).await, Ok("opened req-1".into()));

    // Each is keyed and recorded by its rig name, and its record names its own impl.
    let sent: serde_json::Value = serde_json::from_str(arguments).unwrap();
    for (name, function) in [
        ("open_ticket", "names::tickets::OpenTicket::call"),
        ("close_ticket", "names::tickets::CloseTicket::call"),
    ] {
        let key = idem::Key::derive(name, "req-1", &sent).unwrap();
        let record = idem::admin::show(store.as_ref(), &key).expect("the call's record");
        assert_eq!((record.tool.as_str(), record.function.as_deref()), (name, Some(function)));
    }

    // The classification carries the same names, and the hint the attribute set.
    const OPEN: idem::ToolInfo = idem::tool_info!(<OpenTicket as Tool>::call);
    assert_eq!(OPEN.name, "open_ticket");
    assert!(!OPEN.annotations().destructive_hint, "opening only adds a ticket");
    assert_eq!(CloseTicket::idem_tools()[0].name, "close_ticket");
    assert!(CloseTicket::idem_tools()[0].annotations().destructive_hint);
}

#[tokio::test]
async fn two_rig_tools_sharing_a_name_are_refused_rather_than_replayed() {
    store();
    let escalate = ErasedHandler::new(ToolAdapter::new(Escalate));
    let reassign = ErasedHandler::new(ToolAdapter::new(Reassign));
    let arguments = r#"{"request_id":"req-9"}"#;
    let escalated = dispatch(&escalate, "route_ticket", arguments).await;
    assert_eq!(escalated, Ok("escalated req-9".into()));
    let refused = dispatch(&reassign, "route_ticket", arguments).await;
    assert!(refused.is_err(), "refused, not replayed: {refused:?}");
    // rig's dispatch hides the error's text; the call itself gives it.
    let args = TicketArgs { request_id: "req-9".into() };
    let refused = Reassign.call(&mut ToolContext::default(), args).await.unwrap_err().0;
    assert!(
        refused.contains("names::tickets::Escalate::call")
            && refused.contains("names::tickets::Reassign::call"),
        "the refusal names both: {refused}"
    );
}
