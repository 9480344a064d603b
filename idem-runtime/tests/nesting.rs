//! A call made from the body of another: `current_key()` and `may_have_landed()` refer to the
//! innermost call, however the two are mixed (sync in async, async in sync, async in async), and
//! work moved to `spawn_blocking` sees no call at all (it runs on another thread: read the key
//! first and move it in).

use std::sync::Arc;

use idem_runtime::{current_key, may_have_landed, try_current_key, Call, Error, Key, SledStore};
use idem_runtime::{Status, Store};

fn sled() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path()).unwrap());
    (store, dir)
}

fn call(store: &Arc<dyn Store>, tool: &str) -> Call {
    Call::new(tool, "order-17", &4200).unwrap().store(Arc::clone(store))
}

fn status(store: &Arc<dyn Store>, key: &Key) -> Option<Status> {
    idem_runtime::admin::show(store.as_ref(), key).ok().map(|r| r.status)
}

/// The inner body: reports the key it sees, says its effect may have landed, and fails.
fn inner_body(seen: &mut Option<Key>) -> Result<u32, Error> {
    *seen = try_current_key();
    may_have_landed();
    Err(Error::Key { tool: "inner".into(), reason: "timed out".into() })
}

/// After the outer call finished: the inner key is in doubt (its body said so), the outer one
/// done, and the inner effect does not run again.
fn assert_inner_was_innermost(store: &Arc<dyn Store>, seen: Option<Key>) {
    let (outer, inner) = (call(store, "outer").key().clone(), call(store, "inner").key().clone());
    assert_eq!(seen.as_ref(), Some(&inner), "the inner body sees its own key");
    assert_eq!(status(store, &inner), Some(Status::InDoubt), "the inner key is left in doubt");
    assert_eq!(status(store, &outer), Some(Status::Done), "the outer call is not marked");
    let again: Result<u32, Error> = call(store, "inner").run(|| Ok(2));
    assert!(matches!(again, Err(Error::InDoubt { .. })), "not run a second time: {again:?}");
}

#[tokio::test]
async fn a_sync_call_inside_an_async_body_is_the_innermost() {
    let (store, _dir) = sled();
    let mut seen = None;
    let (store_ref, slot) = (&store, &mut seen);
    let outer: u32 = call(&store, "outer")
        .run_async(move || async move {
            let outer_key = current_key();
            let _ = call(store_ref, "inner").run(|| inner_body(slot));
            assert_eq!(current_key(), outer_key, "the outer key is back after the inner call");
            Ok::<_, Error>(1)
        })
        .await
        .unwrap();
    assert_eq!(outer, 1);
    assert_inner_was_innermost(&store, seen);
}

#[test]
fn an_async_call_driven_by_block_on_inside_a_sync_body_is_the_innermost() {
    let (store, _dir) = sled();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut seen = None;
    let outer: u32 = call(&store, "outer")
        .run(|| {
            let slot = &mut seen;
            let inner = call(&store, "inner").run_async(move || async move { inner_body(slot) });
            let _ = runtime.block_on(inner);
            assert_eq!(Some(current_key()), Some(call(&store, "outer").key().clone()));
            Ok::<_, Error>(1)
        })
        .unwrap();
    assert_eq!(outer, 1);
    assert_inner_was_innermost(&store, seen);
}

#[tokio::test]
async fn an_async_call_inside_an_async_body_is_the_innermost() {
    let (store, _dir) = sled();
    let mut seen = None;
    let (store_ref, slot) = (&store, &mut seen);
    let outer: u32 = call(&store, "outer")
        .run_async(move || async move {
            let inner = call(store_ref, "inner");
            let _ = inner.run_async(move || async move { inner_body(slot) }).await;
            Ok::<_, Error>(1)
        })
        .await
        .unwrap();
    assert_eq!(outer, 1);
    assert_inner_was_innermost(&store, seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_moved_to_spawn_blocking_sees_no_call_and_its_own_calls_are_innermost() {
    let (store, _dir) = sled();
    let outer: u32 = call(&store, "outer")
        .run_async(|| async {
            let moved = Arc::clone(&store);
            let inner_key = call(&store, "inner").key().clone();
            let seen = tokio::task::spawn_blocking(move || {
                // Another thread: the outer call is not visible here.
                assert_eq!(try_current_key(), None);
                assert!(!may_have_landed(), "nothing to mark outside a call");
                let mut seen = None;
                let _ = call(&moved, "inner").run(|| inner_body(&mut seen));
                seen
            })
            .await
            .unwrap();
            assert_eq!(seen, Some(inner_key));
            Ok::<_, Error>(1)
        })
        .await
        .unwrap();
    assert_eq!(outer, 1);
    let inner = call(&store, "inner").key().clone();
    assert_eq!(status(&store, &inner), Some(Status::InDoubt));
}
