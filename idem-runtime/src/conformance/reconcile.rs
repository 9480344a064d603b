//! The checks of reconcilers: each answer a reconciler can give, one that errs or panics, two
//! callers on one key in doubt, a reconciliation cancelled midway, an answer the fence refuses,
//! and a sweep.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::{call, eventually_status, scope, status, until_waiting, ToolError};
use crate::engine::{InDoubtPolicy, Reconciled, Sweep, SweepOutcome};
use crate::error::Error;
use crate::exec::block_on;
use crate::key::Key;
use crate::lifecycle::history::MAX_NOTE;
use crate::lifecycle::transition::{self, Step};
use crate::lifecycle::{Guard, Record, Status};
use crate::store::Store;

/// Leaves the key of (`tool`, `scope`) in doubt, as a call whose answer was lost does.
fn leave_in_doubt(store: &Arc<dyn Store>, tool: &str, scope: &str) -> Key {
    let lost: Result<String, ToolError> = call(store, tool, scope).run(|| {
        crate::engine::may_have_landed();
        Err(ToolError::Declined)
    });
    assert!(matches!(lost, Err(ToolError::Declined)), "{lost:?}");
    let key = call(store, tool, scope).key().clone();
    assert_eq!(status(store, &key), Some(Status::InDoubt), "the lost answer leaves it in doubt");
    key
}

fn attempts(store: &Arc<dyn Store>, key: &Key) -> u32 {
    block_on(store.get(key.as_str())).unwrap().expect("a record").attempts
}

pub fn reconciler_that_finds_it_landed_records_and_replays(store: Arc<dyn Store>) {
    let scope = scope("landed");
    let key = leave_in_doubt(&store, "charge_card", &scope);
    let (asked, runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let got: Result<String, Error> = call(&store, "charge_card", &scope).run_reconciled(
        |k| {
            asked.fetch_add(1, Ordering::SeqCst);
            assert_eq!(k, &key, "the reconciler is asked about the call's key");
            Ok::<_, String>(Reconciled::Landed("ch_vendor".to_string()))
        },
        || {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok("ch_body".to_string())
        },
    );
    assert_eq!(got.unwrap(), "ch_vendor", "the vendor's result comes back");
    assert_eq!((asked.load(Ordering::SeqCst), runs.load(Ordering::SeqCst)), (1, 0));
    let record = block_on(store.get(key.as_str())).unwrap().unwrap();
    assert_eq!(record.status, Status::Done);
    assert_eq!(record.result.as_deref(), Some(r#""ch_vendor""#));
    assert_eq!(record.attempts, 1, "the body started once, in the attempt whose answer was lost");
    let replayed: String = call(&store, "charge_card", &scope)
        .run(|| -> Result<String, Error> { panic!("the body must not run on replay") })
        .unwrap();
    assert_eq!(replayed, "ch_vendor");
}

pub fn reconciler_that_finds_it_did_not_land_runs_the_body(store: Arc<dyn Store>) {
    let scope = scope("not-landed");
    let key = leave_in_doubt(&store, "charge_card", &scope);
    let runs = AtomicUsize::new(0);
    let got: Result<String, Error> = call(&store, "charge_card", &scope).run_reconciled(
        |_| Ok::<_, String>(Reconciled::NotLanded),
        || {
            runs.fetch_add(1, Ordering::SeqCst);
            assert_eq!(crate::engine::current_key(), key, "the body runs with the same key");
            Ok("ch_2".to_string())
        },
    );
    assert_eq!(got.unwrap(), "ch_2");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(status(&store, &key), Some(Status::Done));
}

/// While the reconciler runs, the key moves on: `settle` makes a step from the reconciling
/// record, written as its owner (whom the fence admits, as it admits a fleet peer once the
/// reconciling call's lease lapsed), so that the write of the reconciler's answer is refused.
fn move_on_while_asking(
    store: &Arc<dyn Store>,
    key: &Key,
    settle: impl FnOnce(&Record, u64) -> Step<'_>,
) {
    let held = block_on(store.get(key.as_str())).unwrap().expect("the reconciling call's record");
    assert_eq!(held.status, Status::InFlight, "the reconciling call holds the key");
    let step = settle(&held, store.clock());
    let moved = block_on(store.compare_and_swap(
        &held,
        Guard::of(held.fence(), step.change.by(), store.instance().id()),
        step.new.as_ref(),
        step.change,
    ));
    assert!(moved.unwrap().is_some(), "the key moved on while the reconciler ran");
}

/// An answer whose write the fence refused is not the key's result: the caller gets what the
/// key records, or the error of a key in doubt, never `Ok` with the refused answer. Found by the
/// lifecycle model (`tests/lifecycle_model.rs`, property 2).
pub fn reconciler_answer_refused_by_the_fence_is_not_returned(store: Arc<dyn Store>) {
    let (done, doubt) = (scope("refused-answer"), scope("refused-answer-in-doubt"));
    let key = leave_in_doubt(&store, "charge_card", &done);
    let got: Result<String, Error> = call(&store, "charge_card", &done).run_reconciled(
        |_| {
            move_on_while_asking(&store, &key, |held, now| {
                transition::complete(held, r#""ch_peer""#.to_owned(), None, now)
            });
            Ok::<_, String>(Reconciled::Landed("ch_vendor".to_string()))
        },
        || -> Result<String, Error> { panic!("the key is done: the body must not run") },
    );
    assert_eq!(got.unwrap(), "ch_peer", "the caller gets what the key records");
    let replayed: String = call(&store, "charge_card", &done)
        .run(|| -> Result<String, Error> { panic!("the body must not run on replay") })
        .unwrap();
    assert_eq!(replayed, "ch_peer", "as every later caller does");

    let key = leave_in_doubt(&store, "charge_card", &doubt);
    let got: Result<String, Error> = call(&store, "charge_card", &doubt).run_reconciled(
        |_| {
            move_on_while_asking(&store, &key, |held, now| {
                transition::leave_in_doubt(held, "a peer's run was interrupted", now)
            });
            Ok::<_, String>(Reconciled::Landed("ch_vendor".to_string()))
        },
        || -> Result<String, Error> { panic!("in doubt under `fail`: the body must not run") },
    );
    assert!(matches!(got, Err(Error::InDoubt { .. })), "never Ok with a refused answer: {got:?}");
    assert_eq!(status(&store, &key), Some(Status::InDoubt));
}

pub fn reconciler_that_cannot_tell_leaves_it_in_doubt(store: Arc<dyn Store>) {
    let scope = scope("cannot-tell");
    let key = leave_in_doubt(&store, "charge_card", &scope);
    let runs = AtomicUsize::new(0);
    let got: Result<String, Error> = call(&store, "charge_card", &scope).run_reconciled(
        |_| Ok::<_, String>(Reconciled::CannotTell),
        || {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok("ch_2".to_string())
        },
    );
    match got {
        Err(Error::InDoubt { key: k, reason: Some(reason), .. }) => {
            assert_eq!(k, key.as_str());
            assert!(reason.contains("could not tell"), "{reason}");
        }
        other => panic!("expected InDoubt with the reconciler's reason, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(status(&store, &key), Some(Status::InDoubt));
    assert_eq!(attempts(&store, &key), 1);

    // Under `rerun`, a reconciler that cannot tell leads to the rerun, as without one.
    let rerun: Result<String, Error> =
        call(&store, "charge_card", &scope).in_doubt(InDoubtPolicy::Rerun).run_reconciled(
            |_| Ok::<_, String>(Reconciled::CannotTell),
            || {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok("ch_3".to_string())
            },
        );
    assert_eq!(rerun.unwrap(), "ch_3");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!((status(&store, &key), attempts(&store, &key)), (Some(Status::Done), 2));
}

pub fn reconciler_that_errs_or_panics_leaves_it_in_doubt(store: Arc<dyn Store>) {
    let scope = scope("reconciler-fails");
    let key = leave_in_doubt(&store, "charge_card", &scope);
    let never = || -> Result<String, Error> { panic!("the body must not run") };
    let erred: Result<String, Error> = call(&store, "charge_card", &scope)
        .run_reconciled(|_| Err::<Reconciled<String>, _>("the vendor answered 503"), never);
    match erred {
        Err(Error::InDoubt { reason: Some(reason), .. }) => {
            assert!(reason.contains("the vendor answered 503"), "{reason}")
        }
        other => panic!("expected InDoubt with the reconciler's error, got {other:?}"),
    }
    assert_eq!(status(&store, &key), Some(Status::InDoubt));

    let panicked: Result<String, Error> = call(&store, "charge_card", &scope)
        .run_reconciled(|_| -> Result<Reconciled<String>, String> { panic!("lookup bug") }, never);
    match panicked {
        Err(e @ Error::InDoubt { .. }) => {
            let text = e.to_string();
            assert!(text.contains("panicked: lookup bug"), "the message says why: {text}");
        }
        other => panic!("expected InDoubt after the reconciler panicked, got {other:?}"),
    }
    assert_eq!(status(&store, &key), Some(Status::InDoubt), "not left in flight");

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let async_panic: Result<String, Error> =
        runtime.block_on(call(&store, "charge_card", &scope).run_async_reconciled(
            |_key| async move {
                tokio::task::yield_now().await;
                if true {
                    panic!("async lookup bug");
                }
                Ok::<_, String>(Reconciled::CannotTell)
            },
            || async { never() },
        ));
    assert!(
        matches!(&async_panic, Err(Error::InDoubt { reason: Some(r), .. }) if r.contains("async lookup bug")),
        "{async_panic:?}"
    );
    // Still settleable: the failed reconciliations left the record as a key in doubt.
    let got: String = call(&store, "charge_card", &scope)
        .run_reconciled(|_| Ok::<_, String>(Reconciled::Landed("ch_1".to_string())), never)
        .unwrap();
    assert_eq!(got, "ch_1");
}

pub fn two_callers_on_a_key_in_doubt_reconcile_once(store: Arc<dyn Store>) {
    let scope = scope("reconcile-race");
    let key = leave_in_doubt(&store, "charge_card", &scope);
    let asked = Arc::new(AtomicUsize::new(0));
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (answer_tx, answer_rx) = std::sync::mpsc::channel::<()>();
    let first = {
        let (store, scope, asked) = (Arc::clone(&store), scope.clone(), Arc::clone(&asked));
        std::thread::spawn(move || -> Result<String, Error> {
            call(&store, "charge_card", &scope).run_reconciled(
                |_| {
                    asked.fetch_add(1, Ordering::SeqCst);
                    entered_tx.send(()).unwrap();
                    answer_rx.recv().unwrap();
                    Ok::<_, String>(Reconciled::Landed("ch_vendor".to_string()))
                },
                || Ok("ch_body_1".to_string()),
            )
        })
    };
    entered_rx.recv().unwrap();
    assert_eq!(status(&store, &key), Some(Status::InFlight), "held while the reconciler runs");
    let second = {
        let (store, scope, asked) = (Arc::clone(&store), scope.clone(), Arc::clone(&asked));
        std::thread::spawn(move || -> Result<String, Error> {
            call(&store, "charge_card", &scope).wait(Duration::from_secs(20)).run_reconciled(
                |_| {
                    asked.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(Reconciled::NotLanded)
                },
                || Ok("ch_body_2".to_string()),
            )
        })
    };
    until_waiting(&key);
    answer_tx.send(()).unwrap();
    assert_eq!(first.join().unwrap().unwrap(), "ch_vendor");
    assert_eq!(second.join().unwrap().unwrap(), "ch_vendor", "the waiter gets the answer");
    assert_eq!(asked.load(Ordering::SeqCst), 1, "the reconciler ran once");
}

pub fn cancelled_reconciliation_leaves_it_in_doubt(store: Arc<dyn Store>) {
    let scope = scope("reconcile-cancel");
    let key = leave_in_doubt(&store, "charge_card", &scope);
    let entered = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&entered);
    let mut future = Box::pin(call(&store, "charge_card", &scope).run_async_reconciled(
        move |_key| async move {
            flag.store(true, Ordering::SeqCst);
            // Blocked on the vendor, which never answers.
            std::future::pending::<Result<Reconciled<String>, String>>().await
        },
        || async { Ok::<String, Error>("ch_body".to_string()) },
    ));
    let mut cx = Context::from_waker(Waker::noop());
    let until = Instant::now() + Duration::from_secs(10);
    while !entered.load(Ordering::SeqCst) {
        assert!(Instant::now() < until, "the reconciler was never asked");
        assert!(matches!(future.as_mut().poll(&mut cx), Poll::Pending));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(status(&store, &key), Some(Status::InFlight), "held while the reconciler runs");
    drop(future);
    eventually_status(&store, &key, Status::InDoubt);
    // In doubt, not stuck in flight: the next call reconciles it.
    let got: String = call(&store, "charge_card", &scope)
        .run_reconciled(
            |_| Ok::<_, String>(Reconciled::Landed("ch_vendor".to_string())),
            || -> Result<String, Error> { panic!("the body must not run") },
        )
        .unwrap();
    assert_eq!(got, "ch_vendor");
}

pub fn sweep_settles_every_key_in_doubt_of_its_tools(store: Arc<dyn Store>) {
    // A tool name of its own: a sweep lists the whole store, which other checks share.
    let tool = scope("swept_tool");
    let landed = leave_in_doubt(&store, &tool, &scope("a"));
    let not_landed = leave_in_doubt(&store, &tool, &scope("b"));
    let unknown = leave_in_doubt(&store, &tool, &scope("c"));
    let other_tool = leave_in_doubt(&store, &scope("unswept_tool"), &scope("d"));
    let report = Sweep::new()
        .store(Arc::clone(&store))
        .tool(&tool, |key: &Key| {
            Ok::<_, String>(if *key == landed {
                Reconciled::Landed(serde_json::json!({"id": "ch_1"}))
            } else if *key == not_landed {
                Reconciled::NotLanded
            } else {
                Reconciled::CannotTell
            })
        })
        .run()
        .expect("the sweep lists the store");
    assert_eq!(report.keys.len(), 3, "the tool's three keys in doubt: {report:?}");
    let outcome =
        |key: &Key| report.keys.iter().find(|s| s.key == key.as_str()).map(|s| s.outcome.clone());
    assert_eq!(outcome(&landed), Some(SweepOutcome::Landed));
    assert_eq!(outcome(&not_landed), Some(SweepOutcome::NotLanded));
    assert!(matches!(outcome(&unknown), Some(SweepOutcome::InDoubt { .. })), "{report:?}");
    assert_eq!(report.settled().count(), 2);
    assert_eq!(report.still_in_doubt().count(), 1);
    assert_eq!(status(&store, &landed), Some(Status::Done));
    assert_eq!(status(&store, &not_landed), None, "released");
    assert_eq!(status(&store, &unknown), Some(Status::InDoubt));
    assert_eq!(status(&store, &other_tool), Some(Status::InDoubt), "another tool's is left");
    let record = block_on(store.get(landed.as_str())).unwrap().unwrap();
    assert_eq!(record.result.as_deref(), Some(r#"{"id":"ch_1"}"#));
}

/// The last entry of `key`'s history, which must record a reconciler that erred, with a note of
/// one line that fits a history entry.
fn assert_erred_in_history(store: &Arc<dyn Store>, key: &Key, what: &str) {
    let history = block_on(store.history(key.as_str())).expect("the store answers history");
    let last = history.last().expect("a history");
    assert_eq!(last.event.to_string(), "reconciled (erred)", "{what}: {history:?}");
    assert_eq!(last.status, Some(Status::InDoubt), "{what}: {last:?}");
    let note = last.note.as_deref().expect("the entry says why");
    assert!(!note.contains('\n') && !note.contains('\r'), "{what}: a note of many lines: {note:?}");
    assert!(note.len() <= MAX_NOTE, "{what}: a note of {} bytes", note.len());
}

/// What a reconciler can say when it fails: an error of several lines, one longer than a
/// history note holds, and the message of a failed `assert_eq!` (several lines too).
fn failing_reconciler(case: usize) -> Result<Reconciled<String>, String> {
    match case {
        0 => Err("the vendor answered 503\nretry-after: 30\n".to_owned()),
        1 => Err(format!("the vendor answered 500: {}", "<html>".repeat(300))),
        _ => {
            assert_eq!(1 + 1, 3, "the vendor's ledger\ndisagrees");
            Ok(Reconciled::CannotTell)
        }
    }
}

const FAILURES: [&str; 3] = ["an error of several lines", "an error past 1 KiB", "an assert_eq!"];

pub fn reconciler_failure_of_any_text_leaves_it_in_doubt_with_its_reason(store: Arc<dyn Store>) {
    let never = || -> Result<String, Error> { panic!("the body must not run") };
    for (case, what) in FAILURES.into_iter().enumerate() {
        let scope = scope("reconciler-fails-oddly");
        let key = leave_in_doubt(&store, "charge_card", &scope);
        let got: Result<String, Error> =
            call(&store, "charge_card", &scope).run_reconciled(|_| failing_reconciler(case), never);
        match got {
            Err(Error::InDoubt { key: k, reason: Some(_), .. }) => assert_eq!(k, key.as_str()),
            other => panic!("{what}: expected InDoubt with the reason, got {other:?}"),
        }
        assert_eq!(status(&store, &key), Some(Status::InDoubt), "{what}");
        assert_erred_in_history(&store, &key, what);
    }

    // A sweep reports such keys still in doubt, with the reconciler's reason.
    let tool = scope("oddly_failing_tool");
    let keys: Vec<Key> =
        FAILURES.iter().map(|_| leave_in_doubt(&store, &tool, &scope("s"))).collect();
    let report = Sweep::new()
        .store(Arc::clone(&store))
        .tool(&tool, |key: &Key| {
            failing_reconciler(keys.iter().position(|k| k == key).expect("one of its keys"))
        })
        .run()
        .expect("the sweep lists the store");
    assert_eq!(report.keys.len(), FAILURES.len(), "{report:?}");
    for (key, what) in keys.iter().zip(FAILURES) {
        let swept = report.keys.iter().find(|s| s.key == key.as_str()).expect("swept");
        match &swept.outcome {
            SweepOutcome::InDoubt { reason } => {
                assert!(!reason.contains("the store failed"), "{what}: {reason}")
            }
            other => panic!("{what}: expected the key still in doubt, got {other:?}"),
        }
        assert_eq!(status(&store, key), Some(Status::InDoubt), "{what}");
        assert_erred_in_history(&store, key, what);
    }
}
