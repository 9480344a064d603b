//! The store conformance suite: every check of the engine's contract, written once against the
//! [`Store`] interface, so that each backend runs the same suite. Enabled by the `conformance`
//! feature; each check panics with a message that says what broke.
//!
//! ```ignore
//! idem_runtime::conformance_suite!(my_store_factory);
//! ```

#![allow(missing_docs)]

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::engine::{Call, InDoubtPolicy};
use crate::error::Error;
use crate::exec::block_on;
use crate::key::Key;
use crate::lifecycle::Status;
use crate::store::Store;

mod around;
mod history;
mod reconcile;
mod retention;
mod wait;

pub use self::around::{
    a_swap_is_sent_at_once_and_in_order, bad_arguments_are_refused_and_nothing_is_lost,
    current_key_is_the_derived_key, error_after_may_have_landed_leaves_in_doubt,
    fencing_token_grows_with_every_owner, operator_resolves_and_purges, stale_owner_cannot_write,
    takeover_dropped_before_its_body_is_undone,
};
pub use self::history::{
    a_refused_late_write_is_in_the_history_and_changes_no_record,
    a_reservation_racing_a_history_purge_keeps_its_own_entry,
    history_follows_a_key_through_a_reconcile,
    history_follows_a_key_through_doubt_takeover_and_replay,
    only_changes_that_land_are_in_the_history,
    operator_resolve_is_in_the_history_and_purge_removes_it,
    purge_removes_old_histories_of_released_keys,
    release_keeps_the_history_and_the_next_call_continues_it,
};
pub use self::reconcile::{
    cancelled_reconciliation_leaves_it_in_doubt,
    reconciler_answer_refused_by_the_fence_is_not_returned,
    reconciler_failure_of_any_text_leaves_it_in_doubt_with_its_reason,
    reconciler_that_cannot_tell_leaves_it_in_doubt,
    reconciler_that_errs_or_panics_leaves_it_in_doubt,
    reconciler_that_finds_it_did_not_land_runs_the_body,
    reconciler_that_finds_it_landed_records_and_replays,
    sweep_settles_every_key_in_doubt_of_its_tools, two_callers_on_a_key_in_doubt_reconcile_once,
};
pub use self::retention::{
    a_call_during_a_retention_pass_is_not_held_up, pages_seek_past_the_given_key_in_key_order,
    retention_removes_old_histories_of_released_keys,
    retention_removes_only_finished_records_past_the_bound,
};
pub use self::wait::{waiter_gets_owner_result, waiter_takes_over_after_release, waiter_times_out};

/// What a factory hands the suite: a store, optionally with something that must live as long
/// (a temp dir).
pub trait Subject {
    /// The store under test.
    fn store(&self) -> Arc<dyn Store>;
}

impl Subject for Arc<dyn Store> {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(self)
    }
}

impl<G> Subject for (Arc<dyn Store>, G) {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.0)
    }
}

/// Expands to one `#[test]` per check, each with a fresh subject from `$make`
/// (`fn() -> Option<impl Subject>`; `None` skips, for a backend that is not reachable).
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!(@tests $make;
            runs_once_and_replays, replays_typed_result, releases_on_error,
            panic_leaves_in_doubt_and_rerun_takes_over, dropped_future_leaves_in_doubt,
            waiter_gets_owner_result, waiter_takes_over_after_release, waiter_times_out,
            expired_record_runs_again, replay_mismatch_is_an_error_and_keeps_record,
            one_key_many_threads_runs_once, one_key_many_tasks_runs_once,
            distinct_keys_each_run_once, stale_owner_cannot_write, operator_resolves_and_purges,
            bad_arguments_are_refused_and_nothing_is_lost, current_key_is_the_derived_key,
            error_after_may_have_landed_leaves_in_doubt, fencing_token_grows_with_every_owner,
            takeover_dropped_before_its_body_is_undone, a_swap_is_sent_at_once_and_in_order,
            reconciler_that_finds_it_landed_records_and_replays,
            reconciler_that_finds_it_did_not_land_runs_the_body,
            reconciler_that_cannot_tell_leaves_it_in_doubt,
            reconciler_that_errs_or_panics_leaves_it_in_doubt,
            reconciler_failure_of_any_text_leaves_it_in_doubt_with_its_reason,
            two_callers_on_a_key_in_doubt_reconcile_once,
            cancelled_reconciliation_leaves_it_in_doubt,
            reconciler_answer_refused_by_the_fence_is_not_returned,
            sweep_settles_every_key_in_doubt_of_its_tools,
            history_follows_a_key_through_doubt_takeover_and_replay,
            history_follows_a_key_through_a_reconcile,
            release_keeps_the_history_and_the_next_call_continues_it,
            operator_resolve_is_in_the_history_and_purge_removes_it,
            purge_removes_old_histories_of_released_keys,
            a_reservation_racing_a_history_purge_keeps_its_own_entry,
            only_changes_that_land_are_in_the_history,
            a_refused_late_write_is_in_the_history_and_changes_no_record,
            retention_removes_only_finished_records_past_the_bound,
            retention_removes_old_histories_of_released_keys,
            a_call_during_a_retention_pass_is_not_held_up,
            pages_seek_past_the_given_key_in_key_order);
    };
    (@tests $make:path; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                match $make() {
                    Some(subject) => $crate::conformance::$check(
                        $crate::conformance::Subject::store(&subject),
                    ),
                    None => eprintln!("skipped: no store for the conformance suite"),
                }
            }
        )*
    };
}

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A scope no other check (or earlier run on a shared backend) uses.
pub(crate) fn scope(name: &str) -> String {
    format!(
        "{name}-{}-{}-{}",
        std::process::id(),
        crate::lifecycle::now_ms(),
        NONCE.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn call(store: &Arc<dyn Store>, tool: &str, scope: &str) -> Call {
    Call::new(tool, scope, &serde_json::json!({ "amount": 4200, "customer": "cus_123" }))
        .expect("plain arguments derive a key")
        .store(Arc::clone(store))
}

pub(crate) fn status(store: &Arc<dyn Store>, key: &Key) -> Option<Status> {
    block_on(store.get(key.as_str())).expect("the store answers get").map(|r| r.status)
}

/// Returns once a caller waits for `key` to change (it has read the record and waits on the
/// store, so a change from now on reaches it): a check of the wait path must not race the
/// waiter.
pub(crate) fn until_waiting(key: &Key) {
    let until = Instant::now() + Duration::from_secs(20);
    while crate::engine::waiting(key.as_str()) == 0 {
        assert!(Instant::now() < until, "no caller ever waited for key {key}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits, boundedly, for a write sent from a `Drop` to land.
pub(crate) fn eventually_status(store: &Arc<dyn Store>, key: &Key, want: Status) {
    let until = Instant::now() + Duration::from_secs(10);
    while status(store, key) != Some(want) {
        assert!(Instant::now() < until, "key {key} never became {want}: {:?}", status(store, key));
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn runs_once_and_replays(store: Arc<dyn Store>) {
    let scope = scope("once");
    let runs = AtomicUsize::new(0);
    for attempt in 0..3 {
        let got: Result<String, Error> = call(&store, "charge_card", &scope).run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(format!("ch_{attempt}"))
        });
        assert_eq!(got.expect("call succeeds"), "ch_0", "every attempt gets the first result");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    let key = call(&store, "charge_card", &scope).key().clone();
    let record = block_on(store.get(key.as_str())).unwrap().expect("the record is kept");
    assert_eq!(record.status, Status::Done);
    assert_eq!(record.tool, "charge_card");
    assert_eq!(record.scope, scope);
    assert_eq!(record.attempts, 1);
    let stored = serde_json::to_string(&record).unwrap();
    assert!(!stored.contains("cus_123"), "the arguments are never stored: {stored}");
    assert!(!stored.contains("fingerprint"), "nor a hash of them beside the key: {stored}");
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Charge {
    id: String,
    amount: u64,
    tags: Vec<String>,
}

pub fn replays_typed_result(store: Arc<dyn Store>) {
    let scope = scope("typed");
    let first = Charge { id: "ch_1".into(), amount: 4200, tags: vec!["a".into()] };
    let got: Charge = call(&store, "charge_card", &scope)
        .run(|| Ok::<_, Error>(Charge { ..first_clone(&first) }))
        .unwrap();
    assert_eq!(got, first);
    let replayed: Charge = call(&store, "charge_card", &scope)
        .run(|| -> Result<Charge, Error> { panic!("the body must not run on replay") })
        .unwrap();
    assert_eq!(replayed, first);
}

fn first_clone(c: &Charge) -> Charge {
    Charge { id: c.id.clone(), amount: c.amount, tags: c.tags.clone() }
}

#[derive(Debug)]
pub(crate) enum ToolError {
    Declined,
    #[allow(dead_code)] // read through Debug in failure messages
    Idem(Error),
}

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        ToolError::Idem(e)
    }
}

pub fn releases_on_error(store: Arc<dyn Store>) {
    let scope = scope("release");
    let runs = AtomicUsize::new(0);
    let first: Result<u32, ToolError> = call(&store, "charge_card", &scope).run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Err(ToolError::Declined)
    });
    assert!(matches!(first, Err(ToolError::Declined)), "the body's error comes back: {first:?}");
    let key = call(&store, "charge_card", &scope).key().clone();
    assert_eq!(status(&store, &key), None, "an error releases the key");
    let second: Result<u32, ToolError> = call(&store, "charge_card", &scope).run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(7)
    });
    assert_eq!(second.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a released key runs again");
}

pub fn panic_leaves_in_doubt_and_rerun_takes_over(store: Arc<dyn Store>) {
    let scope = scope("panic");
    let key = call(&store, "send_email", &scope).key().clone();
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let _: Result<(), Error> = call(&store, "send_email", &scope).run(|| panic!("mid-effect"));
    }));
    assert!(panicked.is_err(), "the panic goes on to the caller");
    eventually_status(&store, &key, Status::InDoubt);

    let runs = AtomicUsize::new(0);
    let failed: Result<(), Error> = call(&store, "send_email", &scope).run(|| {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    match failed {
        Err(Error::InDoubt { key: k, tool, .. }) => {
            assert_eq!(k, key.as_str());
            assert_eq!(tool, "send_email");
        }
        other => panic!("expected InDoubt, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "in doubt under `fail` runs nothing");

    let rerun: Result<String, Error> =
        call(&store, "send_email", &scope).in_doubt(InDoubtPolicy::Rerun).run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok("sent".to_string())
        });
    assert_eq!(rerun.unwrap(), "sent");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "`rerun` runs the body again");
    let record = block_on(store.get(key.as_str())).unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (Status::Done, 2));
}

pub fn dropped_future_leaves_in_doubt(store: Arc<dyn Store>) {
    let scope = scope("dropped");
    let key = call(&store, "open_ticket", &scope).key().clone();
    let started = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&started);
    let mut future = Box::pin(call(&store, "open_ticket", &scope).run_async(move || async move {
        flag.store(true, Ordering::SeqCst);
        std::future::pending::<Result<u32, Error>>().await
    }));
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    let until = Instant::now() + Duration::from_secs(10);
    while !started.load(Ordering::SeqCst) {
        assert!(Instant::now() < until, "the body never started");
        assert!(matches!(future.as_mut().poll(&mut cx), Poll::Pending));
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(future);
    eventually_status(&store, &key, Status::InDoubt);
}

pub fn expired_record_runs_again(store: Arc<dyn Store>) {
    let scope = scope("ttl");
    let runs = AtomicUsize::new(0);
    // Long enough that the second call comes within it on a loaded machine.
    let ttl = Duration::from_secs(1);
    let run = |n: u32| -> u32 {
        call(&store, "daily_report", &scope)
            .ttl(ttl)
            .run(|| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(n)
            })
            .unwrap()
    };
    assert_eq!(run(1), 1);
    let done = std::time::Instant::now();
    assert_eq!(run(2), 1, "replayed while fresh");
    // The store's clock counts whole milliseconds: wait a little past the ttl.
    std::thread::sleep((ttl + Duration::from_millis(20)).saturating_sub(done.elapsed()));
    assert_eq!(run(3), 3, "run again once expired");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

pub fn replay_mismatch_is_an_error_and_keeps_record(store: Arc<dyn Store>) {
    let scope = scope("mismatch");
    let _: String =
        call(&store, "charge_card", &scope).run(|| Ok::<_, Error>("ch_1".to_string())).unwrap();
    let wrong: Result<u64, Error> = call(&store, "charge_card", &scope).run(|| Ok(9));
    let key = call(&store, "charge_card", &scope).key().clone();
    match wrong {
        Err(e @ Error::Replay { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(key.as_str()) && text.contains("charge_card"),
                "names key and tool: {text}"
            );
        }
        other => panic!("expected Replay, got {other:?}"),
    }
    let again: String =
        call(&store, "charge_card", &scope).run(|| Ok::<_, Error>("ch_2".to_string())).unwrap();
    assert_eq!(again, "ch_1", "the stored result is intact");
}

pub fn one_key_many_threads_runs_once(store: Arc<dyn Store>) {
    let scope = scope("threads");
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(64));
    let handles: Vec<_> = (0..64)
        .map(|i| {
            let (store, scope, runs, barrier) =
                (Arc::clone(&store), scope.clone(), Arc::clone(&runs), Arc::clone(&barrier));
            std::thread::spawn(move || -> String {
                barrier.wait();
                call(&store, "charge_card", &scope)
                    .run(|| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        Ok::<_, Error>(format!("ch_{i}"))
                    })
                    .expect("every caller succeeds")
            })
        })
        .collect();
    let results: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "64 threads, one key: one run");
    assert!(results.iter().all(|r| r == &results[0]), "all get the same result: {results:?}");
}

pub fn one_key_many_tasks_runs_once(store: Arc<dyn Store>) {
    let scope = scope("tasks");
    let runs = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let results: Vec<String> = runtime.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let (store, scope, runs) = (Arc::clone(&store), scope.clone(), Arc::clone(&runs));
                tokio::spawn(async move {
                    call(&store, "charge_card", &scope)
                        .run_async(|| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Error>(format!("ch_{i}"))
                        })
                        .await
                        .expect("every caller succeeds")
                })
            })
            .collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        results
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "64 tasks, one key: one run");
    assert!(results.iter().all(|r| r == &results[0]), "all get the same result: {results:?}");
}

pub fn distinct_keys_each_run_once(store: Arc<dyn Store>) {
    // 8 threads, 500 keys each (4000 in all); each thread then calls its neighbour's keys too,
    // so every key is also raced by a second caller.
    let scope = scope("distinct");
    let counts = Arc::new(Mutex::new(vec![0u32; 8 * 500]));
    let handles: Vec<_> = (0..8usize)
        .map(|thread| {
            let (store, scope, counts) = (Arc::clone(&store), scope.clone(), Arc::clone(&counts));
            std::thread::spawn(move || {
                let own = (0..500).map(move |n| thread * 500 + n);
                let neighbour = (0..500).map(move |n| ((thread + 1) % 8) * 500 + n);
                for n in own.chain(neighbour) {
                    let got: usize =
                        Call::new("create_ticket", &scope, &serde_json::json!({ "n": n }))
                            .unwrap()
                            .store(Arc::clone(&store))
                            .run(|| {
                                counts.lock().unwrap()[n] += 1;
                                Ok::<_, Error>(n)
                            })
                            .unwrap();
                    assert_eq!(got, n, "the caller gets its own key's result");
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    let counts = counts.lock().unwrap();
    let wrong: Vec<_> = counts.iter().enumerate().filter(|(_, &c)| c != 1).collect();
    assert!(wrong.is_empty(), "each of 4000 keys runs exactly once; (key, runs) off: {wrong:?}");
}

/// The lifecycle's transitions, for the tests of a store outside this crate: they write records
/// and changes as the engine would, through the store's own interface.
pub use crate::lifecycle::transition;

/// A new call of the store instance `instance`, as the engine makes one for each call.
pub fn new_call(instance: &str) -> crate::lifecycle::Owner {
    crate::lifecycle::Owner::new_call(instance)
}
