//! Behaviour of the attributes and `retry!`, through the macros, against real sled stores. Each
//! test has its own store in a temporary directory (tests run in parallel threads of one
//! process), named with `store = …`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use idem::{Durability, Kind, SledStore, Store};
use serde_json::json;

#[derive(Debug, PartialEq)]
enum PayError {
    Declined,
    Idem(String),
}

impl From<idem::Error> for PayError {
    fn from(error: idem::Error) -> Self {
        PayError::Idem(error.to_string())
    }
}

fn open_store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    let store =
        SledStore::builder(dir).durability(Durability::None).open().expect("open sled store");
    Arc::new(store)
}

/// A per-test store, opened on first use.
macro_rules! test_store {
    ($name:ident) => {
        static $name: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);
    };
}

mod seed {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::idempotent(scope = "step_id", store = STORE)]
    pub fn charge_card(amount: u64, customer: &str, step_id: &str) -> Result<String, PayError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        let _ = (amount, customer, step_id);
        Ok(idem::current_key().to_string())
    }
}

/// The key the Python reference derives for `args` of `tool` in `scope`, read from
/// `vectors/keys.jsonl` (add a vector there with `vectors/reference.py`, never with idem).
fn vector(tool: &str, scope: &str, args: serde_json::Value) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/vectors/keys.jsonl");
    let vectors = std::fs::read_to_string(path).expect("the key vectors");
    vectors
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a vector is JSON"))
        .find(|v| v["tool"] == tool && v["scope"] == scope && v["args"] == args)
        .and_then(|v| v["key"].as_str().map(str::to_owned))
        .unwrap_or_else(|| {
            panic!(
                "no vector of {tool} in {scope} with {args}: derive one with vectors/reference.py"
            )
        })
}

#[test]
fn current_key_is_the_seed_key() {
    let key = seed::charge_card(4200, "cus_123", "step-7").unwrap();
    assert_eq!(
        key,
        vector("charge_card", "step-7", json!({"amount": 4200, "customer": "cus_123"}))
    );
    let derived = idem::Key::derive(
        "charge_card",
        "step-7",
        &serde_json::json!({"amount": 4200, "customer": "cus_123"}),
    )
    .unwrap();
    assert_eq!(key, derived.as_str());
}

#[test]
fn repeated_calls_run_the_body_once_and_replay_its_result() {
    let first = seed::charge_card(100, "cus_9", "step-1").unwrap();
    let runs = seed::RUNS.load(Ordering::SeqCst);
    for _ in 0..5 {
        assert_eq!(seed::charge_card(100, "cus_9", "step-1").unwrap(), first);
    }
    assert_eq!(seed::RUNS.load(Ordering::SeqCst), runs);
}

mod counter {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    /// Returns the run number, so that a replay is told apart from a rerun.
    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn charge(order: &str, amount: u64) -> Result<usize, PayError> {
        let _ = (order, amount);
        Ok(RUNS.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[test]
fn replays_the_first_result_and_keys_by_arguments() {
    let first = counter::charge("o-1", 10).unwrap();
    assert_eq!(counter::charge("o-1", 10).unwrap(), first);
    let other_amount = counter::charge("o-1", 11).unwrap();
    let other_scope = counter::charge("o-2", 10).unwrap();
    assert_ne!(other_amount, first);
    assert_ne!(other_scope, first);
    assert_ne!(other_scope, other_amount);
}

mod flaky {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    /// Declines its first two runs, then succeeds.
    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn charge(order: &str) -> Result<String, PayError> {
        let run = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
        if run <= 2 {
            return Err(PayError::Declined);
        }
        Ok(format!("{order}: charged on run {run}"))
    }
}

#[test]
fn an_error_releases_the_key_so_the_next_call_runs() {
    assert_eq!(flaky::charge("o-1"), Err(PayError::Declined));
    assert_eq!(flaky::charge("o-1"), Err(PayError::Declined));
    assert_eq!(flaky::charge("o-1").unwrap(), "o-1: charged on run 3");
    assert_eq!(flaky::charge("o-1").unwrap(), "o-1: charged on run 3");
    assert_eq!(flaky::RUNS.load(Ordering::SeqCst), 3);
}

mod panicky {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn send(order: &str) -> Result<(), PayError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        panic!("the vendor call blew up after sending {order}");
    }

    #[idem::idempotent(scope = "order", tool = "send", store = STORE, in_doubt = "rerun")]
    pub fn send_again(order: &str) -> Result<String, PayError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("resent {order}"))
    }
}

#[test]
fn a_panic_leaves_the_key_in_doubt() {
    let crashed = catch_unwind(AssertUnwindSafe(|| panicky::send("o-1")));
    assert!(crashed.is_err());
    match panicky::send("o-1") {
        Err(PayError::Idem(message)) => assert!(message.contains("in doubt"), "{message}"),
        other => panic!("expected the key in doubt, got {other:?}"),
    }
    assert_eq!(panicky::RUNS.load(Ordering::SeqCst), 1);
    // Same tool name, scope and arguments: the same key, now taken over by `rerun`.
    assert_eq!(panicky::send_again("o-1").unwrap(), "resent o-1");
    assert_eq!(panicky::RUNS.load(Ordering::SeqCst), 2);
}

mod contended {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::idempotent(scope = "order", store = STORE, wait = "30s")]
    pub async fn charge(order: String, amount: u64) -> Result<u64, PayError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = order;
        Ok(amount * 2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_tasks_on_one_key_run_the_body_once() {
    let tasks: Vec<_> =
        (0..32).map(|_| tokio::spawn(contended::charge("o-1".to_owned(), 21))).collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), 42);
    }
    assert_eq!(contended::RUNS.load(Ordering::SeqCst), 1);
}

mod skipping {
    use super::*;

    test_store!(STORE);

    pub struct Client {
        pub name: &'static str,
    }

    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn charge(
        #[idem(skip)] client: &Client,
        order: &str,
        amount: u64,
    ) -> Result<String, PayError> {
        let _ = (order, amount);
        Ok(format!("{} {}", client.name, idem::current_key()))
    }
}

#[test]
fn skipped_parameters_do_not_change_the_key() {
    let first = skipping::charge(&skipping::Client { name: "a" }, "o-1", 5).unwrap();
    let second = skipping::charge(&skipping::Client { name: "b" }, "o-1", 5).unwrap();
    assert_eq!(first, second, "the second call replays the first");
    let key = idem::Key::derive("charge", "o-1", &serde_json::json!({"amount": 5})).unwrap();
    assert_eq!(first, format!("a {key}"));
}

mod renamed {
    use super::*;

    test_store!(STORE);

    #[idem::idempotent(scope = "order", tool = "refund", store = STORE)]
    pub fn refund_v1(order: &str) -> Result<String, PayError> {
        Ok(format!("v1 {}", idem::current_key()))
    }

    #[idem::idempotent(scope = "order", tool = "refund", store = STORE)]
    pub fn refund_v2(order: &str) -> Result<String, PayError> {
        Ok(format!("v2 {}", idem::current_key()))
    }
}

#[test]
fn a_pinned_tool_name_keeps_the_key_across_a_rename() {
    let before = renamed::refund_v1("o-1").unwrap();
    let after = renamed::refund_v2("o-1").unwrap();
    assert_eq!(before, after, "the renamed function replays the old record");
    let key = idem::Key::derive("refund", "o-1", &serde_json::json!({})).unwrap();
    assert_eq!(before, format!("v1 {key}"));
}

mod field_scope {
    use super::*;

    test_store!(STORE);

    #[derive(serde::Serialize)]
    pub struct ChargeRequest {
        pub order_id: String,
        pub amount: u64,
    }

    #[idem::idempotent(scope = "req.order_id", store = STORE)]
    pub async fn charge(req: ChargeRequest) -> Result<String, PayError> {
        let _ = req.amount;
        Ok(idem::current_key().to_string())
    }
}

#[tokio::test]
async fn a_field_path_scope_keeps_the_parameter_in_the_key() {
    let request = field_scope::ChargeRequest { order_id: "o-7".to_owned(), amount: 3 };
    let key = field_scope::charge(request).await.unwrap();
    let expected = idem::Key::derive(
        "charge",
        "o-7",
        &serde_json::json!({"req": {"order_id": "o-7", "amount": 3}}),
    )
    .unwrap();
    assert_eq!(key, expected.as_str());
}

mod methods {
    use super::*;

    test_store!(STORE);

    pub struct Payments {
        pub runs: AtomicUsize,
    }

    impl Payments {
        #[idem::idempotent(scope = "order", store = STORE)]
        pub async fn charge(&self, order: &str, amount: u64) -> Result<u64, PayError> {
            let _ = order;
            self.runs.fetch_add(1, Ordering::SeqCst);
            Ok(amount)
        }

        #[idem::idempotent(scope = "order", store = STORE)]
        pub fn refund(&mut self, order: &str) -> Result<usize, PayError> {
            let _ = order;
            Ok(self.runs.fetch_add(1, Ordering::SeqCst))
        }
    }
}

#[tokio::test]
async fn self_is_not_part_of_the_key() {
    let first = methods::Payments { runs: AtomicUsize::new(0) };
    let second = methods::Payments { runs: AtomicUsize::new(0) };
    assert_eq!(first.charge("o-1", 9).await.unwrap(), 9);
    assert_eq!(second.charge("o-1", 9).await.unwrap(), 9);
    assert_eq!(first.runs.load(Ordering::SeqCst) + second.runs.load(Ordering::SeqCst), 1);
    let mut third = methods::Payments { runs: AtomicUsize::new(10) };
    assert_eq!(third.refund("o-1").unwrap(), 10);
    assert_eq!(third.refund("o-1").unwrap(), 10);
}

mod retried {
    use super::*;

    pub static READS: AtomicUsize = AtomicUsize::new(0);
    pub static CHARGES: AtomicUsize = AtomicUsize::new(0);
    pub static EFFECTS: AtomicUsize = AtomicUsize::new(0);

    /// Fails three times, then reads.
    #[idem::read]
    pub fn get_balance(customer: &str) -> Result<u64, PayError> {
        if READS.fetch_add(1, Ordering::SeqCst) < 3 {
            return Err(PayError::Declined);
        }
        Ok(customer.len() as u64)
    }

    /// Uses the process default store, which only this test installs. The effect lands on the second attempt, whose response is lost on the way back (an
    /// error after the effect, which the vendor dedups by key); the third attempt succeeds.
    #[idem::idempotent(scope = "order")]
    pub async fn charge(order: &str, amount: u64) -> Result<u64, PayError> {
        let _ = order;
        let attempt = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
        if attempt == 1 {
            return Err(PayError::Declined);
        }
        // The vendor applies each idempotency key once.
        static APPLIED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let key = idem::current_key().to_string();
        {
            let mut applied = APPLIED.lock().unwrap();
            if !applied.contains(&key) {
                applied.push(key);
                EFFECTS.fetch_add(1, Ordering::SeqCst);
            }
        }
        if attempt == 2 {
            return Err(PayError::Declined);
        }
        Ok(amount)
    }
}

fn quick() -> idem::Backoff {
    idem::Backoff::default().min_delay(Duration::from_millis(1)).max_delay(Duration::from_millis(5))
}

#[test]
fn retry_repeats_a_read_until_it_succeeds() {
    let balance = idem::retry!(retried::get_balance("cus_123"), backoff = quick());
    assert_eq!(balance, Ok(7));
    assert_eq!(retried::READS.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn retry_repeats_an_idempotent_write_and_its_effect_lands_once() {
    idem::set_default_store(open_store());
    let charged = idem::retry!(retried::charge("o-1", 500).await, backoff = quick());
    assert_eq!(charged, Ok(500));
    assert_eq!(retried::CHARGES.load(Ordering::SeqCst), 3);
    assert_eq!(retried::EFFECTS.load(Ordering::SeqCst), 1);
    // Later retries replay.
    assert_eq!(idem::retry!(retried::charge("o-1", 500).await), Ok(500));
    assert_eq!(retried::CHARGES.load(Ordering::SeqCst), 3);
}

#[test]
fn retry_gives_up_after_the_backoff_and_stops_on_refused_errors() {
    let result = idem::retry!(give_up::declined(), backoff = quick().max_retries(2));
    assert_eq!(result, Err(PayError::Declined));
    assert_eq!(give_up::RUNS.load(Ordering::SeqCst), 3);
    let refused = idem::retry!(give_up::declined(), backoff = quick(), when = |_: &PayError| false);
    assert_eq!(refused, Err(PayError::Declined));
    assert_eq!(give_up::RUNS.load(Ordering::SeqCst), 4);
}

mod give_up {
    use super::*;

    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::read]
    pub fn declined() -> Result<(), PayError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Err(PayError::Declined)
    }
}

#[test]
fn each_attribute_classifies_its_tool_at_compile_time() {
    const READ: idem::ToolInfo = idem::tool_info!(retried::get_balance);
    const KEYED: idem::ToolInfo = idem::tool_info!(seed::charge_card);
    const PINNED: idem::ToolInfo = idem::tool_info!(renamed::refund_v2);
    const UNKEYED: idem::ToolInfo = idem::tool_info!(fax::send_fax);
    assert_eq!(READ, idem::ToolInfo::new("get_balance", Kind::Read));
    assert_eq!(KEYED.kind, Kind::Idempotent { scope: "step_id" });
    assert_eq!(PINNED.name, "refund");
    assert_eq!(UNKEYED.kind, Kind::Write);

    let read = READ.annotations();
    assert!(read.read_only_hint && read.idempotent_hint && !read.destructive_hint);
    let keyed = KEYED.annotations();
    assert!(!keyed.read_only_hint && keyed.idempotent_hint && keyed.destructive_hint);
    let unkeyed = UNKEYED.annotations();
    assert!(!unkeyed.read_only_hint && !unkeyed.idempotent_hint && unkeyed.destructive_hint);
    assert!(READ.retry_safe() && KEYED.retry_safe() && !UNKEYED.retry_safe());
}

mod fax {
    pub static SENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// A write with no key: runs every time.
    #[idem::write]
    pub fn send_fax(to: &str) -> Result<(), std::io::Error> {
        let _ = to;
        SENT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_write_runs_its_body_every_time() {
    fax::send_fax("+1").unwrap();
    fax::send_fax("+1").unwrap();
    assert_eq!(fax::SENT.load(Ordering::SeqCst), 2);
}

#[test]
fn async_tool_futures_stay_send() {
    fn assert_send<F: std::future::Future + Send>(_: &F) {}
    let future = contended::charge("o-send".to_owned(), 1);
    assert_send(&future);
    let payments = methods::Payments { runs: AtomicUsize::new(0) };
    assert_send(&payments.charge("o-send", 1));
    drop(future);
}

mod doubtful {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);
    pub static ASYNC_RUNS: AtomicUsize = AtomicUsize::new(0);

    /// Crashes mid-effect on its first run, leaving the key in doubt.
    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn send_invoice(order: &str) -> Result<u32, PayError> {
        let _ = order;
        if RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("crash mid-effect");
        }
        Ok(1)
    }

    #[idem::idempotent(scope = "order", store = STORE)]
    pub async fn send_reminder(order: &str) -> Result<u32, PayError> {
        let _ = order;
        if ASYNC_RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("crash mid-effect");
        }
        Ok(1)
    }
}

#[test]
fn retry_returns_an_in_doubt_key_at_once() {
    assert!(catch_unwind(|| doubtful::send_invoice("o-9")).is_err(), "the first run crashes");
    let mut asked = 0;
    let result = idem::retry!(
        doubtful::send_invoice("o-9"),
        backoff = quick(),
        when = |_: &PayError| {
            asked += 1;
            true
        }
    );
    assert!(
        matches!(&result, Err(PayError::Idem(text)) if text.contains("in doubt")),
        "{result:?}"
    );
    assert_eq!(asked, 0, "no attempt can settle an in-doubt key: it is not retried");
    assert_eq!(doubtful::RUNS.load(Ordering::SeqCst), 1, "the body never ran again");
}

#[tokio::test]
async fn retry_returns_an_in_doubt_key_at_once_in_async_tools() {
    let crashed = tokio::spawn(doubtful::send_reminder("o-10")).await;
    assert!(crashed.is_err_and(|e| e.is_panic()), "the first run crashes");
    let mut asked = 0;
    let result = idem::retry!(
        doubtful::send_reminder("o-10").await,
        backoff = quick(),
        when = |_: &PayError| {
            asked += 1;
            true
        }
    );
    assert!(
        matches!(&result, Err(PayError::Idem(text)) if text.contains("in doubt")),
        "{result:?}"
    );
    assert_eq!(asked, 0, "not retried");
    assert_eq!(doubtful::ASYNC_RUNS.load(Ordering::SeqCst), 1, "the body never ran again");
}

// The reference keys below were computed with the reference derivation in Python,
// `sha256(f"{scope}\0{tool}\0{json.dumps(args, sort_keys=True, separators=(',', ':'))}")[:32]`,
// and are written here as it printed them, so that they check the macro against Python rather
// than against `Key::derive`.

mod raw {
    use super::*;

    test_store!(STORE);

    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn charge(r#type: &str, order: &str) -> Result<String, PayError> {
        let _ = (r#type, order);
        Ok(idem::current_key().to_string())
    }

    #[idem::idempotent(scope = "r#type", store = STORE)]
    pub fn classify(r#type: &str, amount: u64) -> Result<String, PayError> {
        let _ = (r#type, amount);
        Ok(idem::current_key().to_string())
    }
}

#[test]
fn raw_identifier_parameters_key_by_their_plain_names() {
    // {"type": "card"} in scope "o-1" for tool "charge".
    assert_eq!(
        raw::charge("card", "o-1").unwrap(),
        vector("charge", "o-1", json!({"type": "card"}))
    );
    // {"amount": 5} in scope "refund" for tool "classify".
    assert_eq!(
        raw::classify("refund", 5).unwrap(),
        vector("classify", "refund", json!({"amount": 5}))
    );
    const INFO: idem::ToolInfo = idem::tool_info!(raw::classify);
    assert_eq!(INFO.kind, Kind::Idempotent { scope: "type" });
}

mod conditional {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn charge(
        order: &str,
        #[cfg(any())] gone: String,
        kept: u8,
        #[cfg(test)] present: bool,
        #[cfg_attr(test, cfg(any()), allow(unused))] also_gone: u32,
    ) -> Result<String, PayError> {
        let _ = (order, kept, present);
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(idem::current_key().to_string())
    }
}

#[test]
fn a_parameter_compiled_out_leaves_the_key() {
    // {"kept": 7, "present": true} in scope "o-1" for tool "charge".
    let expected = vector("charge", "o-1", json!({"kept": 7, "present": true}));
    assert_eq!(conditional::charge("o-1", 7, true).unwrap(), expected);
    assert_eq!(conditional::charge("o-1", 7, true).unwrap(), expected);
    assert_eq!(conditional::RUNS.load(Ordering::SeqCst), 1);
}

mod tangled {
    use super::*;

    test_store!(STORE);

    /// Every parameter is named like a binding of the expansion.
    #[idem::idempotent(scope = "__idem_call", tool = "tangle", store = STORE, wait = "1s")]
    pub fn tangle(
        __idem_call: &str,
        __idem_args: u32,
        __idem_body: &str,
        __idem_ret: bool,
        __idem_store: u8,
        __idem_lookup: u8,
    ) -> Result<String, PayError> {
        let _ = (__idem_call, __idem_args, __idem_body, __idem_ret, __idem_store, __idem_lookup);
        Ok(idem::current_key().to_string())
    }
}

#[test]
fn parameters_named_like_the_expansion_keep_their_values() {
    // {"__idem_args": 3, "__idem_body": "b", "__idem_lookup": 5, "__idem_ret": true,
    // "__idem_store": 4} in scope "o-1" for tool "tangle".
    let key = tangled::tangle("o-1", 3, "b", true, 4, 5).unwrap();
    assert_eq!(
        key,
        vector(
            "tangle",
            "o-1",
            json!({"__idem_args": 3, "__idem_body": "b", "__idem_lookup": 5, "__idem_ret": true, "__idem_store": 4})
        )
    );
}

/// A tool in a module of its own name, re-exported beside it: the layout that a companion
/// type named like the function made fail to compile.
mod refunds {
    pub mod refund {
        use super::super::*;

        test_store!(STORE);
        pub static RUNS: AtomicUsize = AtomicUsize::new(0);

        #[idem::idempotent(scope = "order", store = STORE)]
        pub fn refund(order: &str, amount: u64) -> Result<String, PayError> {
            let _ = (order, amount);
            RUNS.fetch_add(1, Ordering::SeqCst);
            Ok(idem::current_key().to_string())
        }
    }
    pub use refund::{__idem_tool_refund, refund};
}

#[test]
fn a_tool_in_a_module_of_its_name_is_keyed_and_classified() {
    // {"amount": 8} in scope "o-4" for tool "refund".
    let key = idem::retry!(refunds::refund("o-4", 8), backoff = quick()).unwrap();
    assert_eq!(key, vector("refund", "o-4", json!({"amount": 8})));
    assert_eq!(refunds::refund("o-4", 8).unwrap(), key);
    assert_eq!(refunds::refund::RUNS.load(Ordering::SeqCst), 1);
    const INFO: idem::ToolInfo = idem::tool_info!(refunds::refund);
    assert_eq!(INFO.kind, Kind::Idempotent { scope: "order" });
    assert_eq!(idem::tool_info!(refunds::refund::refund), INFO);
}

mod associated {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    pub struct Ledger;

    impl Ledger {
        #[idem::read]
        pub fn ping(x: u32) -> Result<u32, PayError> {
            Ok(x)
        }

        #[idem::idempotent(scope = "order", tool = "settle", store = STORE)]
        pub fn settle(order: &str, amount: u64) -> Result<String, PayError> {
            let _ = (order, amount);
            RUNS.fetch_add(1, Ordering::SeqCst);
            Ok(idem::current_key().to_string())
        }

        #[idem::write]
        pub(crate) fn wipe() -> Result<(), PayError> {
            Ok(())
        }
    }
}

#[test]
fn an_associated_function_is_keyed_and_classified() {
    // {"amount": 30} in scope "o-2" for tool "settle".
    let key = associated::Ledger::settle("o-2", 30).unwrap();
    assert_eq!(key, vector("settle", "o-2", json!({"amount": 30})));
    assert_eq!(associated::Ledger::settle("o-2", 30).unwrap(), key);
    assert_eq!(associated::RUNS.load(Ordering::SeqCst), 1);
    assert_eq!(idem::retry!(associated::Ledger::ping(4)), Ok(4));
    assert_eq!(idem::tool_info!(associated::Ledger::ping).kind, Kind::Read);
    assert_eq!(idem::tool_info!(associated::Ledger::wipe).kind, Kind::Write);
    associated::Ledger::wipe().unwrap();
}

mod future_returning {
    use super::*;

    test_store!(STORE);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn charge_later(
        order: String,
        amount: u64,
    ) -> impl std::future::Future<Output = Result<String, PayError>> + Send {
        async move {
            let _ = (order, amount);
            RUNS.fetch_add(1, Ordering::SeqCst);
            Ok(idem::current_key().to_string())
        }
    }
}

#[tokio::test]
async fn a_function_returning_a_future_runs_once_per_key() {
    // {"amount": 12} in scope "o-3" for tool "charge_later".
    let key = future_returning::charge_later("o-3".to_owned(), 12).await.unwrap();
    assert_eq!(key, vector("charge_later", "o-3", json!({"amount": 12})));
    assert_eq!(future_returning::charge_later("o-3".to_owned(), 12).await.unwrap(), key);
    assert_eq!(future_returning::RUNS.load(Ordering::SeqCst), 1);
}
