//! `idem mcp-proxy` under the clients a host really has: the official Python SDK's client
//! (`tests/mcp_proxy/host.py`, `stdio_client` and `ClientSession` of `mcp==2.3.0`) as well as
//! rmcp's; a client that cancels a call, or goes away, after the call was forwarded; and a tool
//! that needs a person's approval, given with the `idem` command as a process. The upstream is
//! `tests/mcp_proxy/payments.py`, which appends a line per effect to a file.
#![cfg(unix)]

mod common;

use std::process::{Command, Stdio};

use rmcp::model::{CallToolRequest, ClientRequest};
use rmcp::service::PeerRequestOptions;
use serde_json::{json, Value};

use self::common::proxy::{charge, charged, params, python, told, within, Setup, CONFIG};
use self::common::{Lines, DEADLINE};

/// Runs `host.py` (the Python SDK's client), which starts the proxy and makes `calls` in order;
/// returns the result of each, as the SDK read it.
fn python_host(setup: &Setup, calls: &Value) -> Vec<Value> {
    let host = Setup::script("host.py");
    let mut command = Command::new(&setup.python);
    command.arg(host).arg(calls.to_string()).arg("--").arg(env!("CARGO_BIN_EXE_idem"));
    command.args(setup.args(false)).envs(setup.envs()).env_remove("IDEM_STORE");
    let mut host = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the Python host starts");
    let mut lines = Lines::read(host.stdout.take().expect("piped stdout"));
    let count = calls.as_array().expect("a list of calls").len();
    let results = (0..count)
        .map(|n| {
            let line = lines.next(&format!("the result of call {n}"));
            serde_json::from_str(&line).expect("a JSON line")
        })
        .collect();
    lines.end();
    let status = host.wait().expect("the host exits");
    assert!(status.success(), "the Python host failed: {status}");
    results
}

#[test]
fn five_charges_from_the_python_sdk_client_charge_once_and_reads_pass_through() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);
    let charge = json!({ "tool": "charge_card", "arguments": { "order_id": "o-1", "amount": 42 } });
    let balance = json!({ "tool": "get_balance", "arguments": { "account": "acc-1" } });
    let calls = json!([charge, charge, balance, charge, charge, balance, charge, balance]);

    let results = python_host(&setup, &calls);
    assert_eq!(setup.effects(), ["charge o-1 42"], "one charge upstream");
    let charges: Vec<&Value> = results.iter().filter(|r| r["text"] != json!(["100"])).collect();
    assert_eq!(charges.len(), 5, "{results:?}");
    assert!(charges.iter().all(|answer| *answer == charges[0]), "five equal answers: {charges:?}");
    assert_eq!(charges[0]["isError"], false);
    assert_eq!(charges[0]["structuredContent"]["result"], "ch_1_o-1_42");
    for read in [&results[2], &results[5], &results[7]] {
        assert_eq!(read["isError"], false, "{read}");
        assert_eq!(read["structuredContent"]["result"], "100", "every read answered: {read}");
    }

    // One record, the charge's: the reads left none.
    let listed = setup.idem(&["ls", "--json"]);
    let record: Value = serde_json::from_str(listed.ok().trim()).expect("one record");
    assert_eq!(record["tool"], "payments/charge_card");
    assert_eq!(record["status"], "done");
}

/// The Python SDK has no `idempotencyKey` field (its request types drop unknown ones), so its
/// client sends the key in `_meta`: once per key and arguments, refused for other arguments.
/// Each key's tie to its call is a record of its own, beside the charge's.
#[test]
fn the_python_sdk_client_sends_its_idempotency_key_in_meta() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);
    let charge = |amount: u64, key: &str| {
        let arguments = json!({ "order_id": "o-3", "amount": amount });
        let meta = json!({ "io.idem/idempotency-key": key });
        json!({ "tool": "charge_card", "arguments": arguments, "meta": meta })
    };
    let calls =
        json!([charge(42, "k-py"), charge(42, "k-py"), charge(43, "k-py"), charge(43, "k-py-2")]);

    let results = python_host(&setup, &calls);
    assert_eq!(results[0]["structuredContent"]["result"], "ch_1_o-3_42", "{results:?}");
    assert_eq!(results[1], results[0], "the retry's answer");
    assert_eq!(results[2]["isError"], true, "{results:?}");
    let idem = &results[2]["structuredContent"]["idem"];
    assert_eq!((&idem["error"], &idem["idempotencyKey"]), (&json!("key-reused"), &json!("k-py")));
    assert_eq!(results[3]["structuredContent"]["result"], "ch_2_o-3_43", "a new key runs");
    assert_eq!(setup.effects(), ["charge o-3 42", "charge o-3 43"]);

    let listed = setup.idem(&["ls", "--json"]);
    let mut tools: Vec<String> = listed
        .ok()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a record")["tool"].to_string())
        .collect();
    tools.sort();
    let claim = "\"payments/charge_card#idempotency-key\"";
    assert_eq!(tools, ["\"payments/charge_card\"", "\"payments/charge_card\"", claim, claim]);
}

/// The client sends `notifications/cancelled` once the upstream has charged, while the charge
/// has not answered yet. The proxy has already forwarded the call, so it does not give the key
/// up: the charge runs to its end and is recorded, and the client's retry gets that answer, with
/// no second charge (a released key would charge again; an abandoned one would be in doubt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_after_it_was_forwarded_completes_and_is_replayed() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG).gated();
    let proxy = setup.proxy().await;

    let request = ClientRequest::CallToolRequest(CallToolRequest::new(charge()));
    let options = PeerRequestOptions::no_options();
    let sent = proxy.client.peer().send_cancellable_request(request, options);
    let handle = within(sent).await.expect("the call is sent");
    setup.wait_for_effect("charge o-1 42");
    within(handle.cancel(Some("the user stopped it".into()))).await.expect("the cancel is sent");
    setup.open_gate();

    let retried = proxy.call(charge()).await;
    assert_eq!(charged(&retried), "ch_1_o-1_42", "the cancelled call's own charge");
    assert_eq!(setup.effects(), ["charge o-1 42"], "one charge");

    // A fresh proxy on the same store replays it too.
    within(proxy.client.cancel()).await.expect("the session closes");
    let again = setup.proxy().await;
    assert_eq!(again.call(charge()).await, retried);
    assert_eq!(setup.effects(), ["charge o-1 42"], "still one charge");
}

/// The client closes the proxy's stdin (MCP's stdio shutdown) with a shipment forwarded and
/// unanswered. The proxy gives open calls a moment to answer (rmcp drains its handlers for 5 s
/// after stdin ends; an answer in that time is recorded), then exits by itself without one:
/// the next proxy on the store says the key is in doubt, as a tool result naming it, and does
/// not ship again.
#[test]
fn a_client_that_closes_the_stream_mid_call_leaves_the_key_in_doubt() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);
    let ship = json!({ "name": "ship_order", "arguments": { "order_id": "o-1" } });

    let mut first = WireClient::start(&setup);
    first.send_request("tools/call", ship.clone());
    setup.wait_for_effect("ship o-1");
    let exited = first.close();
    assert!(exited.success(), "the proxy exits by itself when its client goes: {exited}");

    let mut second = WireClient::start(&setup);
    let answer = second.request("tools/call", ship);
    assert_eq!(answer["isError"], true, "{answer}");
    let idem = &answer["structuredContent"]["idem"];
    assert_eq!(idem["error"], "in-doubt", "{idem}");
    let key = idem["key"].as_str().expect("the key");
    assert!(answer["content"].to_string().contains(key), "the text names the key: {answer}");
    assert_eq!(setup.effects(), ["ship o-1"], "one shipment");
    let listed = setup.idem(&["ls", "--json"]);
    let record: Value = serde_json::from_str(listed.ok().trim()).expect("one record");
    assert_eq!(record["key"], key);
    assert_eq!(record["status"], "in-doubt");
}

const APPROVED_CHARGES: &str = r#"
server = "payments"

[tools.charge_card]
scope = "/order_id"
approve = true
"#;

/// A charge that needs approval waits for a person: `idem approve KEY`, run as the operator
/// would beside the proxy, lets the next call charge once; `idem deny KEY` refuses every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_through_the_proxy_with_the_idem_command() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, APPROVED_CHARGES);
    let proxy = setup.proxy().await;

    let asked = proxy.call(charge()).await;
    let (_, key) = told(&asked, "awaiting-approval");
    assert_eq!(told(&proxy.call(charge()).await, "awaiting-approval").1, key, "still waiting");
    assert!(setup.effects().is_empty(), "nothing charged before the approval");

    setup.idem(&["approve", &key, "--note", "checked the order"]).ok();
    let approved = proxy.call(charge()).await;
    assert_eq!(charged(&approved), "ch_1_o-1_42");
    assert_eq!(proxy.call(charge()).await, approved, "then a replay");
    assert_eq!(setup.effects(), ["charge o-1 42"], "charged once");

    // Another order asks anew; a denial is given to every call, with its note.
    let other = || params("charge_card", json!({ "order_id": "o-2", "amount": 42 }));
    let (_, other_key) = told(&proxy.call(other()).await, "awaiting-approval");
    assert_ne!(other_key, key);
    setup.idem(&["deny", &other_key, "--note", "duplicate order"]).ok();
    for _ in 0..2 {
        let denied = proxy.call(other()).await;
        let (idem, denied_key) = told(&denied, "denied");
        assert_eq!(denied_key, other_key);
        assert_eq!(idem["note"], "duplicate order", "{idem}");
    }
    assert_eq!(setup.effects(), ["charge o-1 42"], "nothing more charged");
}

/// A client that speaks MCP's JSON lines itself, so that it can send what no SDK here sends
/// yet: SEP-3182's top-level `idempotencyKey` on `tools/call`.
struct WireClient {
    proxy: std::process::Child,
    /// `None` once the client has closed the stream.
    stdin: Option<std::process::ChildStdin>,
    stdout: Lines,
    /// Read, so that the proxy's warnings stay out of the test's output.
    _stderr: Lines,
    next_id: u64,
}

impl WireClient {
    fn start(setup: &Setup) -> WireClient {
        let mut proxy = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(setup.args(false))
            .envs(setup.envs())
            .env_remove("IDEM_STORE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the proxy starts");
        let stdin = proxy.stdin.take();
        let stdout = Lines::read(proxy.stdout.take().expect("piped stdout"));
        let _stderr = Lines::read(proxy.stderr.take().expect("piped stderr"));
        let mut client = WireClient { proxy, stdin, stdout, _stderr, next_id: 0 };
        let info = json!({ "name": "wire", "version": "0" });
        let init =
            json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": info });
        client.request("initialize", init);
        client.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
        client
    }

    fn send(&mut self, message: Value) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("the stream is open");
        writeln!(stdin, "{message}").expect("the proxy reads its stdin");
    }

    /// Sends a request, and returns its id without waiting for the answer.
    fn send_request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        id
    }

    /// Sends a request and returns its `result`.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        loop {
            let line = self.stdout.next(&format!("the answer to {method} #{id}"));
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC message");
            if message["id"] == id {
                return message.get("result").cloned().unwrap_or_else(|| panic!("{message}"));
            }
        }
    }

    /// `tools/call` of `charge_card` with SEP-3182's key beside the arguments.
    fn charge(&mut self, key: &str, order: &str, amount: u64) -> Value {
        let arguments = json!({ "order_id": order, "amount": amount });
        let params =
            json!({ "name": "charge_card", "arguments": arguments, "idempotencyKey": key });
        self.request("tools/call", params)
    }
}

impl WireClient {
    /// Closes the proxy's stdin and waits for it to exit, polling: its exit is what is
    /// awaited, and a proxy that does not exit fails the test at [`DEADLINE`].
    fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let until = std::time::Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.proxy.try_wait().expect("the proxy's status") {
                return status;
            }
            assert!(
                std::time::Instant::now() < until,
                "the proxy did not exit within {DEADLINE:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for WireClient {
    fn drop(&mut self) {
        let _ = self.proxy.kill();
        let _ = self.proxy.wait();
    }
}

/// SEP-3182: a client marks a call with its own `idempotencyKey`. With no scope configured for
/// the tool, the key protects it: the same key and arguments charge once, the same key with
/// other arguments is refused (naming the key) and charges nothing, and a new key charges. The
/// same key in `_meta."io.idem/idempotency-key"` (for SDKs without the field) is the same key.
#[test]
fn a_clients_idempotency_key_runs_once_and_is_refused_for_other_arguments() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, "server = \"payments\"\n");
    let mut client = WireClient::start(&setup);

    let first = client.charge("k-1", "o-1", 42);
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(first["structuredContent"]["result"], "ch_1_o-1_42");
    assert_eq!(client.charge("k-1", "o-1", 42), first, "a retry gets the same answer");

    let reused = client.charge("k-1", "o-1", 43);
    assert_eq!(reused["isError"], true, "{reused}");
    let idem = &reused["structuredContent"]["idem"];
    assert_eq!(idem["error"], "key-reused", "{idem}");
    assert_eq!(idem["idempotencyKey"], "k-1", "{idem}");
    let text = reused["content"].to_string();
    assert!(
        text.contains("`k-1` was used for a call of `payments/charge_card` with other"),
        "{text}"
    );
    assert_eq!(setup.effects(), ["charge o-1 42"], "the reused key charged nothing");

    let other = client.charge("k-2", "o-1", 43);
    assert_eq!(other["structuredContent"]["result"], "ch_2_o-1_43", "{other}");

    let arguments = json!({ "order_id": "o-1", "amount": 42 });
    let meta = json!({ "io.idem/idempotency-key": "k-1" });
    let in_meta = json!({ "name": "charge_card", "arguments": arguments, "_meta": meta });
    assert_eq!(client.request("tools/call", in_meta), first, "one key, either spelling");
    assert_eq!(setup.effects(), ["charge o-1 42", "charge o-1 43"]);
}
