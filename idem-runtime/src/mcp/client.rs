//! Exactly once in front of an MCP server someone else wrote: an rmcp client session whose write
//! tools go through the engine.
//!
//! The server's request id cannot deduplicate a call (a client whose stream broke re-issues it
//! under a new id), so the intent does: the key is derived from the server's name, the tool, the
//! canonical arguments and a scope, exactly as for a tool of one's own. Reads pass through.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ErrorCode, JsonObject};
use rmcp::service::{Peer, RoleClient, ServiceError};
use rmcp::ErrorData;
use serde_json::Value;

use crate::canonical::canonical_json;
use crate::engine::{Call, InDoubtPolicy};
use crate::error::Error;
use crate::key::Key;
use crate::store::Store;

/// The `_meta` entry of a `tools/call` in which a client may name the unit of work itself, in
/// place of (or where there is no) configured scope.
pub const SCOPE_META: &str = "io.idem/scope";

/// The `_meta` entry in which the key goes upstream, so that a server that can use it (to send
/// it on as an `Idempotency-Key`) does.
pub const KEY_META: &str = "io.idem/key";

/// The `_meta` entry in which a client sends its own idempotency key for a `tools/call`: the
/// `idempotencyKey` of MCP's SEP-3182, for clients (such as rmcp 3.11's) whose request type has
/// no such field. The key stands in for the scope: a retry that sends it again with the same
/// arguments runs at most once, and one that sends it with other arguments is refused.
pub const IDEMPOTENCY_KEY_META: &str = "io.idem/idempotency-key";

/// What the record that ties a client's idempotency key to its first call is named after: the
/// tool's name in the store, then this. `#` is in no MCP tool name, so it names no real tool.
const CLAIM_SUFFIX: &str = "#idempotency-key";

/// What idem does with one upstream tool, from the configuration ([`ToolPolicy`]) and the
/// server's `tools/list` hints.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protection {
    /// A read (`readOnlyHint`, or `read = true` in the configuration): passed through every time.
    Read,
    /// A write keyed by the arguments at these JSON pointers (or by the call's
    /// [`SCOPE_META`] when it has one): run once per intent.
    Keyed {
        /// JSON pointers into the arguments whose values name the unit of work.
        scope: Vec<String>,
    },
    /// A write with no configured scope: protected only when a call brings its own
    /// [`SCOPE_META`], and passed through unprotected otherwise, as with no idem at all.
    Unscoped,
}

/// How idem treats one upstream tool: its scope, or that it is a read, and the policy of its
/// keys. Scope is a modelling decision, so there is no default one.
///
/// ```
/// use idem_runtime::mcp::ToolPolicy;
///
/// let charge = ToolPolicy::scope(["/order_id"]).ttl(std::time::Duration::from_secs(86_400));
/// let lookup = ToolPolicy::read();
/// # let _ = (charge, lookup);
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ToolPolicy {
    scope: Vec<String>,
    read: bool,
    in_doubt: Option<InDoubtPolicy>,
    ttl: Option<Duration>,
    wait: Option<Duration>,
    approve: bool,
}

impl ToolPolicy {
    /// A write keyed by the values at these JSON pointers into its arguments (`"/order_id"`).
    pub fn scope<P: Into<String>>(pointers: impl IntoIterator<Item = P>) -> ToolPolicy {
        ToolPolicy {
            scope: pointers.into_iter().map(Into::into).collect(),
            ..ToolPolicy::default()
        }
    }

    /// A read, whatever the server's hints say: passed through every time.
    pub fn read() -> ToolPolicy {
        ToolPolicy { read: true, ..ToolPolicy::default() }
    }

    /// What a call does with a key in doubt ([`InDoubtPolicy::Fail`] unless set).
    #[must_use]
    pub fn in_doubt(mut self, policy: InDoubtPolicy) -> ToolPolicy {
        self.in_doubt = Some(policy);
        self
    }

    /// How long a finished call is replayed.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> ToolPolicy {
        self.ttl = Some(ttl);
        self
    }

    /// How long a call waits for the same intent running elsewhere.
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> ToolPolicy {
        self.wait = Some(wait);
        self
    }

    /// Whether a person must approve each intent before it is forwarded.
    #[must_use]
    pub fn approve(mut self, required: bool) -> ToolPolicy {
        self.approve = required;
        self
    }
}

/// An rmcp client session whose write tools run once per intent.
///
/// [`call_tool`](Self::call_tool) of a tool with a scope derives the key, reserves it in the
/// store, forwards the call once (with the key in `_meta` under [`KEY_META`]), records the
/// result and replays it to every later call with the same intent; a concurrent duplicate waits
/// for it. A result with `isError: true` is not recorded, as for a tool of one's own. A call
/// whose answer was lost (the connection broke after it was sent) leaves its key in doubt. idem's
/// outcomes (in doubt, in flight past the wait, awaiting approval, denied) come back as tool
/// results with `isError: true` that name the key and the next step, never as errors.
///
/// A call may bring its client's own idempotency key in `_meta` under [`IDEMPOTENCY_KEY_META`]
/// (MCP's SEP-3182): it then protects any write, configured or not, and stands in for the
/// scope. The first call with a key ties it to its arguments; a later call with the same key
/// and other arguments gets a tool result with `isError: true` (kind `key-reused`, naming both
/// keys) and runs nothing.
///
/// ```no_run
/// # async fn demo(peer: rmcp::service::Peer<rmcp::service::RoleClient>) -> Result<(), rmcp::service::ServiceError> {
/// use idem_runtime::mcp::{IdempotentClient, ToolPolicy};
///
/// let payments = IdempotentClient::new(peer, "payments")
///     .tool("charge_card", ToolPolicy::scope(["/order_id"]))
///     .classify()
///     .await?;
/// let params = rmcp::model::CallToolRequestParams::new("charge_card");
/// let charged = payments.call_tool(params).await?;
/// # let _ = charged; Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotentClient {
    peer: Peer<RoleClient>,
    server: String,
    store: Option<Arc<dyn Store>>,
    policies: HashMap<String, ToolPolicy>,
    /// The upstream tools the server says only read.
    reads: Arc<HashMap<String, bool>>,
}

impl IdempotentClient {
    /// A client of the server `server` (its name in every key, so that two servers' tools of
    /// one name never share keys: keep it stable) over `peer`. No tool is protected until it is
    /// given a scope with [`tool`](Self::tool) or a call brings one.
    pub fn new(peer: Peer<RoleClient>, server: impl Into<String>) -> IdempotentClient {
        IdempotentClient {
            peer,
            server: server.into(),
            store: None,
            policies: HashMap::new(),
            reads: Arc::default(),
        }
    }

    /// The store the keys go to (the process's default store otherwise).
    #[must_use]
    pub fn store(mut self, store: Arc<dyn Store>) -> IdempotentClient {
        self.store = Some(store);
        self
    }

    /// How idem treats the upstream tool `name`.
    #[must_use]
    pub fn tool(mut self, name: impl Into<String>, policy: ToolPolicy) -> IdempotentClient {
        self.policies.insert(name.into(), policy);
        self
    }

    /// Reads the server's `tools/list`, so that the tools it marks `readOnlyHint` pass through.
    /// Without it only [`ToolPolicy::read`] marks a read.
    pub async fn classify(mut self) -> Result<IdempotentClient, ServiceError> {
        let tools = self.peer.list_all_tools().await?;
        let reads = tools.iter().map(|tool| {
            let read = tool.annotations.as_ref().and_then(|hints| hints.read_only_hint);
            (tool.name.to_string(), read == Some(true))
        });
        self.reads = Arc::new(reads.collect());
        Ok(self)
    }

    /// What idem does with the upstream tool `name`.
    pub fn protection(&self, name: &str) -> Protection {
        let policy = self.policies.get(name);
        if policy.is_some_and(|policy| policy.read) || self.reads.get(name) == Some(&true) {
            return Protection::Read;
        }
        match policy {
            Some(policy) if !policy.scope.is_empty() => {
                Protection::Keyed { scope: policy.scope.clone() }
            }
            _ => Protection::Unscoped,
        }
    }

    /// The upstream tools the server listed that are writes with no scope: they pass through
    /// unprotected unless a call names its scope. Say so at start-up.
    pub fn unprotected(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .reads
            .keys()
            .map(String::as_str)
            .filter(|name| self.protection(name) == Protection::Unscoped)
            .collect();
        names.sort_unstable();
        names
    }

    /// The client session this wraps.
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// Calls the upstream tool, at most once per intent for a write with a scope. An `Err` is
    /// the upstream's own refusal (a protocol error such as unknown tool or invalid arguments,
    /// after which the key is released) or a call that could not be sent; everything idem has to
    /// say is an `Ok` result with `isError: true`.
    pub async fn call_tool(
        &self,
        params: CallToolRequestParams,
    ) -> Result<CallToolResult, ServiceError> {
        let tool = params.name.to_string();
        let arguments = params.arguments.clone().unwrap_or_default();
        let client_key = match client_key(&params) {
            Ok(client_key) => client_key,
            Err(reason) => return Ok(told(&tool, Error::Key { tool: tool.clone(), reason })),
        };
        let scope = match (self.protection(&tool), &client_key, call_scope(&params)) {
            (Protection::Read, ..) => return self.peer.call_tool(params).await,
            (_, Some(client_key), _) => client_key.clone(),
            (_, None, Some(scope)) => scope,
            (Protection::Keyed { scope }, None, None) => match scope_of(&scope, &arguments) {
                Ok(scope) => scope,
                Err(reason) => {
                    let error = Error::Key { tool: tool.clone(), reason };
                    return Ok(told(&tool, error));
                }
            },
            (Protection::Unscoped, None, None) => return self.peer.call_tool(params).await,
        };
        let call = match self.call(&tool, &scope, &arguments) {
            Ok(call) => call,
            Err(error) => return Ok(told(&tool, error)),
        };
        if let Some(client_key) = &client_key {
            if let Err(refused) = self.claim(&tool, client_key, call.key()).await {
                return Ok(refused);
            }
        }
        let key = call.key().to_string();
        let sent_key = key.clone();
        let forward = || async move {
            let mut params = params;
            let meta = params.meta.get_or_insert_with(Default::default);
            meta.0.insert(KEY_META.to_owned(), Value::String(sent_key));
            self.peer.call_tool(params).await.map_err(|error| {
                if may_have_landed(&error) {
                    crate::engine::may_have_landed();
                }
                Failed::Upstream(error)
            })
        };
        match call.run_async(forward).await {
            Ok(result) => Ok(result),
            Err(Failed::Idem(error)) => Ok(told(&tool, error)),
            Err(Failed::Upstream(error)) if may_have_landed(&error) => {
                let in_doubt = Error::InDoubt {
                    key,
                    tool: self.key_tool(&tool),
                    since_ms: crate::lifecycle::now_ms(),
                    reason: Some(format!("the answer from upstream was lost: {error}")),
                };
                Ok(told(&tool, in_doubt))
            }
            Err(Failed::Upstream(error)) => Err(error),
        }
    }

    /// The tool's name in the store: the server's name and the tool's, so that two servers'
    /// tools never share keys.
    fn key_tool(&self, tool: &str) -> String {
        format!("{}/{tool}", self.server)
    }

    /// Ties the client's idempotency key to the call's key, the first time it is seen, in a
    /// record of its own (the tool's name in the store with [`CLAIM_SUFFIX`], the client's key
    /// as scope, and `key` as its result): a key is a hash, like every key the store holds, so
    /// no argument is stored. Refuses, as the tool result to return, a key tied to another call
    /// of this tool: the same client key with other arguments.
    async fn claim(&self, tool: &str, client_key: &str, key: &Key) -> Result<(), CallToolResult> {
        let claimed = format!("{}{CLAIM_SUFFIX}", self.key_tool(tool));
        // Claiming has no effect outside the store, so a claim left in doubt by a crash is
        // simply made again.
        let mut claim =
            Call::from_canonical(&claimed, client_key, "{}").in_doubt(InDoubtPolicy::Rerun);
        if let Some(store) = &self.store {
            claim = claim.store(Arc::clone(store));
        }
        if let Some(ttl) = self.policies.get(tool).and_then(|policy| policy.ttl) {
            claim = claim.ttl(ttl);
        }
        let mine = key.to_string();
        let first = claim.run_async(|| async { Ok::<_, Error>(mine) }).await;
        match first {
            Ok(first) if first == key.as_str() => Ok(()),
            Ok(first) => Err(reused(tool, &self.key_tool(tool), client_key, &first)),
            Err(error) => Err(told(tool, error)),
        }
    }

    fn call(&self, tool: &str, scope: &str, arguments: &JsonObject) -> Result<Call, Error> {
        let mut call = Call::new(&self.key_tool(tool), scope, arguments)?;
        if let Some(store) = &self.store {
            call = call.store(Arc::clone(store));
        }
        if let Some(policy) = self.policies.get(tool) {
            if let Some(in_doubt) = policy.in_doubt {
                call = call.in_doubt(in_doubt);
            }
            if let Some(ttl) = policy.ttl {
                call = call.ttl(ttl);
            }
            if let Some(wait) = policy.wait {
                call = call.wait(wait);
            }
            call = call.approve(policy.approve);
        }
        Ok(call)
    }
}

/// Why a forwarded call has no result to record.
enum Failed {
    Idem(Error),
    Upstream(ServiceError),
}

impl From<Error> for Failed {
    fn from(error: Error) -> Self {
        Failed::Idem(error)
    }
}

/// Whether the upstream may have run the tool although no result came back: anything but a
/// protocol error that refuses the request itself (unknown tool, invalid arguments, a malformed
/// request), which a server sends before it runs anything.
fn may_have_landed(error: &ServiceError) -> bool {
    let ServiceError::McpError(error) = error else { return true };
    ![ErrorCode::INVALID_PARAMS, ErrorCode::METHOD_NOT_FOUND, ErrorCode::INVALID_REQUEST]
        .contains(&error.code)
        && error.code != ErrorCode::PARSE_ERROR
}

/// The longest client key taken, in bytes: a UUID is 36, and the key is kept as the scope of
/// its claim record, so a key of megabytes would be a record of megabytes.
const MAX_CLIENT_KEY: usize = 255;

/// The client's own idempotency key, if the call brings one in its `_meta`; an error naming the
/// entry if it is not a non-empty string of at most [`MAX_CLIENT_KEY`] bytes.
fn client_key(params: &CallToolRequestParams) -> Result<Option<String>, String> {
    let Some(value) = params.meta.as_ref().and_then(|meta| meta.0.get(IDEMPOTENCY_KEY_META)) else {
        return Ok(None);
    };
    let entry = format!(
        "the client's idempotency key (SEP-3182's `idempotencyKey`, or \
         `_meta.\"{IDEMPOTENCY_KEY_META}\"`)"
    );
    match value {
        Value::String(key) if key.len() > MAX_CLIENT_KEY => Err(format!(
            "{entry} is {} bytes long, more than the {MAX_CLIENT_KEY} taken: send a shorter key \
             (a UUID, say) naming the request",
            key.len()
        )),
        Value::String(key) if !key.is_empty() => Ok(Some(key.clone())),
        other => Err(format!("{entry} must be a non-empty string, not {other}")),
    }
}

/// The tool result for a client key that was first used with other arguments: names the
/// client's key and the key of its first call, which an operator can look up.
fn reused(tool: &str, key_tool: &str, client_key: &str, first: &str) -> CallToolResult {
    let message = format!(
        "the idempotency key `{client_key}` was used for a call of `{key_tool}` with other \
         arguments (idem key {first}); a key names one request: send a new key for a new \
         request, or the first request's arguments unchanged to retry it"
    );
    let data = serde_json::json!({
        "idem": {
            "error": "key-reused",
            "key": first,
            "idempotencyKey": client_key,
            "retryable": false,
        }
    });
    let data = ErrorData::invalid_params(message.clone(), Some(data));
    super::tool_result::tool_result(tool, &data)
        .unwrap_or_else(|| CallToolResult::error(vec![rmcp::model::ContentBlock::text(message)]))
}

/// The scope a call names for itself in its `_meta`, if it names one.
fn call_scope(params: &CallToolRequestParams) -> Option<String> {
    let meta = params.meta.as_ref()?;
    meta.0.get(SCOPE_META).and_then(Value::as_str).map(str::to_owned)
}

/// The scope of a call from the values at `pointers` in its arguments: a string as it is, any
/// other value as canonical JSON, several joined as a canonical JSON array. Fails naming the
/// pointer that is not there, since a missing scope would silently merge units of work.
fn scope_of(pointers: &[String], arguments: &JsonObject) -> Result<String, String> {
    let arguments = Value::Object(arguments.clone());
    let mut values = Vec::with_capacity(pointers.len());
    for pointer in pointers {
        match arguments.pointer(pointer) {
            Some(Value::Null) | None => {
                return Err(format!(
                    "the scope `{pointer}` is not in the arguments: pass it, or name the scope \
                     in `_meta.\"{SCOPE_META}\"`"
                ))
            }
            Some(value) => values.push(value.clone()),
        }
    }
    match values.as_slice() {
        [Value::String(one)] => Ok(one.clone()),
        [one] => canonical_json(one).map_err(|error| error.to_string()),
        _ => canonical_json(&Value::Array(values)).map_err(|error| error.to_string()),
    }
}

/// idem's outcome as the tool result the model reads.
fn told(tool: &str, error: Error) -> CallToolResult {
    let data = ErrorData::from(error);
    super::tool_result::tool_result(tool, &data).unwrap_or_else(|| {
        CallToolResult::error(vec![rmcp::model::ContentBlock::text(data.message)])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> JsonObject {
        let Value::Object(object) = value else { panic!("not an object") };
        object
    }

    #[test]
    fn the_scope_is_read_at_its_pointers() {
        let args = object(serde_json::json!({"order_id": "o-1", "cart": {"id": 7}, "amount": 42}));
        assert_eq!(scope_of(&["/order_id".into()], &args).unwrap(), "o-1");
        assert_eq!(scope_of(&["/cart/id".into()], &args).unwrap(), "7");
        assert_eq!(
            scope_of(&["/order_id".into(), "/cart/id".into()], &args).unwrap(),
            r#"["o-1",7]"#
        );
        let missing = scope_of(&["/customer".into()], &args).unwrap_err();
        assert!(missing.contains("`/customer` is not in the arguments"), "{missing}");
    }

    #[test]
    fn a_reused_client_key_tells_the_model_to_keep_the_arguments_or_send_a_new_key() {
        let first = "82e1e1a327aa97bb3929e05cc4ca3bd5";
        let result = reused("charge_card", "payments/charge_card", "k-1", first);
        assert_eq!(result.is_error, Some(true));
        let idem = &result.structured_content.as_ref().expect("structured content")["idem"];
        assert_eq!(idem["error"], "key-reused");
        assert_eq!(idem["key"], first);
        assert_eq!(idem["idempotencyKey"], "k-1");
        let text = serde_json::to_string(&result.content).unwrap();
        for part in ["`charge_card` did not run", first, "send a new key", "`k-1` was used"] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }

    #[test]
    fn only_a_refused_request_cannot_have_landed() {
        let refused = ServiceError::McpError(ErrorData::invalid_params("no such field", None));
        assert!(!may_have_landed(&refused));
        let failed = ServiceError::McpError(ErrorData::internal_error("boom", None));
        assert!(may_have_landed(&failed));
        assert!(may_have_landed(&ServiceError::TransportClosed));
    }
}
