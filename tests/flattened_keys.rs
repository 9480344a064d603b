//! What the key of a `#[idem(flatten)]` tool is over: the arguments as the parameter's type
//! reads and writes them, with `null` members left out and `ignore = […]` fields left out. So the
//! model's cosmetic variations of one call are one key, a new `Option` field leaves old keys
//! alone, and a reworded free-text field does not run the effect twice.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The reference: `sha256(f"{scope}\0{tool}\0{canonical}")[:32]`, `canonical` written out as
/// `vectors/reference.py` derives it for a flattened tool.
fn reference_key(scope: &str, tool: &str, canonical: &str) -> String {
    let digest = Sha256::digest(format!("{scope}\0{tool}\0{canonical}").as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    hex[..32].to_owned()
}

/// One sled store for the whole test binary: the default store is set once per process.
fn store() {
    static STORE: OnceLock<(tempfile::TempDir, Arc<dyn idem::Store>)> = OnceLock::new();
    STORE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store: Arc<dyn idem::Store> =
            Arc::new(idem::SledStore::open(dir.path().join("idem.sled")).expect("sled opens"));
        idem::set_default_store(store.clone());
        (dir, store)
    });
}

/// A one-field wrapper, as rmcp's `Parameters<T>` is.
struct Parameters<T>(T);

#[derive(Serialize, Deserialize)]
struct Order {
    #[serde(alias = "order")]
    order_id: String,
    amount: f64,
    note: Option<String>,
    #[serde(default)]
    express: bool,
}

static ORDER_RUNS: AtomicU32 = AtomicU32::new(0);
static ORDER_KEYS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[idem::idempotent(scope = "order_id")]
fn place_order(#[idem(flatten)] Parameters(req): Parameters<Order>) -> Result<u32, String> {
    ORDER_KEYS.lock().unwrap().push(idem::current_key().to_string());
    Ok(ORDER_RUNS.fetch_add(1, Ordering::SeqCst) + 1)
}

fn order(arguments: &str) -> Result<u32, String> {
    let req: Order = serde_json::from_str(arguments).expect("the arguments deserialize");
    place_order(Parameters(req))
}

#[test]
fn the_models_cosmetic_variations_of_one_call_are_one_key() {
    store();
    let variations = [
        r#"{"order_id":"o-1","amount":10.0,"express":false}"#,
        r#"{"order_id":"o-1","amount":10}"#,
        r#"{"order_id":"o-1","amount":10.0,"note":null}"#,
        r#"{"order":"o-1","amount":10.0}"#,
        r#"{"order_id":"o-1","amount":1e1,"because":"the model added this"}"#,
    ];
    for arguments in variations {
        assert_eq!(order(arguments), Ok(1), "{arguments} replays the first call");
    }
    assert_eq!(ORDER_RUNS.load(Ordering::SeqCst), 1, "one intent ran once");
    let expected =
        reference_key("o-1", "place_order", r#"{"amount":10.0,"express":false,"order_id":"o-1"}"#);
    assert_eq!(*ORDER_KEYS.lock().unwrap(), [expected], "the key has no `note`: it is null");

    assert_eq!(order(r#"{"order_id":"o-1","amount":10,"note":"gift"}"#), Ok(2));
    assert_eq!(order(r#"{"order_id":"o-1","amount":10,"express":true}"#), Ok(3));
    assert_eq!(ORDER_RUNS.load(Ordering::SeqCst), 3, "a note or a changed field is another intent");
}

static REFUND_RUNS: AtomicU32 = AtomicU32::new(0);

/// The tool as a first release shipped it.
mod v1 {
    use super::*;

    #[derive(Serialize, Deserialize)]
    pub struct Refund {
        pub order_id: String,
        pub cents: u64,
    }

    #[idem::idempotent(scope = "order_id", tool = "refund")]
    pub fn refund(#[idem(flatten)] req: Refund) -> Result<String, String> {
        REFUND_RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("v1 refunded {}", req.cents))
    }
}

/// The next release, with an optional field the old calls do not use.
mod v2 {
    use super::*;

    #[derive(Serialize, Deserialize)]
    pub struct Refund {
        pub order_id: String,
        pub cents: u64,
        pub reason: Option<String>,
    }

    #[idem::idempotent(scope = "order_id", tool = "refund")]
    pub fn refund(#[idem(flatten)] req: Refund) -> Result<String, String> {
        REFUND_RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("v2 refunded {}", req.cents))
    }
}

#[test]
fn an_option_field_added_in_a_new_release_leaves_the_keys_of_calls_that_do_not_use_it() {
    store();
    let arguments = r#"{"order_id":"o-7","cents":500}"#;
    let before = v1::refund(serde_json::from_str(arguments).unwrap());
    assert_eq!(before.as_deref(), Ok("v1 refunded 500"));
    // The deploy lands; the agent retries the same call.
    let after = v2::refund(serde_json::from_str(arguments).unwrap());
    assert_eq!(after.as_deref(), Ok("v1 refunded 500"), "the retry replays the first run");
    assert_eq!(REFUND_RUNS.load(Ordering::SeqCst), 1);

    let with_reason = r#"{"order_id":"o-7","cents":500,"reason":"damaged"}"#;
    let other = v2::refund(serde_json::from_str(with_reason).unwrap());
    assert_eq!(other.as_deref(), Ok("v2 refunded 500"), "a reason given is another intent");
    assert_eq!(REFUND_RUNS.load(Ordering::SeqCst), 2);
}

#[derive(Serialize, Deserialize)]
struct Mail {
    to: String,
    subject: String,
    body: String,
    r#type: Option<String>,
}

static MAIL_RUNS: AtomicU32 = AtomicU32::new(0);
static MAIL_KEYS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The body is free text the model rewords on a retry; the kind of mail is not part of the
/// intent either (and is a raw identifier, named plain).
#[idem::idempotent(scope = "to", ignore = ["body", "r#type"])]
fn send_mail(#[idem(flatten)] Parameters(mail): Parameters<Mail>) -> Result<String, String> {
    MAIL_RUNS.fetch_add(1, Ordering::SeqCst);
    MAIL_KEYS.lock().unwrap().push(idem::current_key().to_string());
    Ok(format!("sent: {}", mail.body))
}

fn mail(subject: &str, body: &str, kind: Option<&str>) -> Parameters<Mail> {
    Parameters(Mail {
        to: "ada@example.com".to_owned(),
        subject: subject.to_owned(),
        body: body.to_owned(),
        r#type: kind.map(str::to_owned),
    })
}

#[test]
fn an_ignored_field_is_left_out_of_the_key() {
    store();
    let first = send_mail(mail("Your receipt", "Thanks!", Some("receipt")));
    let reworded = send_mail(mail("Your receipt", "Thank you so much!", None));
    assert_eq!(first.as_deref(), Ok("sent: Thanks!"));
    assert_eq!(reworded.as_deref(), Ok("sent: Thanks!"), "the reworded retry is a replay");
    assert_eq!(MAIL_RUNS.load(Ordering::SeqCst), 1);
    let expected = reference_key(
        "ada@example.com",
        "send_mail",
        r#"{"subject":"Your receipt","to":"ada@example.com"}"#,
    );
    assert_eq!(*MAIL_KEYS.lock().unwrap(), [expected]);

    let other = send_mail(mail("Your invoice", "Thanks!", None));
    assert_eq!(other.as_deref(), Ok("sent: Thanks!"));
    assert_eq!(MAIL_RUNS.load(Ordering::SeqCst), 2, "a field not ignored still counts");
}
