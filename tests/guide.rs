//! The walk-through that the crate docs once held as doctests, asserting what each step showed:
//! the key a body sends its vendor, `retry!` on a read, a key left in doubt by a panic and settled
//! by an operator, a reconciler and a sweep, and a tool naming its own store. The crate docs keep
//! the quick start; the README teaches the rest.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idem::admin::Resolution;
use idem::{Key, Reconciled};

/// One sled store for the whole test binary: the default store is set once per process.
fn store() -> Arc<dyn idem::Store> {
    static STORE: OnceLock<(tempfile::TempDir, Arc<dyn idem::Store>)> = OnceLock::new();
    let (_, store) = STORE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store: Arc<dyn idem::Store> =
            Arc::new(idem::SledStore::open(dir.path().join("idem.sled")).expect("sled opens"));
        idem::set_default_store(store.clone());
        (dir, store)
    });
    store.clone()
}

#[idem::idempotent(scope = "order_id", in_doubt = "rerun")]
fn charge_with_vendor_key(amount: u64, order_id: &str) -> Result<String, idem::Error> {
    let key = idem::current_key();
    Ok(format!("charged {amount} under key {key}"))
}

#[test]
fn the_body_sees_the_key_derived_from_the_intent() {
    store();
    let key = Key::derive("charge_with_vendor_key", "o-17", &serde_json::json!({"amount": 4200}))
        .unwrap();
    let want = format!("charged 4200 under key {key}");
    assert_eq!(charge_with_vendor_key(4200, "o-17").unwrap(), want);
    assert_eq!(charge_with_vendor_key(4200, "o-17").unwrap(), want, "replayed, same key");
    assert!(idem::try_current_key().is_none(), "outside a call there is no key");
}

static BALANCE_TRIES: AtomicU32 = AtomicU32::new(0);

/// Fails twice, then answers.
#[idem::read]
fn get_balance(customer: &str) -> Result<u64, String> {
    match BALANCE_TRIES.fetch_add(1, Ordering::SeqCst) {
        0 | 1 => Err("the service is busy".to_owned()),
        _ => Ok(customer.len() as u64 * 100),
    }
}

#[idem::write]
fn send_fax(_to: &str) -> Result<(), String> {
    Ok(())
}

#[test]
fn retry_repeats_a_read_until_it_answers() {
    let quick = idem::Backoff::default().min_delay(Duration::from_millis(1));
    assert_eq!(idem::retry!(get_balance("cus_42"), backoff = quick), Ok(600));
    assert_eq!(BALANCE_TRIES.load(Ordering::SeqCst), 3);

    // `when` takes a predicate over the tool's error; this attempt answers at once.
    let again = idem::retry!(get_balance("cus_42"), when = |e: &String| e.contains("busy"));
    assert_eq!(again, Ok(600));
    assert_eq!(BALANCE_TRIES.load(Ordering::SeqCst), 4);

    // `idem::retry!(send_fax("+1 555"))` does not compile (tests/ui holds that case).
    assert_eq!(idem::tool_info!(send_fax).kind, idem::Kind::Write);
    assert_eq!(send_fax("+1 555"), Ok(()));
}

#[derive(Debug)]
enum MailError {
    Idem(idem::Error),
}

impl From<idem::Error> for MailError {
    fn from(error: idem::Error) -> Self {
        MailError::Idem(error)
    }
}

#[idem::idempotent(scope = "ticket")]
fn send_reply(ticket: u32, text: &str) -> Result<String, MailError> {
    panic!("the mail server hung up after accepting ticket {ticket}'s reply");
}

#[test]
fn a_panicked_body_leaves_the_key_in_doubt_until_an_operator_resolves_it() {
    let store = store();
    // The body panicked: the reply may have gone out.
    assert!(std::panic::catch_unwind(|| send_reply(7, "Fixed.")).is_err());

    let key = match send_reply(7, "Fixed.") {
        Err(MailError::Idem(error @ idem::Error::InDoubt { .. })) => {
            assert!(error.to_string().contains("idem resolve"), "{error}");
            Key::parse(error.key().unwrap()).unwrap()
        }
        other => panic!("expected the key in doubt, got {other:?}"),
    };

    // The mail log shows the reply was sent: record that, and later calls replay it.
    idem::admin::resolve(
        store.as_ref(),
        &key,
        Resolution::Done(serde_json::json!("sent")),
        "ann@ops-1",
        Some("the vendor shows the message as sent"),
        false,
    )
    .unwrap();
    assert_eq!(send_reply(7, "Fixed.").unwrap(), "sent");
}

/// The vendor's charges, by the idempotency key each was made under.
static VENDOR: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

fn vendor_charge(key: &Key) -> String {
    let mut charges = VENDOR.lock().unwrap();
    let id = format!("ch_{}", charges.len() + 1);
    charges.push((key.to_string(), id.clone()));
    id
}

fn vendor_find(key: &Key) -> Option<String> {
    VENDOR.lock().unwrap().iter().find(|(k, _)| k == key.as_str()).map(|(_, id)| id.clone())
}

#[idem::idempotent(scope = "order_id", reconcile = "find_charge")]
fn charge_reconciled(amount: u64, order_id: &str) -> Result<String, String> {
    let id = vendor_charge(&idem::current_key());
    // The vendor charged, and its answer was lost.
    idem::may_have_landed();
    Err(format!("no answer for {id} of {amount}"))
}

fn find_charge(key: &Key) -> Result<Reconciled<String>, String> {
    Ok(vendor_find(key).map_or(Reconciled::NotLanded, Reconciled::Landed))
}

#[test]
fn a_reconciler_records_what_landed_and_a_sweep_finds_nothing_left() {
    store();
    assert!(charge_reconciled(4200, "o-17").is_err(), "the answer was lost: in doubt");
    assert_eq!(
        charge_reconciled(4200, "o-17").unwrap(),
        "ch_1",
        "reconciled from the vendor, not charged again"
    );
    assert_eq!(VENDOR.lock().unwrap().len(), 1);

    // At start-up, the same reconciler settles every key of the tool left in doubt.
    let report = idem::Sweep::new().tool("charge_reconciled", find_charge).run().unwrap();
    assert_eq!(report.still_in_doubt().count(), 0);
}

static AUDIT: OnceLock<Arc<dyn idem::Store>> = OnceLock::new();

fn audit_store() -> Arc<dyn idem::Store> {
    Arc::clone(AUDIT.get().expect("opened at start-up"))
}

#[idem::idempotent(scope = "entry", store = audit_store, ttl = "24h", wait = "10s")]
fn record_audit(entry: &str) -> Result<u32, idem::Error> {
    Ok(entry.len() as u32)
}

#[test]
fn a_tool_names_its_own_store() {
    let default = store();
    let dir = tempfile::tempdir().unwrap();
    let audit = idem::SledStore::builder(dir.path().join("audit.sled"))
        .durability(idem::Durability::Flush)
        .open()
        .unwrap();
    AUDIT.set(Arc::new(audit)).ok();
    assert_eq!(record_audit("refund o-17").unwrap(), 11);

    let key = Key::derive("record_audit", "refund o-17", &serde_json::json!({})).unwrap();
    let record = idem::admin::show(audit_store().as_ref(), &key).expect("in the audit store");
    assert_eq!(record.status, idem::Status::Done);
    assert!(idem::admin::show(default.as_ref(), &key).is_err(), "not in the default store");
}
