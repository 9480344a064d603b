//! Two tools with the same function name in different modules share a tool name, and so their
//! keys. The record says which function wrote it: the other function is refused, with an error
//! that says to pin distinct names, instead of being handed a result it never produced.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use idem::{Durability, SledStore, Store};

static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    Arc::new(SledStore::builder(dir).durability(Durability::None).open().expect("sled opens"))
});
static EMAILS: AtomicUsize = AtomicUsize::new(0);
static SMS: AtomicUsize = AtomicUsize::new(0);

mod email {
    use super::*;

    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn send(to: &str, order: &str) -> Result<String, idem::Error> {
        EMAILS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("email to {to} for {order}"))
    }

    #[idem::idempotent(scope = "order", store = STORE, tool = "notify")]
    pub fn notify(to: &str, order: &str) -> Result<String, idem::Error> {
        Ok(format!("email notice to {to} for {order}"))
    }
}

mod sms {
    use super::*;

    #[idem::idempotent(scope = "order", store = STORE)]
    pub fn send(to: &str, order: &str) -> Result<String, idem::Error> {
        SMS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("sms to {to} for {order}"))
    }

    /// Pinned to the same name as `email::notify`: sharing is then the user's choice.
    #[idem::idempotent(scope = "order", store = STORE, tool = "notify")]
    pub fn notify(to: &str, order: &str) -> Result<String, idem::Error> {
        Ok(format!("sms notice to {to} for {order}"))
    }
}

#[test]
fn a_second_function_with_the_same_name_is_refused_not_handed_the_first_ones_result() {
    assert_eq!(email::send("cus_42", "o-1").unwrap(), "email to cus_42 for o-1");
    match sms::send("cus_42", "o-1") {
        Err(idem::Error::SharedToolName { tool, recorded, calling, .. }) => {
            assert_eq!(tool, "send");
            assert!(recorded.ends_with("email::send"), "{recorded}");
            assert!(calling.ends_with("sms::send"), "{calling}");
        }
        other => panic!("expected SharedToolName, got {other:?}"),
    }
    let message = sms::send("cus_42", "o-1").unwrap_err().to_string();
    assert!(message.contains("tool = \"…\""), "says how to fix it: {message}");
    assert_eq!(SMS.load(Ordering::SeqCst), 0, "the sms body never ran");
    assert_eq!(email::send("cus_42", "o-1").unwrap(), "email to cus_42 for o-1", "still replays");
    assert_eq!(EMAILS.load(Ordering::SeqCst), 1);
}

#[test]
fn functions_pinned_to_one_name_share_its_keys_by_choice() {
    assert_eq!(email::notify("cus_7", "o-2").unwrap(), "email notice to cus_7 for o-2");
    assert_eq!(sms::notify("cus_7", "o-2").unwrap(), "email notice to cus_7 for o-2");
}
