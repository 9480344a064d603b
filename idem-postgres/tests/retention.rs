//! A PostgreSQL store connected with `retain` removes old finished records in the background
//! and keeps what is in doubt; `idem::admin::stats` reports its policy and passes. (The
//! conformance suite checks the passes themselves on PostgreSQL: bounded batches, released
//! histories, a call during a pass.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::block_on;
use idem_runtime::conformance::{new_call, transition};
use idem_runtime::store::{Guard, Inserted};
use idem_runtime::{Call, Error, Key, Status, Store};
use serde_json::json;

fn key(tool: &str) -> Key {
    Call::new(tool, "order-1", &json!({"amount": 4200})).unwrap().key().clone()
}

/// Writes `tool`'s key as a call two hours ago (on the store's clock) would have left it.
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

#[test]
fn a_store_connected_with_retain_removes_old_finished_records_in_the_background() {
    let Some((url, schema, _guard)) = common::scratch_schema("retain") else { return };
    let writer_store =
        Arc::new(PgStore::builder(&url).schema(&schema).retention(None).connect().unwrap());
    let writer: Arc<dyn Store> = writer_store.clone();
    assert!(writer_store.retention().is_none(), "no retention unless asked");
    let old: Vec<Key> =
        (0..5).map(|n| two_hours_ago(writer.as_ref(), &format!("charge_{n}"), false)).collect();
    let doubted = two_hours_ago(writer.as_ref(), "refund", true);
    let recent: String = Call::new("charge_recent", "order-1", &json!({"amount": 4200}))
        .unwrap()
        .store(Arc::clone(&writer))
        .run(|| Ok::<_, Error>("ch_new".to_owned()))
        .unwrap();
    assert_eq!(recent, "ch_new");

    // Another process of the fleet, with a bound of an hour.
    let keeper =
        PgStore::builder(&url).schema(&schema).retain(Duration::from_secs(3600)).connect().unwrap();
    let ended = common::eventually(Duration::from_secs(30), || {
        keeper.retention().is_some_and(|status| status.passes > 0)
    });
    let status_now = keeper.retention().expect("the store runs retention");
    assert!(ended, "no retention pass ended: {status_now:?}");
    assert_eq!(status_now.keep_ms, 3_600_000);
    assert_eq!(status_now.last_pass().map(|p| p.removed.records), Some(5), "{status_now:?}");
    for key in &old {
        assert_eq!(status(writer.as_ref(), key), None, "old finished key {key} is removed");
        assert!(block_on(writer.history(key.as_str())).unwrap().is_empty(), "with its history");
    }
    assert_eq!(status(writer.as_ref(), &doubted), Some(Status::InDoubt), "in doubt is kept");
    assert_eq!(status(writer.as_ref(), &key("charge_recent")), Some(Status::Done));
    assert_eq!(keeper.retention().map(|r| r.removed.records), Some(5));
    drop(keeper);
}
