//! Which writes announce their change to the fleet: only those a caller waits for. Each
//! announcement wakes the listening connection of every process of the fleet, so a write that
//! no caller waits for (nearly all of them) announces nothing. An observer of its own listens on
//! the store's channel, directly on the server, and ends each look with a marker it sends
//! itself: the server delivers notifications in commit order, so whatever the store announced
//! before the marker has arrived by the time the marker does.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PgStore;
use idem_runtime::{Call, Error, Store};
use sha2::{Digest, Sha256};
use tokio_postgres::{AsyncMessage, NoTls};

/// The store's channel for `schema`'s default table (`Names::channel`).
fn channel(schema: &str) -> String {
    let digest = Sha256::digest(format!("{schema}.records"));
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("idem_{hex}")
}

/// A connection listening on a channel, on a runtime of its own.
struct Observer {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    heard: tokio::sync::mpsc::UnboundedReceiver<String>,
    channel: String,
    markers: usize,
}

impl Observer {
    fn listen(url: &str, channel: &str) -> Observer {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (heard_tx, heard) = tokio::sync::mpsc::unbounded_channel();
        let client = runtime.block_on(async {
            let (client, mut connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
            tokio::spawn(async move {
                while let Some(message) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    if let Ok(AsyncMessage::Notification(n)) = message {
                        let _ = heard_tx.send(n.payload().to_owned());
                    }
                }
            });
            client.batch_execute(&format!("LISTEN {channel}")).await.unwrap();
            client
        });
        Observer { runtime, client, heard, channel: channel.to_owned(), markers: 0 }
    }

    /// Every payload announced since the last look, up to a marker of the observer's own.
    fn announced(&mut self) -> Vec<String> {
        self.markers += 1;
        let marker = format!("observer-marker-{}", self.markers);
        let sql = format!("SELECT pg_notify('{}', '{marker}')", self.channel);
        self.runtime.block_on(self.client.batch_execute(&sql)).unwrap();
        let mut payloads = Vec::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            // The connection's task runs while the runtime is driven.
            let heard = self
                .runtime
                .block_on(async { tokio::time::timeout_at(until, self.heard.recv()).await });
            match heard {
                Ok(Some(payload)) if payload == marker => return payloads,
                Ok(Some(payload)) => payloads.push(payload),
                _ => panic!("the observer's own marker never came back; heard {payloads:?}"),
            }
        }
    }
}

fn store(url: &str, schema: &str) -> Arc<dyn Store> {
    let store = PgStore::builder(url).schema(schema).lease(Duration::from_secs(30)).pool_size(4);
    Arc::new(store.connect().expect("the store connects"))
}

fn charge(scope: &str) -> Call {
    Call::new("charge_card", scope, &("cus_1", 4200)).unwrap()
}

#[test]
fn only_a_write_that_a_caller_waits_for_is_announced() {
    let Some((url, schema, _guard)) = common::scratch_schema("announce") else { return };
    let owner_store = store(&url, &schema);
    let mut observer = Observer::listen(&common::server_url(&url), &channel(&schema));
    assert!(observer.announced().is_empty(), "nothing written yet");

    // A call that no one waits for: its reservation and its result announce nothing.
    let alone = charge("alone");
    let got: Result<String, Error> =
        alone.clone().store(Arc::clone(&owner_store)).run(|| Ok("ch_1".into()));
    assert_eq!(got.unwrap(), "ch_1");
    assert_eq!(observer.announced(), Vec::<String>::new(), "a call no one waited for");

    // A call another process's caller (a store of its own) waits for: its result is announced.
    let waited = charge("waited");
    let key = waited.key().as_str().to_owned();
    let (release_tx, release) = mpsc::channel::<()>();
    let owner = {
        let (call, store) = (waited.clone(), Arc::clone(&owner_store));
        std::thread::spawn(move || {
            call.store(store).run(|| {
                release.recv().unwrap();
                Ok::<String, Error>("ch_2".into())
            })
        })
    };
    let marked =
        format!("SELECT count(*) FROM \"{schema}\".records WHERE key = '{key}' AND waiters");
    let reserved = format!("SELECT count(*) FROM \"{schema}\".records WHERE key = '{key}'");
    assert!(common::eventually(Duration::from_secs(30), || common::query_i64(&url, &reserved) == 1));
    let waiter = {
        let (call, store) = (waited.clone(), store(&url, &schema));
        std::thread::spawn(move || {
            call.store(store)
                .wait(Duration::from_secs(30))
                .run(|| Ok::<String, Error>("ch_3".into()))
        })
    };
    assert!(
        common::eventually(Duration::from_secs(30), || common::query_i64(&url, &marked) == 1),
        "the waiter marks the record before it waits"
    );
    assert_eq!(observer.announced(), Vec::<String>::new(), "the mark itself announces nothing");
    release_tx.send(()).unwrap();
    assert_eq!(owner.join().unwrap().unwrap(), "ch_2");
    assert_eq!(observer.announced(), [key], "the owner's result, which a caller waited for");
    assert_eq!(waiter.join().unwrap().unwrap(), "ch_2", "the waiter replays the owner's result");
}
