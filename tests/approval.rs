//! `approve` and `approve_if = "…"` on `#[idem::idempotent]`, against real sled stores: a refund
//! over a threshold waits for a person, a small one runs at once, and a changed amount needs its
//! own approval.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use idem::admin::{self, Decision};
use idem::{Durability, Error, Key, SledStore, Status, Store};

fn open_store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    Arc::new(SledStore::builder(dir).durability(Durability::None).open().expect("open sled"))
}

fn awaiting(error: &Error) -> Key {
    match error {
        Error::AwaitingApproval { key, .. } => key.parse().unwrap(),
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
}

mod threshold {
    use super::*;

    pub static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::idempotent(scope = "order_id", store = STORE, approve_if = "amount > 1_000")]
    pub fn refund(amount: u64, order_id: &str) -> Result<String, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("re_{order_id}_{amount}"))
    }
}

#[test]
fn a_refund_over_the_threshold_waits_for_a_person_and_a_small_one_runs_at_once() {
    use threshold::{refund, RUNS, STORE};
    assert_eq!(refund(20, "o-1").unwrap(), "re_o-1_20", "under the threshold: no approval");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);

    let key = awaiting(&refund(5_000, "o-2").unwrap_err());
    assert!(matches!(refund(5_000, "o-2"), Err(Error::AwaitingApproval { .. })));
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "nothing ran for the large refund");
    admin::decide(STORE.as_ref(), &key, Decision::Approve, "ann@ops", None).unwrap();
    assert_eq!(refund(5_000, "o-2").unwrap(), "re_o-2_5000");
    assert_eq!(refund(5_000, "o-2").unwrap(), "re_o-2_5000", "replayed");
    assert_eq!(RUNS.load(Ordering::SeqCst), 2, "the approved refund ran once");

    // The model changes the amount: another key, which needs its own approval.
    let changed = awaiting(&refund(5_001, "o-2").unwrap_err());
    assert_ne!(changed, key);
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}

mod flattened {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct RefundRequest {
        pub order_id: String,
        pub amount: u64,
    }

    pub static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);
    pub static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[idem::idempotent(
        scope = "order_id",
        store = STORE,
        approve_if = "req.amount > 1_000",
        approve_wait = "60s",
        approval_ttl = "1h"
    )]
    pub async fn refund(#[idem(flatten)] req: RefundRequest) -> Result<String, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("re_{}", req.amount))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_call_waiting_for_approval_goes_on_once_approved() {
    use flattened::{refund, RefundRequest, RUNS, STORE};
    let request = || RefundRequest { order_id: "o-9".into(), amount: 7_000 };
    let key = idem::Key::derive(
        "refund",
        "o-9",
        &serde_json::json!({ "order_id": "o-9", "amount": 7_000 }),
    )
    .unwrap();
    let call = tokio::spawn(refund(request()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while idem_runtime::waiting(key.as_str()) == 0 {
        assert!(Instant::now() < deadline, "the call never waited");
        tokio::task::yield_now().await;
    }
    assert_eq!(admin::show(STORE.as_ref(), &key).unwrap().status, Status::AwaitingApproval);
    let store = Arc::clone(&STORE);
    tokio::task::spawn_blocking(move || {
        admin::decide(store.as_ref(), &key, Decision::Approve, "ann@ops", Some("ok"))
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(call.await.unwrap().unwrap(), "re_7000");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}

mod always {
    use super::*;

    pub static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(open_store);

    #[idem::idempotent(scope = "account", store = STORE, approve)]
    pub fn delete_account(account: &str) -> Result<(), Error> {
        let _ = account;
        panic!("a denied key never runs");
    }
}

#[test]
fn a_denied_deletion_never_runs_and_says_why() {
    use always::{delete_account, STORE};
    let key = awaiting(&delete_account("acct-1").unwrap_err());
    admin::decide(STORE.as_ref(), &key, Decision::Deny, "bob@ops", Some("customer asked to stay"))
        .unwrap();
    let denied = delete_account("acct-1").unwrap_err();
    assert!(matches!(&denied, Error::Denied { .. }), "{denied:?}");
    assert!(denied.to_string().contains("customer asked to stay"), "{denied}");
}
