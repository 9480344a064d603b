//! MCP's SEP-3182 `idempotencyKey` on `tools/call`, as the proxy reads it. rmcp 3.11's
//! `CallToolRequestParams` has no such field and drops unknown ones, so the proxy reads its
//! client's messages a line at a time (stdio's framing) and moves a top-level
//! `params.idempotencyKey` of a `tools/call` into `params._meta`, under
//! [`IDEMPOTENCY_KEY_META`], where `IdempotentClient` reads a client's key. Every other line
//! goes on byte for byte.

use idem_runtime::mcp::IDEMPOTENCY_KEY_META;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

/// SEP-3182's name of the field.
const FIELD: &str = "idempotencyKey";

/// stdin, as the proxy's MCP server reads it: each line as it came, but for the key's move.
/// Ends when stdin ends (or fails), so the server sees its client close the stream.
pub(crate) fn client_input() -> DuplexStream {
    let (input, mut output) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let line = lift(line);
            if output.write_all(line.as_bytes()).await.is_err()
                || output.write_all(b"\n").await.is_err()
            {
                break;
            }
        }
    });
    input
}

/// `line` with a `tools/call`'s top-level `idempotencyKey` moved into its `_meta` (a key that
/// `_meta` already holds wins); any other line, unchanged. The value moves as it is: the
/// client layer refuses one that is not a non-empty string, naming it.
fn lift(line: String) -> String {
    if !line.contains(FIELD) {
        return line;
    }
    let Ok(mut message) = serde_json::from_str::<Value>(&line) else { return line };
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        return line;
    }
    let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
        return line;
    };
    let Some(key) = params.remove(FIELD) else { return line };
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(Default::default()));
    let Some(meta) = meta.as_object_mut() else { return line };
    meta.entry(IDEMPOTENCY_KEY_META).or_insert(key);
    message.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lifted(message: Value) -> Value {
        serde_json::from_str(&lift(message.to_string())).unwrap()
    }

    #[test]
    fn a_calls_key_moves_into_its_meta() {
        let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "charge_card", "arguments": {"idempotencyKey": "arg"}, "idempotencyKey": "k-1",
        }});
        let params = &lifted(call)["params"];
        assert_eq!(params["_meta"][IDEMPOTENCY_KEY_META], "k-1");
        assert_eq!(params.get(FIELD), None);
        assert_eq!(params["arguments"], json!({"idempotencyKey": "arg"}), "arguments untouched");

        let both = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "c", "idempotencyKey": "top", "_meta": {IDEMPOTENCY_KEY_META: "meta", "x": 1},
        }});
        assert_eq!(lifted(both)["params"]["_meta"], json!({IDEMPOTENCY_KEY_META: "meta", "x": 1}));
    }

    #[test]
    fn every_other_line_goes_on_as_it_came() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"idempotencyKey":"k"}}"#,
            r#"{"jsonrpc":"2.0", "id":2, "method":"tools/call","params":{"name":"c"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"idempotencyKey":1}}"#,
            "not json idempotencyKey",
        ] {
            assert_eq!(lift(line.to_owned()), line);
        }
    }
}
