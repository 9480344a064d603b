//! A wait of `Duration::MAX` means "as long as it takes": set on the call or as the lock wait,
//! it never overflows the clock into a panic. A call that sets none waits the engine's default.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use idem_runtime::block_on;
use idem_runtime::{Call, Durability, Error, SledStore, Store};

/// A store whose reads need no sync, so that one poll takes a call as far as it can go.
fn store() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::builder(dir.path()).durability(Durability::None).open().unwrap();
    (Arc::new(store), dir)
}

/// An owner is running the body; a waiter with `configure`'s wait starts waiting for it (its
/// first poll reaches the wait: the store needs no sync), then the owner finishes, and the
/// waiter gets the owner's result.
fn waiter_gets_the_result(store: &Arc<dyn Store>, configure: impl FnOnce(Call) -> Call) {
    let call = || Call::new("charge_card", "order-17", &4200).unwrap().store(Arc::clone(store));
    let finish = Arc::new(AtomicBool::new(false));
    let release = Arc::clone(&finish);
    let owner = call().run_async(move || async move {
        std::future::poll_fn(|_| {
            if release.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        Ok::<_, Error>("ch_1".to_owned())
    });
    let mut owner = pin!(owner);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(owner.as_mut().poll(&mut cx).is_pending(), "the owner's body runs");

    let waiter = configure(call()).run_async(|| async { Ok::<_, Error>("ch_2".to_owned()) });
    let mut waiter = pin!(waiter);
    assert!(waiter.as_mut().poll(&mut cx).is_pending(), "the waiter waits for the owner");
    finish.store(true, Ordering::SeqCst);
    assert_eq!(block_on(owner).unwrap(), "ch_1");
    assert_eq!(block_on(waiter).unwrap(), "ch_1", "the waiter replays the owner's result");
}

#[test]
fn a_call_waiting_duration_max_waits_instead_of_panicking() {
    let (store, _dir) = store();
    waiter_gets_the_result(&store, |call| call.wait(Duration::MAX));
}

#[test]
fn a_call_that_sets_no_wait_waits_the_engines_default() {
    let (store, _dir) = store();
    waiter_gets_the_result(&store, |call| call);
}

#[test]
fn a_lock_wait_of_duration_max_opens_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let opened = SledStore::builder(dir.path()).lock_wait(Duration::MAX).open();
    assert!(opened.is_ok(), "{:?}", opened.err());
}
