//! Reconcilers through the attribute: `reconcile = "…"` on sync and async tools, free functions
//! and methods (`&self`, as rmcp's and rig's tools keep their vendor client), stacked with
//! `#[async_trait]`, and a sweep over `#[idem::tools]`' list. Real sled stores in temporary
//! directories; each key is put in doubt as a lost answer leaves it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use idem::{Durability, Key, Reconciled, SledStore, Status, Store};
use serde::{Deserialize, Serialize};

fn open_store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    let store =
        SledStore::builder(dir).durability(Durability::None).open().expect("open sled store");
    Arc::new(store)
}

#[derive(Debug)]
enum PayError {
    Lost,
    Idem(idem::Error),
}

impl From<idem::Error> for PayError {
    fn from(error: idem::Error) -> Self {
        PayError::Idem(error)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
}

/// A vendor that keeps charges by idempotency key, and can be told to lose its answer.
#[derive(Default)]
struct Vendor {
    charges: Mutex<Vec<(String, Charge)>>,
    lose_answer: std::sync::atomic::AtomicBool,
    lookups: AtomicUsize,
}

impl Vendor {
    fn charge(&self, key: &Key) -> Result<Charge, PayError> {
        let mut charges = self.charges.lock().unwrap();
        let charge = Charge { id: format!("ch_{}", charges.len() + 1) };
        charges.push((key.to_string(), charge.clone()));
        if self.lose_answer.swap(false, Ordering::SeqCst) {
            idem::may_have_landed();
            return Err(PayError::Lost);
        }
        Ok(charge)
    }

    fn find(&self, key: &Key) -> Result<Reconciled<Charge>, String> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let charges = self.charges.lock().unwrap();
        Ok(match charges.iter().find(|(k, _)| k == key.as_str()) {
            Some((_, charge)) => Reconciled::Landed(charge.clone()),
            None => Reconciled::NotLanded,
        })
    }

    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

mod free_sync {
    use super::*;

    pub static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);
    pub static VENDOR: LazyLock<Vendor> = LazyLock::new(Vendor::default);

    pub fn find_charge(key: &Key) -> Result<Reconciled<Charge>, String> {
        VENDOR.find(key)
    }

    #[idem::idempotent(scope = "order_id", store = STORE, reconcile = "find_charge")]
    pub fn charge_card(amount: u64, order_id: &str) -> Result<Charge, PayError> {
        let _ = (amount, order_id);
        VENDOR.charge(&idem::current_key())
    }
}

#[test]
fn a_sync_reconciler_settles_a_lost_answer_with_the_vendors_charge() {
    use free_sync::*;
    VENDOR.lose_answer.store(true, Ordering::SeqCst);
    assert!(matches!(charge_card(4200, "o-1"), Err(PayError::Lost)));
    assert_eq!(VENDOR.count(), 1, "the charge landed, its answer did not");
    let got = charge_card(4200, "o-1").expect("reconciled");
    assert_eq!(got, Charge { id: "ch_1".into() }, "the vendor's charge comes back");
    assert_eq!(VENDOR.count(), 1, "not charged again");
    assert_eq!(VENDOR.lookups.load(Ordering::SeqCst), 1);
    // Recorded: later calls replay without asking.
    assert_eq!(charge_card(4200, "o-1").unwrap(), got);
    assert_eq!(VENDOR.lookups.load(Ordering::SeqCst), 1);
}

mod methods {
    use super::*;

    pub static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);

    pub struct Payments {
        pub vendor: Vendor,
    }

    #[idem::tools]
    impl Payments {
        async fn find_charge(&self, key: &Key) -> Result<Reconciled<Charge>, String> {
            tokio::task::yield_now().await;
            self.vendor.find(key)
        }

        #[idem::idempotent(scope = "order_id", store = STORE, reconcile = "find_charge")]
        pub async fn charge_card(&self, amount: u64, order_id: &str) -> Result<Charge, PayError> {
            let _ = (amount, order_id);
            tokio::task::yield_now().await;
            self.vendor.charge(&idem::current_key())
        }
    }

    pub fn find_refund(_key: &Key) -> Result<Reconciled<String>, String> {
        Ok(Reconciled::CannotTell)
    }

    #[async_trait::async_trait]
    pub trait Refunds {
        async fn refund(&self, order_id: &str) -> Result<String, PayError>;
        async fn void(&self, order_id: &str) -> Result<String, PayError>;
    }

    pub static LOSE_VOID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

    impl Payments {
        /// A method reconciler of a boxed tool: asked through the tool's `&self`.
        pub async fn find_void(&self, _key: &Key) -> Result<Reconciled<String>, String> {
            self.vendor.lookups.fetch_add(1, Ordering::SeqCst);
            Ok(Reconciled::NotLanded)
        }
    }

    #[async_trait::async_trait]
    impl Refunds for Payments {
        #[idem::idempotent(scope = "order_id", store = STORE, reconcile = "methods::find_refund_async")]
        async fn refund(&self, order_id: &str) -> Result<String, PayError> {
            let _ = order_id;
            idem::may_have_landed();
            Err(PayError::Lost)
        }

        #[idem::idempotent(scope = "order_id", store = STORE, reconcile = "find_void")]
        async fn void(&self, order_id: &str) -> Result<String, PayError> {
            if LOSE_VOID.swap(false, Ordering::SeqCst) {
                idem::may_have_landed();
                return Err(PayError::Lost);
            }
            Ok(format!("voided {order_id}"))
        }
    }

    pub async fn find_refund_async(key: &Key) -> Result<Reconciled<String>, String> {
        find_refund(key)
    }
}

#[tokio::test]
async fn an_async_method_reconciler_asks_through_self() {
    use methods::*;
    let payments = Payments { vendor: Vendor::default() };
    payments.vendor.lose_answer.store(true, Ordering::SeqCst);
    assert!(matches!(payments.charge_card(4200, "o-2").await, Err(PayError::Lost)));
    let got = payments.charge_card(4200, "o-2").await.expect("reconciled");
    assert_eq!(got, Charge { id: "ch_1".into() });
    assert_eq!(payments.vendor.count(), 1, "charged once");
    assert_eq!(payments.vendor.lookups.load(Ordering::SeqCst), 1);

    // A boxed (`#[async_trait]`) tool whose reconciler cannot tell: in doubt, saying why.
    assert!(matches!(payments.refund("o-2").await, Err(PayError::Lost)));
    match payments.refund("o-2").await {
        Err(PayError::Idem(idem::Error::InDoubt { reason: Some(reason), .. })) => {
            assert!(reason.contains("could not tell"), "{reason}")
        }
        other => panic!("expected InDoubt, got {other:?}"),
    }

    // A boxed tool whose method reconciler finds nothing: released, and the body runs.
    assert!(matches!(payments.void("o-2").await, Err(PayError::Lost)));
    assert_eq!(payments.void("o-2").await.unwrap(), "voided o-2");
    assert_eq!(payments.vendor.lookups.load(Ordering::SeqCst), 2, "asked through &self");

    // The block's sweep asks the async method reconciler through `&payments`.
    payments.vendor.lose_answer.store(true, Ordering::SeqCst);
    assert!(matches!(payments.charge_card(900, "o-5").await, Err(PayError::Lost)));
    let report = payments.idem_sweep().store(Arc::clone(&STORE)).run_async().await.unwrap();
    let outcomes: Vec<_> = report.keys.iter().map(|s| (s.scope.as_str(), &s.outcome)).collect();
    assert_eq!(outcomes, [("o-5", &idem::SweepOutcome::Landed)], "{report:?}");
    assert_eq!(payments.charge_card(900, "o-5").await.unwrap(), Charge { id: "ch_2".into() });
    assert_eq!(payments.vendor.count(), 2, "one charge per order");
}

mod sweep {
    use super::*;

    pub static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);

    pub struct Bank {
        pub vendor: Vendor,
    }

    #[idem::tools]
    impl Bank {
        pub fn find_payment(&self, key: &Key) -> Result<Reconciled<Charge>, String> {
            self.vendor.find(key)
        }

        #[idem::idempotent(scope = "invoice", store = STORE, reconcile = "find_payment")]
        pub fn pay(&self, invoice: &str) -> Result<Charge, PayError> {
            let _ = invoice;
            self.vendor.charge(&idem::current_key())
        }

        #[idem::read]
        pub fn balance(&self) -> Result<u64, PayError> {
            Ok(0)
        }
    }
}

#[test]
fn a_sweep_at_start_up_settles_the_tools_keys_in_doubt() {
    use sweep::*;
    let bank = Bank { vendor: Vendor::default() };
    bank.vendor.lose_answer.store(true, Ordering::SeqCst);
    assert!(matches!(bank.pay("inv-1"), Err(PayError::Lost)));
    let key = Key::derive("pay", "inv-1", &serde_json::json!({})).unwrap();
    let status = |key: &Key| {
        idem::admin::show(STORE.as_ref(), key).map(|r| r.status).unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(status(&key), Status::InDoubt);

    assert_eq!(bank.balance().unwrap(), 0);
    assert_eq!(Bank::idem_tools().len(), 2, "a read and an idempotent write");
    // The block's tools that name a reconciler, each asked through `&bank`.
    let report = bank.idem_sweep().store(Arc::clone(&STORE)).run().expect("the sweep runs");
    assert_eq!(report.settled().count(), 1, "{report:?}");
    assert_eq!(report.keys[0].key, key.as_str());
    assert_eq!(report.keys[0].outcome, idem::SweepOutcome::Landed);
    assert_eq!(status(&key), Status::Done);
    // The call replays the settled charge without asking or charging.
    assert_eq!(bank.pay("inv-1").unwrap(), Charge { id: "ch_1".into() });
    assert_eq!(bank.vendor.count(), 1);
    assert_eq!(bank.vendor.lookups.load(Ordering::SeqCst), 1);
}

mod shapes {
    use super::*;

    pub static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);
    pub static VENDOR: LazyLock<Vendor> = LazyLock::new(Vendor::default);

    /// A one-field wrapper named `Json`, as rmcp's and axum's: stored and replayed as its `T`.
    pub struct Json<T>(pub T);

    pub fn find_charge(key: &Key) -> Result<Reconciled<Charge>, String> {
        VENDOR.find(key)
    }

    pub async fn find_charge_async(key: &Key) -> Result<Reconciled<Charge>, String> {
        VENDOR.find(key)
    }

    /// The reconciler answers with the `T` inside the `Json<T>`.
    #[idem::idempotent(scope = "order_id", store = STORE, reconcile = "find_charge")]
    pub fn charge_json(order_id: &str) -> Result<Json<Charge>, PayError> {
        let _ = order_id;
        VENDOR.charge(&idem::current_key()).map(Json)
    }

    /// A `fn` returning `impl Future`: its reconciler is async, as its body is.
    #[idem::idempotent(scope = "order_id", store = STORE, reconcile = "find_charge_async")]
    pub fn charge_later(
        order_id: String,
    ) -> impl std::future::Future<Output = Result<Charge, PayError>> {
        async move {
            let _ = order_id;
            VENDOR.charge(&idem::current_key())
        }
    }
}

#[tokio::test]
async fn a_json_tool_and_a_future_returning_tool_are_reconciled_too() {
    use shapes::*;
    VENDOR.lose_answer.store(true, Ordering::SeqCst);
    assert!(matches!(charge_json("o-3"), Err(PayError::Lost)));
    let Json(got) = charge_json("o-3").map_err(|e| format!("{e:?}")).unwrap();
    assert_eq!(got, Charge { id: "ch_1".into() });

    VENDOR.lose_answer.store(true, Ordering::SeqCst);
    assert!(matches!(charge_later("o-4".into()).await, Err(PayError::Lost)));
    assert_eq!(charge_later("o-4".into()).await.unwrap(), Charge { id: "ch_2".into() });
    assert_eq!(VENDOR.count(), 2, "one charge per order");
    assert_eq!(VENDOR.lookups.load(Ordering::SeqCst), 2);
}
