//! `idem mcp-proxy` in front of an upstream written with rmcp (`tests/common/rmcp_upstream.rs`),
//! with rmcp's client on the proxy's stdio, as a host runs it. The proxy spawns this test binary
//! itself as its upstream: with `IDEM_TEST_RMCP_UPSTREAM` set, `main` serves the upstream on
//! stdio instead of testing, which is why this test has no libtest harness (whose own output
//! would go to stdout, the protocol's channel).
#![cfg(unix)]

mod common;

use std::path::PathBuf;

use serde_json::json;

use self::common::proxy::{charge, charged, params, within, Setup, CONFIG};
use self::common::rmcp_upstream::{self, UPSTREAM};

fn main() {
    if std::env::var_os(UPSTREAM).is_some() {
        return rmcp_upstream::serve();
    }
    // The proxy passes its environment on to the upstream it spawns, and gets this process's:
    // the marker reaches the upstream (this binary again), which then serves.
    std::env::set_var(UPSTREAM, "1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(five_charges_charge_once_and_reads_pass_through());
    println!("test five_charges_charge_once_and_reads_pass_through ... ok");
}

/// The proxy's command line with this binary as the upstream.
fn args(setup: &Setup) -> Vec<String> {
    let mut args = setup.proxy_args(false);
    let me = std::env::current_exe().expect("the test binary's path");
    args.extend(["--".to_owned(), me.display().to_string()]);
    args
}

async fn five_charges_charge_once_and_reads_pass_through() {
    let setup = Setup::new(PathBuf::new(), CONFIG);

    let proxy = setup.proxy_with(args(&setup)).await;
    let tools = within(proxy.client.list_all_tools()).await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert_eq!(names, ["charge_card", "get_balance"], "the rmcp upstream's tools");

    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(charged(&proxy.call(charge()).await));
    }
    assert_eq!(setup.effects(), ["charge o-1"], "one charge upstream");
    assert!(answers.iter().all(|answer| answer == "ch_1_o-1"), "five equal answers: {answers:?}");

    for _ in 0..3 {
        let balance = proxy.call(params("get_balance", json!({ "account": "a-1" }))).await;
        assert_eq!(balance.is_error, Some(false), "{balance:?}");
    }
    let reads = setup.effects().iter().filter(|effect| *effect == "balance").count();
    assert_eq!(reads, 3, "every read reaches the upstream");
    drop(proxy);

    // A fresh proxy, and a fresh upstream behind it, on the same store: the charge replays.
    let fresh = setup.proxy_with(args(&setup)).await;
    assert_eq!(charged(&fresh.call(charge()).await), "ch_1_o-1");
    let charges = setup.effects().iter().filter(|effect| effect.starts_with("charge")).count();
    assert_eq!(charges, 1, "still one charge: {:?}", setup.effects());
}
