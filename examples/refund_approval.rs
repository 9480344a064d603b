//! A refund over a threshold waits for a person: the agent's call records its key as awaiting
//! approval and waits, an operator lists what waits and approves it with `idem approve`, and
//! the refund runs once. The model then changes the amount: that is another key, which needs
//! its own approval, and the operator denies it with a note the agent's call receives.
//!
//! ```text
//! cargo run --example refund_approval
//! ```
//!
//! **How the operator step runs.** With `IDEM_BIN` naming the `idem` command (the example's
//! test sets it; `cargo build -p idem-agent-cli` builds it as `target/debug/idem`), it runs that
//! command, which reaches this process through the store's admin socket, exactly as an operator
//! would from another terminal. Without it, it calls [`idem::admin::decide`], the function
//! behind `idem approve`, and prints the command an operator would type.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idem::admin::{self, Decision, Filter};
use idem::{Error, Key, SledStore, Status, Store};

static STORE: OnceLock<Arc<dyn Store>> = OnceLock::new();
static REFUNDS: AtomicU32 = AtomicU32::new(0);

fn store() -> Arc<dyn Store> {
    Arc::clone(STORE.get().expect("main opens the store first"))
}

/// Refunds `amount_cents` on an order. Over 100.00 a person must approve the exact refund; the
/// call waits up to a minute for the decision.
#[idem::idempotent(
    scope = "order_id",
    store = store,
    approve_if = "amount_cents > 10_000",
    approve_wait = "60s"
)]
fn refund(order_id: &str, amount_cents: u64) -> Result<String, Error> {
    let n = REFUNDS.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("re_{n} ({amount_cents} cents on {order_id})"))
}

/// The key an operator sees waiting for `amount_cents` on order o-2, once the call has asked.
fn waiting_key(amount_cents: u64) -> Key {
    let key = Key::derive("refund", "o-2", &serde_json::json!({ "amount_cents": amount_cents }))
        .expect("a key");
    let deadline = Instant::now() + Duration::from_secs(30);
    let awaiting = Filter::new().status(Status::AwaitingApproval).tool("refund");
    loop {
        let listed = admin::scan(store().as_ref(), &awaiting).expect("the store lists").records;
        if let Some(record) = listed.iter().find(|record| record.key == key.as_str()) {
            println!("   $ idem ls --status awaiting-approval");
            println!("   {}  {}  {}  {}", record.key, record.tool, record.scope, record.status);
            return key;
        }
        assert!(Instant::now() < deadline, "the call never asked for approval");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Approves or denies `key` as an operator does: with the `idem` command when `IDEM_BIN` names
/// it, else with the function behind it.
fn operator(path: &Path, key: &Key, decision: Decision, note: &str) {
    let verb = decision.as_str();
    println!("   $ idem --store {} {verb} {key} --note '{note}'", path.display());
    match std::env::var_os("IDEM_BIN") {
        Some(idem) => {
            let output = Command::new(idem)
                .arg("--store")
                .arg(path)
                .args([verb, key.as_str(), "--note", note])
                .output()
                .expect("the idem command runs");
            let said = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success(), "idem {verb} failed: {output:?}");
            println!("   {}", said.trim_end());
        }
        None => {
            admin::decide(store().as_ref(), key, decision, "operator", Some(note))
                .expect("the decision is recorded");
        }
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("idem.sled");
    let opened: Arc<dyn Store> = Arc::new(SledStore::open(&path).expect("the store opens"));
    STORE.set(opened).ok().expect("opened once");

    println!("1. A small refund runs at once:");
    println!("   {}", refund("o-1", 2_500).expect("no approval needed"));

    println!("2. A refund of 500.00 waits for a person:");
    let waiting = std::thread::spawn(|| refund("o-2", 50_000));
    let key = waiting_key(50_000);
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 1, "nothing ran while it waits");
    operator(&path, &key, Decision::Approve, "customer called, refund agreed");
    let refunded = waiting.join().expect("the call returns").expect("approved, so it runs");
    println!("   the waiting call went on: {refunded}");
    let again = refund("o-2", 50_000).expect("replayed");
    assert_eq!(again, refunded, "a retry replays the refund");
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 2, "the approved refund ran once");
    println!("   a retry replays it: {again}");

    println!("3. The model changes the amount to 600.00: another key, its own approval:");
    let changed = std::thread::spawn(|| refund("o-2", 60_000));
    let other = waiting_key(60_000);
    assert_ne!(other, key, "the approval of 500.00 does not cover 600.00");
    operator(&path, &other, Decision::Deny, "only 500.00 was agreed");
    match changed.join().expect("the call returns") {
        Err(denied @ Error::Denied { .. }) => println!("   the call is refused: {denied}"),
        other => panic!("expected a denial, got {other:?}"),
    }
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 2, "the denied refund never ran");
    println!(
        "ok: the refund over the threshold ran once, after approval; the changed one never ran"
    );
}
