//! Behaviour of the PostgreSQL store beyond the shared suite: live leases, async runtimes, and
//! opening a store that is not there.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::block_on;
use idem_runtime::conformance::{new_call, transition};
use idem_runtime::store::{lease, Inserted};
use idem_runtime::{Call, Error, Status, Store};

fn store(url: &str, schema: &str) -> PgStore {
    PgStore::builder(url).schema(schema).pool_size(4).connect().expect("the store connects")
}

#[test]
fn a_live_lease_cannot_be_taken_over() {
    let Some((url, schema, _guard)) = common::scratch_schema("live") else { return };
    let (a, b) = (store(&url, &schema), store(&url, &schema));
    let owner = new_call(a.instance().id());
    let (_, inserted) = common::reserve(&a, "k1", "charge_card", "s", &owner);
    assert!(matches!(inserted, Inserted::New { .. }), "a reserves");
    let held = block_on(b.get("k1")).unwrap().expect("b sees the record");
    assert!(lease::holds(&held, b.clock(), b.instance().id()), "the lease is live");
    assert!(held.lease_until.is_some());

    let other = new_call(b.instance().id());
    let takeover = transition::take_over(&held, &other, None, b.clock(), b.instance().lease());
    assert!(common::swap(&b, &held, takeover).is_none(), "a live owner's record is not taken over");
    // b writing under a's owner: the store refuses an owner that is not one of its calls.
    let release = transition::release(&held);
    assert!(common::swap(&b, &held, release).is_none(), "nor released by another");
    assert!(common::renew(&a, &held), "the owner renews its lease");

    let done = transition::complete(&held, "1".into(), None, a.clock());
    assert!(common::swap(&a, &held, done).is_some(), "the owner finishes");
    let finished = block_on(b.get("k1")).unwrap().unwrap();
    assert_eq!((finished.status, finished.lease_until), (Status::Done, None));
    assert!(!common::renew(&a, &held), "a finished record has no lease to renew");
}

#[test]
fn works_inside_a_tokio_runtime_and_from_plain_threads() {
    let Some((url, schema, _guard)) = common::scratch_schema("rt") else { return };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store: Arc<dyn Store> = runtime.block_on(async {
        // Both ways of connecting work inside a runtime, even a single-threaded one.
        let blocking =
            PgStore::builder(&url).schema(&schema).connect().expect("connect inside a runtime");
        let store: Arc<dyn Store> = Arc::new(
            PgStore::builder(&url).schema(&schema).connect_async().await.expect("connect_async"),
        );
        let got: u32 = Call::new("count", "rt", &1)
            .unwrap()
            .store(Arc::clone(&store))
            .run_async(|| async { Ok::<_, Error>(7) })
            .await
            .unwrap();
        assert_eq!(got, 7);
        // Dropped inside the runtime: must not panic.
        drop(blocking);
        store
    });
    let replayed: u32 = Call::new("count", "rt", &1)
        .unwrap()
        .store(Arc::clone(&store))
        .run(|| Ok::<_, Error>(8))
        .unwrap();
    assert_eq!(replayed, 7, "a plain thread replays what the async call stored");
    runtime.block_on(async move { drop(store) });
}

#[test]
fn a_missing_table_is_an_error_when_not_creating() {
    let Some(url) = common::database_url() else {
        return;
    };
    let schema = common::unique_schema("missing");
    match PgStore::builder(&url).schema(&schema).create(false).connect() {
        Err(e) => assert!(e.to_string().contains("no idem records table"), "{e}"),
        Ok(store) => panic!("opened a store that is not there: {store:?}"),
    }
    let bad = PgStore::builder(&url).table("Robert'); DROP TABLE students;--").connect();
    assert!(bad.unwrap_err().to_string().contains("not usable"));
}

#[test]
fn the_url_names_the_table() {
    let Some((url, schema, _guard)) = common::scratch_schema("url") else { return };
    let joiner = if url.contains('?') { '&' } else { '?' };
    let store =
        PgStore::connect(&format!("{url}{joiner}idem_table={schema}.calls")).expect("connects");
    assert_eq!(store.table(), format!("{schema}.calls"));
    assert!(block_on(store.scan_page(None, usize::MAX)).unwrap().entries.is_empty());
}

#[test]
fn a_table_of_the_first_release_is_migrated_to_the_one_status_spelling() {
    let Some((url, schema, _guard)) = common::scratch_schema("spelling") else { return };
    let args = serde_json::json!({"n": 1});
    let doubtful = idem_runtime::Key::derive("charge_card", "s", &args).unwrap();
    // The table as the first release created it, with its spelling of two statuses.
    common::run_sql(
        &url,
        &format!(
            r#"CREATE SCHEMA "{schema}";
            CREATE TABLE "{schema}".records (
                key text PRIMARY KEY,
                status text NOT NULL CHECK (status IN ('in_flight', 'done', 'in_doubt')),
                tool text NOT NULL, scope text NOT NULL, owner text NOT NULL,
                attempts bigint NOT NULL, created_at bigint NOT NULL, updated_at bigint NOT NULL,
                completed_at bigint, expires_at bigint, lease_until bigint,
                args_fingerprint text NOT NULL, result text);
            INSERT INTO "{schema}".records VALUES
                ('{doubtful}', 'in_doubt', 'charge_card', 's', 'pg:old#1', 1, 1, 2, NULL, NULL,
                 NULL, 'f', NULL),
                ('k_flight', 'in_flight', 'charge_card', 's', 'pg:old#2', 1, 1, 2, NULL, NULL,
                 1, 'f', NULL),
                ('k_done', 'done', 'charge_card', 's', 'pg:old#3', 1, 1, 2, 2, NULL, NULL, 'f',
                 '7');"#
        ),
    )
    .expect("the old table is created");

    let store: Arc<dyn Store> = Arc::new(store(&url, &schema));
    let mut statuses: Vec<(String, Status)> = block_on(store.scan_page(None, usize::MAX))
        .unwrap()
        .into_records()
        .map(|r| r.unwrap())
        .map(|r| (r.key, r.status))
        .collect();
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected = vec![
        (doubtful.to_string(), Status::InDoubt),
        ("k_done".to_owned(), Status::Done),
        ("k_flight".to_owned(), Status::InFlight),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(statuses, expected, "every old row reads, with its status");
    let unmarked = format!("SELECT count(*) FROM \"{schema}\".records WHERE NOT waiters");
    assert_eq!(common::query_i64(&url, &unmarked), 3, "the waiters mark is added, unset");
    let again: Result<u32, Error> =
        Call::new("charge_card", "s", &args).unwrap().store(Arc::clone(&store)).run(|| Ok(1));
    assert!(matches!(again, Err(Error::InDoubt { .. })), "still in doubt: {again:?}");

    let old_spelling = format!(
        "INSERT INTO \"{schema}\".records VALUES ('k_old', 'in_flight', 't', 's', 'o', 1, 1, 1, \
         NULL, NULL, NULL, 'f', NULL)"
    );
    assert!(common::run_sql(&url, &old_spelling).is_err(), "the old spelling is refused now");
    drop(store);
    let reopened = self::store(&url, &schema);
    assert_eq!(
        block_on(reopened.scan_page(None, usize::MAX)).unwrap().into_records().count(),
        3,
        "a second migration changes nothing"
    );
}

/// Earlier releases announced changes from triggers inside the writing transaction, which made
/// every notifying commit of the fleet wait for the one before it; the migration drops them, and
/// the writers announce after their commits.
#[test]
fn the_notify_triggers_of_an_earlier_release_are_dropped() {
    let Some((url, schema, _guard)) = common::scratch_schema("triggers") else { return };
    let first = store(&url, &schema);
    drop(first);
    common::run_sql(
        &url,
        &format!(
            r#"CREATE FUNCTION "{schema}"."records_notify"() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_notify('old', NEW.key); RETURN NULL; END $$;
            CREATE TRIGGER "records_notify_insert_delete" AFTER INSERT OR DELETE
                ON "{schema}".records FOR EACH ROW EXECUTE FUNCTION "{schema}"."records_notify"();
            CREATE TRIGGER "records_notify_update" AFTER UPDATE
                ON "{schema}".records FOR EACH ROW EXECUTE FUNCTION "{schema}"."records_notify"();"#
        ),
    )
    .expect("the earlier release's triggers are created");
    let store: Arc<dyn Store> = Arc::new(store(&url, &schema));
    let ran: Result<u32, Error> = Call::new("charge_card", "s", &serde_json::json!({"n": 2}))
        .unwrap()
        .store(Arc::clone(&store))
        .run(|| Ok(2));
    assert_eq!(ran.unwrap(), 2);
    for gone in [
        format!(r#"DROP TRIGGER "records_notify_update" ON "{schema}".records"#),
        format!(r#"DROP TRIGGER "records_notify_insert_delete" ON "{schema}".records"#),
        format!(r#"DROP FUNCTION "{schema}"."records_notify"()"#),
    ] {
        assert!(common::run_sql(&url, &gone).is_err(), "already dropped by the migration: {gone}");
    }
}

#[test]
fn a_deep_result_written_by_an_earlier_release_still_lists() {
    let Some((url, schema, _guard)) = common::scratch_schema("deep") else { return };
    let store = store(&url, &schema);
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    common::run_sql(
        &url,
        &format!(
            "INSERT INTO \"{schema}\".records VALUES ('k_deep', 'done', 'report', 's', 'o', 1, 1, \
             2, 2, NULL, NULL, 'f', '{deep}'), ('k_fine', 'done', 'report', 's', 'o', 1, 1, 2, 2, \
             NULL, NULL, 'f', '1')"
        ),
    )
    .unwrap();
    let listing = idem_runtime::admin::scan(&store, &idem_runtime::admin::Filter::default())
        .expect("the listing does not fail as a whole");
    assert_eq!(listing.records.len(), 2, "both rows read: {:?}", listing.unreadable);
    let stats = idem_runtime::admin::stats(&store).unwrap();
    assert_eq!((stats.by_status.get("done"), stats.unreadable), (Some(&2), 0));
}

#[test]
fn a_record_of_another_function_with_the_same_tool_name_is_refused() {
    let Some((url, schema, _guard)) = common::scratch_schema("function") else { return };
    let store: Arc<dyn Store> = Arc::new(store(&url, &schema));
    let send = |function: &str| {
        Call::new("send", "o-1", &1).unwrap().store(Arc::clone(&store)).function(function)
    };
    let first: String = send("email::send").run(|| Ok::<_, Error>("email".into())).unwrap();
    assert_eq!(first, "email");
    let other: Result<String, Error> = send("sms::send").run(|| Ok("sms".into()));
    assert!(matches!(other, Err(Error::SharedToolName { .. })), "{other:?}");
    let again: String = send("email::send").run(|| Ok::<_, Error>("twice".into())).unwrap();
    assert_eq!(again, "email", "the writer itself still replays");
}

/// A reservation whose insert waits for another writer's insert of the same key, which then
/// commits, finds the other's record: the key is taken, not reserved twice, and the race is not
/// an error. (A read in the insert's own statement would share its snapshot and miss that row.)
#[test]
fn a_reservation_that_waited_for_another_insert_finds_its_record() {
    let Some((url, schema, _guard)) = common::scratch_schema("race") else { return };
    let a = store(&url, &schema);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let other = runtime.block_on(async {
        let (client, connection) =
            tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        // Another writer's insert, left uncommitted: a finished record of its own.
        client
            .batch_execute(&format!(
                "BEGIN; INSERT INTO \"{schema}\".records (key, status, tool, scope, owner, \
                 attempts, created_at, updated_at, completed_at, args_fingerprint, result) VALUES \
                 ('k1', 'done', \
                 'charge_card', 's', 'another-process#1', 1, 1, 2, 2, '', '\"ch_other\"')"
            ))
            .await
            .unwrap();
        client
    });
    let reserving = std::thread::spawn(move || {
        let owner = new_call(a.instance().id());
        common::reserve(&a, "k1", "charge_card", "s", &owner).1
    });
    // The reservation's insert waits for the other's to end.
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%\"{schema}\".%records%'"
    );
    assert!(
        common::eventually(Duration::from_secs(10), || common::query_i64(&url, &waiting) == 1),
        "the reservation never waited for the other insert"
    );
    runtime.block_on(other.batch_execute("COMMIT")).unwrap();
    match reserving.join().expect("the reservation answers") {
        Inserted::Existing(found) => {
            assert_eq!(found.owner.as_str(), "another-process#1");
            assert_eq!(
                (found.status, found.result.as_deref()),
                (Status::Done, Some("\"ch_other\""))
            );
        }
        other => panic!("reserved a key another writer holds: {other:?}"),
    }
}
