//! Tools as methods and argument objects: `#[idem(flatten)]` keys equal the reference derivation
//! over a `tools/call`'s `arguments`, `#[idem::tools]` classifies the methods of inherent and
//! trait impls, and `retry!` and `tool_info!` take them by path. rig-core's own `Tool` trait is
//! checked in the workspace member `rig/` (its `tests/rig.rs`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The reference: `sha256(f"{scope}\0{tool}\0{json.dumps(arguments, sort_keys=True,
/// separators=(',', ':'))}")[:32]`, with the JSON text written out as Python prints it.
fn reference_key(scope: &str, tool: &str, arguments_json: &str) -> String {
    let digest = Sha256::digest(format!("{scope}\0{tool}\0{arguments_json}").as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    hex[..32].to_owned()
}

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

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Payment {
    invoice_id: String,
    to: String,
    amount: u64,
}

/// A one-field wrapper, as rmcp's `Parameters<T>` is: the pattern binds the argument object.
struct Parameters<T>(T);

static PAY_RUNS: AtomicU32 = AtomicU32::new(0);
static PAY_KEYS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The scope names a field of the argument object, which stays in the arguments: the key is
/// over exactly the object the client sent.
#[idem::idempotent(scope = "invoice_id")]
fn send_payment(#[idem(flatten)] Parameters(req): Parameters<Payment>) -> Result<String, String> {
    PAY_RUNS.fetch_add(1, Ordering::SeqCst);
    PAY_KEYS.lock().unwrap().push(idem::current_key().to_string());
    Ok(format!("paid {} to {}", req.amount, req.to))
}

#[test]
fn a_flattened_pattern_keys_the_arguments_object_with_the_scope_field_in_it() {
    let store = store();
    let payment = |invoice: &str| Payment {
        invoice_id: invoice.to_owned(),
        to: "acct-2".to_owned(),
        amount: 4200,
    };
    let first = send_payment(Parameters(payment("inv-1"))).unwrap();
    let again = send_payment(Parameters(payment("inv-1"))).unwrap();
    assert_eq!((first.as_str(), again.as_str()), ("paid 4200 to acct-2", "paid 4200 to acct-2"));
    assert_eq!(PAY_RUNS.load(Ordering::SeqCst), 1, "the repeat is a replay");

    let expected = reference_key(
        "inv-1",
        "send_payment",
        r#"{"amount":4200,"invoice_id":"inv-1","to":"acct-2"}"#,
    );
    assert_eq!(
        PAY_KEYS.lock().unwrap().as_slice(),
        std::slice::from_ref(&expected),
        "the body ran under the reference key"
    );
    let record = idem::admin::show(store.as_ref(), &idem::Key::parse(&expected).unwrap()).unwrap();
    assert_eq!((record.tool.as_str(), record.scope.as_str()), ("send_payment", "inv-1"));

    send_payment(Parameters(payment("inv-2"))).unwrap();
    assert_eq!(PAY_RUNS.load(Ordering::SeqCst), 2, "another invoice is another intent");
}

static TRANSFER_KEYS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[derive(Serialize)]
struct Transfer {
    to: String,
    amount: u64,
}

/// The scope is a parameter of its own, not a field: it is not in the arguments object.
#[idem::idempotent(scope = "session")]
fn transfer(#[idem(flatten)] req: Transfer, session: &str) -> Result<u64, String> {
    TRANSFER_KEYS.lock().unwrap().push(idem::current_key().to_string());
    Ok(req.amount)
}

#[test]
fn a_flattened_parameter_beside_a_scope_parameter_keys_only_its_fields() {
    store();
    assert_eq!(transfer(Transfer { to: "acct-9".into(), amount: 7 }, "sess-4"), Ok(7));
    let expected = reference_key("sess-4", "transfer", r#"{"amount":7,"to":"acct-9"}"#);
    assert_eq!(*TRANSFER_KEYS.lock().unwrap(), [expected]);
}

#[derive(Serialize)]
#[serde(untagged)]
enum Loose {
    Number(u64),
}

#[idem::idempotent(scope = "step")]
fn loose(#[idem(flatten)] value: Loose, step: &str) -> Result<u64, String> {
    let Loose::Number(n) = value;
    Ok(n)
}

#[test]
fn a_flattened_value_that_is_not_an_object_is_refused_by_name_and_runs_nothing() {
    store();
    let error = loose(Loose::Number(3), "s-1").unwrap_err();
    assert!(
        error.contains("parameter `value`") && error.contains("not as a JSON object"),
        "{error}"
    );
}

/// Tools as methods of an inherent impl.
struct Bank {
    busy: AtomicU32,
    payments: AtomicU32,
}

#[idem::tools]
impl Bank {
    #[idem::read]
    fn get_balance(&self, account: &str) -> Result<u64, String> {
        match self.busy.fetch_sub(1, Ordering::SeqCst) {
            1.. => Err("busy".to_owned()),
            _ => Ok(account.len() as u64),
        }
    }

    #[idem::idempotent(scope = "invoice_id", tool = "pay")]
    async fn pay(&self, #[idem(flatten)] req: Payment) -> Result<u64, String> {
        self.payments.fetch_add(1, Ordering::SeqCst);
        if self.payments.load(Ordering::SeqCst) == 1 {
            return Err("the bank timed out before charging".to_owned());
        }
        Ok(req.amount)
    }

    #[idem::write]
    fn delete_account(&self, account: &str) -> Result<(), String> {
        let _ = account;
        Ok(())
    }

    fn helper(&self) -> u32 {
        self.busy.load(Ordering::SeqCst)
    }
}

#[test]
fn an_impl_block_under_tools_lists_and_classifies_its_methods() {
    assert_eq!(idem::tool_info!(Bank::get_balance).kind, idem::Kind::Read);
    const PAY: idem::ToolInfo = idem::tool_info!(Bank::pay);
    assert_eq!(PAY.name, "pay");
    assert_eq!(PAY.kind, idem::Kind::Idempotent { scope: "invoice_id" });
    assert!(!idem::tool_info!(Bank::delete_account).retry_safe());
    let listed: Vec<(&str, bool)> =
        Bank::idem_tools().iter().map(|tool| (tool.name, tool.retry_safe())).collect();
    assert_eq!(listed, [("get_balance", true), ("pay", true), ("delete_account", false)]);
}

#[tokio::test]
async fn retry_takes_methods_by_their_types_path() {
    store();
    let bank = Bank { busy: AtomicU32::new(2), payments: AtomicU32::new(0) };
    let quick = idem::Backoff::default().min_delay(std::time::Duration::from_millis(1));
    assert_eq!(idem::retry!(Bank::get_balance(&bank, "acct-1"), backoff = quick.clone()), Ok(6));
    assert_eq!(bank.helper(), u32::MAX, "two failures, then the answer: three calls");

    let req = Payment { invoice_id: "inv-m".into(), to: "acct-3".into(), amount: 50 };
    let paid = idem::retry!(Bank::pay(&bank, req.clone()).await, backoff = quick.clone());
    assert_eq!(paid, Ok(50));
    assert_eq!(bank.payments.load(Ordering::SeqCst), 2, "the failed attempt released the key");
    assert_eq!(idem::retry!(Bank::pay(&bank, req.clone()).await, backoff = quick), Ok(50));
    assert_eq!(bank.payments.load(Ordering::SeqCst), 2, "a replay");
    assert_eq!(bank.delete_account("acct-1"), Ok(()), "a write runs as it is");
}

/// A one-field `Json` wrapper with no serde impls, as rmcp's and axum's are.
struct Json<T>(pub T);

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u32,
}

struct Till {
    sales: u32,
}

impl Till {
    #[idem::idempotent(scope = "sale")]
    fn sell(&mut self, sale: &str) -> Result<Json<Receipt>, String> {
        self.sales += 1;
        Ok(Json(Receipt { id: self.sales }))
    }

    #[idem::idempotent(scope = "sale")]
    async fn sell_async(&mut self, sale: &str) -> Result<Json<Receipt>, String> {
        self.sales += 1;
        Ok(Json(Receipt { id: self.sales }))
    }
}

#[tokio::test]
async fn a_json_wrapped_result_is_stored_as_its_contents_and_wrapped_again() {
    store();
    let mut till = Till { sales: 0 };
    assert_eq!(till.sell("sale-1").unwrap().0, Receipt { id: 1 });
    assert_eq!(till.sell("sale-1").unwrap().0, Receipt { id: 1 }, "replayed");
    assert_eq!(till.sell_async("sale-2").await.unwrap().0, Receipt { id: 2 });
    assert_eq!(till.sell_async("sale-2").await.unwrap().0, Receipt { id: 2 }, "replayed");
    assert_eq!(till.sales, 2);
}

/// A tool behind a trait of the user's own, `&self` and its arguments only (rig's older shape).
trait Lookup {
    fn find(&self, name: &str) -> Result<u32, String>;
}

struct Directory {
    tries: AtomicU32,
}

#[idem::tools]
impl Lookup for Directory {
    #[idem::read(tool = "find_person")]
    fn find(&self, name: &str) -> Result<u32, String> {
        match self.tries.fetch_add(1, Ordering::SeqCst) {
            0 => Err("the directory is restarting".to_owned()),
            _ => Ok(name.len() as u32),
        }
    }
}

#[test]
fn retry_takes_a_trait_impls_method_by_its_qualified_path() {
    let directory = Directory { tries: AtomicU32::new(0) };
    let quick = idem::Backoff::default().min_delay(std::time::Duration::from_millis(1));
    let found = idem::retry!(<Directory as Lookup>::find(&directory, "ada"), backoff = quick);
    assert_eq!(found, Ok(3));
    assert_eq!(directory.tries.load(Ordering::SeqCst), 2, "one failure, then the answer");
    assert_eq!(idem::tool_info!(<Directory as Lookup>::find).name, "find_person");
}

/// Two blocks in one module, each with a keyed method named `create` and no `tool = "…"`: one
/// tool name, so one key for the same arguments.
struct Orders;
struct Tickets;

#[idem::tools]
impl Orders {
    #[idem::idempotent(scope = "request_id", destructive = false)]
    fn create(&self, request_id: &str) -> Result<String, String> {
        Ok(format!("order for {request_id}"))
    }
}

#[idem::tools]
impl Tickets {
    #[idem::idempotent(scope = "request_id")]
    fn create(&self, request_id: &str) -> Result<String, String> {
        Ok(format!("ticket for {request_id}"))
    }
}

#[test]
fn two_blocks_sharing_a_method_name_are_refused_rather_than_replayed() {
    store();
    assert_eq!(Orders.create("rq-shared"), Ok("order for rq-shared".to_owned()));
    let refused = Tickets.create("rq-shared").unwrap_err();
    assert!(
        refused.contains("tools::Orders::create") && refused.contains("tools::Tickets::create"),
        "the refusal names both methods: {refused}"
    );
    assert!(!idem::tool_info!(Orders::create).annotations().destructive_hint);
    assert!(idem::tool_info!(Tickets::create).annotations().destructive_hint);
}
