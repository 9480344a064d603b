//! idem on rig-core's own `Tool` trait: a tool keyed with `#[idem::idempotent]` and classified
//! with `#[idem::tools]` runs once per request when rig dispatches it by name, its key is the
//! reference derivation over the arguments the model sent, `retry!` repeats its
//! `call(&self, &mut ToolContext, args)`, and a `#[write]` tool is classified as destructive.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rig_core::effect::{EffectKind, Outcome};
use rig_core::serve::adapters::ToolAdapter;
use rig_core::serve::{serve_inline, ErasedHandler};
use rig_core::tool::{Tool, ToolContext};
use serde::{Deserialize, Serialize};

use common::store;

#[derive(Debug)]
struct MathError(String);

impl std::fmt::Display for MathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MathError {}

impl From<idem::Error> for MathError {
    fn from(error: idem::Error) -> Self {
        MathError(error.to_string())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct AddArgs {
    request_id: String,
    x: i64,
    y: i64,
}

/// A keyed tool: the request id scopes it, and the argument object is the key's arguments.
struct Adder {
    runs: AtomicU32,
}

#[idem::tools]
impl Tool for Adder {
    const NAME: &'static str = "add";
    type Args = AddArgs;
    type Output = i64;
    type Error = MathError;

    fn description(&self) -> String {
        "Adds two numbers, once per request".to_owned()
    }

    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {
                "request_id": {"type": "string"},
                "x": {"type": "integer"},
                "y": {"type": "integer"}
            },
            "required": ["request_id", "x", "y"]
        })
    }

    #[idem::idempotent(scope = "request_id")]
    async fn call(
        &self,
        #[idem(skip)] context: &mut ToolContext,
        #[idem(flatten)] args: AddArgs,
    ) -> Result<i64, MathError> {
        let _ = context;
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(args.x + args.y)
    }
}

/// What rig's own dispatch returns for a tool call of `name` with the model's `arguments`.
async fn dispatch(handler: &ErasedHandler, name: &str, arguments: &str) -> serde_json::Value {
    let kind = EffectKind::ToolCall { name: name.to_owned(), args: arguments.to_owned() };
    match serve_inline(handler, kind).await {
        Ok(Outcome::ToolResult { result }) => {
            assert!(result.is_success(), "the tool call failed: {result:?}");
            let output = result.output();
            match (output.as_json(), output.as_text()) {
                (Some(json), _) => json.clone(),
                (None, Some(text)) => serde_json::Value::String(text.to_owned()),
                (None, None) => panic!("neither JSON nor text: {}", output.render()),
            }
        }
        other => panic!("rig did not answer with a tool result: {other:?}"),
    }
}

#[tokio::test]
async fn a_rig_dispatched_tool_runs_once_per_request_and_keys_the_models_arguments() {
    let store = store();
    assert_eq!(
        idem::tool_info!(<Adder as Tool>::call).kind,
        idem::Kind::Idempotent { scope: "request_id" }
    );
    assert_eq!(idem::tool_info!(Adder::call).name, Adder::NAME);
    assert_eq!(Adder::idem_tools().len(), 1);

    let adder = Arc::new(Adder { runs: AtomicU32::new(0) });
    let handler = ErasedHandler::new(ToolAdapter::new(Shared(adder.clone())));
    let arguments = r#"{"request_id":"rq-1","x":2,"y":3}"#;
    assert_eq!(dispatch(&handler, "add", arguments).await, serde_json::json!(5));
    assert_eq!(dispatch(&handler, "add", arguments).await, serde_json::json!(5));
    assert_eq!(adder.runs.load(Ordering::SeqCst), 1, "the repeated request is a replay");

    assert_eq!(dispatch(&handler, "add", r#"{"request_id":"rq-2","x":2,"y":3}"#).await, 5);
    assert_eq!(adder.runs.load(Ordering::SeqCst), 2, "another request runs");

    // The key is over the argument object the model sent, scope field included, as a Python
    // service with the reference derivation would compute it.
    let sent: serde_json::Value = serde_json::from_str(arguments).unwrap();
    let key = idem::Key::derive("add", "rq-1", &sent).unwrap();
    let record = idem::admin::show(store.as_ref(), &key).expect("the call's record is there");
    assert_eq!(record.status, idem::Status::Done);
    assert_eq!(record.result.as_deref(), Some("5"));
}

/// rig takes a tool by value; the tests keep a handle on its counter.
struct Shared(Arc<Adder>);

impl Tool for Shared {
    const NAME: &'static str = Adder::NAME;
    type Args = AddArgs;
    type Output = i64;
    type Error = MathError;

    fn description(&self) -> String {
        self.0.description()
    }

    fn parameters(&self) -> serde_json::Value {
        self.0.parameters()
    }

    async fn call(&self, context: &mut ToolContext, args: AddArgs) -> Result<i64, MathError> {
        self.0.call(context, args).await
    }
}

/// A read that fails twice before it answers, as a rate-limited vendor does.
struct Quote {
    tries: AtomicU32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct QuoteArgs {
    symbol: String,
}

#[idem::tools]
impl Tool for Quote {
    const NAME: &'static str = "quote";
    type Args = QuoteArgs;
    type Output = u32;
    type Error = MathError;

    fn description(&self) -> String {
        "Looks a price up".to_owned()
    }

    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"symbol": {"type": "string"}}})
    }

    #[idem::read]
    async fn call(&self, context: &mut ToolContext, args: QuoteArgs) -> Result<u32, MathError> {
        let _ = context;
        match self.tries.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Err(MathError("rate limited".to_owned())),
            _ => Ok(args.symbol.len() as u32),
        }
    }
}

#[tokio::test]
async fn retry_repeats_a_call_that_borrows_rigs_context_mutably() {
    store();
    let quick = idem::Backoff::default().min_delay(Duration::from_millis(1));
    let quote = Quote { tries: AtomicU32::new(0) };
    let mut context = ToolContext::default();
    let args = QuoteArgs { symbol: "ACME".to_owned() };
    let price = idem::retry!(
        <Quote as Tool>::call(&quote, &mut context, args.clone()).await,
        backoff = quick.clone()
    );
    assert_eq!(price.map_err(|e| e.0), Ok(4));
    assert_eq!(quote.tries.load(Ordering::SeqCst), 3, "two failures, then the answer");

    // The keyed tool too: the first attempt's reply is the answer, and a repeat replays it.
    let adder = Adder { runs: AtomicU32::new(0) };
    let add = AddArgs { request_id: "rq-retry".into(), x: 40, y: 2 };
    let sum = idem::retry!(Adder::call(&adder, &mut context, add.clone()).await, backoff = quick);
    assert_eq!(sum.map_err(|e| e.0), Ok(42));
    assert_eq!(adder.call(&mut context, add).await.map_err(|e| e.0), Ok(42));
    assert_eq!(adder.runs.load(Ordering::SeqCst), 1);
}

/// A write with no key: classified, never repeated by `retry!`, destructive for MCP.
struct Mailer;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct MailArgs {
    to: String,
}

#[idem::tools]
impl Tool for Mailer {
    const NAME: &'static str = "send_mail";
    type Args = MailArgs;
    type Output = String;
    type Error = MathError;

    fn description(&self) -> String {
        "Sends an email".to_owned()
    }

    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"to": {"type": "string"}}})
    }

    #[idem::write]
    async fn call(&self, context: &mut ToolContext, args: MailArgs) -> Result<String, MathError> {
        let _ = context;
        Ok(format!("sent to {}", args.to))
    }
}

#[tokio::test]
async fn a_rig_write_tool_is_classified_as_destructive_and_runs_as_it_is() {
    const MAIL: idem::ToolInfo = idem::tool_info!(<Mailer as Tool>::call);
    assert_eq!(MAIL.name, "send_mail");
    assert_eq!(MAIL.kind, idem::Kind::Write);
    assert!(!MAIL.retry_safe());
    assert!(MAIL.annotations().destructive_hint && !MAIL.annotations().idempotent_hint);
    let handler = ErasedHandler::new(ToolAdapter::new(Mailer));
    let sent = dispatch(&handler, "send_mail", r#"{"to":"ada@example.com"}"#).await;
    assert_eq!(sent, serde_json::json!("sent to ada@example.com"));
}
