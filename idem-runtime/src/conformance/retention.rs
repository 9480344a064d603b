//! The checks of retention: a pass removes finished records (with their histories) and released
//! keys' histories past the bound, a batch of bounded size at a time, and nothing in flight or
//! in doubt; calls go on while a pass is under way; the pages a pass walks seek past the key
//! they are given, in key order.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{call, eventually_status, scope, status, ToolError};
use crate::engine::retention::{Retainer, RetentionPass};
use crate::error::Error;
use crate::exec::block_on;
use crate::key::Key;
use crate::lifecycle::retention::Removed;
use crate::lifecycle::retention::Retention;
use crate::lifecycle::{transition, Guard, Owner, Record, Status};
use crate::store::{Inserted, Store, Stored};

const HOUR: Duration = Duration::from_secs(3600);

/// Writes the key of `tool` in `scope` as a call would have, `ago` before the store's clock: a
/// reservation, then (with `finish`) its outcome. Returns the key and the record left.
fn written_ago(
    store: &Arc<dyn Store>,
    tool: &str,
    scope: &str,
    ago: Duration,
    finish: Option<fn(&Record, u64) -> transition::Step<'_>>,
) -> (Key, Record) {
    let key = call(store, tool, scope).key().clone();
    let at = store.clock() - ago.as_millis() as u64;
    let owner = Owner::new_call(store.instance().id());
    let step =
        transition::reserve(key.as_str(), tool, scope, None, &owner, at, store.instance().lease());
    let reserved = step.new.expect("a reservation makes a record");
    let inserted = block_on(store.insert_if_absent(&reserved, step.change)).expect("insert");
    assert!(matches!(inserted, Inserted::New { .. }), "key {key} is new");
    let Some(finish) = finish else { return (key, reserved) };
    let step = finish(&reserved, at);
    let new = step.new.expect("the outcome is a record");
    let swapped = block_on(store.compare_and_swap(
        &reserved,
        Guard::of(reserved.fence(), step.change.by(), store.instance().id()),
        Some(&new),
        step.change,
    ));
    assert!(swapped.expect("swap").is_some(), "the owner settles its own record");
    (key, new)
}

fn done(held: &Record, at: u64) -> transition::Step<'_> {
    transition::complete(held, "\"ch_old\"".into(), None, at)
}

fn doubted(held: &Record, at: u64) -> transition::Step<'_> {
    transition::leave_in_doubt(held, "the process died mid-call", at)
}

fn history_len(store: &Arc<dyn Store>, key: &Key) -> usize {
    block_on(store.history(key.as_str())).expect("the store answers history").len()
}

/// How many times a body ran, and what the caller got.
fn run_counted(store: &Arc<dyn Store>, tool: &str, scope: &str, runs: &AtomicUsize) -> String {
    call(store, tool, scope)
        .run(|| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("ch_new".to_owned())
        })
        .expect("the call succeeds")
}

pub fn retention_removes_only_finished_records_past_the_bound(store: Arc<dyn Store>) {
    let scope = scope("retention");
    let old: Vec<Key> = (0..7)
        .map(|n| written_ago(&store, &format!("charge_{n}"), &scope, 2 * HOUR, Some(done)).0)
        .collect();
    let (doubted_key, _) = written_ago(&store, "refund", &scope, 2 * HOUR, Some(doubted));
    let (running_key, _) = written_ago(&store, "transfer", &scope, 2 * HOUR, None);
    let runs = AtomicUsize::new(0);
    run_counted(&store, "charge_recent", &scope, &runs);
    let doubted_history = history_len(&store, &doubted_key);

    let policy = Retention::new(HOUR).batch(3);
    let mut pass = RetentionPass::new(store.as_ref(), &policy);
    let mut batches = Vec::new();
    while let Some(batch) = block_on(pass.next_batch()).expect("the pass runs") {
        batches.push(batch);
    }
    assert!(batches.iter().all(|b| b.records <= 3), "a batch removes at most 3: {batches:?}");
    assert!(batches.len() >= 4, "10 records in pages of 3 take 4 batches: {batches:?}");
    let removed = pass.removed();
    assert_eq!((removed.records, removed.histories), (7, 0), "the 7 old finished records");

    for key in &old {
        assert_eq!(status(&store, key), None, "old finished key {key} is removed");
        assert_eq!(history_len(&store, key), 0, "with its history");
    }
    assert_eq!(status(&store, &doubted_key), Some(Status::InDoubt), "in doubt is never removed");
    assert_eq!(history_len(&store, &doubted_key), doubted_history, "nor its history");
    assert_eq!(status(&store, &running_key), Some(Status::InFlight), "in flight is kept");
    let replayed = run_counted(&store, "charge_recent", &scope, &runs);
    assert_eq!((replayed.as_str(), runs.load(Ordering::SeqCst)), ("ch_new", 1), "recent replays");
    run_counted(&store, "charge_0", &scope, &runs);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a removed key's next call runs its body");

    let again = Retention::new(HOUR).run(store.as_ref()).expect("a second pass runs");
    assert_eq!(again, Removed::default(), "nothing else outlived the bound");
}

pub fn retention_removes_old_histories_of_released_keys(store: Arc<dyn Store>) {
    let scope = scope("retention-released");
    let released: Vec<Key> = (0..4)
        .map(|n| {
            let tool = format!("charge_{n}");
            let failed: Result<String, ToolError> =
                call(&store, &tool, &scope).run(|| Err(ToolError::Declined));
            assert!(failed.is_err());
            call(&store, &tool, &scope).key().clone()
        })
        .collect();
    let doubted = call(&store, "refund", &scope).key().clone();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _: Result<String, Error> = call(&store, "refund", &scope).run(|| panic!("crash"));
    }));
    eventually_status(&store, &doubted, Status::InDoubt);
    let doubted_history = history_len(&store, &doubted);

    let kept = Retention::new(Duration::from_secs(600)).run(store.as_ref()).expect("pass");
    assert_eq!(kept, Removed::default(), "histories newer than the bound are kept");
    assert_eq!(history_len(&store, &released[0]), 2);

    // Every entry is older than a bound of zero once the store's clock has moved past the last.
    let last = block_on(store.history(released[3].as_str())).unwrap().last().unwrap().at;
    while store.clock() <= last + 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let policy = Retention::new(Duration::ZERO).batch(2);
    let mut pass = RetentionPass::new(store.as_ref(), &policy);
    while let Some(batch) = block_on(pass.next_batch()).expect("the pass runs") {
        assert!(batch.histories <= 2, "a batch removes at most 2: {batch:?}");
    }
    assert_eq!(pass.removed().histories, 4, "each released key's history");
    for key in &released {
        assert_eq!(history_len(&store, key), 0, "key {key}'s history is removed");
    }
    assert_eq!(status(&store, &doubted), Some(Status::InDoubt), "in doubt, even past a bound of 0");
    assert_eq!(history_len(&store, &doubted), doubted_history);
}

pub fn a_call_during_a_retention_pass_is_not_held_up(store: Arc<dyn Store>) {
    let scope = scope("retention-during");
    for n in 0..20 {
        written_ago(&store, &format!("charge_{n}"), &scope, 2 * HOUR, Some(done));
    }
    // A pass that rests an hour after each batch of 5: it stays under way for the whole check.
    let policy = Retention::new(HOUR).batch(5).pause(HOUR).every(HOUR);
    let retainer = Retainer::start(Arc::clone(&store), policy).expect("the retainer starts");
    let until = Instant::now() + Duration::from_secs(20);
    while retainer.status().removed.records < 5 {
        assert!(Instant::now() < until, "the first batch never ran: {:?}", retainer.status());
        std::thread::sleep(Duration::from_millis(5));
    }

    let runs = AtomicUsize::new(0);
    let first = run_counted(&store, "charge_new", &scope, &runs);
    let again = run_counted(&store, "charge_new", &scope, &runs);
    assert_eq!((first.as_str(), again.as_str()), ("ch_new", "ch_new"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a fresh call and its replay, mid-pass");

    let status_now = retainer.status();
    assert_eq!(status_now.passes, 0, "the pass is still under way: {status_now:?}");
    assert_eq!(status_now.removed.records, 5, "one batch of 5 so far: {status_now:?}");
    let left = walk(store.as_ref(), 100).into_iter().filter_map(|(_, stored)| match stored {
        Stored::Record(record) => record.ok(),
        Stored::History { .. } => None,
    });
    assert_eq!(
        left.filter(|r| r.tool.starts_with("charge_") && r.tool != "charge_new").count(),
        15
    );
    drop(retainer);
}

/// Every page from the first, `limit` keys at a time, as a pass walks them: each page's keys
/// sort after the key it was asked from, and the walk ends at the page that says it is the last.
fn walk(store: &dyn Store, limit: usize) -> Vec<(String, Stored)> {
    let mut walked: Vec<(String, Stored)> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = block_on(store.scan_page(after.as_deref(), limit)).expect("a page");
        assert!(
            page.entries.len() <= limit,
            "a page of {} past a limit of {limit}",
            page.entries.len()
        );
        if let (Some(after), Some((first, _))) = (&after, page.entries.first()) {
            assert!(first > after, "a page after {after} starts at {first}");
        }
        if let (Some(next), Some((last, _))) = (&page.next, page.entries.last()) {
            assert!(next >= last, "the next page reads after {next}, before this page's {last}");
        }
        walked.extend(page.entries);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let keys: Vec<&String> = walked.iter().map(|(key, _)| key).collect();
    assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "in key order, once each: {keys:?}");
    walked
}

pub fn pages_seek_past_the_given_key_in_key_order(store: Arc<dyn Store>) {
    let scope = scope("pages");
    let runs = AtomicUsize::new(0);
    let done: Vec<Key> = (0..5)
        .map(|n| {
            let tool = format!("charge_{n}");
            run_counted(&store, &tool, &scope, &runs);
            call(&store, &tool, &scope).key().clone()
        })
        .collect();
    let released: Vec<Key> = (0..4)
        .map(|n| {
            let tool = format!("refund_{n}");
            let failed: Result<String, ToolError> =
                call(&store, &tool, &scope).run(|| Err(ToolError::Declined));
            assert!(failed.is_err());
            call(&store, &tool, &scope).key().clone()
        })
        .collect();

    for limit in [3, 2] {
        let (mut records, mut histories) = (BTreeMap::new(), BTreeMap::new());
        for (key, stored) in walk(store.as_ref(), limit) {
            match stored {
                Stored::Record(record) => {
                    records.insert(key, record.expect("each record reads"));
                }
                Stored::History { last_at } => {
                    histories.insert(key, last_at);
                }
            }
        }
        for key in &done {
            let stored = block_on(store.get(key.as_str())).unwrap();
            assert_eq!(records.get(key.as_str()), stored.as_ref(), "key {key} in a page as stored");
            assert!(!histories.contains_key(key.as_str()), "key {key} has a record");
        }
        for key in &released {
            assert!(!records.contains_key(key.as_str()), "released key {key} has no record");
            let last = block_on(store.history(key.as_str())).unwrap().last().map(|entry| entry.at);
            assert!(last.is_some(), "released key {key} keeps its history");
            assert_eq!(
                histories.get(key.as_str()).copied(),
                last,
                "key {key}: its last entry's time"
            );
        }
    }

    let keys: BTreeMap<String, Stored> = walk(store.as_ref(), 3).into_iter().collect();
    let mut ours: Vec<&Key> = done.iter().collect();
    ours.sort();
    let from = ours[1].as_str();
    let next = keys.range::<str, _>((Bound::Excluded(from), Bound::Unbounded)).next();
    let page = block_on(store.scan_page(Some(from), 1)).unwrap();
    assert_eq!(page.entries.len(), 1, "a page of one");
    assert_eq!(
        Some(&page.entries[0].0),
        next.map(|(key, _)| key),
        "the key after {from}, and only it"
    );
    assert!(page.next.is_some(), "a page of one after {from} is not the last");
}
