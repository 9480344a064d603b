//! A sled store opened with `retain` removes old finished records in the background, keeps
//! what is in doubt, reports its passes (to its opener and through the admin socket), and stops its
//! passes when it closes, so that the store opens again at once. A SQLite store does the same,
//! while another process's handle of the same file (here a second store) sees the removals.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::admin::{self, Admin};
use idem_runtime::block_on;
use idem_runtime::conformance::{new_call, transition};
use idem_runtime::retention::RetentionStatus;
use idem_runtime::store::{Guard, Inserted};
use idem_runtime::{Call, Error, Key, SledStore, SqliteStore, Status, Store};
use serde_json::json;

const HOUR: Duration = Duration::from_secs(3600);

fn key(tool: &str) -> Key {
    Call::new(tool, "order-1", &json!({"amount": 4200})).unwrap().key().clone()
}

/// Writes `tool`'s key as a call two hours ago would have left it: done, or (`doubted`) in
/// doubt.
fn two_hours_ago(store: &dyn Store, tool: &str, doubted: bool) -> Key {
    let key = key(tool);
    let at = store.clock() - 2 * 3_600_000;
    let owner = new_call(store.instance().id());
    let step = transition::reserve(
        key.as_str(),
        tool,
        "order-1",
        None,
        &owner,
        at,
        store.instance().lease(),
    );
    let reserved = step.new.unwrap();
    let inserted = block_on(store.insert_if_absent(&reserved, step.change)).unwrap();
    assert!(matches!(inserted, Inserted::New { .. }));
    let step = match doubted {
        true => transition::leave_in_doubt(&reserved, "the process died", at),
        false => transition::complete(&reserved, "\"ch_old\"".into(), None, at),
    };
    let new = step.new.unwrap();
    assert!(block_on(store.compare_and_swap(
        &reserved,
        Guard::of(reserved.fence(), step.change.by(), store.instance().id()),
        Some(&new),
        step.change
    ))
    .unwrap()
    .is_some());
    key
}

fn status(store: &dyn Store, key: &Key) -> Option<Status> {
    block_on(store.get(key.as_str())).unwrap().map(|r| r.status)
}

/// The retention status `retention` reads once a pass has ended.
fn after_a_pass(retention: impl Fn() -> Option<RetentionStatus>) -> RetentionStatus {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let status = retention().expect("the store runs retention");
        if status.passes > 0 {
            return status;
        }
        assert!(Instant::now() < until, "no retention pass ended: {status:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_store_opened_with_retain_removes_old_finished_records_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sled");
    let store = SledStore::builder(&path).retention(None).open().unwrap();
    assert_eq!(store.retention(), None, "no retention unless asked");
    let old: Vec<Key> =
        (0..5).map(|n| two_hours_ago(&store, &format!("charge_{n}"), false)).collect();
    let doubted = two_hours_ago(&store, "refund", true);
    let recent: String = Call::new("charge_recent", "order-1", &json!({"amount": 4200}))
        .unwrap()
        .store(Arc::new(store))
        .run(|| Ok::<_, Error>("ch_new".to_owned()))
        .unwrap();
    assert_eq!(recent, "ch_new");

    // Closed above (its last handle went with the call); opened again with a bound of an hour.
    let store =
        SledStore::builder(&path).lock_wait(Duration::from_secs(5)).retain(HOUR).open().unwrap();
    let passes = after_a_pass(|| store.retention());
    assert_eq!(passes.keep_ms, 3_600_000);
    let last = passes.last_pass().expect("the pass that ended");
    assert_eq!((last.removed.records, last.removed.histories), (5, 0), "{passes:?}");
    for key in &old {
        assert_eq!(status(&store, key), None, "old finished key {key} is removed");
        assert!(block_on(store.history(key.as_str())).unwrap().is_empty(), "with its history");
    }
    assert_eq!(status(&store, &doubted), Some(Status::InDoubt), "in doubt is kept");
    assert_eq!(status(&store, &key("charge_recent")), Some(Status::Done), "recent is kept");

    // What `idem stats` prints: the passes, told by the process that runs them through its
    // admin socket; the store itself reports none (it only stores).
    assert_eq!(admin::stats(&store).unwrap().retention, None);
    #[cfg(unix)]
    {
        let mut remote = idem_runtime::remote::Remote::connect(&path)
            .unwrap()
            .expect("the holder answers on its socket");
        let through_socket = remote.stats().unwrap().retention.expect("the holder's policy");
        assert_eq!(through_socket.keep_ms, 3_600_000);
        assert!(through_socket.passes >= 1);
        assert_eq!(through_socket.removed.records, 5);
    }

    // Closing stops the passes and lets go of the store: it opens again at once.
    drop(store);
    let again = SledStore::builder(&path).lock_wait(Duration::from_secs(5)).open().unwrap();
    assert_eq!(status(&again, &doubted), Some(Status::InDoubt));
}

#[test]
fn a_sqlite_store_opened_with_retain_removes_old_finished_records_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.sqlite");
    // Another user of the file, with no policy of its own, as a second process would be.
    let other = SqliteStore::builder(&path).retention(None).open().unwrap();
    assert_eq!(other.retention(), None, "no retention unless asked");
    let old: Vec<Key> =
        (0..5).map(|n| two_hours_ago(&other, &format!("charge_{n}"), false)).collect();
    let doubted = two_hours_ago(&other, "refund", true);
    let approval = Call::new("refund_big", "order-9", &json!({"amount": 90_000}))
        .unwrap()
        .store(Arc::new(SqliteStore::builder(&path).retention(None).open().unwrap()))
        .approve(true)
        .run(|| Ok::<_, Error>("re_1".to_owned()));
    let waiting = match approval {
        Err(Error::AwaitingApproval { key, .. }) => key.parse::<Key>().unwrap(),
        other => panic!("expected AwaitingApproval, got {other:?}"),
    };

    let store = SqliteStore::builder(&path).retain(HOUR).open().unwrap();
    let passes = after_a_pass(|| store.retention());
    assert_eq!(passes.keep_ms, 3_600_000);
    let last = passes.last_pass().expect("the pass that ended");
    assert_eq!((last.removed.records, last.removed.histories), (5, 0), "{passes:?}");
    for key in &old {
        assert_eq!(status(&other, key), None, "old finished key {key} is removed for all");
        assert!(block_on(other.history(key.as_str())).unwrap().is_empty(), "with its history");
    }
    assert_eq!(status(&other, &doubted), Some(Status::InDoubt), "in doubt is kept");
    assert_eq!(status(&other, &waiting), Some(Status::AwaitingApproval), "so is a person's");
    assert_eq!(admin::stats(&store).unwrap().retention, None, "the store reports no passes");

    // Closing stops the passes; the file stays usable by the other handle.
    drop(store);
    assert_eq!(status(&other, &doubted), Some(Status::InDoubt));
}
