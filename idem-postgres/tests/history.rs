//! The history table on a real server: created by the migration for a table of an earlier
//! release too, and written in the same statement as the record's change, so that a history row
//! that cannot be written takes the change with it.

mod common;

use std::sync::Arc;

use idem_postgres::PgStore;
use idem_runtime::admin;
use idem_runtime::block_on;
use idem_runtime::history::Event;
use idem_runtime::{Call, Error, Key, Status, Store};

fn charge(store: &Arc<dyn Store>) -> Call {
    Call::new("charge_card", "order-1", &serde_json::json!({"amount": 4200}))
        .unwrap()
        .store(Arc::clone(store))
}

fn events(store: &Arc<dyn Store>, key: &Key) -> Vec<(Event, Option<Status>)> {
    admin::history(store.as_ref(), key).unwrap().into_iter().map(|e| (e.event, e.status)).collect()
}

#[test]
fn a_table_from_before_histories_gets_its_history_table_when_a_store_connects() {
    let Some((url, schema, _guard)) = common::scratch_schema("hmig") else { return };
    let store: Arc<dyn Store> =
        Arc::new(PgStore::builder(&url).schema(&schema).pool_size(2).connect().unwrap());
    let before = charge(&store);
    let old_key = before.key().clone();
    let _: String = before.run(|| Ok::<_, Error>("ch_1".into())).unwrap();
    drop(store);
    // As an earlier release left the table: records, no history.
    common::run_sql(&url, &format!("DROP TABLE \"{schema}\".records_history")).unwrap();

    let refused =
        PgStore::builder(&url).schema(&schema).pool_size(2).create(false).connect().unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("records_history") && message.contains("migrate"),
        "a store that may not create says what is missing and what to do: {message}"
    );

    let store: Arc<dyn Store> =
        Arc::new(PgStore::builder(&url).schema(&schema).pool_size(2).connect().unwrap());
    assert!(events(&store, &old_key).is_empty(), "the old record's changes were not kept");
    let replayed: String = charge(&store).run(|| Ok::<_, Error>("ch_2".into())).unwrap();
    assert_eq!(replayed, "ch_1", "the old record still replays");
    let fresh = Call::new("charge_card", "order-2", &1).unwrap().store(Arc::clone(&store));
    let fresh_key = fresh.key().clone();
    let _: String = fresh.run(|| Ok::<_, Error>("ch_3".into())).unwrap();
    assert_eq!(
        events(&store, &fresh_key),
        [(Event::Reserved, Some(Status::InFlight)), (Event::Done, Some(Status::Done))]
    );
    // And the command's way in, which does not create, now finds both tables.
    PgStore::builder(&url).schema(&schema).pool_size(2).create(false).connect().unwrap();
}

#[test]
fn a_history_row_that_cannot_be_written_takes_the_records_change_with_it() {
    let Some((url, schema, _guard)) = common::scratch_schema("hatom") else { return };
    let store: Arc<dyn Store> =
        Arc::new(PgStore::builder(&url).schema(&schema).pool_size(2).connect().unwrap());
    // Expired as soon as it is done, so that the purge below takes it without waiting.
    let done = Call::new("charge_card", "order-9", &1)
        .unwrap()
        .store(Arc::clone(&store))
        .ttl(std::time::Duration::ZERO);
    let done_key = done.key().clone();
    let _: String = done.run(|| Ok::<_, Error>("ch_9".into())).unwrap();
    // From here on the server refuses every history row.
    common::run_sql(
        &url,
        &format!(
            r#"CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'no history today'; END $$;
               CREATE TRIGGER refuse BEFORE INSERT ON "{schema}".records_history
               FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse();"#
        ),
    )
    .unwrap();

    let runs = std::sync::atomic::AtomicUsize::new(0);
    let refused: Result<String, Error> = charge(&store).run(|| {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok("ch_1".into())
    });
    assert!(matches!(refused, Err(Error::Store { .. })), "{refused:?}");
    assert_eq!(runs.into_inner(), 0, "the body does not run on a reservation that failed");
    let key = charge(&store).key().clone();
    assert_eq!(block_on(store.get(key.as_str())).unwrap(), None, "no record without its row");

    let purged = admin::purge(store.as_ref(), admin::Purge::Expired, "ann@ops");
    // A purge writes no row: it deletes the record and its rows in one statement.
    assert_eq!(purged.unwrap(), admin::Purged::new(1, 0));
    assert_eq!(block_on(store.get(done_key.as_str())).unwrap(), None);
    assert!(events(&store, &done_key).is_empty(), "the purge took the rows with the record");
}
