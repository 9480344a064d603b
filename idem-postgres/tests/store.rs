//! Behaviour of the PostgreSQL store beyond the shared suite: live leases, async runtimes, and
//! opening a store that is not there.

mod common;

use std::sync::Arc;

use idem_postgres::PgStore;
use idem_runtime::exec::block_on;
use idem_runtime::{now_ms, Call, Error, Record, Status, Store};

fn store(url: &str, schema: &str) -> PgStore {
    PgStore::builder(url).schema(schema).pool_size(4).connect().expect("the store connects")
}

#[test]
fn a_live_lease_cannot_be_taken_over() {
    let Some(url) = common::database_url() else {
        return;
    };
    let schema = common::unique_schema("live");
    let _guard = common::DropSchema { url: url.clone(), schema: schema.clone() };
    let (a, b) = (store(&url, &schema), store(&url, &schema));
    let mine =
        Record::reserve("k1", "charge_card", "s", &format!("{}#1", a.owner_id()), "f", now_ms());
    assert_eq!(block_on(a.reserve(&mine)).unwrap(), None, "a reserves");
    let held = block_on(b.get("k1")).unwrap().expect("b sees the record");
    assert!(b.owner_alive(&held), "the lease is live");
    assert!(held.lease_until.is_some());

    let takeover = held.taken_over(&format!("{}#1", b.owner_id()), now_ms());
    assert!(
        !block_on(b.replace(&held, Some(&takeover))).unwrap(),
        "a live owner's record is not taken over"
    );
    assert!(!block_on(b.replace(&held, None)).unwrap(), "nor released by another");
    assert!(block_on(a.renew(&held)).unwrap(), "the owner renews its lease");

    let done = held.done(serde_json::json!(1), now_ms(), None);
    assert!(block_on(a.replace(&held, Some(&done))).unwrap(), "the owner finishes");
    let finished = block_on(b.get("k1")).unwrap().unwrap();
    assert_eq!((finished.status, finished.lease_until), (Status::Done, None));
    assert!(!block_on(a.renew(&held)).unwrap(), "a finished record has no lease to renew");
}

#[test]
fn works_inside_a_tokio_runtime_and_from_plain_threads() {
    let Some(url) = common::database_url() else {
        return;
    };
    let schema = common::unique_schema("rt");
    let _guard = common::DropSchema { url: url.clone(), schema: schema.clone() };
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
    let Some(url) = common::database_url() else {
        return;
    };
    let schema = common::unique_schema("url");
    let _guard = common::DropSchema { url: url.clone(), schema: schema.clone() };
    let joiner = if url.contains('?') { '&' } else { '?' };
    let store =
        PgStore::connect(&format!("{url}{joiner}idem_table={schema}.calls")).expect("connects");
    assert_eq!(store.table(), format!("{schema}.calls"));
    assert_eq!(block_on(store.scan()).unwrap(), Vec::new());
}

#[test]
fn processes_of_an_older_version_are_still_woken_on_the_legacy_channel() {
    let Some(url) = common::database_url() else {
        return;
    };
    let schema = common::unique_schema("legacy");
    let _guard = common::DropSchema { url: url.clone(), schema: schema.clone() };
    let store = store(&url, &schema);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        // What an older version listens on: `idem_{schema}_{table}`.
        let (client, mut connection) =
            tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
                }
            }
        });
        client.batch_execute(&format!("LISTEN \"idem_{schema}_records\"")).await.unwrap();
        let mine =
            Record::reserve("k", "legacy", "s", &format!("{}#1", store.owner_id()), "f", now_ms());
        assert_eq!(store.reserve(&mine).await.unwrap(), None);
        let (channel, key) = tokio::time::timeout(std::time::Duration::from_secs(30), rx.recv())
            .await
            .expect("the change is announced on the legacy channel")
            .unwrap();
        assert_eq!((channel, key), (format!("idem_{schema}_records"), "k".to_owned()));
    });
}
