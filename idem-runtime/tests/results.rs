//! Whatever is recorded `Done` replays into the same type. A result JSON cannot carry back (NaN,
//! nesting past serde_json's 128 levels) is refused before it is recorded: the caller gets a
//! clear error, and since the body ran, the key is left in doubt rather than run again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_runtime::{Call, Error, SledStore, Status, Store};

fn sled() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path()).unwrap());
    (store, dir)
}

/// Calls `scope`'s key twice with a body returning `value`; checks the first call is refused
/// with `Error::Result` naming the key, the key is in doubt, and the body ran once.
fn refused_and_in_doubt<T>(value: impl Fn() -> T, scope: &str)
where
    T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let (store, _dir) = sled();
    let call = || Call::new("report", scope, &1).unwrap().store(Arc::clone(&store));
    let key = call().key().clone();
    let runs = AtomicUsize::new(0);
    let body = || {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(value())
    };
    match call().run(body) {
        Err(Error::Result { key: named, reason, .. }) => {
            assert_eq!(named, key.as_str());
            assert!(reason.contains("would not replay"), "{reason}");
        }
        other => panic!("expected Error::Result, got {other:?}"),
    }
    let record = idem_runtime::admin::show(store.as_ref(), &key).unwrap();
    assert_eq!(record.status, Status::InDoubt, "the body ran: the key is in doubt");
    let again = call().run(body);
    assert!(matches!(again, Err(Error::InDoubt { .. })), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[test]
fn a_result_nested_past_128_levels_is_refused_before_it_is_recorded() {
    refused_and_in_doubt(
        || {
            let mut value = serde_json::json!(1);
            for _ in 0..200 {
                value = serde_json::json!([value]);
            }
            value
        },
        "deep",
    );
}

#[test]
fn a_nan_result_is_refused_before_it_is_recorded() {
    refused_and_in_doubt(|| f64::NAN, "nan");
    refused_and_in_doubt(|| vec![1.0, f64::INFINITY], "infinity");
}

#[test]
fn a_result_that_reads_back_is_recorded_and_replayed() {
    let (store, _dir) = sled();
    let call = || Call::new("report", "fine", &1).unwrap().store(Arc::clone(&store));
    let first: Vec<Option<f64>> = call().run(|| Ok::<_, Error>(vec![Some(0.5), None])).unwrap();
    let again: Vec<Option<f64>> = call().run(|| Ok::<_, Error>(vec![])).unwrap();
    assert_eq!(first, again);
}
