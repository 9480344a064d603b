//! The checks of a key's history: every change that landed is in it, in order, with who made
//! it; a release keeps it, a purge removes it, a refused write adds nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::{call, eventually_status, scope, status, ToolError};
use crate::admin::{self, Purge};
use crate::engine::InDoubtPolicy;
use crate::error::Error;
use crate::exec::block_on;
use crate::key::Key;
use crate::lifecycle::history::{Answer, Entry, Event, MAX_NOTE};
use crate::lifecycle::{transition, Guard, Resolution, Status};
use crate::store::{Inserted, Store};

fn history(store: &Arc<dyn Store>, key: &Key) -> Vec<Entry> {
    block_on(store.history(key.as_str())).expect("the store answers history")
}

/// The history as (event, state) pairs, which is what most checks compare.
fn steps(entries: &[Entry]) -> Vec<(Event, Option<Status>)> {
    entries.iter().map(|entry| (entry.event, entry.status)).collect()
}

pub fn history_follows_a_key_through_doubt_takeover_and_replay(store: Arc<dyn Store>) {
    let scope = scope("history");
    let key = call(&store, "charge_card", &scope).key().clone();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _: Result<String, Error> = call(&store, "charge_card", &scope).run(|| panic!("crash"));
    }));
    eventually_status(&store, &key, Status::InDoubt);
    let first = block_on(store.get(key.as_str())).unwrap().unwrap().owner;
    let got: String = call(&store, "charge_card", &scope)
        .in_doubt(InDoubtPolicy::Rerun)
        .run(|| Ok::<_, Error>("ch_1".into()))
        .unwrap();
    let second = block_on(store.get(key.as_str())).unwrap().unwrap().owner;
    let replayed: String =
        call(&store, "charge_card", &scope).run(|| Ok::<_, Error>("ch_2".into())).unwrap();
    assert_eq!((got.as_str(), replayed.as_str()), ("ch_1", "ch_1"));

    let entries = history(&store, &key);
    assert_eq!(
        steps(&entries),
        [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::InDoubt, Some(Status::InDoubt)),
            (Event::TookOver, Some(Status::InFlight)),
            (Event::Done, Some(Status::Done)),
        ],
        "one entry per change, a replay adds none: {entries:?}"
    );
    let by: Vec<&str> = entries.iter().map(|e| e.by.as_str()).collect();
    assert_eq!(by, [first.as_str(), first.as_str(), second.as_str(), second.as_str()]);
    assert!(entries[1].note.as_deref().is_some_and(|n| n.contains("panicked")), "{entries:?}");
    assert!(entries[2].note.as_deref().is_some_and(|n| n.contains("rerun")), "{entries:?}");
    assert!(entries.windows(2).all(|w| w[0].at <= w[1].at), "oldest first: {entries:?}");
    let none = call(&store, "charge_card", &super::scope("history-none")).key().clone();
    assert!(history(&store, &none).is_empty(), "a key never called has no history");
}

pub fn release_keeps_the_history_and_the_next_call_continues_it(store: Arc<dyn Store>) {
    let scope = scope("history-release");
    let key = call(&store, "charge_card", &scope).key().clone();
    let failed: Result<String, ToolError> =
        call(&store, "charge_card", &scope).run(|| Err(ToolError::Declined));
    assert!(failed.is_err());
    assert_eq!(status(&store, &key), None, "released");
    assert_eq!(
        steps(&history(&store, &key)),
        [(Event::Reserved, Some(Status::InFlight)), (Event::Released, None)],
        "a released key keeps its history"
    );
    let _: String =
        call(&store, "charge_card", &scope).run(|| Ok::<_, Error>("ch_1".into())).unwrap();
    assert_eq!(
        steps(&history(&store, &key)),
        [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::Released, None),
            (Event::Reserved, Some(Status::InFlight)),
            (Event::Done, Some(Status::Done)),
        ]
    );
}

pub fn operator_resolve_is_in_the_history_and_purge_removes_it(store: Arc<dyn Store>) {
    let scope = scope("history-operator");
    let key = call(&store, "charge_card", &scope).key().clone();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _: Result<String, Error> = call(&store, "charge_card", &scope).run(|| panic!("crash"));
    }));
    eventually_status(&store, &key, Status::InDoubt);
    let before = history(&store, &key);

    // An operator's note longer than an entry keeps, over two lines: made to fit, never a
    // reason for the resolve to fail.
    let note = format!("vendor dashboard shows ch_9 — «paid» ✓\n{}", "x".repeat(MAX_NOTE));
    admin::resolve(
        store.as_ref(),
        &key,
        Resolution::Done(serde_json::json!("ch_9")),
        "ann@ops-1",
        Some(&note),
        false,
    )
    .unwrap();
    let entries = history(&store, &key);
    let last = entries.last().expect("an entry for the resolve");
    assert_eq!(
        (last.event, last.status, last.by.as_str()),
        (Event::Resolved, Some(Status::Done), "ann@ops-1"),
        "{entries:?}"
    );
    let kept = last.note.as_deref().expect("the note is kept");
    assert!(kept.starts_with("vendor dashboard shows ch_9 — «paid» ✓\\nxxx"), "{kept}");
    assert!(
        kept.len() <= MAX_NOTE && kept.ends_with(crate::lifecycle::history::TRUNCATED),
        "{kept}"
    );
    assert_eq!(entries.len(), before.len() + 1);

    std::thread::sleep(Duration::from_millis(5));
    let removed =
        admin::purge(store.as_ref(), Purge::OlderThan(Duration::from_millis(1)), "ann@ops-1")
            .unwrap();
    assert!(removed.records >= 1);
    assert_eq!(status(&store, &key), None);
    assert!(history(&store, &key).is_empty(), "a purge removes the history with the record");
    let _: String =
        call(&store, "charge_card", &scope).run(|| Ok::<_, Error>("ch_10".into())).unwrap();
    assert_eq!(
        steps(&history(&store, &key)),
        [(Event::Reserved, Some(Status::InFlight)), (Event::Done, Some(Status::Done))],
        "after a purge a key starts a new history"
    );
}

pub fn only_changes_that_land_are_in_the_history(store: Arc<dyn Store>) {
    let scope = scope("history-fence");
    let key = call(&store, "send_email", &scope).key().clone();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _: Result<(), Error> = call(&store, "send_email", &scope).run(|| panic!("crash"));
    }));
    eventually_status(&store, &key, Status::InDoubt);
    let doubtful = block_on(store.get(key.as_str())).unwrap().unwrap();
    let now = store.clock();

    // A reconciler's write, which the store must spell back with its answer; its note came from
    // user code, and is made to fit one line.
    let why = "the vendor has no record\nof this key yet";
    let asked = transition::settle_cannot_tell(&doubtful, Answer::CannotTell, why, now);
    let still = asked.new.clone().unwrap();
    assert!(block_on(store.compare_and_swap(
        &doubtful,
        Guard::of(doubtful.fence(), asked.change.by(), store.instance().id()),
        Some(&still),
        asked.change
    ))
    .unwrap()
    .is_some());
    let landed = transition::settle_landed(&still, r#""sent""#.into(), None, now);
    let done = landed.new.clone().unwrap();
    assert!(block_on(store.compare_and_swap(
        &still,
        Guard::of(still.fence(), landed.change.by(), store.instance().id()),
        Some(&done),
        landed.change
    ))
    .unwrap()
    .is_some());
    let before = history(&store, &key);
    let noted = before.iter().rev().find(|e| e.note.is_some()).unwrap();
    assert_eq!(noted.note.as_deref(), Some("the vendor has no record\\nof this key yet"));

    // Stale writes are refused by the fence, and leave no entry.
    let stale = transition::complete(&doubtful, r#""sent""#.into(), None, now);
    assert!(block_on(store.compare_and_swap(
        &doubtful,
        Guard::of(doubtful.fence(), stale.change.by(), store.instance().id()),
        Some(&done),
        stale.change
    ))
    .unwrap()
    .is_none());
    let stale = transition::release(&still);
    assert!(block_on(store.compare_and_swap(
        &still,
        Guard::of(still.fence(), stale.change.by(), store.instance().id()),
        None,
        stale.change
    ))
    .unwrap()
    .is_none());
    let again = transition::reserve(
        key.as_str(),
        "send_email",
        &scope,
        None,
        &doubtful.owner,
        now,
        store.instance().lease(),
    );
    let found = block_on(store.insert_if_absent(again.new.as_ref().unwrap(), again.change));
    assert!(matches!(found.unwrap(), Inserted::Existing(_)), "a reservation finds the record");
    assert_eq!(status(&store, &key), Some(Status::Done), "and the record stays");

    let after = history(&store, &key);
    assert_eq!(after, before, "refused writes add nothing to the history");
    let tail: Vec<_> = steps(&after).into_iter().rev().take(2).collect();
    assert_eq!(
        tail,
        [
            (Event::Reconciled { answer: Answer::Landed }, Some(Status::Done)),
            (Event::Reconciled { answer: Answer::CannotTell }, Some(Status::InDoubt)),
        ]
    );
    assert_eq!(
        after[after.len() - 2].note.as_deref(),
        Some("the vendor has no record\\nof this key yet")
    );
}

/// A key through reserve → in doubt → reconcile (landed) → replay, and a second key whose
/// reconciler finds the effect did not land and whose body then runs: each answer is an entry,
/// with the reconciling call as its author, and the replay adds none.
pub fn history_follows_a_key_through_a_reconcile(store: Arc<dyn Store>) {
    use crate::engine::Reconciled;

    let lose_answer = |scope: &str| {
        let lost: Result<String, ToolError> = call(&store, "charge_card", scope).run(|| {
            crate::engine::may_have_landed();
            Err(ToolError::Declined)
        });
        assert!(lost.is_err());
        call(&store, "charge_card", scope).key().clone()
    };
    let scope = scope("history-reconcile");
    let key = lose_answer(&scope);
    let got: Result<String, Error> = call(&store, "charge_card", &scope).run_reconciled(
        |_| Ok::<_, String>(Reconciled::Landed("ch_vendor".to_string())),
        || -> Result<String, Error> { panic!("the vendor has the charge: the body must not run") },
    );
    assert_eq!(got.unwrap(), "ch_vendor");
    let reconciler = block_on(store.get(key.as_str())).unwrap().unwrap().owner;
    let replayed: String = call(&store, "charge_card", &scope)
        .run(|| -> Result<String, Error> { panic!("a replay runs no body") })
        .unwrap();
    assert_eq!(replayed, "ch_vendor");
    let entries = history(&store, &key);
    assert_eq!(
        steps(&entries),
        [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::InDoubt, Some(Status::InDoubt)),
            (Event::TookOver, Some(Status::InFlight)),
            (Event::Reconciled { answer: Answer::Landed }, Some(Status::Done)),
        ],
        "{entries:?}"
    );
    assert_eq!(entries[3].by, reconciler.as_str(), "the reconciling call settled it");
    assert!(entries[2].note.as_deref().is_some_and(|n| n.contains("reconciler")), "{entries:?}");

    let scope = super::scope("history-not-landed");
    let key = lose_answer(&scope);
    let ran: Result<String, Error> = call(&store, "charge_card", &scope)
        .run_reconciled(|_| Ok::<_, String>(Reconciled::NotLanded), || Ok("ch_2".to_string()));
    assert_eq!(ran.unwrap(), "ch_2");
    let cannot = super::scope("history-cannot-tell");
    let unsure = lose_answer(&cannot);
    let still: Result<String, Error> = call(&store, "charge_card", &cannot).run_reconciled(
        |_| Err::<Reconciled<String>, _>("the vendor is down".to_string()),
        || Ok("ch_3".to_string()),
    );
    assert!(matches!(still, Err(Error::InDoubt { .. })), "{still:?}");
    assert_eq!(
        steps(&history(&store, &key)),
        [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::InDoubt, Some(Status::InDoubt)),
            (Event::TookOver, Some(Status::InFlight)),
            (Event::Reconciled { answer: Answer::NotLanded }, None),
            (Event::Reserved, Some(Status::InFlight)),
            (Event::Done, Some(Status::Done)),
        ]
    );
    let unsure = history(&store, &unsure);
    let last = unsure.last().expect("entries");
    assert_eq!(
        (last.event, last.status),
        (Event::Reconciled { answer: Answer::Erred }, Some(Status::InDoubt))
    );
    assert!(last.note.as_deref().is_some_and(|n| n.contains("the vendor is down")), "{unsure:?}");
}

/// Released keys have no record, so a purge of records alone never reached their histories:
/// the store grew without bound. A purge by age removes those older than its bound, and counts
/// them apart from records.
pub fn purge_removes_old_histories_of_released_keys(store: Arc<dyn Store>) {
    let scope = scope("history-purge-released");
    let released: Vec<Key> = (0..5)
        .map(|n| {
            let tool = format!("charge_card_{n}");
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
    let doubted_history = history(&store, &doubted);

    let expired = admin::purge(store.as_ref(), Purge::Expired, "ann@ops-1").unwrap();
    assert_eq!(expired, admin::Purged::new(0, 0), "an expiry purge removes no history");
    assert_eq!(history(&store, &released[0]).len(), 2, "kept by an expiry purge");

    // Every entry is older than a bound of zero once the store's clock has moved past the last.
    let last = history(&store, &released[4]).last().expect("a released key has a history").at;
    while store.clock() <= last + 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let purged = admin::purge(store.as_ref(), Purge::OlderThan(Duration::ZERO), "ann@ops-1")
        .expect("purge runs");
    assert_eq!(purged, admin::Purged::new(0, released.len()), "each released key's history");
    for key in &released {
        assert!(history(&store, key).is_empty(), "key {key}'s history is purged");
    }
    assert_eq!(status(&store, &doubted), Some(Status::InDoubt), "a record is never a history");
    assert_eq!(history(&store, &doubted), doubted_history, "a key with a record keeps its history");

    let late = call(&store, "charge_card_late", &scope).key().clone();
    let failed: Result<String, ToolError> =
        call(&store, "charge_card_late", &scope).run(|| Err(ToolError::Declined));
    assert!(failed.is_err());
    let bound = Duration::from_secs(600);
    let purged = admin::purge(store.as_ref(), Purge::OlderThan(bound), "ann@ops-1").unwrap();
    assert_eq!(purged, admin::Purged::new(0, 0), "a history newer than the bound is kept");
    assert_eq!(history(&store, &late).len(), 2);

    let _: String =
        call(&store, "charge_card_0", &scope).run(|| Ok::<_, Error>("ch_1".into())).unwrap();
    assert_eq!(
        steps(&history(&store, &released[0])),
        [(Event::Reserved, Some(Status::InFlight)), (Event::Done, Some(Status::Done))],
        "a key reserved after its history was purged starts a new one"
    );
}

/// A reservation of a released key racing the removal of its history keeps its own entry: the
/// history it ends up with is the old one continued, or a fresh one.
pub fn a_reservation_racing_a_history_purge_keeps_its_own_entry(store: Arc<dyn Store>) {
    let (mut continued, mut fresh) = (0, 0);
    for round in 0..20 {
        let scope = scope(&format!("history-purge-race-{round}"));
        let failed: Result<String, ToolError> =
            call(&store, "charge_card", &scope).run(|| Err(ToolError::Declined));
        assert!(failed.is_err());
        let key = call(&store, "charge_card", &scope).key().clone();
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|threads| {
            threads.spawn(|| {
                start.wait();
                let change = transition::purge("ann@ops-1").change;
                block_on(store.append_history(key.as_str(), change)).expect("the removal runs");
            });
            start.wait();
            let _: String =
                call(&store, "charge_card", &scope).run(|| Ok::<_, Error>("ch_1".into())).unwrap();
        });
        let steps = steps(&history(&store, &key));
        let own = [(Event::Reserved, Some(Status::InFlight)), (Event::Done, Some(Status::Done))];
        let old = [(Event::Reserved, Some(Status::InFlight)), (Event::Released, None)];
        if steps == own {
            fresh += 1;
        } else {
            assert_eq!(steps, [&old[..], &own[..]].concat(), "round {round}: the call's entries");
            continued += 1;
        }
        assert_eq!(status(&store, &key), Some(Status::Done), "round {round}");
    }
    eprintln!("histories continued: {continued}, fresh: {fresh}");
}

/// A stale owner's refused late write is appended to the key's history and changes no record,
/// whatever state the key is in (in doubt, absent, done with a large result), and the key's
/// next changes follow it.
pub fn a_refused_late_write_is_in_the_history_and_changes_no_record(store: Arc<dyn Store>) {
    let scope = scope("late");
    let key = call(&store, "charge_card", &scope).key().clone();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _: Result<String, Error> = call(&store, "charge_card", &scope).run(|| panic!("crash"));
    }));
    eventually_status(&store, &key, Status::InDoubt);
    let stale = block_on(store.get(key.as_str())).unwrap().unwrap();
    block_on(store.append_history(key.as_str(), transition::refuse_late_write(&stale))).unwrap();
    assert_eq!(block_on(store.get(key.as_str())).unwrap().as_ref(), Some(&stale), "unchanged");
    let late = history(&store, &key).pop().expect("an entry");
    assert_eq!((late.event, late.status), (Event::LateWriteRefused, Some(Status::InDoubt)));
    assert_eq!(late.by, stale.owner.as_str(), "by the stale owner");
    assert!(late.note.as_deref().is_some_and(|note| note.contains("effect ran")), "{late:?}");

    // The key's next changes follow it: a rerun that fails releases the key, a refused late
    // write finds it absent, and the next call reserves it.
    let failed: Result<String, Error> = call(&store, "charge_card", &scope)
        .in_doubt(InDoubtPolicy::Rerun)
        .run(|| Err(Error::Key { tool: "charge_card".into(), reason: "declined".into() }));
    assert!(failed.is_err());
    block_on(store.append_history(key.as_str(), transition::refuse_late_write(&stale))).unwrap();
    assert_eq!(status(&store, &key), None, "a late write on an absent key adds no record");
    let large = "x".repeat(16 * 1024);
    let got: String =
        call(&store, "charge_card", &scope).run(|| Ok::<_, Error>(large.clone())).unwrap();
    let done = block_on(store.get(key.as_str())).unwrap().unwrap();
    block_on(store.append_history(key.as_str(), transition::refuse_late_write(&stale))).unwrap();
    assert_eq!(block_on(store.get(key.as_str())).unwrap().as_ref(), Some(&done), "unchanged");
    let replayed: String =
        call(&store, "charge_card", &scope).run(|| Ok::<_, Error>("again".into())).unwrap();
    assert_eq!((got.len(), replayed), (large.len(), large));
    assert_eq!(
        steps(&history(&store, &key)),
        [
            (Event::Reserved, Some(Status::InFlight)),
            (Event::InDoubt, Some(Status::InDoubt)),
            (Event::LateWriteRefused, Some(Status::InDoubt)),
            (Event::TookOver, Some(Status::InFlight)),
            (Event::Released, None),
            (Event::LateWriteRefused, None),
            (Event::Reserved, Some(Status::InFlight)),
            (Event::Done, Some(Status::Done)),
            (Event::LateWriteRefused, Some(Status::Done)),
        ]
    );
}
