//! `idem mcp-proxy` as an MCP host runs it: rmcp's client spawns the proxy, which spawns a real
//! MCP server that deduplicates nothing, `tests/mcp_proxy/payments.py` on the official Python
//! SDK (`mcp==2.3.0`), or reaches the same server over streamable HTTP on a loopback port
//! (`--upstream`). Each charge, shipment and quote appends a line to a file, so the effects are
//! counted across every process that ran. `$IDEM_TEST_PYTHON` names a python with the SDK
//! installed; `.ci/run` makes one under the target directory and sets it.
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use self::common::proxy::{
    charge, charge_five_times, charged, free_port, params, python, within, Setup, CONFIG,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_charges_through_the_proxy_charge_once_and_a_fresh_proxy_replays() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);

    let proxy = setup.proxy().await;
    let answer = charge_five_times(&setup, &proxy).await;
    within(proxy.client.cancel()).await.expect("the session closes");

    // Another proxy process, another upstream process, the same store: a replay.
    let again = setup.proxy().await;
    assert_eq!(again.call(charge()).await, answer);
    assert_eq!(setup.effects(), ["charge o-1 42"], "still one charge");

    // Another order is charged, once.
    let other = again.call(params("charge_card", json!({ "order_id": "o-2", "amount": 42 })));
    assert_eq!(charged(&other.await), "ch_2_o-2_42");
    assert_eq!(setup.effects(), ["charge o-1 42", "charge o-2 42"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_passes_through_every_time() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);
    let proxy = setup.proxy().await;
    let tools = within(proxy.client.list_all_tools()).await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    let upstream =
        ["charge_card", "get_balance", "ship_order", "get_quote", "hold_stock_on_quotes"];
    assert_eq!(names, upstream, "the upstream's tools");
    let hints = tools[1].annotations.as_ref().and_then(|hints| hints.read_only_hint);
    assert_eq!(hints, Some(true), "the upstream's hints, as they are");

    let balance = || params("get_balance", json!({ "account": "acc-1" }));
    for _ in 0..3 {
        let answer = proxy.call(balance()).await;
        assert_eq!(answer.is_error, Some(false), "{answer:?}");
        assert_eq!(answer.structured_content.unwrap()["result"], "100");
    }
    assert!(setup.effects().is_empty());
    let listed = common::idem_in(Path::new("/"), &["--store", &setup.store, "ls", "--json"]);
    assert_eq!(listed.ok(), "", "a read leaves no record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_killed_while_a_shipment_runs_leaves_it_in_doubt() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG).on_sled();
    let ship = || params("ship_order", json!({ "order_id": "o-1" }));

    let first = setup.proxy().await;
    let client = first.client.clone();
    let pending = tokio::spawn(async move { client.call_tool(ship()).await });
    setup.wait_for_effect("ship o-1");
    first.kill();
    let lost = within(pending).await.expect("the call's task");
    assert!(lost.is_err(), "the killed proxy never answered: {lost:?}");

    // The next proxy on the same store says so, as a tool result, and does not ship again.
    let second = setup.proxy().await;
    let answer = second.call(ship()).await;
    assert_eq!(answer.is_error, Some(true), "{answer:?}");
    let idem = &answer.structured_content.as_ref().expect("structured content")["idem"];
    assert_eq!(idem["error"], "in-doubt", "{idem}");
    let key = idem["key"].as_str().expect("the key");
    assert_eq!(setup.effects(), ["ship o-1"], "one shipment");

    // The operator sees the same key in doubt.
    within(second.client.cancel()).await.expect("the session closes");
    let mut stderr = second.stderr;
    stderr.end();
    let listed = common::idem_in(Path::new("/"), &["--store", &setup.store, "ls", "--json"]);
    let record: Value = serde_json::from_str(listed.ok().trim()).expect("one record");
    assert_eq!(record["key"], key);
    assert_eq!(record["status"], "in-doubt");
    assert_eq!(record["tool"], "payments/ship_order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_sqlite_store_charge_once() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, CONFIG);
    let (a, b) = tokio::join!(setup.proxy(), setup.proxy());
    let (one, two) = tokio::join!(a.call(charge()), b.call(charge()));
    assert_eq!(setup.effects(), ["charge o-1 42"], "one charge for both proxies");
    assert_eq!(one, two, "both get the one charge's answer");
    assert_eq!(charged(&one), "ch_1_o-1_42");
}

#[test]
fn check_prints_each_tool_with_its_classification() {
    let Some(python) = python() else { return };
    let unscoped_ship = "server = \"payments\"\n[tools.charge_card]\nscope = \"/order_id\"\n";
    let setup = Setup::new(python, unscoped_ship);
    let args = setup.args(true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let effects = setup.effects.display().to_string();
    let run = common::idem_in_with(Path::new("/"), &args, &[("PAYMENTS_EFFECTS", &effects)]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "charge_card           keyed by /order_id\n\
         get_balance           read: passed through every time\n\
         ship_order            unprotected: a write with no scope, passed through\n\
         get_quote             read: passed through every time\n\
         hold_stock_on_quotes  unprotected: a write with no scope, passed through\n"
    );
    assert!(!Path::new(&setup.store["sqlite:".len()..]).exists(), "--check opens no store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_warns_of_the_writes_that_pass_through_unprotected() {
    let Some(python) = python() else { return };
    let config = "server = \"payments\"\n[tools.charge_card]\nscope = \"/order_id\"\n\
                  [tools.charge_crad]\nscope = \"/order_id\"\n";
    let setup = Setup::new(python, config);
    let mut proxy = setup.proxy().await;
    let warning = proxy.stderr.next("the unprotected tools' warning");
    assert!(warning.contains("pass through unprotected"), "{warning}");
    assert!(warning.ends_with(": hold_stock_on_quotes, ship_order"), "{warning}");
    let typo = proxy.stderr.next("the unknown tools' warning");
    assert!(typo.ends_with("does not list: charge_crad"), "{typo}");
}

#[test]
fn a_bad_configuration_names_the_tool_and_the_key() {
    let Some(python) = python() else { return };
    let setup = Setup::new(python, "server = \"payments\"\n[tools.charge_card]\nscop = \"/id\"\n");
    let args = setup.args(false);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let error = common::idem_in(Path::new("/"), &args);
    let line = error.fails(2);
    assert!(line.contains("proxy.toml: tool `charge_card`: unknown field `scop`"), "{line}");
    assert!(setup.effects().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_is_classified_again_and_passed_on() {
    let Some(python) = python() else { return };
    let config = format!("{CONFIG}\n[tools.get_quote]\nscope = \"/order_id\"\n");
    let setup = Setup::new(python, &config);
    let proxy = setup.proxy().await;
    let quote = || params("get_quote", json!({ "order_id": "o-1" }));

    // The upstream says get_quote only reads: its hint wins, and each quote reaches it.
    let first = proxy.call(quote()).await;
    let second = proxy.call(quote()).await;
    assert_ne!(first, second, "a read passes through every time");
    assert_eq!(setup.effects(), ["quote o-1", "quote o-1"]);

    // Now quotes hold stock: the upstream lists get_quote without the hint and says so.
    let held = proxy.call(params("hold_stock_on_quotes", json!({}))).await;
    assert_eq!(held.is_error, Some(false), "{held:?}");
    within(proxy.client.service().changed.notified()).await;
    let tools = within(proxy.client.list_all_tools()).await.expect("tools/list");
    let listed = tools.iter().find(|tool| tool.name == "get_quote").expect("get_quote listed");
    let hint = listed.annotations.as_ref().and_then(|hints| hints.read_only_hint);
    assert_eq!(hint, None, "the upstream's new listing");

    // The proxy classified the list again before passing the notification on: a write now,
    // keyed by its configured scope.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(proxy.call(quote()).await);
    }
    assert_eq!(setup.effects(), ["quote o-1", "quote o-1", "quote o-1"], "one more quote");
    assert!(answers.iter().all(|answer| answer == &answers[0]), "three equal answers");
    assert_eq!(answers[0].structured_content.as_ref().unwrap()["result"], "q_3_o-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_in_front_of_a_streamable_http_upstream_charges_once() {
    let Some(python) = python() else { return };
    let setup =
        Setup::new(python, &format!("{CONFIG}\n[tools.get_quote]\nscope = \"/order_id\"\n"));
    let upstream = setup.http_upstream();

    let args = setup.http_args(true, &upstream.url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let check = common::idem_in(Path::new("/"), &args);
    assert!(check.ok().starts_with("charge_card           keyed by /order_id\n"), "{check:?}");

    let proxy = setup.proxy_with(setup.http_args(false, &upstream.url)).await;
    charge_five_times(&setup, &proxy).await;

    let balance = proxy.call(params("get_balance", json!({ "account": "acc-1" }))).await;
    assert_eq!(balance.structured_content.unwrap()["result"], "100", "a read passes through");
    assert_eq!(setup.effects(), ["charge o-1 42"]);
    let listed = common::idem_in(Path::new("/"), &["--store", &setup.store, "ls", "--json"]);
    let record: Value = serde_json::from_str(listed.ok().trim()).expect("one record");
    assert_eq!(record["tool"], "payments/charge_card");

    // A tool list change reaches the proxy over HTTP too (on the call's event stream): once
    // the proxy passed it on, get_quote is a write, keyed by its configured scope.
    let held = proxy.call(params("hold_stock_on_quotes", json!({}))).await;
    assert_eq!(held.is_error, Some(false), "{held:?}");
    within(proxy.client.service().changed.notified()).await;
    let quote = || params("get_quote", json!({ "order_id": "o-1" }));
    assert_eq!(proxy.call(quote()).await, proxy.call(quote()).await, "a replay");
    assert_eq!(setup.effects(), ["charge o-1 42", "quote o-1"], "one quote");
}

#[test]
fn an_upstream_url_no_one_answers_is_named_at_start_up() {
    let setup = Setup::new(PathBuf::new(), CONFIG);
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    let args = setup.http_args(false, &url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = common::idem_in(Path::new("/"), &args);
    let line = run.fails(1);
    assert!(line.contains(&format!("cannot reach the upstream server at {url}")), "{line}");
    assert!(line.contains("start it, or give --upstream the URL"), "{line}");
}

#[test]
fn the_upstream_is_given_exactly_once() {
    let setup = Setup::new(PathBuf::from("python3"), CONFIG);
    let both = setup.http_args(false, "http://127.0.0.1:9/mcp");
    let both: Vec<&str> = both.iter().map(String::as_str).chain(["--", "python3"]).collect();
    let line = common::idem_in(Path::new("/"), &both).fails(2).to_owned();
    assert!(line.contains("'--upstream <URL>' cannot be used with '[COMMAND]...'"), "{line}");

    let neither = setup.proxy_args(false);
    let neither: Vec<&str> = neither.iter().map(String::as_str).collect();
    let line = common::idem_in(Path::new("/"), &neither).fails(2).to_owned();
    assert!(line.contains("not provided: <--upstream <URL>|COMMAND>"), "{line}");

    let tls = setup.http_args(false, "https://payments.example/mcp");
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let line = common::idem_in(Path::new("/"), &tls).fails(2).to_owned();
    assert!(line.contains("https://payments.example/mcp: this idem speaks plain HTTP"), "{line}");
    assert!(!Path::new(&setup.store["sqlite:".len()..]).exists(), "no store for bad usage");
}

/// Runs when `DATABASE_URL` names a PostgreSQL database, as idem-cli's other PostgreSQL test
/// does: the default schema and table, an order of this run's own.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_proxies_on_one_postgresql_store_charge_once() {
    let Some(python) = python() else { return };
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("skipped: DATABASE_URL is not set");
        return;
    };
    let mut setup = Setup::new(python, CONFIG);
    setup.store = url;
    let order = format!("pg-{}-{}", std::process::id(), idem_runtime::store::now_ms());
    let charge = || params("charge_card", json!({ "order_id": order, "amount": 42 }));
    let (a, b) = tokio::join!(setup.proxy(), setup.proxy());
    let (one, two) = tokio::join!(a.call(charge()), b.call(charge()));
    assert_eq!(setup.effects(), [format!("charge {order} 42")], "one charge for both proxies");
    assert_eq!(one, two, "both get the one charge's answer");

    // A third proxy, after both: a replay.
    within(a.client.cancel()).await.expect("the session closes");
    let again = setup.proxy().await;
    assert_eq!(again.call(charge()).await, one);
    assert_eq!(setup.effects().len(), 1, "still one charge");
}
