//! The checks of a caller that finds the key in flight: it waits for the owner, and gets the
//! owner's result, or runs the body once the owner releases, or gives up when its wait ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{call, scope, until_waiting, ToolError};
use crate::error::Error;
use crate::store::Store;

pub fn waiter_gets_owner_result(store: Arc<dyn Store>) {
    let scope = scope("wait");
    let runs = Arc::new(AtomicUsize::new(0));
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
    let owner = {
        let (store, scope, runs) = (Arc::clone(&store), scope.clone(), Arc::clone(&runs));
        std::thread::spawn(move || -> Result<String, Error> {
            call(&store, "book_room", &scope).run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                entered_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                Ok("room-1".to_string())
            })
        })
    };
    entered_rx.recv().unwrap();
    let waiter = {
        let (store, scope, runs) = (Arc::clone(&store), scope.clone(), Arc::clone(&runs));
        std::thread::spawn(move || -> Result<String, Error> {
            call(&store, "book_room", &scope).wait(Duration::from_secs(20)).run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok("room-2".to_string())
            })
        })
    };
    until_waiting(call(&store, "book_room", &scope).key());
    let finished = Instant::now();
    finish_tx.send(()).unwrap();
    assert_eq!(owner.join().unwrap().unwrap(), "room-1");
    assert_eq!(waiter.join().unwrap().unwrap(), "room-1", "the waiter gets the owner's result");
    // Not a speed check: a waiter that missed the change would read the record only at the end
    // of its wait.
    let waited = finished.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "the waiter woke on the change, not at the end of its wait ({waited:?})"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

pub fn waiter_takes_over_after_release(store: Arc<dyn Store>) {
    let scope = scope("takeover");
    let runs = Arc::new(AtomicUsize::new(0));
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
    let owner = {
        let (store, scope, runs) = (Arc::clone(&store), scope.clone(), Arc::clone(&runs));
        std::thread::spawn(move || -> Result<String, ToolError> {
            call(&store, "book_room", &scope).run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                entered_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                Err(ToolError::Declined)
            })
        })
    };
    entered_rx.recv().unwrap();
    let waiter = {
        let (store, scope, runs) = (Arc::clone(&store), scope.clone(), Arc::clone(&runs));
        std::thread::spawn(move || -> Result<String, ToolError> {
            call(&store, "book_room", &scope).wait(Duration::from_secs(20)).run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok("room-2".to_string())
            })
        })
    };
    until_waiting(call(&store, "book_room", &scope).key());
    let released = Instant::now();
    finish_tx.send(()).unwrap();
    assert!(matches!(owner.join().unwrap(), Err(ToolError::Declined)));
    assert_eq!(
        waiter.join().unwrap().unwrap(),
        "room-2",
        "the waiter runs once the owner releases"
    );
    // Not a speed check: a waiter that missed the release would look again only at the end of
    // its wait.
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "the waiter woke on the release, not at the end of its wait ({waited:?})"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

pub fn waiter_times_out(store: Arc<dyn Store>) {
    let scope = scope("timeout");
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (finish_tx, finish_rx) = std::sync::mpsc::channel::<()>();
    let owner = {
        let (store, scope) = (Arc::clone(&store), scope.clone());
        std::thread::spawn(move || -> Result<u8, Error> {
            call(&store, "book_room", &scope).run(|| {
                entered_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                Ok(1)
            })
        })
    };
    entered_rx.recv().unwrap();
    let started = Instant::now();
    let waited: Result<u8, Error> =
        call(&store, "book_room", &scope).wait(Duration::from_millis(200)).run(|| Ok(2));
    let took = started.elapsed();
    match waited {
        Err(Error::InFlight { tool, .. }) => assert_eq!(tool, "book_room"),
        other => panic!("expected InFlight after the wait, got {other:?}"),
    }
    assert!(took >= Duration::from_millis(200), "it waited the whole wait ({took:?})");
    finish_tx.send(()).unwrap();
    assert_eq!(owner.join().unwrap().unwrap(), 1);
}
