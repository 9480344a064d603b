//! `retry!` inside an attempt of another `retry!`: an idem error no attempt can fix (here, a key
//! in doubt) ends the innermost retrying, whichever of the two is async.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use idem::{Durability, SledStore, Store};

static STORE: LazyLock<Arc<dyn Store>> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    Arc::new(SledStore::builder(dir).durability(Durability::None).open().expect("sled opens"))
});
#[derive(Debug)]
enum PayError {
    TimedOut,
    Idem(idem::Error),
}

impl From<idem::Error> for PayError {
    fn from(error: idem::Error) -> Self {
        PayError::Idem(error)
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);
static CONSULTED: AtomicUsize = AtomicUsize::new(0);

/// Sends a request whose answer times out: the effect may have landed, so the key goes in doubt.
#[idem::idempotent(scope = "order", store = STORE)]
fn charge(order: &str) -> Result<u32, PayError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    assert!(!order.is_empty());
    idem::may_have_landed();
    Err(PayError::TimedOut)
}

#[idem::read]
async fn checkout(order: &str) -> Result<u32, PayError> {
    let quick = idem::Backoff::default().min_delay(Duration::from_millis(1)).without_jitter();
    idem::retry!(
        charge(order),
        backoff = quick,
        when = |_: &PayError| {
            CONSULTED.fetch_add(1, Ordering::SeqCst);
            true
        }
    )
}

#[tokio::test]
async fn an_in_doubt_key_ends_the_inner_sync_retry_inside_an_async_attempt() {
    let quick = idem::Backoff::default().min_delay(Duration::from_millis(1)).max_retries(1);
    let outcome = idem::retry!(checkout("o-1").await, backoff = quick);
    assert!(matches!(outcome, Err(PayError::Idem(idem::Error::InDoubt { .. }))), "{outcome:?}");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "the effect ran once");
    assert_eq!(
        CONSULTED.load(Ordering::SeqCst),
        1,
        "the inner retry asked `when` about the first error only: the in-doubt one ended it"
    );
}
